#!/usr/bin/env bash
# libkvclient's ClusterClient against three real nodes serving by a map in a
# real etcd (written with etcdctl, epoch 1, an even split over a, b, c):
#   - kvload --cluster --verify --history: keys spread over every node (the
#     report's ops per node), nothing failed, nothing stale, linearizable;
#   - the map moves the second half of a's slots to b (epoch 2) under a
#     write load: the clients adopt epoch 2, b applies writes of slots that
#     were a's, and no write fails (those a answered WRONG_SHARD were
#     resubmitted to b: the report's reroutes);
#   - node c stopped: its keys fail at once with SHARD_UNAVAILABLE (the
#     report's shard_unavailable), a's and b's keep serving.
# ~2 min in the TCG guest.
source "$(dirname "$0")/lib.sh"
kv_require_device

# Node a's slots 683..1365 move to b at epoch 2.
map_json() { # EPOCH B_FIRST
  echo "{\"cluster\":\"$KV_CLUSTER\",\"epoch\":$1,\"slots\":4096,\"nodes\":[\"a\",\"b\",\"c\"],\"ranges\":[[0,\"a\"],[$2,\"b\"],[2731,\"c\"]]}"
}
report_field() { # REPORT PYTHON-EXPRESSION-OF-r
  python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}

kv_etcd_start
kv_etcdctl put "/kvnode/$KV_CLUSTER/map" "$(map_json 1 1366)" >/dev/null || kv_fail "cannot write the map"
KV_TOKEN="$KV_TEST_DIR/token"
(umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$KV_TOKEN")
KV_C_IDS=(a b c)
# One after another: three starts at once starve etcd in the TCG guest.
for i in 0 1 2; do kv_cluster_node_start "$i"; done
kv_wait_for 90 kv_cluster_serving 3 || {
  kv_etcdctl get --prefix "/kvnode/$KV_CLUSTER/" >&2 || true
  for i in 0 1 2; do tail -n 15 "${KV_C_LOG[i]}" >&2; done
  kv_fail "not 3 nodes serving within 90 s of their start"
}
kv_node_use 0
kv_ok "cluster $KV_CLUSTER: etcd and nodes a, b, c serving by map epoch 1"

# 1. Verified load over every node.
h="$KV_TEST_DIR/history.tsv"
kv_cluster_load verified --keys 200 --distribution uniform --read_ratio 0.5 --delete_ratio 0.2 \
  --clients 2 --depth 4 --verify --history "$h" --timeout_ms 30000
kv_cluster_more_puts 100 "the verified load"
kv_cluster_load_stop strict
r=$KV_LOAD_REPORT
[[ $(report_field "$r" 'r["failed_ops"] + r["verify_errors"] + r["stale_reads"]') == 0 ]] ||
  kv_fail "verified load: failed, verify errors or stale reads in $r"
for n in a b c; do
  ops=$(report_field "$r" "r['nodes']['$n']['ops']") || kv_fail "no ops of node $n in $r"
  ((ops > 0)) || kv_fail "node $n served no operation of the verified load"
done
kv_log "ops per node: $(report_field "$r" '{k: v["ops"] for k, v in r["nodes"].items()}')"
kv_history_check "$h"

# 2. A map change under a write load: a's second half goes to b.
b_puts=$(kv_node_stat 1 ops_put)
kv_cluster_load moving --keys 400 --distribution uniform --read_ratio 0 --clients 2 --depth 4 \
  --timeout_ms 30000
kv_etcdctl put "/kvnode/$KV_CLUSTER/map" "$(map_json 2 683)" >/dev/null || kv_fail "cannot move slots"
kv_log "map epoch 2: slots 683..1365 from a to b"
kv_cluster_more_puts 200 "the map change"
kv_cluster_load_stop strict
r=$KV_LOAD_REPORT
[[ $(report_field "$r" 'r["failed_ops"]') == 0 ]] || kv_fail "writes failed across the map change"
[[ $(report_field "$r" 'r["cluster"]["map_epoch"]') == 2 ]] ||
  kv_fail "the clients did not adopt map epoch 2: $(report_field "$r" 'r["cluster"]')"
kv_node_stat_at_least 1 ops_put $((b_puts + 200)) || kv_fail "b applied no writes after the move"
kv_ok "map change under load: 0 failed, clients at epoch 2; $(report_field "$r" 'r["cluster"]["wrong_shard"]') WRONG_SHARD answers, $(report_field "$r" 'r["cluster"]["reroutes"]') reroutes"

# 3. c stopped: its slots fail at once, the others serve.
kv_cluster_node_stop 2
kv_wait_for 30 kv_cluster_serving 2 || kv_fail "etcd still lists c as serving"
# In the foreground (kv_cluster_load waits for PUTs on every node, c too).
KV_LOAD_LOG="$KV_TEST_DIR/without_c.log"
r="$KV_TEST_DIR/without_c.json"
rc=0
"$KV_KVLOAD" --cluster "$(kv_cluster_seeds)" --auth_token_file "$KV_TOKEN" --keys 300 \
  --distribution uniform --read_ratio 0.5 --clients 2 --depth 4 --ops 3000 --value_size 64 \
  --timeout_ms 30000 --connect_timeout_ms 5000 --progress=false --report "$r" \
  >"$KV_LOAD_LOG" 2>&1 || rc=$?
((rc == 1)) || { tail -n 20 "$KV_LOAD_LOG" >&2; kv_fail "kvload exited $rc, not 1 (failed ops)"; }
su=$(report_field "$r" 'r["shard_unavailable"]')
failed=$(report_field "$r" 'r["failed_ops"]')
((su > 0)) || kv_fail "no SHARD_UNAVAILABLE with c stopped ($r)"
((failed == su)) || kv_fail "$failed failed, but only $su with SHARD_UNAVAILABLE"
grep -aq "SHARD_UNAVAILABLE: slot [0-9]* of node 'c'" "$KV_LOAD_LOG" ||
  kv_fail "kvload's log names no slot of node 'c'"
kv_ok "c stopped: $su operations failed with SHARD_UNAVAILABLE, every failure of that kind"

kv_cluster_stop
echo "cluster_client: PASS"
