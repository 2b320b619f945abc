#!/usr/bin/env bash
# The cluster demo, run by `deploy/demo.sh --cluster` where a verbs device is
# (natively or in deploy/vm/rxe-vm): etcd on loopback, `kvctl cluster init`
# of nodes a, b, c, the three nodes, and `kvload --cluster` across them. Then
# node b is killed (SIGKILL): its slots fail at once with SHARD_UNAVAILABLE
# once its lease expires, a and c keep serving; b restarted serves its slots
# again to the same clients. Last, a fleet roll under a fresh load: `kvctl
# cluster roll` upgrades a, b and c live in turn to a stand-in for the next
# release (this binary under another build id), and that load ends with no
# failed operation. `kvctl cluster status` at each step.
#
#   DEMO_DURATION=S     seconds of load before the kill and after the restart [4]
#   DEMO_KEYS=N         keys [3000]
#   DEMO_PORT=P         node a's port; b and c take the next two [7000]
#   DEMO_ETCD_PORT=P    etcd's client port; its peer port is P+1 [23790]
#   DEMO_GATE_S=S       the roll's health gate after each node [2]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source deploy/lib.sh

build=${KVNODE_BUILD_DIR:-$PWD/build}
dur=${DEMO_DURATION:-4}
keys=${DEMO_KEYS:-3000}
port=${DEMO_PORT:-7000}
etcd_port=${DEMO_ETCD_PORT:-23790}
ttl=3
cluster=demo
ids=(a b c)
dir=$(mktemp -d /tmp/kvnode-demo-cluster.XXXXXX)
token="$dir/token"
(umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$token")
endpoints="127.0.0.1:$etcd_port"
pids=() etcd_pid="" load_pid=""
cleanup() {
  local p
  # A live upgrade's new process is nobody's child here: its pid file names it.
  for p in "${pids[@]}" "$etcd_pid" "$load_pid" $(cat "$dir"/*/pid 2>/dev/null); do
    [[ -n $p ]] && kill -KILL "$p" 2>/dev/null || true
  done
  rm -f /dev/shm/kvnode-demo-$$-*
}
trap cleanup EXIT

kvctl() { "$build/tools/kvctl" "$@"; }
status() { kvctl cluster status --etcd_endpoints "$endpoints" --cluster "$cluster" | sed 's/^/   /'; }
admin() { echo "$dir/${ids[$1]}/admin/admin.sock"; }
stat_of() { # I KEY
  kvctl --admin_socket "$(admin "$1")" --json stats 2>/dev/null | grep -o "\"$2\":[0-9]*" | cut -d: -f2
}
fail() {
  echo "demo: $*"
  local f
  for f in "$dir"/etcd.log "$dir"/*/kvnode*.log "$dir"/kvload.log; do
    [[ -f $f ]] || continue
    echo "== last lines of $f"
    tail -15 "$f"
  done
  exit 1
}

echo "== starting etcd on $endpoints (data in $dir/etcd)"
/usr/bin/etcd --name demo --data-dir "$dir/etcd" \
  --listen-client-urls "http://$endpoints" --advertise-client-urls "http://$endpoints" \
  --listen-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
  --initial-advertise-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
  --initial-cluster "demo=http://127.0.0.1:$((etcd_port + 1))" --logger zap \
  --log-outputs stderr >"$dir/etcd.log" 2>&1 &
etcd_pid=$!
etcd_healthy() { ETCDCTL_API=3 etcdctl --endpoints "$endpoints" endpoint health >/dev/null 2>&1; }
KV_AWAIT_INTERVAL=0.2 kv_await 60 etcd_healthy || fail "etcd not healthy within 60 s"

echo "== kvctl cluster init: nodes a, b, c, 4096 slots split evenly (map epoch 1)"
kvctl cluster init --etcd_endpoints "$endpoints" --cluster "$cluster" --nodes a,b,c | sed 's/^/   /'

start_node() { # I
  local i=$1 d="$dir/${ids[$1]}"
  mkdir -p -m 700 "$d"
  "$build/node/kvnode" --listen "127.0.0.1:$((port + i))" --db_path "$d/db" \
    --shm_name "kvnode-demo-$$-${ids[i]}" --admin_socket "$d/admin/admin.sock" \
    --auth_token_file "$token" --arena_size $((64 << 20)) --pid_file "$d/pid" \
    --cluster "$cluster" --etcd_endpoints "$endpoints" --node_id "${ids[i]}" \
    --etcd_lease_ttl_s "$ttl" >>"$d/kvnode.log" 2>&1 &
  pids[i]=$!
}
pinged() { kvctl --admin_socket "$(admin "$1")" ping >/dev/null 2>&1; }
serving() { # N: member keys saying "serving"
  [[ $(ETCDCTL_API=3 etcdctl --endpoints "$endpoints" get --prefix "/kvnode/$cluster/nodes/" \
    --print-value-only 2>/dev/null | grep -o '"state":"serving"' | wc -l) == "$1" ]]
}
echo "== starting nodes a, b, c on 127.0.0.1:$port-$((port + 2)) ($(kv_active_device))"
for i in 0 1 2; do start_node "$i"; done
for i in 0 1 2; do KV_AWAIT_INTERVAL=0.2 kv_await 120 pinged "$i" || fail "node ${ids[i]} did not come up"; done
KV_AWAIT_INTERVAL=0.2 kv_await 60 serving 3 || fail "not three nodes serving within 60 s"
status

echo "== kvload --cluster: $keys keys, YCSB A, 4 clients, each with a session to every node"
# A 5 s deadline per operation: those in flight to b when it dies wait it
# out (the client fails at once only new operations of a node the map says
# is down), and the clients' other operations wait behind them.
seeds="127.0.0.1:$port,127.0.0.1:$((port + 1)),127.0.0.1:$((port + 2))"
"$build/tools/kvload" --cluster "$seeds" --auth_token_file "$token" --workload A \
  --keys "$keys" --distribution uniform --clients 4 --threads 2 --depth 4 --preload \
  --duration 100000 --timeout_ms 5000 --progress=false --report "$dir/report.json" \
  >"$dir/kvload.log" 2>&1 &
load_pid=$!
until grep -aq '^kvload: preloaded' "$dir/kvload.log"; do
  kill -0 "$load_pid" 2>/dev/null || fail "kvload exited"
  kv_nap 0.1 # polling a condition (preload done) under kvload's own deadlines
done
puts() { local i s=""; for i in 0 1 2; do s+="${ids[i]} $(stat_of "$i" ops_put || echo -) "; done; echo "$s"; }
echo "   writes applied per node: $(puts)"
kv_nap "$dur" # the demo's pacing: steady load before the kill
echo "   writes applied per node: $(puts)"

echo "== kill -9 node b (pid ${pids[1]}); its lease expires within ${ttl} s"
t0=$(date +%s%N)
kill -KILL "${pids[1]}"
wait "${pids[1]}" 2>/dev/null || true
pids[1]=""
unavailable() { grep -aq SHARD_UNAVAILABLE "$dir/kvload.log"; }
kv_await 60 unavailable || fail "no SHARD_UNAVAILABLE within 60 s of b's loss"
echo "   b's slots fail with SHARD_UNAVAILABLE $((($(date +%s%N) - t0) / 1000000)) ms after the kill:"
grep -a -m1 SHARD_UNAVAILABLE "$dir/kvload.log" | sed 's/^.*\] /   /'
before=$(puts)
kv_nap 1 # the demo's pacing: a second of a and c serving alone
echo "   writes applied per node: $before -> $(puts)"
status

echo "== restarting node b on its port and database"
start_node 1
KV_AWAIT_INTERVAL=0.2 kv_await 120 pinged 1 || fail "node b did not come up again"
KV_AWAIT_INTERVAL=0.2 kv_await 60 serving 3 || fail "b not serving within 60 s"
b0=$(stat_of 1 ops_put || echo 0)
b_serves() { (($(stat_of 1 ops_put || echo 0) > b0 + 50)); }
KV_AWAIT_INTERVAL=0.2 kv_await 60 b_serves || fail "b's slots not served again within 60 s"
echo "   b serves its slots to the same clients again: writes applied per node: $(puts)"
status
kv_nap "$dur" # the demo's pacing: steady load after the restart

kill -INT "$load_pid"
rc=0
wait "$load_pid" || rc=$?
load_pid=""
summary() { # REPORT WHAT
  python3 - "$1" "$2" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"== kvload: {r['ops']} ops, failed {r['failed_ops']} "
      f"(shard_unavailable {r.get('shard_unavailable', '?')}{sys.argv[2]}), "
      f"longest gap {r['blackout_ms']:.0f} ms")
PY
}
summary "$dir/report.json" ": b's slots while b was down"
echo "   kvload exited $rc (1: the failed operations of b's slots)"
((rc == 0 || rc == 1)) || fail "kvload exited $rc"

# The next release, stood in for by this binary under another build id.
next="$dir/kvnode-next"
printf '#!/bin/sh\nexec "%s" "$@" --build_id=demo-next\n' "$build/node/kvnode" >"$next"
chmod 755 "$next"
echo "== fleet roll under load: kvctl cluster roll --binary $next"
echo "   (a live upgrade of a, b, c in turn, each followed by a ${DEMO_GATE_S:-2} s health gate)"
"$build/tools/kvload" --cluster "$seeds" --auth_token_file "$token" --workload A \
  --keys "$keys" --distribution uniform --clients 4 --threads 2 --depth 4 --verify \
  --duration 100000 --timeout_ms 30000 --progress=false --report "$dir/roll-report.json" \
  >"$dir/kvload-roll.log" 2>&1 &
load_pid=$!
b0=$(stat_of 1 ops_put || echo 0)
KV_AWAIT_INTERVAL=0.2 kv_await 60 b_serves || fail "the second load reached no node within 60 s"
kvctl cluster roll --binary "$next" --gate_s "${DEMO_GATE_S:-2}" --etcd_endpoints "$endpoints" \
  --cluster "$cluster" | sed 's/^/   /' || fail "kvctl cluster roll failed"
status
kill -INT "$load_pid"
rc=0
wait "$load_pid" || rc=$?
load_pid=""
summary "$dir/roll-report.json" ""
((rc == 0)) || fail "kvload exited $rc during the fleet roll"

echo "== stopping the nodes (SIGTERM) and etcd"
# After the roll each node is its upgrade's new process: its pid file says which.
for i in 0 1 2; do pids[i]=$(cat "$dir/${ids[i]}/pid"); done
for i in 0 1 2; do kill -TERM "${pids[i]}"; done
for i in 0 1 2; do
  kv_await 60 kv_gone "${pids[i]}" || fail "node ${ids[i]} still alive 60 s after SIGTERM"
  echo "   ${ids[i]}: $(grep -a 'kvnode: exit' "$dir/${ids[i]}/kvnode.log" | tail -1 | sed 's/^.*\] //')"
done
pids=()
kill -TERM "$etcd_pid"
kv_await 30 kv_gone "$etcd_pid" || fail "etcd still alive 30 s after SIGTERM"
etcd_pid=""
echo "demo: done (reports: $dir/report.json, $dir/roll-report.json)"
