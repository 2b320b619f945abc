#!/usr/bin/env bash
# Security, start-up checks that need no device (label unit, runs on the host):
# the auth token file. A token file that group or others can read (or write),
# a symlink, a directory, an empty file: the node refuses to start with a
# message that names the file and what is wrong, exits non-zero before it
# touches the network, the device or the database (no RocksDB directory, no
# admin socket, no shared-memory segment is created). A 0600 file passes the
# token stage (the node then fails later only for want of a device on a host
# without one, or starts where there is one).
set -euo pipefail
KV_BUILD=${KVNODE_BUILD_DIR:?KVNODE_BUILD_DIR must point at the build directory}
NODE=${KV_NODE_BIN:-$KV_BUILD/server/kvnode}
TEST=security_startup
log() { echo "[$TEST $(date +%H:%M:%S)] $*" >&2; }
fail() {
  log "FAIL: $*"
  exit 1
}

dir=$(mktemp -d "/tmp/kv-$TEST.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$dir"
  rm -f "/dev/shm/kvnode-$TEST-$$"
}
trap cleanup EXIT
shm="kvnode-$TEST-$$"

# Runs the node with token file $1; prints its output; returns its exit code
# (the node must exit by itself within 60 s: it never serves here).
run_node() {
  local token=$1 tag=$2 rc=0
  "$NODE" --listen 127.0.0.1:0 --db_path "$dir/db-$tag" --shm_name "$shm" \
    --admin_socket "$dir/admin-$tag/admin.sock" --auth_token_file "$token" \
    --arena_size $((8 << 20)) >"$dir/$tag.log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  local deadline=$(($(date +%s) + 60))
  while kill -0 "$pid" 2>/dev/null; do
    if (($(date +%s) > deadline)); then
      kill -TERM "$pid" || true
      wait "$pid" || true
      echo "STILL RUNNING"
      return 0
    fi
    sleep 0.05 # poll interval of a condition with a deadline
  done
  wait "$pid" || rc=$?
  return $rc
}

# expect_refused TAG FILE MESSAGE-REGEX
expect_refused() {
  local tag=$1 file=$2 re=$3 rc=0
  run_node "$file" "$tag" || rc=$?
  [[ $rc -ne 0 ]] || { cat "$dir/$tag.log" >&2; fail "$tag: the node started (exit $rc)"; }
  grep -qE "$re" "$dir/$tag.log" || { cat "$dir/$tag.log" >&2; fail "$tag: no clear message /$re/"; }
  [[ ! -e $dir/db-$tag ]] || fail "$tag: RocksDB directory created before the token was checked"
  [[ ! -e $dir/admin-$tag ]] || fail "$tag: admin socket directory created before the token check"
  [[ ! -e /dev/shm/$shm ]] || fail "$tag: shared-memory segment created before the token check"
  log "ok: $tag refused (exit $rc): $(grep -oE "$re.*" "$dir/$tag.log" | head -n 1)"
}

head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/token"
for mode in 640 604 620; do
  cp "$dir/token" "$dir/token-$mode"
  chmod "$mode" "$dir/token-$mode"
  expect_refused "mode-$mode" "$dir/token-$mode" \
    "auth_token_file $dir/token-$mode: mode 0?$mode lets group/others access it; chmod 600 it"
done

chmod 600 "$dir/token"
ln -s "$dir/token" "$dir/token-link"
expect_refused symlink "$dir/token-link" "auth_token_file $dir/token-link: open: .*symbolic links"
mkdir -m 700 "$dir/token-dir"
expect_refused directory "$dir/token-dir" "auth_token_file $dir/token-dir: not a regular file"
: >"$dir/token-empty"
chmod 600 "$dir/token-empty"
expect_refused empty "$dir/token-empty" "auth_token_file $dir/token-empty: empty token"
printf '\n' >"$dir/token-newline"
chmod 600 "$dir/token-newline"
expect_refused newline-only "$dir/token-newline" "empty token"
expect_refused missing "$dir/no-such-token" "auth_token_file $dir/no-such-token: open: No such file"

# The control: the same token with mode 0600 passes the token check.
rc=0
out=$(run_node "$dir/token" good) || rc=$?
if grep -q "auth_token_file" "$dir/good.log"; then
  cat "$dir/good.log" >&2
  fail "a 0600 token file was refused"
fi
if [[ $out == "STILL RUNNING" ]]; then
  log "ok: 0600 token accepted (the node started: there is a device here)"
else
  log "ok: 0600 token accepted; the node then stopped at: $(grep -m1 'cannot start' "$dir/good.log" || tail -n 1 "$dir/good.log")"
fi
echo "security_startup: PASS"
