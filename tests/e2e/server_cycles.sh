#!/usr/bin/env bash
# 100 connect/PUT/READ/disconnect cycles leave `rdma resource show qp/mr` of
# the node at its idle baseline; SIGTERM then exits 0 within seconds.
source "$(dirname "$0")/lib.sh"
kv_require_device

kv_start_node
base_qp=$(kv_rdma_count qp)
base_mr=$(kv_rdma_count mr)
kv_log "idle baseline: $base_qp QPs, $base_mr MRs"
kv_raw --mode cycles --n 100 || kv_fail "cycles"
kv_wait_for 20 kv_qp_count_is "$base_qp" ||
  kv_fail "QPs after 100 cycles: $(kv_rdma_count qp), baseline $base_qp"
[[ $(kv_rdma_count mr) -eq $base_mr ]] || kv_fail "MRs after 100 cycles: $(kv_rdma_count mr), baseline $base_mr"
[[ $(kv_stat sessions_accepted) -ge 100 ]] || kv_fail "sessions_accepted < 100"
kv_ok "100 cycles: QPs $base_qp -> $(kv_rdma_count qp), MRs $base_mr -> $(kv_rdma_count mr)"
# A connected client at SIGTERM: the node says Goodbye and still exits fast.
kv_raw --mode steady --n 5 --duration_s 60 --key_prefix last- >"$KV_DIR/steady.out" 2>&1 &
kv_wait_for 30 kv_stat_at_least clients 1 ||
  kv_fail "steady client did not connect"
kv_stop_node
echo "server_cycles: PASS"
