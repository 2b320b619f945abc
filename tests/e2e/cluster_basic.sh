#!/usr/bin/env bash
# The cluster's steady path across live upgrades: a real etcd, three nodes
# (a, b, c: `kvctl cluster init`'s even split of 4096 slots), and `kvload
# --cluster` (ClusterClient: one session per node, keys routed by slot) with
# --verify and --history over keys spread on all three. Each node in turn is
# upgraded live (SIGUSR2; it hands its etcd lease to the new process). Then:
#   - zero failed operations, zero verify errors, every node served writes
#     after its own upgrade;
#   - kvhistory finds the history linearizable;
#   - membership never flapped: each member key in etcd is the one created
#     at the node's first start (same create_revision: the lease was handed
#     over, the key never deleted), and the map epoch is still 1;
#   - `kvctl cluster status` shows three serving nodes at generation 2.
# ~1.5 min in the TCG guest (the three node starts are most of it).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/upgrade_lib.sh"
kv_require_device

# The default lease TTL (3 s): a live upgrade hands the lease over renewed,
# and the new process's etcd channel is up before Ready, so the lease never
# lapses across an upgrade (KV_BASIC_TTL to try another).
KV_ETCD_TTL=${KV_BASIC_TTL:-3}
kv_test_dir
up_make_builds "$KV_TEST_DIR"
KV_NODE_BIN="$KV_TEST_DIR/kvnode-a"
kv_cluster_start 3

# The create_revision of each member key (etcdctl's JSON; the key is base64).
member_revisions() {
  kv_etcdctl get --prefix "/kvnode/$KV_CLUSTER/nodes/" -w json |
    grep -o '"create_revision":[0-9]*' | paste -sd' '
}
revs_before=$(member_revisions)
[[ $(wc -w <<<"$revs_before") == 3 ]] || kv_fail "expected 3 member keys, got: $revs_before"

kv_cluster_load load --keys 60 --distribution uniform --read_ratio 0.5 --delete_ratio 0.3 \
  --clients 4 --depth 4 --verify --history "$KV_TEST_DIR/history.tsv" --timeout_ms 30000

for i in 0 1 2; do
  kv_node_use "$i"
  UP_FIRST_PID=${KV_C_PID[i]}
  t0=$(kv_now_ns)
  up_upgrade kill
  kv_log "node ${KV_C_IDS[i]}: live upgrade $UP_OLD -> $UP_NEW in $((($(kv_now_ns) - t0) / 1000000)) ms"
  kv_cluster_more_puts 100 "node ${KV_C_IDS[i]}'s upgrade" "$i"
done
kv_cluster_more_puts 100 "the upgrades"
kv_cluster_load_stop strict

python3 - "$KV_LOAD_REPORT" <<'PY' || kv_fail "kvload's report"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["failed_ops"] == 0 and r["verify_errors"] == 0 and r["stale_reads"] == 0, r
assert r.get("shard_unavailable", 0) == 0, r.get("shard_unavailable")
print(f"kvload: {r['ops']} ops, 0 failed, 0 verify errors; per node: "
      f"{r.get('nodes', r.get('per_node', '?'))}")
PY
kv_history_check "$KV_TEST_DIR/history.tsv"

revs_after=$(member_revisions)
[[ $revs_after == "$revs_before" ]] ||
  kv_fail "member keys were re-created across the upgrades: $revs_before -> $revs_after"
map=$(kv_etcdctl get "/kvnode/$KV_CLUSTER/map" --print-value-only)
[[ $map == *'"epoch":1,'* ]] || kv_fail "the map changed across the upgrades: $map"
kv_ok "membership kept across the upgrades (member create revisions $revs_after; map epoch 1)"

kv_cluster_status_is 3 2 ||
  kv_fail "kvctl cluster status: not a, b, c serving at generation 2: $KV_STATUS_OUT"
kv_cluster_status >&2
kv_ok "kvctl cluster status: a, b, c serving at generation 2"
kv_cluster_stop
echo "cluster_basic: PASS"
