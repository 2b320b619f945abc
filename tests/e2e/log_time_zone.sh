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
source "$(dirname "$0")/lib.sh"

kv_tmpdir "$KV_TEST"
dir=$KV_TMP
if ! command -v strace >/dev/null || ! strace -o /dev/null true 2>/dev/null; then
  kv_log "SKIP: strace is missing or cannot trace here"
  exit 77
fi
mkdir -m 0755 "$dir/open"
KV_LOG=$dir/node.log # kv_fail shows it
rc=0
env -u TZ strace -f -e trace=%file -o "$dir/trace" "$KV_NODE_BIN" --listen 127.0.0.1:0 \
  --db_path "$dir/db" --shm_name "kvnode-$KV_TEST-$$" --admin_socket "$dir/open/admin.sock" \
  >"$KV_LOG" 2>&1 || rc=$?
((rc != 0)) || kv_fail "the node started with an admin socket directory of mode 0755"
logged=$(grep -c '^[IWE][0-9]' "$KV_LOG" || true)
((logged >= 2)) || kv_fail "expected at least 2 log lines, got $logged"
stats=$(grep -c 'stat[^(]*(AT_FDCWD, "/etc/localtime"\|stat("/etc/localtime"' "$dir/trace" || true)
((stats == 0)) || kv_fail "$logged log lines stat()ed /etc/localtime $stats times: $(grep localtime "$dir/trace")"
kv_ok "$logged log lines, /etc/localtime read once and never stat()ed by path"
