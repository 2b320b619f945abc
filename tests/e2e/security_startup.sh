#!/usr/bin/env bash
# Security, start-up checks that need no device (label unit, runs on the host;
# also e2e_security_startup, label e2e, in the guest):
# the auth token file, the directory of an explicit --admin_socket (must
# be the node user's own, mode 0700: group/world access, another owner or a
# symlink refused), and the --db_path directory (the node's own, writable by
# nobody else: another owner, group/world write, a symlink refused, naming
# the directory and its owner or mode). A token file that group or others
# can read (or write), a symlink, a directory, an empty file: the node
# refuses to start with a message that names the file and what is wrong,
# exits non-zero before it touches the network, the device or the database
# (no RocksDB directory, no admin socket, no shared-memory segment is
# created). A 0600 file passes the
# token stage (the node then fails later only for want of a device on a host
# without one, or starts where there is one). A wildcard --listen without
# --advertise_address is refused the same way (a live upgrade would send
# remote clients to their own host).
# Where there is a verbs device (the guest): symbolic links planted under the
# write journal's names in the node's own database directory are never
# written through (the file they point at keeps its bytes).
set -euo pipefail
KV_BUILD=${KVNODE_BUILD_DIR:?KVNODE_BUILD_DIR must point at the build directory}
NODE=${KV_NODE_BIN:-$KV_BUILD/node/kvnode}
TEST=security_startup
# The refusals need no device and run on the host (security_startup, label
# unit); in the guest (e2e_security_startup, KV_STARTUP_DEVICE_ONLY=1) only
# the runs that start a node: each node process costs seconds under TCG.
device_only=${KV_STARTUP_DEVICE_ONLY:-0}
# kv_active_device
source "$(dirname "${BASH_SOURCE[0]}")/../../deploy/lib.sh"
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
# (the node must exit by itself within 60 s). Where there is a device a node
# that passed the checks starts: then it is stopped with SIGTERM as soon as
# it logs that it listens, and "STARTED" is printed.
run_node() {
  local token=$1 tag=$2 rc=0
  "$NODE" --listen "${LISTEN:-127.0.0.1:0}" --db_path "${DB_PATH:-$dir/db-$tag}" --shm_name "$shm" \
    --admin_socket "${ADMIN_SOCKET:-$dir/admin-$tag/admin.sock}" --auth_token_file "$token" \
    --arena_size $((8 << 20)) ${ADVERTISE:+--advertise_address="$ADVERTISE"} >"$dir/$tag.log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  local deadline=$(($(date +%s) + 60))
  while kill -0 "$pid" 2>/dev/null; do
    if grep -qs ') listening on ' "$dir/$tag.log" || (($(date +%s) > deadline)); then
      kill -TERM "$pid" || true
      wait "$pid" || true
      echo "STARTED"
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
  ((!device_only)) || return 0
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

# --- an explicit --admin_socket whose directory is not the node's own 0700 one:
# refused after the token check, before the device and the database; the
# directory is left as it was and no socket is created in it.
# expect_admin_refused TAG DIR MESSAGE-REGEX
expect_admin_refused() {
  local tag=$1 adir=$2 re=$3 rc=0 before
  ((!device_only)) || return 0
  before=$(stat -c '%a %u' "$adir")
  ADMIN_SOCKET="$adir/admin.sock" run_node "$dir/token" "$tag" || rc=$?
  [[ $rc -ne 0 ]] || { cat "$dir/$tag.log" >&2; fail "$tag: the node started (exit $rc)"; }
  grep -qE "$re" "$dir/$tag.log" || { cat "$dir/$tag.log" >&2; fail "$tag: no clear message /$re/"; }
  [[ ! -e $adir/admin.sock ]] || fail "$tag: a socket was created in $adir"
  [[ $(stat -c '%a %u' "$adir") == "$before" ]] || fail "$tag: $adir changed"
  [[ ! -e $dir/db-$tag ]] || fail "$tag: RocksDB directory created before the admin dir check"
  [[ ! -e /dev/shm/$shm ]] || fail "$tag: shared-memory segment created before the admin dir check"
  log "ok: $tag refused (exit $rc): $(grep -oE "admin_socket .*" "$dir/$tag.log" | head -n 1)"
}
mkdir -m 700 "$dir/adm-ok"
mkdir "$dir/adm-777" && chmod 777 "$dir/adm-777"
expect_admin_refused admin-777 "$dir/adm-777" \
  "admin_socket $dir/adm-777/admin.sock: directory $dir/adm-777 has mode 0777: group/others"
mkdir "$dir/adm-1777" && chmod 1777 "$dir/adm-1777" # like /tmp
expect_admin_refused admin-1777 "$dir/adm-1777" "directory $dir/adm-1777 has mode 1777"
mkdir "$dir/adm-770" && chmod 770 "$dir/adm-770"
expect_admin_refused admin-770 "$dir/adm-770" "directory $dir/adm-770 has mode 0770"
ln -s "$dir/adm-ok" "$dir/adm-link"
expect_admin_refused admin-symlink "$dir/adm-link" "directory $dir/adm-link is a symbolic link"
if [[ $(id -u) -eq 0 ]]; then
  mkdir -m 700 "$dir/adm-other"
  chown 65534:65534 "$dir/adm-other"
  expect_admin_refused admin-other-owner "$dir/adm-other" \
    "directory $dir/adm-other is owned by uid 65534, not by this node's uid 0"
else
  log "skip: admin-other-owner needs root (to give the directory to uid 65534)"
fi

# --- a --db_path directory that is not the node's own or that others can
# write (they could plant links under the names the node creates there):
# refused after the token check, before the admin socket, the device and the
# arena, naming the directory and its owner or mode; the directory is left as
# it was, with nothing created in it.
# expect_db_refused TAG DIR MESSAGE-REGEX
expect_db_refused() {
  local tag=$1 ddir=$2 re=$3 rc=0 before
  ((!device_only)) || return 0
  before=$(stat -c '%a %u' "$ddir")
  DB_PATH=$ddir run_node "$dir/token" "$tag" || rc=$?
  [[ $rc -ne 0 ]] || { cat "$dir/$tag.log" >&2; fail "$tag: the node started (exit $rc)"; }
  grep -qE "$re" "$dir/$tag.log" || { cat "$dir/$tag.log" >&2; fail "$tag: no clear message /$re/"; }
  [[ $(stat -c '%a %u' "$ddir") == "$before" ]] || fail "$tag: $ddir changed"
  [[ -z $(ls -A "$ddir") ]] || fail "$tag: files were created in $ddir: $(ls -A "$ddir")"
  [[ ! -e $dir/admin-$tag ]] || fail "$tag: admin socket directory created before the db dir check"
  [[ ! -e /dev/shm/$shm ]] || fail "$tag: shared-memory segment created before the db dir check"
  log "ok: $tag refused (exit $rc): $(grep -oE "db_path .*" "$dir/$tag.log" | head -n 1)"
}
mkdir "$dir/db-777" && chmod 777 "$dir/db-777"
expect_db_refused db-777 "$dir/db-777" \
  "db_path $dir/db-777: directory $dir/db-777 has mode 0777: group/others can write it"
mkdir "$dir/db-1777" && chmod 1777 "$dir/db-1777" # like /tmp
expect_db_refused db-1777 "$dir/db-1777" "directory $dir/db-1777 has mode 1777"
mkdir "$dir/db-775" && chmod 775 "$dir/db-775"
expect_db_refused db-775 "$dir/db-775" "directory $dir/db-775 has mode 0775"
mkdir -m 700 "$dir/db-own"
ln -s "$dir/db-own" "$dir/db-link"
expect_db_refused db-symlink "$dir/db-link" "directory $dir/db-link is a symbolic link"
if [[ $(id -u) -eq 0 ]]; then
  mkdir -m 700 "$dir/db-other"
  chown 65534:65534 "$dir/db-other"
  expect_db_refused db-other-owner "$dir/db-other" \
    "db_path $dir/db-other: directory $dir/db-other is owned by uid 65534, not by this node's uid 0"
else
  log "skip: db-other-owner needs root (to give the directory to uid 65534)"
fi
# Others may read it (the node's files in it are 0600): a 0755 one of the
# node's own passes. Where there is a device the node starts (the store opens
# after the device), and symbolic links planted under the spare journal's
# names (the temporary one is written at every start) are replaced by a
# regular file, never written through.
mkdir -m 755 "$dir/db-755"
dev=$(kv_active_device) || dev=""
victim=$dir/victim
echo "a file the node's user can write, not the node's" >"$victim"
sum=$(md5sum <"$victim")
spare=$dir/db-755/kvnode-writes.journal.spare
if [[ -n $dev ]]; then
  ln -s "$victim" "$spare.tmp"
  ln -s "$victim" "$spare"
fi
out=$(DB_PATH=$dir/db-755 run_node "$dir/token" db-755) || true
grep -q "db_path" "$dir/db-755.log" && { cat "$dir/db-755.log" >&2; fail "a 0755 db dir of the node's own was refused"; }
log "ok: a 0755 database directory of the node's own passes the check"
if [[ -n $dev ]]; then
  [[ $out == STARTED ]] || { cat "$dir/db-755.log" >&2; fail "links: the node did not start"; }
  [[ $(md5sum <"$victim") == "$sum" ]] || fail "links: the file behind a link was written ($(stat -c %s "$victim") bytes)"
  [[ -f $spare && ! -L $spare ]] || fail "links: the spare journal is not a regular file: $(ls -l "$dir/db-755")"
  [[ ! -e $spare.tmp ]] || fail "links: the spare's temporary name is left"
  log "ok: links at the spare journal's names on $dev: replaced by a regular file, their target unchanged"
fi

# --- a wildcard --listen without --advertise_address: a live upgrade would
# send every remote client to 0.0.0.0 (its own host). Refused at start with a
# message naming the flag, before the database, the admin socket and the arena.
LISTEN=0.0.0.0:7000 expect_refused wildcard-v4 "$dir/token" \
  "advertise_address: required when --listen 0.0.0.0:7000 is a wildcard address"
LISTEN='[::]:0' expect_refused wildcard-v6 "$dir/token" \
  "advertise_address: required when --listen .::.:0 is a wildcard address"
LISTEN=0.0.0.0:0 ADVERTISE=0.0.0.0 expect_refused wildcard-advertised "$dir/token" \
  "advertise_address: 0.0.0.0 is a wildcard address"
# The control passes every check: the same token with mode 0600, the same
# wildcard listen address with an advertise address, missing admin socket
# and database directories.
rc=0
out=$(LISTEN=0.0.0.0:0 ADVERTISE=127.0.0.1 run_node "$dir/token" good) || rc=$?
if grep -q "auth_token_file" "$dir/good.log"; then
  cat "$dir/good.log" >&2
  fail "a 0600 token file was refused"
fi
if grep -q "advertise_address" "$dir/good.log"; then
  cat "$dir/good.log" >&2
  fail "--listen 0.0.0.0:0 --advertise_address=127.0.0.1 was refused"
fi
log "ok: --listen 0.0.0.0:0 with --advertise_address=127.0.0.1 passes the check"
grep -q "admin_socket" "$dir/good.log" && { cat "$dir/good.log" >&2; fail "a missing admin dir was refused"; }
if [[ $out == "STARTED" ]]; then
  [[ $(stat -c '%a' "$dir/db-good") == 700 ]] || fail "the missing db dir was created $(stat -c '%a' "$dir/db-good")"
  log "ok: a missing database directory was created 0700"
fi
if [[ -e $dir/admin-good ]]; then
  [[ $(stat -c '%a' "$dir/admin-good") == 700 ]] || fail "the missing admin dir was created $(stat -c '%a' "$dir/admin-good")"
  log "ok: a missing admin socket directory was created 0700"
fi
if [[ $out == "STARTED" ]]; then
  log "ok: 0600 token accepted (the node started: there is a device here)"
else
  log "ok: 0600 token accepted; the node then stopped at: $(grep -m1 'cannot start' "$dir/good.log" || tail -n 1 "$dir/good.log")"
fi

# --- a symbolic link under the write journal's own name, in the node's own
# database directory: the journal is read at every start; the start is
# refused, naming it, and the file it points at is left alone. Needs a
# device: the store opens after it.
if [[ -n $dev ]]; then
  db=$dir/db-journal-link
  mkdir -m 700 "$db"
  ln -s "$victim" "$db/kvnode-writes.journal"
  rc=0
  out=$(DB_PATH=$db run_node "$dir/token" journal-link) || rc=$?
  [[ $out != STARTED && $rc -ne 0 ]] || { cat "$dir/journal-link.log" >&2; fail "journal-link: the node started"; }
  re="$db/kvnode-writes.journal is a symbolic link"
  grep -qF "$re" "$dir/journal-link.log" || { cat "$dir/journal-link.log" >&2; fail "journal-link: no message '$re'"; }
  [[ $(md5sum <"$victim") == "$sum" && -L $db/kvnode-writes.journal ]] || fail "journal-link: the link or its target changed"
  log "ok: journal-link refused (exit $rc): $(grep -oF "$re" "$dir/journal-link.log" | head -n 1)"
else
  log "skip: the journal's names (needs a verbs device: run e2e_security_startup in deploy/vm/rxe-vm)"
fi
echo "security_startup: PASS"
