#!/usr/bin/env bash
# libkvclient + kvload against the real node: 8 clients, YCSB A, --verify for
# KV_VERIFY_DURATION seconds (default 20): zero failed operations, zero
# verification errors, GETs served by RDMA READ; after the clients leave, the
# node's QPs/MRs are back at its idle baseline. Then a clean restart on the
# same RocksDB with a new shared-memory segment (a cold rebuild of the arena)
# and `kvload --audit` of the ack log: every acknowledged write is readable
# at its acknowledged version or newer.
source "$(dirname "$0")/lib.sh"
kv_require_device
# A number from `kvctl --json stats` by dotted path (arena.keys).
node_stat() {
  "$KV_KVCTL" --admin_socket "$KV_ADMIN" --json stats | python3 -c '
import json, sys
v = json.load(sys.stdin)
for k in sys.argv[1].split("."):
    v = v[k]
print(v)' "$1"
}
dur=${KV_VERIFY_DURATION:-20}
keys=${KV_VERIFY_KEYS:-5000}

kv_start_node
base_qp=$(kv_rdma_count qp)
base_mr=$(kv_rdma_count mr)
kv_log "idle baseline: $base_qp QPs, $base_mr MRs; kvload for ${dur}s"
acks="$KV_DIR/acks.log"
report="$KV_DIR/report.json"
rc=0
"$KV_KVLOAD" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --workload A --clients 8 \
  --threads 2 --depth 4 --keys "$keys" --value_size 64 --preload --duration "$dur" --verify \
  --ack_log "$acks" --report "$report" || rc=$?
[[ $rc -eq 0 ]] || kv_fail "kvload exited $rc"
python3 - "$report" <<'PY' || kv_fail "report check"
import json, sys
r = json.load(open(sys.argv[1]))
for k in ("ops", "reads", "writes", "failed_ops", "verify_errors", "stale_reads", "duration_s",
          "ops_per_s", "latency_us", "timeline"):
    assert k in r, f"report lacks {k}"
for k in ("p50", "p99", "p999", "max"):
    assert k in r["latency_us"], f"latency_us lacks {k}"
assert r["failed_ops"] == 0, f"failed_ops {r['failed_ops']}"
assert r["verify_errors"] == 0, f"verify_errors {r['verify_errors']}"
assert r["stale_reads"] == 0, f"stale_reads {r['stale_reads']}"
assert r["reads"] > 0 and r["writes"] > 0, "no reads or no writes"
c = r["client"]
assert c["gets_by_read"] > 0, "no GET served by RDMA READ"
print(f"report: {r['ops']} ops ({r['reads']} reads, {r['writes']} writes) in {r['duration_s']:.1f}s, "
      f"{c['gets_by_read']} GETs by READ, {c['gets_by_rpc']} by RPC, failed 0, verify errors 0")
PY
kv_ok "kvload --verify: zero failed ops, zero verify errors"

clients_gone() { [[ $(node_stat clients) -eq 0 ]]; }
kv_wait_for 10 clients_gone ||
  kv_fail "clients did not return to 0"
[[ $(kv_rdma_count qp) -eq $base_qp && $(kv_rdma_count mr) -eq $base_mr ]] ||
  kv_fail "after kvload: $(kv_rdma_count qp) QPs / $(kv_rdma_count mr) MRs vs baseline $base_qp/$base_mr"
kv_ok "node back at its idle baseline ($base_qp QPs, $base_mr MRs)"
kv_stop_node

# Clean restart on the same RocksDB, new segment: the arena is rebuilt cold.
[[ -n ${KV_E2E_TRACE:-} ]] && set -x
dir=$KV_DIR
KV_SHM="kvnode-e2e-$$-$RANDOM-b"
KV_ADMIN="$dir/admin2/admin.sock"
KV_LOG="$dir/kvnode-restart.log"
"$KV_NODE_BIN" --listen 127.0.0.1:0 --db_path "$dir/db" --shm_name "$KV_SHM" \
  --admin_socket "$KV_ADMIN" --auth_token_file "$KV_TOKEN" --arena_size $((64 << 20)) \
  --sync_writes=false >"$KV_LOG" 2>&1 &
KV_PID=$!
kv_wait_for 60 kv_admin ping || kv_fail "restarted node did not answer ping"
KV_ADDR=$(kv_admin ping | python3 -c 'import json,sys; print(json.load(sys.stdin)["listen"])')
rebuilt=$(node_stat arena.keys)
[[ $rebuilt -ge 1 ]] || kv_fail "restarted node has no keys in its arena"
kv_log "restarted pid $KV_PID on $KV_ADDR: $rebuilt keys rebuilt from RocksDB"
rc=0
"$KV_KVLOAD" --audit "$acks" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" \
  --report "$dir/audit.json" || rc=$?
[[ $rc -eq 0 ]] || kv_fail "audit of the ack log failed (exit $rc)"
kv_ok "audit of the ack log passed after a cold restart"
kv_stop_node
echo "client_verify: PASS"
