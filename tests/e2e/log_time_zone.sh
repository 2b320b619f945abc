#!/usr/bin/env bash
# No log line of the node reads /etc/localtime (label unit, runs on the host).
# With TZ unset, glibc's mktime(), which glog calls per line, stats the zone
# file under glibc's process-wide time-zone lock, so a slow file system
# stalls every thread that logs (docs/upgrade.md, "The GET gap at a Move was
# glibc's time-zone lock"); kvnode and kvload pin TZ at start
# (base/time_zone.h). The node is started, with TZ unset, where it logs a
# warning and then refuses an admin socket directory that others can enter,
# under strace: the zone file may be read once, at start, and never stat()ed
# by path after. Skipped (77) where strace cannot trace.
set -euo pipefail
KV_BUILD=${KVNODE_BUILD_DIR:?KVNODE_BUILD_DIR must point at the build directory}
NODE=${KV_NODE_BIN:-$KV_BUILD/node/kvnode}
TEST=log_time_zone
log() { echo "[$TEST $(date +%H:%M:%S)] $*" >&2; }
fail() {
  log "FAIL: $*"
  exit 1
}

dir=$(mktemp -d "/tmp/kv-$TEST.XXXXXX")
trap 'rm -rf "$dir"' EXIT
if ! command -v strace >/dev/null || ! strace -o /dev/null true 2>/dev/null; then
  log "SKIP: strace is missing or cannot trace here"
  exit 77
fi
mkdir -m 0755 "$dir/open"
rc=0
env -u TZ strace -f -e trace=%file -o "$dir/trace" "$NODE" --listen 127.0.0.1:0 \
  --db_path "$dir/db" --shm_name "kvnode-$TEST-$$" --admin_socket "$dir/open/admin.sock" \
  >"$dir/node.log" 2>&1 || rc=$?
((rc != 0)) || fail "the node started with an admin socket directory of mode 0755"
lines=$(grep -c '^[IWE][0-9]' "$dir/node.log" || true)
((lines >= 2)) || fail "expected at least 2 log lines, got $lines: $(cat "$dir/node.log")"
stats=$(grep -c 'stat[^(]*(AT_FDCWD, "/etc/localtime"\|stat("/etc/localtime"' "$dir/trace" || true)
((stats == 0)) || fail "$lines log lines stat()ed /etc/localtime $stats times: $(grep localtime "$dir/trace")"
log "ok: $lines log lines, /etc/localtime read once and never stat()ed by path"
