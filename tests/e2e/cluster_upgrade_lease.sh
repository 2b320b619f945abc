#!/usr/bin/env bash
# A cluster member's etcd lease across live upgrades, a SIGKILL and a
# SIGTERM (docs/upgrade.md, "The cluster lease"). A real etcd, three nodes
# a, b, c of one cluster (`kvctl cluster init`, or the same map written with
# etcdctl where kvctl has no `cluster`), and `etcdctl watch --prefix` on the
# member keys in the background, each event stamped as it arrives:
#   - node b upgraded live 3 times (SIGUSR2, kvctl upgrade, SIGUSR2): its
#     member key is never deleted, every write of it carries the lease of
#     b's first start, its create revision stays, its generation advances
#     by one per upgrade, and it ends "serving"; b's stats show the map
#     (cluster_map_epoch 1, its 1365 slots, etcd connected);
#   - node c killed by SIGKILL: its key is deleted once, after the kill,
#     with nothing but its lease to delete it (how soon after the TTL is
#     etcd's lease checker's timing, printed here and measured by
#     deploy/bench/bench-cluster.sh, not asserted: a loaded guest delays it);
#   - node a stopped by SIGTERM: its key is deleted when the node revokes
#     its lease (logged), before or within 1 s of its exit, not TTL later.
# ~1.5 min in the TCG guest.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/upgrade_lib.sh"
kv_require_device
# The node directories kv_cluster_node_launch makes hold --pid_file, whose
# directory must be the node's own 0700 one.
umask 077

kv_test_dir
up_make_builds "$KV_TEST_DIR"
KV_NODE_BIN="$KV_TEST_DIR/kvnode-a"
MEMBERS="/kvnode/$KV_CLUSTER/nodes/"

# The cluster of kv_cluster_start, with the map written by etcdctl when this
# kvctl cannot `cluster init`.
cluster_up() {
  kv_etcd_start
  KV_TOKEN="$KV_TEST_DIR/token"
  (umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$KV_TOKEN")
  KV_C_IDS=(a b c)
  if ! "$KV_KVCTL" cluster init --etcd_endpoints "$KV_ETCD_ENDPOINTS" --cluster "$KV_CLUSTER" \
    --nodes a,b,c >"$KV_TEST_DIR/init.out" 2>&1; then
    kv_log "kvctl cluster init: $(head -n 1 "$KV_TEST_DIR/init.out"): writing the map with etcdctl"
    kv_etcdctl put "/kvnode/$KV_CLUSTER/map" "{\"cluster\":\"$KV_CLUSTER\",\"epoch\":1,\"slots\":4096,\
\"nodes\":[\"a\",\"b\",\"c\"],\"ranges\":[[0,\"a\"],[1366,\"b\"],[2731,\"c\"]]}" >/dev/null
  fi
  local i
  for i in 0 1 2; do kv_cluster_node_launch "$i" --node_id "${KV_C_IDS[i]}"; done
  for i in 0 1 2; do kv_cluster_node_wait "$i"; done
  kv_wait_for 60 kv_cluster_serving 3 ||
    kv_fail "not 3 members serving within 60 s: $(kv_etcdctl get --prefix "$MEMBERS" --print-value-only)"
  kv_ok "cluster $KV_CLUSTER: etcd and nodes a, b, c serving"
}
cluster_up

# Every watch response on one line, after the arrival time (us) it was read
# at: bash builtins only, so the stamp is not late by a fork under TCG.
WATCH_LOG="$KV_TEST_DIR/watch.log"
: >"$WATCH_LOG"
ETCDCTL_API=3 "$KV_ETCDCTL_BIN" --endpoints "$KV_ETCD_ENDPOINTS" watch --prefix "$MEMBERS" -w json |
  while IFS= read -r line; do printf '%s %s\n' "${EPOCHREALTIME//[!0-9]/}" "$line"; done \
    >>"$WATCH_LOG" &
WATCH_PID=$!
# The watch is live once a write shows in it (etcdctl takes seconds to
# start under TCG: the probe is written again until it shows).
probe=$(printf '%s' "${MEMBERS}zz-probe" | base64)
for ((try = 0; ; try++)); do
  ((try < 15)) || kv_fail "etcdctl watch saw nothing within 15 probes"
  kv_etcdctl put "${MEMBERS}zz-probe" "probe $try" >/dev/null
  kv_wait_for 2 grep -q "$probe" "$WATCH_LOG" && break
done
kv_etcdctl del "${MEMBERS}zz-probe" >/dev/null

# member NODE: sets M_LEASE M_CREV M_GEN M_STATE from `etcdctl get -w json`
# (one python for the four: each start costs under TCG); fails when absent.
member() {
  local out
  out=$(kv_etcdctl get "$MEMBERS$1" -w json | python3 -c '
import base64, json, sys
kvs = json.load(sys.stdin).get("kvs", [])
if not kvs: sys.exit(1)
m = json.loads(base64.b64decode(kvs[0]["value"]))
print(kvs[0].get("lease", 0), kvs[0]["create_revision"], m["generation"], m["state"])') || return 1
  read -r M_LEASE M_CREV M_GEN M_STATE <<<"$out"
}
member_is() { member "$1" && [[ $M_GEN == "$2" && $M_STATE == serving ]]; }
member_gone() { ! kv_etcdctl get "$MEMBERS$1" --print-value-only | grep -q .; }

member b || kv_fail "no member key for b"
lease0=$M_LEASE crev0=$M_CREV gen0=$M_GEN
kv_log "b: lease $lease0, create revision $crev0, generation $gen0"

kv_node_use 1
UP_FIRST_PID=${KV_C_PID[1]}
for k in 1 2 3; do
  how=kill
  ((k == 2)) && how=kvctl
  up_upgrade "$how"
  kv_wait_for 30 member_is b $((gen0 + k)) ||
    up_fail "b's member key not at generation $((gen0 + k)), serving, within 30 s of the upgrade"
  member b
  [[ $M_LEASE == "$lease0" ]] || up_fail "upgrade $k: b's lease is $M_LEASE, was $lease0"
  [[ $M_CREV == "$crev0" ]] || up_fail "upgrade $k: b's member key was re-created"
  kv_ok "upgrade $k ($how): b pid $UP_OLD -> $UP_NEW, generation $M_GEN, lease $M_LEASE"
done
st=$(kv_admin stats)
for want in cluster_map_epoch:1 cluster_slots_owned:1365 cluster_etcd_connected:1; do
  v=$(kv_json_num "$st" "${want%:*}") # extra stats are doubles: "1.0"
  [[ ${v%.0} == "${want#*:}" ]] || kv_fail "b's stats: ${want%:*} is '$v', not ${want#*:}: $st"
done
ttl_left=$(kv_json_num "$st" cluster_lease_ttl_left_ms)
((${ttl_left%.*} > 0)) || kv_fail "b's stats: cluster_lease_ttl_left_ms $ttl_left"
kv_ok "b serves map epoch 1 with its 1365 slots (lease $ttl_left ms left)"

# --- c: SIGKILL. Its lease expires: the key goes.
kv_wait_for 30 member_is c 1 || kv_fail "c not serving"
t_kill=${EPOCHREALTIME//[!0-9]/}
kv_cluster_node_kill 2
kv_wait_for 30 member_gone c || kv_fail "c's member key still there 30 s after its SIGKILL"

# --- a: SIGTERM. It revokes its lease: the key goes before its exit.
pid_a=$(kv_node_pid 0)
t_term=${EPOCHREALTIME//[!0-9]/}
kill -TERM "$pid_a"
kv_wait_for "$KV_STOP_TIMEOUT" kv_gone "$pid_a" || kv_fail "a did not exit on SIGTERM"
t_exit=${EPOCHREALTIME//[!0-9]/}
wait "$pid_a" || kv_fail "a exited non-zero"
KV_C_PID[0]=""
grep -aq "cluster: lease [0-9]* revoked" "${KV_C_LOG[0]}" || kv_fail "a did not log its revoke"
kv_wait_for 10 member_gone a || kv_fail "a's member key still there 10 s after its exit"

# The watch's story, checked at once.
kv_etcdctl put "${MEMBERS}zz-end" end >/dev/null
kv_wait_for 30 grep -q "$(printf '%s' "${MEMBERS}zz-end" | base64)" "$WATCH_LOG" ||
  kv_fail "the watch did not see the end marker"
kill "$WATCH_PID" 2>/dev/null || true
python3 - "$WATCH_LOG" "$MEMBERS" "$lease0" "$gen0" "$t_kill" "$t_term" "$t_exit" \
  "$KV_ETCD_TTL" <<'PY' || kv_fail "the member keys' history (watch log $WATCH_LOG)"
import base64, json, sys
log, prefix, lease0, gen0, t_kill, t_term, t_exit, ttl = sys.argv[1:]
lease0, gen0, ttl = int(lease0), int(gen0), int(ttl)
t_kill, t_term, t_exit = int(t_kill), int(t_term), int(t_exit)
events = []  # (t_us, node, "PUT"|"DELETE", lease, member)
for line in open(log):
    t, resp = line.split(" ", 1)
    for e in json.loads(resp).get("Events") or []:
        kv = e["kv"]
        node = base64.b64decode(kv["key"]).decode()[len(prefix):]
        if node.startswith("zz-"):
            continue
        if e.get("type") == 1:
            events.append((int(t), node, "DELETE", None, None))
        else:
            events.append((int(t), node, "PUT", kv.get("lease", 0),
                           json.loads(base64.b64decode(kv["value"]))))
b = [e for e in events if e[1] == "b"]
assert b, "no event of b"
assert all(e[2] == "PUT" for e in b), f"b's key was deleted: {b}"
assert all(e[3] == lease0 for e in b), f"b's key under another lease: {[e[3] for e in b]}"
gens = [e[4]["generation"] for e in b]
assert gens == sorted(gens), f"b's generation went back: {gens}"
assert set(range(gen0 + 1, gen0 + 4)) <= set(gens), f"b's generations {gens}"
assert b[-1][4]["generation"] == gen0 + 3 and b[-1][4]["state"] == "serving", b[-1]
states = [(e[4]["generation"], e[4]["state"]) for e in b]
print(f"b: {len(b)} writes, all under lease {lease0}, none deleted: {states}")

def deleted(node):
    d = [e for e in events if e[1] == node and e[2] == "DELETE"]
    assert len(d) == 1, f"{node}: {len(d)} deletions"
    return d[0][0]
dc = deleted("c") - t_kill
assert dc > 0, f"c's key deleted {-dc / 1e6:.2f} s before its SIGKILL"
print(f"c: key deleted {dc / 1e6:.2f} s after SIGKILL (TTL {ttl} s)")
da = deleted("a")
assert da <= t_exit + 1_000_000, f"a's key deleted {(da - t_exit) / 1e6:.2f} s after its exit"
a_states = [e[4]["state"] for e in events if e[1] == "a" and e[2] == "PUT"]
print(f"a: key deleted {(da - t_term) / 1e6:.2f} s after SIGTERM, "
      f"{(t_exit - da) / 1e6:.2f} s before its exit was seen; states {a_states}")
PY
kv_ok "membership: b's key kept its lease over 3 upgrades; c's expired, a's revoked"

kv_cluster_node_stop 1
kv_etcd_stop
echo "cluster_upgrade_lease: PASS"
