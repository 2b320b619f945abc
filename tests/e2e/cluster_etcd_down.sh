#!/usr/bin/env bash
# Serving never waits on etcd: etcd and three nodes under `kvload --cluster
# --verify`, then etcd is killed (SIGKILL) for KV_ETCD_OUTAGE_S (10) seconds.
#   - every node sees it (stats cluster_etcd_connected 0) and keeps applying
#     writes meanwhile; the clients keep their map: zero failed operations,
#     zero verify errors over the whole run;
#   - etcd restarted on its ports and data: every node reconnects
#     (cluster_etcd_connected 1) and `kvctl cluster status` shows the three
#     serving again, each within a deadline; the map epoch is unchanged.
# ~1.5 min in the TCG guest.
source "$(dirname "$0")/lib.sh"
kv_require_device

outage_s=${KV_ETCD_OUTAGE_S:-10}
kv_cluster_start 3
kv_cluster_load load --keys 300 --distribution uniform --clients 4 --depth 4 --verify \
  --timeout_ms 30000

every_node_stat_is() { # KEY VALUE
  local i
  for i in "${!KV_C_IDS[@]}"; do kv_node_stat_is "$i" "$1" "$2" || return 1; done
}
every_node_stat_is cluster_etcd_connected 1 ||
  kv_fail "cluster_etcd_connected is not 1 on every node before the outage"

t_down=$SECONDS
kv_etcd_kill
kv_wait_for $((KV_ETCD_TTL + 15)) every_node_stat_is cluster_etcd_connected 0 ||
  kv_fail "not every node reports cluster_etcd_connected 0 within $((KV_ETCD_TTL + 15)) s"
kv_log "every node sees etcd gone"
kv_cluster_more_puts 100 "etcd's loss"
# The outage's length is the condition under test (longer than the lease
# TTL), not a synchronisation: pace out the rest of it.
left=$((outage_s - (SECONDS - t_down)))
((left <= 0)) || kv_nap "$left"
kv_cluster_more_puts 50 "$outage_s s without etcd"
kv_log "$((SECONDS - t_down)) s without etcd; every node applied writes meanwhile"

kv_etcd_restart
t_up=$(kv_now_ns)
kv_wait_for 60 every_node_stat_is cluster_etcd_connected 1 ||
  kv_fail "not every node reconnected to etcd within 60 s of its restart"
reconnect_ms=$((($(kv_now_ns) - t_up) / 1000000))
kv_wait_for 60 kv_cluster_status_is 3 ||
  kv_fail "kvctl cluster status not 3 serving within 60 s of etcd's restart: $KV_STATUS_OUT"
kv_ok "nodes reconnected ${reconnect_ms} ms after etcd's restart; all three serving again"
kv_cluster_status >&2
map=$(kv_etcdctl get "/kvnode/$KV_CLUSTER/map" --print-value-only)
[[ $map == *'"epoch":1,'* ]] || kv_fail "the map changed across the outage: $map"
kv_cluster_more_puts 100 "etcd's return"
kv_cluster_load_stop strict
kv_load_report_clean
kv_cluster_stop
echo "cluster_etcd_down: PASS"
