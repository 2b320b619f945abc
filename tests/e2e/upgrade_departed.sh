#!/usr/bin/env bash
# Departed clients' records cross a live upgrade before writes pause. Batches
# of kvload clients (KV_DEPARTED in all, default 32) write about 1100 times
# each, which fills their 1024-entry dedupe windows, and are SIGKILLed: no
# Goodbye, so the node keeps their records for a retry that may still come.
# Four other clients (YCSB A) stay connected through KV_UPGRADES (default 1)
# live upgrades. For each upgrade:
#   - the old process sent every departed record before it paused writes
#     ("records of clients without a session sent") and, at HandOver, only
#     the records of the clients in session (4);
#   - the new process holds every record (client_records);
#   - its phases are printed: o_presend (the departed records, writes
#     flowing), o_handover_prep and write_pause (writes waiting).
# Afterwards the connected clients saw no failed operation.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/upgrade_lib.sh"
kv_require_device
departed=${KV_DEPARTED:-32}
n=${KV_UPGRADES:-1}
batch=48

kv_tmpdir departed-bins
bins=$KV_TMP
up_make_builds "$bins"
KV_NODE_BIN=$bins/kvnode-a
kv_start_node "${UP_NODE_FLAGS[@]}" --max_clients $((batch + 8))
UP_FIRST_PID=$KV_PID

report="$KV_DIR/report.json"
"$KV_KVLOAD" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --workload A --clients 4 \
  --threads 1 --depth 4 --keys 2000 --value_size 64 --duration 100000 --report "$report" \
  --progress=false --connect_timeout_ms 5000 --timeout_ms 30000 >"$KV_DIR/kvload.log" 2>&1 &
load_pid=$!
kv_wait_for 60 kv_stat_is clients 4 || kv_fail "the connected kvload's 4 clients did not connect"

# --- departed clients ---------------------------------------------------------------
made=0
while ((made < departed)); do
  c=$((departed - made < batch ? departed - made : batch))
  "$KV_KVLOAD" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --workload A --clients "$c" \
    --threads "$(kv_load_threads)" --depth 4 --keys 2000 --value_size 64 --duration 100000 \
    --progress=false --timeout_ms 30000 >"$KV_DIR/departed.log" 2>&1 &
  pid=$!
  kv_wait_for 60 kv_stat_is clients $((c + 4)) || kv_fail "departing batch: $(kv_stat clients) clients"
  # Killed, not stopped (an orderly end says Goodbye and its records go),
  # once it has written about 1100 times a client.
  puts0=$(kv_stat ops_put)
  enough() { (($(kv_stat ops_put) - puts0 >= c * 1100)); }
  kv_wait_for 300 enough || kv_fail "departing batch of $c clients: too few writes"
  kill -KILL "$pid"
  wait "$pid" 2>/dev/null || true
  kv_wait_for 60 kv_stat_is clients 4 || kv_fail "the killed batch's sessions did not close"
  made=$((made + c))
done
records=$(kv_stat client_records)
((records == departed + 4)) || kv_fail "client_records $records, expected $departed departed + 4"
kv_ok "$departed departed clients' records held (full windows), 4 clients connected"

# --- upgrades ---------------------------------------------------------------------
for ((i = 1; i <= n; i++)); do
  at=$(wc -l <"$KV_LOG")
  up_upgrade kill
  kv_log "upgrade $i: phases (ms): $(up_phases)"
  log=$(tail -n +"$((at + 1))" "$KV_LOG")
  grep -q "upgrade: $departed records of clients without a session sent" <<<"$log" ||
    up_fail "upgrade $i: the departed records were not sent ahead of the pause"
  grep -q "HandOver sent (4 client records sent in the pause, $((departed + 4)) held;" <<<"$log" ||
    up_fail "upgrade $i: the pause carried more than the 4 clients in session"
  records=$(kv_stat client_records)
  ((records == departed + 4)) || up_fail "upgrade $i: the new process holds $records records"
  kv_wait_for 30 kv_stat_is clients 4 || up_fail "upgrade $i: clients on the new process: $(kv_stat clients)"
  kv_ok "upgrade $i: $departed departed records sent before the pause, 4 in it"
done

kv_stop_kvload "$load_pid" "$KV_DIR/kvload.log"
python3 - "$report" <<'PY' || kv_fail "report check"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["failed_ops"] == 0, f"failed_ops {r['failed_ops']}"
assert r["client"]["moves"] > 0, "no client moved"
print(f"kvload (4 clients): {r['ops']} ops, failed 0, longest gap {r['blackout_ms']:.1f} ms, "
      f"between writes {r['blackout_write_ms']:.1f} ms")
PY
kv_ok "the connected clients: 0 failed operations across $n upgrade(s)"
up_stop_node
