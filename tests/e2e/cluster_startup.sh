#!/usr/bin/env bash
# Cluster start-up refusals that need no device and no etcd (label unit, on
# the host): the kvnode process with wrong cluster flags exits 2 with a
# message naming the flag, before it creates anything (no database
# directory, no admin socket, no shared memory); a database that holds
# another node's or cluster's identity (DB/cluster-identity) is refused,
# naming the database, its owner and who asked, and the identity file is
# left as it was. Without --cluster the cluster flags must be absent too.
set -euo pipefail
KV_BUILD=${KVNODE_BUILD_DIR:?KVNODE_BUILD_DIR must point at the build directory}
NODE=${KV_NODE_BIN:-$KV_BUILD/node/kvnode}
TEST=cluster_startup
log() { echo "[$TEST $(date +%H:%M:%S)] $*" >&2; }
fail() {
  log "FAIL: $*"
  exit 1
}

dir=$(mktemp -d "/tmp/kv-$TEST.XXXXXX")
shm="kvnode-$TEST-$$"
cleanup() {
  rm -rf "$dir"
  rm -f "/dev/shm/$shm"
}
trap cleanup EXIT

# run TAG DB ARGS...: runs the node (it must exit by itself: every case here
# is refused before it listens); prints nothing, returns its exit code.
run() {
  local tag=$1 db=$2 rc=0
  shift 2
  timeout 60 "$NODE" --listen 127.0.0.1:0 --db_path "$db" --shm_name "$shm" \
    --admin_socket "$dir/admin-$tag/admin.sock" --arena_size $((8 << 20)) "$@" \
    >"$dir/$tag.log" 2>&1 || rc=$?
  return $rc
}

# expect_refused TAG WANT-RC MESSAGE-REGEX ARGS...: on a database path that
# does not exist; nothing may be created.
expect_refused() {
  local tag=$1 want=$2 re=$3 rc=0
  shift 3
  run "$tag" "$dir/db-$tag" "$@" || rc=$?
  [[ $rc -eq $want ]] || { cat "$dir/$tag.log" >&2; fail "$tag: exit $rc, expected $want"; }
  grep -qE -- "$re" "$dir/$tag.log" || { cat "$dir/$tag.log" >&2; fail "$tag: no clear message /$re/"; }
  [[ ! -e $dir/db-$tag ]] || fail "$tag: database directory created"
  [[ ! -e $dir/admin-$tag ]] || fail "$tag: admin socket directory created"
  [[ ! -e /dev/shm/$shm ]] || fail "$tag: shared-memory segment created"
  log "ok: $tag: $(grep -oE -- "$re.*" "$dir/$tag.log" | head -n 1)"
}

E=127.0.0.1:2379
expect_refused no-endpoints 2 "--cluster: needs --etcd_endpoints" --cluster c1 --node_id a
expect_refused endpoints-alone 2 "--etcd_endpoints: only means something with --cluster" \
  --etcd_endpoints "$E"
expect_refused node-id-alone 2 "--node_id: only means something with --cluster" --node_id a
expect_refused ttl-alone 2 "--etcd_lease_ttl_s: only means something with --cluster" \
  --etcd_lease_ttl_s 5
expect_refused bad-cluster 2 "--cluster 'c/1'" --cluster c/1 --etcd_endpoints "$E" --node_id a
expect_refused bad-node-id 2 "--node_id 'a b'" --cluster c1 --etcd_endpoints "$E" --node_id "a b"
expect_refused endpoint-no-port 2 "--etcd_endpoints: '127.0.0.1'" \
  --cluster c1 --etcd_endpoints 127.0.0.1 --node_id a
expect_refused endpoint-scheme 2 "--etcd_endpoints: 'http://$E' must be host:port" \
  --cluster c1 --etcd_endpoints "http://$E" --node_id a
expect_refused ttl-low 2 "--etcd_lease_ttl_s: must be 2..60 seconds, not 1" \
  --cluster c1 --etcd_endpoints "$E" --node_id a --etcd_lease_ttl_s 1

# --- identity: a database of node 'a' of cluster 'c1' (the file a first
# start writes) refuses node 'b' and cluster 'c2'; the first start of a
# database needs --node_id.
db=$dir/db-a
mkdir -m 700 "$db"
instance=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
printf 'cluster=c1\nnode_id=a\ninstance=%s\n' "$instance" >"$db/cluster-identity"
chmod 600 "$db/cluster-identity"
sum=$(md5sum <"$db/cluster-identity")
# expect_identity_refused TAG MESSAGE-REGEX ARGS...
expect_identity_refused() {
  local tag=$1 re=$2 rc=0
  shift 2
  run "$tag" "$db" --etcd_endpoints "$E" "$@" || rc=$?
  [[ $rc -ne 0 ]] || { cat "$dir/$tag.log" >&2; fail "$tag: the node started"; }
  grep -qE -- "$re" "$dir/$tag.log" || { cat "$dir/$tag.log" >&2; fail "$tag: no clear message /$re/"; }
  [[ $(md5sum <"$db/cluster-identity") == "$sum" ]] || fail "$tag: the identity file changed"
  [[ $(ls -A "$db") == cluster-identity ]] || fail "$tag: files created in $db: $(ls -A "$db")"
  [[ ! -e $dir/admin-$tag ]] || fail "$tag: admin socket directory created"
  [[ ! -e /dev/shm/$shm ]] || fail "$tag: shared-memory segment created"
  log "ok: $tag (exit $rc): $(grep -oE -- "database at .*" "$dir/$tag.log" | head -n 1)"
}
expect_identity_refused other-node \
  "database at $db belongs to node 'a' of cluster 'c1', not node 'b' of cluster 'c1'" \
  --cluster c1 --node_id b
expect_identity_refused other-cluster "database at $db belongs to node 'a' of cluster 'c1'.*'c2'" \
  --cluster c2 --node_id a
expect_identity_refused other-cluster-no-id "database at $db belongs to node 'a' of cluster 'c1'.*'c2'" \
  --cluster c2

rc=0
run first-no-id "$dir/db-new" --cluster c1 --etcd_endpoints "$E" || rc=$?
[[ $rc -ne 0 ]] || fail "first-no-id: the node started"
grep -q -- "--node_id" "$dir/first-no-id.log" || { cat "$dir/first-no-id.log" >&2; fail "first-no-id: no message naming --node_id"; }
[[ ! -e $dir/db-new/cluster-identity ]] || fail "first-no-id: an identity was written"
log "ok: first-no-id (exit $rc): $(grep -oE -- "--node_id.*" "$dir/first-no-id.log" | head -n 1)"
log "PASS"
