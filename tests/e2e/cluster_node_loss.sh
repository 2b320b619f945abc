#!/usr/bin/env bash
# A node's loss and return under load: etcd and three nodes, `kvload
# --cluster --history` on keys spread over all three, then SIGKILL of node
# b. Its member key goes with its lease (--etcd_lease_ttl_s 3), the other
# nodes push the map with b not alive, and the clients fail b's slots at once
# with SHARD_UNAVAILABLE:
#   - the first such failure comes before the operations' 10 s deadline
#     (kvload's first logged failure against the kill's time, one clock):
#     b's slots fail when the map says b is gone, not by timing out. How
#     soon (TTL + 1 s is the goal) is a benchmark's figure
#     (deploy/bench/bench-cluster.sh), not this test's: a loaded guest can
#     take seconds just to deliver the kill;
#   - no operation on a key of a or c fails (the history, each key's owner
#     from the map: kvnode_key_owner), and a and c keep applying writes;
#   - b restarted on its port and database: it registers again, and its
#     slots serve the same kvload (no restart of the clients): b applies
#     writes again;
#   - the whole history is linearizable (failed writes: unknown outcome).
# ~1.5 min in the TCG guest.
source "$(dirname "$0")/lib.sh"
kv_require_device

KV_KEY_OWNER=${KV_KEY_OWNER:-$KV_BUILD/tests/e2e/kvnode_key_owner}
kv_cluster_start 3
ranges=$(kv_cluster_ranges) || kv_fail "cannot read the map's ranges"
h="$KV_TEST_DIR/history.tsv"
# A failure before the operations' deadline can only be the client's
# SHARD_UNAVAILABLE, never the deadline itself.
op_timeout_ms=10000
kv_cluster_load load --keys 300 --distribution uniform --read_ratio 0.5 --clients 4 --depth 4 \
  --history "$h" --timeout_ms "$op_timeout_ms"
# What is wrong is collected, and the test goes on to check the rest: a
# failed expectation about the loss must not hide one about the return.
problems=()
problem() {
  kv_log "PROBLEM: $*"
  problems+=("$*")
}

# Milliseconds since local midnight: of a glog line ("E20261207 05:33:34.123456 ...")
# and of an $EPOCHREALTIME reading. kvload logs in the local zone, as printf does.
log_ms() {
  [[ $1 =~ ^[EWIF][0-9]{4,8}\ ([0-9]{2}):([0-9]{2}):([0-9]{2})\.([0-9]{3}) ]] || return 1
  echo $(((10#${BASH_REMATCH[1]} * 3600 + 10#${BASH_REMATCH[2]} * 60 + 10#${BASH_REMATCH[3]}) * 1000 + 10#${BASH_REMATCH[4]}))
}
clock_ms() {
  local us=${1//[!0-9]/} hms
  printf -v hms '%(%H %M %S)T' $((us / 1000000))
  read -r hh mm ss <<<"$hms"
  echo $(((10#$hh * 3600 + 10#$mm * 60 + 10#$ss) * 1000 + us % 1000000 / 1000))
}
unavailable_logged() { grep -aq 'SHARD_UNAVAILABLE' "$KV_LOAD_LOG"; }

t_kill=$EPOCHREALTIME
kv_cluster_node_kill 1
kv_log "node b killed (SIGKILL) under load"
kv_wait_for $((KV_ETCD_TTL + 30)) unavailable_logged ||
  kv_fail "no SHARD_UNAVAILABLE in kvload's log within $((KV_ETCD_TTL + 30)) s of b's loss"
first=$(grep -a -m1 'SHARD_UNAVAILABLE' "$KV_LOAD_LOG")
echo "$first" >&2
[[ $first == *"'b'"* ]] || problem "the first SHARD_UNAVAILABLE does not name node 'b'"
f_ms=$(log_ms "$first") || kv_fail "no glog time in kvload's line: $first"
k_ms=$(clock_ms "$t_kill")
delay=$(((f_ms - k_ms + 86400000) % 86400000))
kv_log "first SHARD_UNAVAILABLE ${delay} ms after the kill (lease TTL ${KV_ETCD_TTL} s)"
((delay < op_timeout_ms)) ||
  problem "b's slots failed with SHARD_UNAVAILABLE ${delay} ms after the kill, not before the operations' ${op_timeout_ms} ms deadline"
kv_wait_for 30 kv_cluster_serving 2 || kv_fail "etcd still lists b as serving"
kv_cluster_more_puts 100 "b's loss" 0 2

kv_cluster_node_start 1
kv_wait_for 60 kv_cluster_serving 3 || kv_fail "b did not register again within 60 s"
kv_cluster_more_puts 100 "b's restart" 1
kill -0 "$KV_LOAD_PID" || kv_fail "kvload did not live through b's loss"
kv_ok "b restarted: its slots serve the same kvload again"
kv_cluster_more_puts 50 "b's return"
kv_cluster_load_stop lenient

python3 - "$KV_LOAD_REPORT" <<'PY' || problem "not every failed operation was SHARD_UNAVAILABLE"
import json, sys
r = json.load(open(sys.argv[1]))
su = r.get("shard_unavailable", 0)
print(f"kvload: {r['ops']} ops, {r['failed_ops']} failed, {su} of them SHARD_UNAVAILABLE")
assert su > 0 and r["failed_ops"] == su
PY
"$KV_KEY_OWNER" --ranges "$ranges" "$h" >"$h.owners" || kv_fail "kvnode_key_owner"
read -r bad b_failed b_ok <<<"$(awk -F'\t' 'NR > 1 && $1 !~ /^#/ {
  if ($6 == "failed") { if ($8 == "b") bf++; else bad++ } else if ($8 == "b") bo++ }
  END { print bad + 0, bf + 0, bo + 0 }' "$h.owners")"
((bad == 0)) || problem "$bad operations on keys of a or c failed while b was down"
((b_failed > 0)) || problem "no operation on b's keys failed: the loss was not seen"
kv_log "b's loss failed $b_failed of its operations, $bad of a's or c's; $b_ok of b's succeeded"
kv_history_check "$h" "PUT ok" "GET ok"
kv_cluster_stop
((${#problems[@]} == 0)) || kv_fail "$(printf '%s; ' "${problems[@]}")"
echo "cluster_node_loss: PASS"
