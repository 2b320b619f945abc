#!/usr/bin/env bash
# --metrics_listen refusals at start (label unit, runs on the host: the
# metrics socket is bound before the device is opened). A port another
# process listens on stops the start, naming the flag, the address and
# the reason, before the node creates its admin socket or database; so
# does an address that is no host:port. The same node flags with the
# port free get past the socket stage (on a host without a device the
# start then fails at the device, not at the metrics address).
source "$(dirname "$0")/lib.sh"

kv_tmpdir "$KV_TEST"
dir=$KV_TMP
chmod 700 "$dir"
holder=""
trap 'rc=$?; [[ -n $holder ]] && kill "$holder" 2>/dev/null; kv_cleanup "$rc"' EXIT
KV_LOG=$dir/node.log # kv_fail shows it

# A listener on a free port, held until stdin closes (the kernel picks it).
coproc HOLD { python3 -c '
import socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(4)
print(s.getsockname()[1], flush=True); sys.stdin.read()'; }
holder=$HOLD_PID
read -r -t 30 port <&"${HOLD[0]}" || kv_fail "the port holder did not start"

run_node() { # METRICS_LISTEN TAG -> the node's exit status in RC
  RC=0
  KV_LOG=$dir/$2.log
  "$KV_NODE_BIN" --listen 127.0.0.1:0 --db_path "$dir/db-$2" --shm_name "kvnode-$KV_TEST-$$" \
    --admin_socket "$dir/admin-$2/admin.sock" --metrics_listen "$1" >"$KV_LOG" 2>&1 || RC=$?
}

run_node "127.0.0.1:$port" taken
((RC != 0)) || kv_fail "the node started on a metrics port another process listens on"
want="--metrics_listen 127.0.0.1:$port: bind: Address already in use"
grep -qF -- "$want" "$KV_LOG" || kv_fail "no '$want' in the log"
[[ ! -e $dir/admin-taken/admin.sock && ! -e $dir/db-taken ]] ||
  kv_fail "the refused start left an admin socket or a database behind"
kv_ok "port in use: exit $RC, $(grep -F -- "$want" "$KV_LOG" | sed 's/^.*cannot start: //')"

run_node "127.0.0.1" noport
((RC != 0)) || kv_fail "the node started with --metrics_listen 127.0.0.1"
grep -q -- "--metrics_listen.*expected host:port" "$KV_LOG" || kv_fail "bad address not named"
kv_ok "no port: exit $RC, $(grep -- '--metrics_listen' "$KV_LOG" | sed 's/^.*cannot start: //')"

# Control: the port free (the holder gone), the metrics stage passes.
exec {HOLD[1]}>&-
wait "$holder" || true
holder=""
# Where there is a device the node starts: stopped once it listens.
KV_LOG=$dir/free.log
"$KV_NODE_BIN" --listen 127.0.0.1:0 --db_path "$dir/db-free" --shm_name "kvnode-$KV_TEST-$$" \
  --admin_socket "$dir/admin-free/admin.sock" --metrics_listen "127.0.0.1:$port" >"$KV_LOG" 2>&1 &
node=$!
started() { grep -q ') listening on ' "$KV_LOG"; }
kv_wait_for 60 eval '! kill -0 $node || started' || kv_fail "the node neither started nor exited"
started && kill -TERM "$node"
RC=0
wait "$node" || RC=$?
if grep -q -- "--metrics_listen" "$KV_LOG"; then
  kv_fail "the free port was refused: $(grep -- '--metrics_listen' "$KV_LOG")"
fi
kv_ok "port free: past the metrics socket (exit $RC: $(grep -a 'cannot start\|listening on' "$KV_LOG" | head -n 1 | cut -c1-160))"
echo "metrics_http_startup: PASS"
