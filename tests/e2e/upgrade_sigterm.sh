#!/usr/bin/env bash
# SIGTERM to the new process N during its journal phase (docs/upgrade.md
# section 2.1): after Owned, before N has RocksDB. The old process O is held
# in its RocksDB close (--upgrade_fault=o_close_db:hang), so N journals every
# write and waits for a Released that does not come. Then SIGTERM to N:
#   - N stops its wait, kills the hung O (whose lock would keep RocksDB from
#     the next start), leaves the write journal and exits 0 (logged);
#   - the node is started again on the same RocksDB (what systemd would do):
#     the start replays the journal, at least every write N had journaled
#     when it was signalled;
#   - kvload (2 clients, --verify, op deadline 90 s: it outwaits the stop and
#     the restart) ends without a failed op, verify error or stale read, and
#     the ack-log audit on the restarted node finds every acknowledged write.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/upgrade_lib.sh"
kv_require_device

kv_start_node "${UP_NODE_FLAGS[@]}" --upgrade_fault=o_close_db:hang \
  --upgrade_old_exit_deadline_ms=60000
o_pid=$KV_PID
acks="$KV_DIR/acks.log"
report="$KV_DIR/report.json"
"$KV_KVLOAD" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --workload A --clients 2 \
  --threads 1 --depth 4 --keys 500 --value_size 64 --preload --duration 100000 --verify \
  --ack_log "$acks" --report "$report" --progress=false --connect_timeout_ms 5000 \
  --timeout_ms 90000 >"$KV_DIR/kvload.log" 2>&1 &
load_pid=$!
kv_wait_for 120 kv_stat_is clients 2 || kv_fail "clients did not connect"

kill -USR2 "$o_pid"
a=$(kv_admin_until 90 ping '"generation":2,') || kv_fail "generation 2 did not answer within 90 s"
n_pid=$(kv_json_num "$a" pid)
o_hung() { grep -q 'injected hang at o_close_db' "$KV_LOG"; }
kv_wait_for 60 o_hung || up_fail "O (pid $o_pid) did not reach o_close_db"
# Writes that only N's journal holds: what the restart must replay.
kv_wait_for 60 kv_stat_at_least journaled_writes 50 || up_fail "N journaled fewer than 50 writes"
journaled=$(kv_stat journaled_writes)
[[ -e $KV_DIR/db/kvnode-writes.journal ]] || kv_fail "no write journal while N journals"
kv_log "N (pid $n_pid) journaled $journaled writes, O (pid $o_pid) hangs in its close: SIGTERM to N"

kill -TERM "$n_pid"
kv_wait_for 60 up_gone "$n_pid" || up_fail "N (pid $n_pid) still alive 60 s after SIGTERM"
kv_wait_for 5 up_exit_logged "$n_pid" || up_fail "N (pid $n_pid) did not log exit 0 after SIGTERM"
kv_wait_for 15 up_gone "$o_pid" || up_fail "the hung O (pid $o_pid) outlived N"
wait "$o_pid" 2>/dev/null || true # killed on purpose: its status says so
[[ -e $KV_DIR/db/kvnode-writes.journal ]] || kv_fail "N removed its write journal unreplayed"
kv_ok "N stopped by SIGTERM in its journal phase: exit 0, O gone, the journal left"

# The restart: the same RocksDB, port and admin socket.
log_lines=$(wc -l <"$KV_LOG")
"$KV_NODE_BIN" --listen "$KV_ADDR" --db_path "$KV_DIR/db" --shm_name "$KV_SHM" \
  --admin_socket "$KV_ADMIN" --auth_token_file "$KV_TOKEN" --pid_file "$KV_DIR/pid" \
  --arena_size $((32 << 20)) --sync_writes=false --max_clients 16 "${UP_NODE_FLAGS[@]}" \
  >>"$KV_LOG" 2>&1 &
KV_PID=$!
kv_wait_for 60 kv_admin ping || kv_fail "the restarted node did not answer"
replayed=$(tail -n +$((log_lines + 1)) "$KV_LOG" |
  grep -o 'replayed [0-9]* journaled writes' | grep -o '[0-9][0-9]*' | head -n 1 || true)
((${replayed:-0} >= journaled)) ||
  kv_fail "the restart replayed ${replayed:-0} journaled writes, N had journaled $journaled"
[[ ! -e $KV_DIR/db/kvnode-writes.journal ]] || kv_fail "the journal outlived its replay"
kv_ok "restart replayed $replayed journaled writes (N had journaled $journaled when signalled)"

kv_wait_for 90 kv_stat_is clients 2 || kv_fail "clients did not reconnect to the restarted node"
kv_stop_kvload "$load_pid" "$KV_DIR/kvload.log"
read -r failed verr stale < <(python3 -c '
import json, sys
r = json.load(open(sys.argv[1])); print(r["failed_ops"], r["verify_errors"], r["stale_reads"])' \
  "$report")
[[ $failed == 0 && $verr == 0 && $stale == 0 ]] ||
  kv_fail "kvload: $failed failed ops, $verr verify errors, $stale stale reads"
"$KV_KVLOAD" --audit "$acks" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" \
  --report "$KV_DIR/audit.json" >"$KV_DIR/audit.log" 2>&1 ||
  { tail -5 "$KV_DIR/audit.log" >&2; kv_fail "ack-log audit failed: an acknowledged write is lost"; }
kv_ok "kvload: no failed op, verify error or stale read; the audit finds every acknowledged write"
kv_stop_node
echo "upgrade_sigterm: PASS"
