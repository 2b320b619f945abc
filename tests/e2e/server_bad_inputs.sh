#!/usr/bin/env bash
# Each bad input a client can send (docs/security.md) gets its error (or a
# closed session) while a well-behaved client keeps working without a single
# failure; the node keeps serving, counts every error by kind, and is back at
# its idle verbs baseline afterwards.
source "$(dirname "$0")/lib.sh"
kv_require_device

# --max_clients 4: kvload (2) and the raw client (1) leave one slot for the
# bad clients, so too_many is refused at its second session.
kv_start_node --handshake_timeout_ms=5000 --max_clients 4
base_qp=$(kv_rdma_count qp)
base_mr=$(kv_rdma_count mr)

# The well-behaved clients: kvload --verify (when built) and a raw client.
load=""
if [[ -x $KV_KVLOAD ]]; then
  "$KV_KVLOAD" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --workload A --clients 2 \
    --threads 1 --depth 4 --keys 2000 --value_size 64 --preload --duration 30 --verify \
    --report "$KV_DIR/load.json" >"$KV_DIR/load.out" 2>&1 &
  load=$!
fi
kv_raw --mode steady --n 10 --duration_s 30 --key_prefix steady- >"$KV_DIR/steady.out" 2>&1 &
steady=$!
kv_wait_for 60 kv_stat_at_least clients 1 || kv_fail "well-behaved clients did not connect"

for mode in bad_auth bad_version garbage oversize_frame truncated unexpected too_many no_handshake \
  rpc_bad bad_rkey vanish; do
  kv_raw --mode "$mode" --timeout_s 20 --n 8 >"$KV_DIR/$mode.out" 2>&1 ||
    { cat "$KV_DIR/$mode.out" >&2; kv_fail "$mode: the node did not answer as specified"; }
  kill -0 "$KV_PID" 2>/dev/null || kv_fail "$mode: the node died"
  kv_ok "$mode: $(tail -n 1 "$KV_DIR/$mode.out")"
done

wait "$steady" || { cat "$KV_DIR/steady.out" >&2; kv_fail "the well-behaved client saw a failure"; }
kv_ok "well-behaved raw client: $(tail -n 1 "$KV_DIR/steady.out")"
if [[ -n $load ]]; then
  wait "$load" || { tail -n 20 "$KV_DIR/load.out" >&2; kv_fail "kvload --verify saw failures"; }
  kv_ok "kvload --verify: $(grep -E '^failed' "$KV_DIR/load.out")"
fi

stats=$(kv_admin stats)
for kind in auth_failed unsupported_version malformed_frame unexpected_message handshake_timeout \
  rpc_malformed rpc_oversize rpc_unknown_opcode rpc_wrong_client qp_error peer_vanished \
  too_many_clients; do
  n=$(grep -o "\"$kind\":[0-9]*" <<<"$stats" | cut -d: -f2)
  [[ $n -ge 1 ]] || kv_fail "errors.$kind = $n, expected >= 1"
done
kv_ok "errors counted: $(grep -o '"errors":{[^}]*}' <<<"$stats")"

kv_wait_for 20 kv_qp_count_is "$base_qp" ||
  kv_fail "QPs not back at the idle baseline ($base_qp): $(kv_rdma_count qp)"
[[ $(kv_rdma_count mr) -eq $base_mr ]] || kv_fail "MRs not back at baseline ($base_mr): $(kv_rdma_count mr)"
kv_ok "back at the idle baseline: $base_qp QPs, $base_mr MRs"
kv_stop_node
echo "server_bad_inputs: PASS"
