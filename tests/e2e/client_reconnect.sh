#!/usr/bin/env bash
# Sessions survive a node restart: kvload --verify runs while the node is
# stopped (SIGTERM: Goodbye, control connections close) and started again on
# the same port and RocksDB. The clients reconnect with their client ids and
# retry what was in flight inside each operation's deadline: zero failed
# operations, zero verify errors, and the ack-log audit passes afterwards.
source "$(dirname "$0")/lib.sh"
kv_require_device

kv_start_node
port=${KV_ADDR##*:}
dir=$KV_DIR
acks="$dir/acks.log"
report="$dir/report.json"
"$KV_KVLOAD" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --workload A --clients 4 \
  --threads 1 --depth 4 --keys 500 --preload --duration "${KV_RECONNECT_DURATION:-10}" --verify \
  --timeout_ms 120000 --ack_log "$acks" --report "$report" >"$dir/kvload.out" 2>&1 &
load_pid=$!
# Wait until the measured run has completed some operations.
progressed() { grep -qE '^\[ +[0-9]+s\] +[1-9]' "$dir/kvload.out"; }
kv_wait_for 120 progressed || { cat "$dir/kvload.out"; kv_fail "kvload made no progress"; }
kv_log "kvload running; stopping the node"
kv_stop_node
KV_SHM="kvnode-e2e-$$-$RANDOM-r"
KV_ADMIN="$dir/admin2/admin.sock"
KV_LOG="$dir/kvnode-restart.log"
"$KV_NODE_BIN" --listen "127.0.0.1:$port" --db_path "$dir/db" --shm_name "$KV_SHM" \
  --admin_socket "$KV_ADMIN" --auth_token_file "$KV_TOKEN" --arena_size $((64 << 20)) \
  --sync_writes=false >"$KV_LOG" 2>&1 &
KV_PID=$!
kv_wait_for 120 kv_admin ping || kv_fail "restarted node did not answer ping"
kv_log "node restarted (pid $KV_PID); waiting for kvload"
rc=0
wait "$load_pid" || rc=$?
cat "$dir/kvload.out"
[[ $rc -eq 0 ]] || kv_fail "kvload exited $rc across the restart"
python3 - "$report" <<'PY' || kv_fail "report check"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["failed_ops"] == 0 and r["verify_errors"] == 0, r
assert r["client"]["reconnects"] >= 4, f"expected every client to reconnect: {r['client']}"
print(f"reconnects {r['client']['reconnects']}, resends {r['client']['rpc_resends']}, "
      f"blackout {r.get('blackout_ms')} ms, ops {r['ops']}")
PY
# The clients resumed their ids with their resume secrets (persisted with
# their dedupe records and reloaded at the restart): none got a fresh id.
refused=$(kv_stat errors.resume_refused)
[[ $refused == 0 ]] || kv_fail "errors.resume_refused=$refused: clients lost their ids"
"$KV_KVLOAD" --audit "$acks" --server "127.0.0.1:$port" --auth_token_file "$KV_TOKEN" ||
  kv_fail "audit after the restart failed"
kv_ok "clients reconnected across a node restart with zero failed operations"
kv_stop_node
echo "client_reconnect: PASS"
