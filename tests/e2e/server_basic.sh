#!/usr/bin/env bash
# A node starts, a raw client PUTs by RPC and READs every value back from the
# arena by RDMA (through its type-2 window), retried PUTs are deduplicated,
# DELETE/GET/PING answer as specified; stats count it; SIGTERM exits 0 with no
# leaked verbs object or shm. Then the same with --memory_windows=off and a
# restart that re-attaches a kept arena.
source "$(dirname "$0")/lib.sh"
kv_require_device

kv_start_node
base_qp=$(kv_rdma_count qp)
base_mr=$(kv_rdma_count mr)
kv_log "idle baseline: $base_qp QPs, $base_mr MRs"
kv_raw --mode put_get --n 100 || kv_fail "put_get"
kv_ok "put_get"
[[ $(kv_stat ops_put) -ge 100 ]] || kv_fail "stats ops_put < 100"
[[ $(kv_stat dedupe_hits) -ge 1 ]] || kv_fail "no dedupe hit counted"
# Whole answers first (grep -q in a pipe would cut the writer off: pipefail).
mrs=$(kv_admin mrs)
[[ $mrs == *'"kind":"mr"'* ]] || kv_fail "mrs lists no MR: $mrs"
metrics=$(kv_admin metrics)
grep -q '^kvnode_ops_total{op="put"} [1-9]' <<<"$metrics" || kv_fail "metrics: $metrics"
[[ $(kv_admin bogus) == *'"ok":false'* ]] || kv_fail "unknown admin command accepted"
[[ $(kv_admin clients) == *'"clients":['* ]] || kv_fail "clients"
mem=$(kv_admin memory)
(($(kv_json_num "$mem" malloc_in_use_bytes || echo 0) > 0)) || kv_fail "memory: $mem"
kv_wait_for 10 kv_stat_is clients 0 ||
  kv_fail "clients did not return to 0"
[[ $(kv_rdma_count qp) -eq $base_qp && $(kv_rdma_count mr) -eq $base_mr ]] ||
  kv_fail "after the client left: $(kv_rdma_count qp) QPs / $(kv_rdma_count mr) MRs vs baseline"
kv_stop_node

# Without windows: the arena MR's rkey.
kv_start_node --memory_windows=off
kv_raw --mode put_get --n 50 || kv_fail "put_get without windows"
kv_ok "put_get with --memory_windows=off"
kv_stop_node

# --keep_arena: the segment survives a clean stop and is re-attached.
kv_start_node --keep_arena
kv_raw --mode put_get --n 20 || kv_fail "put_get (keep_arena)"
kv_stop_node keep
[[ -e /dev/shm/$KV_SHM ]] || kv_fail "--keep_arena: segment removed"
prev_dir=$KV_DIR prev_shm=$KV_SHM
KV_DIR=$prev_dir
"$KV_NODE_BIN" --listen 127.0.0.1:0 --db_path "$prev_dir/db" --shm_name "$prev_shm" \
  --admin_socket "$prev_dir/admin/admin.sock" --auth_token_file "$prev_dir/token" \
  --arena_size $((32 << 20)) --sync_writes=false >"$prev_dir/kvnode2.log" 2>&1 &
KV_PID=$! KV_ADMIN="$prev_dir/admin/admin.sock" KV_LOG="$prev_dir/kvnode2.log" KV_SHM=$prev_shm
kv_wait_for 60 kv_admin ping || kv_fail "restart did not come up"
grep -q "reattached" "$KV_LOG" || kv_fail "kept arena was not re-attached: $(grep 'store ' "$KV_LOG")"
kv_ok "kept arena re-attached: $(grep -o 'store .*' "$KV_LOG" | head -1)"
kv_stop_node
echo "server_basic: PASS"
