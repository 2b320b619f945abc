#!/usr/bin/env bash
# 100 connect/PUT/READ/disconnect cycles leave `rdma resource show qp/mr` of
# the node at its idle baseline; the dedupe records of departed clients are
# kept or dropped by how they left; SIGTERM then exits 0 within seconds.
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

# Dedupe records of departed clients. Goodbye{client close} (the raw client's)
# keeps the id's record for a resume; a kvclient's Close says Goodbye{client
# done} and its record goes; a client that vanished keeps its record. Every
# record held also travels in each live upgrade's handoff while writes wait.
recs=$(kv_stat client_records)
[[ $recs == 100 ]] || kv_fail "client_records $recs after 100 cycles with Goodbye{client close}, expected 100"
load=("$KV_KVLOAD" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --workload A --clients 4
  --threads 1 --depth 4 --keys 200) # 4 kvclients of YCSB A
"${load[@]}" --duration 1 >"$KV_DIR/closed.out" 2>&1 || { cat "$KV_DIR/closed.out"; kv_fail "kvload failed"; }
kv_wait_for 10 kv_stat_is clients 0 || kv_fail "kvload's clients did not leave"
recs=$(kv_stat client_records)
[[ $recs == 100 ]] || kv_fail "client_records $recs after 4 kvclients closed, expected 100: their records stayed"
"${load[@]}" --duration 600 >"$KV_DIR/vanish.out" 2>&1 &
pid=$!
kv_wait_for 60 kv_stat_is clients 4 || kv_fail "the second kvload did not connect"
kill -KILL "$pid"
wait "$pid" 2>/dev/null || true
kv_wait_for 30 kv_stat_is clients 0 || kv_fail "the killed kvload's sessions were not closed: $(kv_admin clients)"
recs=$(kv_stat client_records)
[[ $recs == 104 ]] || kv_fail "client_records $recs after 4 kvclients vanished, expected 104: a retry may need them"
kv_ok "client records: 100 after Goodbye{client close}, still 100 after 4 closed kvclients, 104 after 4 vanished ones"
# A connected client at SIGTERM: the node says Goodbye and still exits fast.
kv_raw --mode steady --n 5 --duration_s 60 --key_prefix last- >"$KV_DIR/steady.out" 2>&1 &
kv_wait_for 30 kv_stat_at_least clients 1 ||
  kv_fail "steady client did not connect"
kv_stop_node
echo "server_cycles: PASS"
