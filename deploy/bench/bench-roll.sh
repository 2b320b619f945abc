#!/usr/bin/env bash
# What a fleet roll (`kvctl cluster roll`, docs/cluster.md "Fleet roll")
# costs the clients and how long it takes, against single live upgrades, in
# one run on a verbs device (in deploy/vm/rxe-vm when the host has none):
# etcd on loopback and three nodes a, b, c started by tests/e2e/lib.sh's
# kv_cluster_start (the e2e tests' harness) as wrapper build a
# (tests/e2e/upgrade_lib.sh's up_make_builds: two builds of one binary that
# differ in build id). Not a test: it prints a table and writes
# BENCH_OUT/bench-roll.json.
#
# One load for the whole run: kvload --cluster --history (BENCH_CLIENTS
# clients, depth BENCH_DEPTH, YCSB A, uniform, 5 s deadline per operation,
# no preload, so that the history's clock is the report's start_unix_s).
# BENCH_TRIALS trials, each of:
#   single  two live upgrades of node b alone (`kvctl --admin_socket ...
#           upgrade --binary` the other build, then back), one after the other:
#           b's client blackout = the longest gap between completed operations
#           on keys b owns (kvnode_key_owner, the map's ranges) that overlaps
#           the window from just before the kvctl request to the old pid gone
#           (/proc polled every 10 ms under a deadline); and signal -> old
#           exit, from the request's arrival at b (b's log line "upgrade:
#           starting", as the upgrade benchmark's signal) to the old pid gone
#           (kvctl's own start, a dynamically linked exec that takes seconds
#           under TCG, is reported beside it)
#   roll    `kvctl cluster roll --binary` the other build `--build_id` its id
#           (no probe) `--gate_s BENCH_GATE_S` of all three nodes: each node's
#           blackout within the roll's window (kvctl's start to its exit) and
#           within its own upgrade (the plan's started_ms..ended_ms); the
#           roll's time on kvctl's own clock (its progress lines, from its
#           start to "done"; its exec and exit, seconds of dynamic linking
#           from 9p in the TCG guest, are in the wall time reported beside it)
# The builds alternate so that every event is a real upgrade (a roll skips a
# node already on its build). Figures: the median and max of each node's roll
# blackout over the trials; roll_blackout_ratio = the median of every
# (node, trial) roll blackout / the median single blackout (goal <= 1.5);
# roll_time_ratio = the median roll time / (3 x the median single signal ->
# old exit + 3 x gate_s) (goal <= 1.2; also against signal -> upgrade
# complete, the new process's RocksDB open, which a roll waits for before the
# node is done); failed operations (must be 0) and
# kvhistory's verdict on the history (must be linearizable). kvload's depth is
# shared by all the nodes a client talks to: a node's upgrade can stall the
# others' keys too, which the roll-window figure counts and the own-window
# figure does not. Exit 1 when an operation failed or the history is not
# linearizable (after the JSON and the table).
#
#   deploy/bench/bench-roll.sh                 build in build/, run (VM if needed)
#   KVNODE_BUILD_DIR=DIR deploy/bench/bench-roll.sh --no-build
#   BENCH_OUT=DIR        raw output and the JSON [BUILD/bench-roll]
#   BENCH_TRIALS [3] BENCH_GATE_S [2] BENCH_KEYS [10000] BENCH_CLIENTS [4]
#   BENCH_DEPTH [4] BENCH_TTL [3] (the nodes' etcd lease)
#   BENCH_VM_TIMEOUT     the guest's time limit, s [300 + 150 per trial]
# ~6 min in the TCG guest at the defaults (shared 2-core host, VM boot included).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source deploy/lib.sh
build=${KVNODE_BUILD_DIR:-$PWD/build}
mode=${1:-}
case $mode in
  "" | --no-build | --inner) ;;
  *) echo "bench-roll.sh: unknown argument '$mode' (--no-build, or none)" >&2; exit 2 ;;
esac
trials=${BENCH_TRIALS:-3} gate_s=${BENCH_GATE_S:-2} keys=${BENCH_KEYS:-10000}
clients=${BENCH_CLIENTS:-4} depth=${BENCH_DEPTH:-4} ttl=${BENCH_TTL:-3}
for v in trials gate_s keys clients depth ttl; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "bench-roll.sh: BENCH_${v^^} must be a whole number, not '${!v}'" >&2; exit 2; }
done
((trials >= 1 && keys >= 1 && clients >= 1 && depth >= 1 && ttl >= 1)) ||
  { echo "bench-roll.sh: BENCH_TRIALS, BENCH_KEYS, BENCH_CLIENTS, BENCH_DEPTH and BENCH_TTL must be >= 1" >&2; exit 2; }

if [[ $mode == --inner ]]; then
  export KVNODE_BUILD_DIR=$build KV_ETCD_TTL=$ttl
  # The e2e harness: etcd and cluster start, kv_fail on a missed deadline.
  source tests/e2e/lib.sh
  source tests/e2e/upgrade_lib.sh
  source tests/e2e/roll_lib.sh
  out=${BENCH_OUT:-$build/bench-roll}
  rm -rf "$out"
  mkdir -p "$out"
  kv_require_device
  roll_fleet_start
  ranges=$(kv_cluster_ranges) || kv_fail "no map in etcd"
  events="$out/events.tsv" # kind trial k node from to t0_ns t1_ns generation old_pid
  printf '# kind\ttrial\tk\tnode\tfrom\tto\tt0_ns\tt1_ns\tgeneration\told_pid\n' >"$events"
  other() { [[ $1 == a ]] && echo b || echo a; }
  b_sock="${KV_C_DIR[1]}/admin/admin.sock"

  echo "== load: kvload --cluster, $clients clients x depth $depth, YCSB A, uniform, $keys keys, --history"
  kv_cluster_load load --keys "$keys" --workload A --distribution uniform --clients "$clients" \
    --depth "$depth" --history "$out/history.tsv" --timeout_ms 5000

  # Before each event: every member serving, b idle, the load through every node.
  settle() { # WHAT
    kv_wait_for 60 kv_cluster_serving 3 || kv_fail "$1: not 3 members serving within 60 s"
    "$KV_ADMIN_REQUEST" --until '"upgrade_in_progress":false' --wait_s 30 "$b_sock" stats \
      >/dev/null || kv_fail "$1: b still upgrading 30 s later"
    kv_cluster_more_puts 50 "$1"
  }

  # One live upgrade of b to build TO by kvctl; the window is from just
  # before kvctl's start to the old pid gone.
  single() { # TRIAL K FROM TO
    local trial=$1 k=$2 from=$3 to=$4 a old gen t0 t1 kpid rc=0
    a=$(kv_node_admin 1 ping) || kv_fail "b does not answer ping"
    old=$(kv_json_num "$a" pid)
    gen=$(kv_json_num "$a" generation)
    t0=$(kv_now_ns)
    "$KV_KVCTL" --admin_socket "$b_sock" upgrade --binary "$KV_TEST_DIR/kvnode-$to" \
      >"$out/single-$trial-$k.out" 2>&1 &
    kpid=$!
    # /proc every 10 ms: builtins only (up_gone), so the poll costs the guest little.
    KV_AWAIT_INTERVAL=0.01 kv_await 90 up_gone "$old" ||
      kv_fail "single $trial.$k: b's old process $old alive 90 s after the upgrade request"
    t1=$(kv_now_ns)
    wait "$kpid" || rc=$?
    ((rc == 0)) || { cat "$out/single-$trial-$k.out" >&2; kv_fail "single $trial.$k: kvctl upgrade exited $rc"; }
    wait "$old" 2>/dev/null || true # the first process is our child
    a=$(kv_node_admin 1 ping) || kv_fail "b does not answer ping after its upgrade"
    [[ $a == *"\"generation\":$((gen + 1)),"* && $a == *"\"build_id\":\"build-$to\""* ]] ||
      kv_fail "single $trial.$k: b is not generation $((gen + 1)) on build-$to: $a"
    printf 'single\t%s\t%s\tb\t%s\t%s\t%s\t%s\t%s\t%s\n' "$trial" "$k" "$from" "$to" "$t0" "$t1" \
      "$gen" "$old" >>"$events"
    echo "   trial $trial: b build-$from -> build-$to, kvctl's start -> old exit $(((t1 - t0) / 1000000)) ms"
  }

  # A roll of every node to build TO; its window is kvctl's run.
  roll() { # TRIAL FROM TO
    local trial=$1 from=$2 to=$3 t0 t1 rc=0 now n
    t0=$(kv_now_ns)
    "$KV_KVCTL" cluster roll --etcd_endpoints "$KV_ETCD_ENDPOINTS" --cluster "$KV_CLUSTER" \
      --binary "$KV_TEST_DIR/kvnode-$to" --build_id "build-$to" --gate_s "$gate_s" \
      >"$out/roll-$trial.out" 2>&1 || rc=$?
    t1=$(kv_now_ns)
    ((rc == 0)) || { cat "$out/roll-$trial.out" >&2; kv_fail "roll $trial: kvctl cluster roll exited $rc"; }
    kv_etcdctl get "/kvnode/$KV_CLUSTER/roll" --print-value-only >"$out/roll-$trial.plan.json" ||
      kv_fail "roll $trial: no plan in etcd"
    for n in 0 1 2; do
      now=$(kv_node_admin "$n" ping) || kv_fail "roll $trial: node ${KV_C_IDS[n]} does not answer ping"
      [[ $now == *"\"build_id\":\"build-$to\""* ]] ||
        kv_fail "roll $trial: node ${KV_C_IDS[n]} is not on build-$to: $now"
    done
    printf 'roll\t%s\t1\t*\t%s\t%s\t%s\t%s\t-\t-\n' "$trial" "$from" "$to" "$t0" "$t1" >>"$events"
    echo "   trial $trial: roll build-$from -> build-$to in $(((t1 - t0) / 1000000)) ms"
  }

  fleet=a # every node's build between trials
  for ((t = 1; t <= trials; t++)); do
    echo "== trial $t of $trials: b alone (there and back), then a roll of a, b, c (gate $gate_s s)"
    settle "trial $t"
    single "$t" 1 "$fleet" "$(other "$fleet")"
    settle "trial $t, b's first upgrade"
    single "$t" 2 "$(other "$fleet")" "$fleet"
    settle "trial $t, b's second upgrade"
    roll "$t" "$fleet" "$(other "$fleet")"
    fleet=$(other "$fleet")
  done
  kv_cluster_more_puts 50 "the last roll"

  kv_cluster_load_stop lenient # failed operations are reported below, not fatal here
  cp "$KV_LOAD_LOG" "$out/load.log"
  cp "$KV_LOAD_REPORT" "$out/load.json"
  "$KV_BUILD/tests/e2e/kvnode_key_owner" --ranges "$ranges" "$out/history.tsv" >"$out/owners.tsv" ||
    kv_fail "kvnode_key_owner"
  hrc=0
  "$KV_BUILD/tools/kvhistory" "$out/history.tsv" >"$out/kvhistory.log" 2>&1 || hrc=$?
  kv_cluster_stop
  for i in 0 1 2; do # the nodes' logs (every process of a node appends to its start's log)
    cp "${KV_C_LOG[i]}" "$out/node-${KV_C_IDS[i]}.log"
  done

  rc=0
  python3 - "$out" "$hrc" "$gate_s" "$clients" "$depth" "$keys" <<'PY' || rc=$?
import bisect, datetime, json, os, re, statistics, sys
out, hrc, gate_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
clients, depth, keys = (int(x) for x in sys.argv[4:7])
load = json.load(open(os.path.join(out, "load.json")))
base = round(load["start_unix_s"] * 1e9)  # the history's 0 on the wall clock

done = {}  # node -> sorted return_ns of its completed (not failed) operations
failed = {}
for line in open(os.path.join(out, "owners.tsv")):
    if line.startswith("#") or not line.strip():
        continue
    f = line.rstrip("\n").split("\t")
    if f[5] == "failed":
        failed[f[7]] = failed.get(f[7], 0) + 1
    else:
        done.setdefault(f[7], []).append(int(f[4]))
for v in done.values():
    v.sort()

def blackout_ms(node, w0, w1):
    """The longest gap between consecutive completions on NODE's keys that
    overlaps [w0, w1] (wall ns)."""
    r, lo, hi = done.get(node, []), w0 - base, w1 - base
    i = max(0, bisect.bisect_left(r, lo) - 1)  # the last completion before the window
    j = min(len(r) - 1, bisect.bisect_right(r, hi))  # the first after it
    gaps = [r[x + 1] - r[x] for x in range(i, j)]
    return max(gaps) / 1e6 if gaps else None

# b's log (glog: local time, as python's here): when each upgrade request
# reached the node ("upgrade: starting ... generation G -> G+1") and when each
# process logged its exit ("kvnode: exit 0 (pid P,"), and when the new one
# had RocksDB open again ("upgrade: generation G+1 complete": a roll moves on
# only then, when the member says serving again).
req_at, exit_at, done_at = {}, {}, {}
glog_ns = lambda l: round(datetime.datetime.strptime(l[1:25], "%Y%m%d %H:%M:%S.%f").timestamp() * 1e9)
for line in open(os.path.join(out, "node-b.log"), errors="replace"):
    m = re.search(r"upgrade: starting, binary .*, generation (\d+) -> ", line)
    if m and line[:1] == "I":
        req_at[int(m.group(1))] = glog_ns(line)
    m = re.search(r"upgrade: generation (\d+) complete", line)
    if m and line[:1] == "I":
        done_at[int(m.group(1))] = glog_ns(line)
    m = re.search(r"kvnode: exit 0 \(pid (\d+),", line)
    if m and line[:1] == "I":
        exit_at[m.group(1)] = glog_ns(line)

single, rolls = [], []
for line in open(os.path.join(out, "events.tsv")):
    if line.startswith("#"):
        continue
    kind, trial, k, node, frm, to, t0, t1, gen, old = line.rstrip("\n").split("\t")
    t0, t1 = int(t0), int(t1)
    if kind == "single":
        # The signal: the request's arrival at b (its log), not kvctl's start
        # (a dynamically linked exec, seconds under TCG); kvctl's start when
        # the log has no line inside the window.
        req = req_at.get(int(gen))
        ok = req is not None and t0 <= req <= t1
        ex = exit_at.get(old)
        single.append({"trial": int(trial), "k": int(k), "build": f"{frm}->{to}",
                       "blackout_ms": blackout_ms("b", t0, t1),
                       "signal_to_old_exit_ms": (t1 - (req if ok else t0)) / 1e6,
                       "signal_from": "node log" if ok else "kvctl start",
                       "kvctl_start_to_old_exit_ms": (t1 - t0) / 1e6,
                       "exit_logged_to_gone_ms": (t1 - ex) / 1e6 if ex and ex <= t1 else None,
                       "signal_to_complete_ms": (done_at[int(gen) + 1] - req) / 1e6
                       if ok and int(gen) + 1 in done_at else None})
        continue
    plan = json.load(open(os.path.join(out, f"roll-{trial}.plan.json")))
    nodes = {}
    for n in plan["nodes"]:
        s, e = n.get("started_ms", 0), n.get("ended_ms", 0)
        nodes[n["node_id"]] = {
            "blackout_ms": blackout_ms(n["node_id"], t0, t1),
            "own_blackout_ms": blackout_ms(n["node_id"], s * 10**6, e * 10**6) if s and e else None,
            "upgrade_ms": e - s if s and e else None}
    # kvctl's own clock: its progress lines count from its start (after the
    # exec, the dynamic linking and the etcd connection: seconds under TCG,
    # from a 9p file system), and its last line is "done".
    prog = [(float(m.group(1)), m.group(2)) for m in
            (re.match(r"\[\s*([0-9.]+)s\] roll \S+: (.*) \(\d+ of", l)
             for l in open(os.path.join(out, f"roll-{trial}.out"))) if m]
    run_s = next((t for t, ev in reversed(prog) if ev == "done"), None)
    first = plan["nodes"][0]
    intent_s = next((t for t, ev in prog if ev == f"{first['node_id']}: upgrading"), None)
    kvctl_start_s = (first["started_ms"] / 1e3 - intent_s - t0 / 1e9
                     if intent_s is not None and first.get("started_ms") else None)
    ends = [n.get("ended_ms", 0) for n in plan["nodes"]]
    starts = [n.get("started_ms", 0) for n in plan["nodes"]]
    rolls.append({"trial": int(trial), "build": f"{frm}->{to}", "time_s": (t1 - t0) / 1e9,
                  "kvctl_run_s": run_s, "kvctl_start_s": kvctl_start_s,
                  "between_nodes_s": [(starts[i + 1] - ends[i]) / 1e3 for i in range(len(ends) - 1)],
                  "after_last_s": t1 / 1e9 - ends[-1] / 1e3 if ends and ends[-1] else None,
                  "nodes": nodes})

med = lambda v: statistics.median(v) if v else None
ids = sorted({n for r in rolls for n in r["nodes"]})
per_node = {}
for n in ids:
    b = [r["nodes"][n]["blackout_ms"] for r in rolls if r["nodes"][n]["blackout_ms"] is not None]
    o = [r["nodes"][n]["own_blackout_ms"] for r in rolls
         if r["nodes"][n]["own_blackout_ms"] is not None]
    per_node[n] = {"median_ms": med(b), "max_ms": max(b) if b else None,
                   "own_median_ms": med(o), "own_max_ms": max(o) if o else None}
every = [r["nodes"][n]["blackout_ms"] for r in rolls for n in ids
         if r["nodes"][n]["blackout_ms"] is not None]
every_own = [r["nodes"][n]["own_blackout_ms"] for r in rolls for n in ids
             if r["nodes"][n]["own_blackout_ms"] is not None]
s_black = med([s["blackout_ms"] for s in single if s["blackout_ms"] is not None])
s_exit = med([s["signal_to_old_exit_ms"] for s in single])
s_kvctl = med([s["kvctl_start_to_old_exit_ms"] for s in single])
s_done = med([s["signal_to_complete_ms"] for s in single if s["signal_to_complete_ms"] is not None])
s_tail = med([s["exit_logged_to_gone_ms"] for s in single if s["exit_logged_to_gone_ms"] is not None])
r_wall = med([r["time_s"] for r in rolls])
r_time = med([r["kvctl_run_s"] for r in rolls if r["kvctl_run_s"] is not None])
nn = len(ids)
ratio = lambda a, b: a / b if a is not None and b else None
res = {
    "config": {"trials": len(rolls), "singles": len(single), "gate_s": gate_s, "nodes": nn,
               "clients": clients, "depth": depth, "keys": keys, "workload": "A",
               "distribution": "uniform", "op_timeout_ms": 5000},
    "single_blackout_ms": s_black,
    "single_signal_to_old_exit_ms": s_exit,
    "single_kvctl_start_to_old_exit_ms": s_kvctl,
    "single_exit_logged_to_gone_ms": s_tail,
    "single_signal_to_complete_ms": s_done,
    "roll_blackout_ms": per_node,
    "roll_blackout_median_ms": med(every),
    "roll_blackout_own_median_ms": med(every_own),
    "roll_time_s": r_time,
    "roll_wall_s": r_wall,
    "roll_node_upgrade_ms": med([r["nodes"][n]["upgrade_ms"] for r in rolls for n in ids
                                 if r["nodes"][n]["upgrade_ms"] is not None]),
    "roll_between_nodes_s": med([x for r in rolls for x in r["between_nodes_s"]]),
    "roll_time_budget_complete_s": (nn * s_done / 1000 + nn * gate_s) if s_done is not None else None,
    "roll_time_budget_s": (nn * s_exit / 1000 + nn * gate_s) if s_exit is not None else None,
    "roll_blackout_ratio": ratio(med(every), s_black),
    "roll_blackout_own_ratio": ratio(med(every_own), s_black),
    "roll_time_ratio": ratio(r_time, nn * s_exit / 1000 + nn * gate_s) if s_exit is not None else None,
    "roll_wall_time_ratio": ratio(r_wall, nn * s_exit / 1000 + nn * gate_s) if s_exit is not None else None,
    "roll_time_over_complete_ratio": ratio(r_time, nn * s_done / 1000 + nn * gate_s)
    if s_done is not None else None,
    "ops": load["ops"], "failed_ops": load["failed_ops"], "failed_by_node": failed,
    "linearizable": hrc == 0, "kvhistory_rc": hrc,
    "single": single, "rolls": rolls,
}
# The targets' rows (deploy/bench/targets.json, table "roll").
res["roll"] = [
    {"figure": "roll_blackout_ratio", "value": res["roll_blackout_ratio"], "trials": len(rolls),
     "gate_s": gate_s, "place": "one guest",
     "measured": f"{res['roll_blackout_ratio']:.2f}x ({med(every):.0f} / {s_black:.0f} ms)"
     if res["roll_blackout_ratio"] is not None else "-"},
    {"figure": "roll_time_ratio", "value": res["roll_time_ratio"], "trials": len(rolls),
     "gate_s": gate_s, "place": "one guest",
     "measured": f"{res['roll_time_ratio']:.2f}x ({r_time:.1f} / {res['roll_time_budget_s']:.1f} s)"
     if res["roll_time_ratio"] is not None else "-"},
    {"figure": "failed_ops", "value": load["failed_ops"], "trials": len(rolls), "gate_s": gate_s,
     "place": "one guest", "measured": str(load["failed_ops"])},
]
json.dump(res, open(os.path.join(out, "bench-roll.json"), "w"), indent=1)

f1 = lambda v, d=0: "-" if v is None else f"{v:.{d}f}"
print("| figure | value | baseline / goal |")
print("| --- | --- | --- |")
for n in ids:
    p = per_node[n]
    print(f"| node {n}'s blackout in a roll | median {f1(p['median_ms'])} ms, max {f1(p['max_ms'])} ms "
          f"(own upgrade: median {f1(p['own_median_ms'])}, max {f1(p['own_max_ms'])} ms) | "
          f"b alone: median {f1(s_black)} ms |")
print(f"| roll_blackout_ratio | {f1(res['roll_blackout_ratio'], 2)}x "
      f"(own upgrade only: {f1(res['roll_blackout_own_ratio'], 2)}x) | <= 1.5 |")
print(f"| roll time (kvctl's clock) | median {f1(r_time, 1)} s "
      f"({', '.join(f1(r['kvctl_run_s'], 1) for r in rolls)}); with kvctl's exec and exit "
      f"{f1(r_wall, 1)} s; per node intent -> done {f1(res['roll_node_upgrade_ms'])} ms, "
      f"done -> next intent {f1(res['roll_between_nodes_s'], 1)} s | "
      f"{nn} x {f1(s_exit)} ms signal -> old exit + {nn} x {gate_s} s gate = "
      f"{f1(res['roll_time_budget_s'], 1)} s |")
print(f"| roll_time_ratio | {f1(res['roll_time_ratio'], 2)}x (wall: {f1(res['roll_wall_time_ratio'], 2)}x; "
      f"against signal -> upgrade complete: {f1(res['roll_time_over_complete_ratio'], 2)}x) | <= 1.2 |")
print(f"| b alone: signal -> old exit | median {f1(s_exit)} ms (from kvctl's start {f1(s_kvctl)} ms; "
      f"old's 'exit 0' logged -> gone {f1(s_tail)} ms) | signal -> upgrade complete "
      f"(RocksDB open in the new process) {f1(s_done)} ms |")
print(f"| operations, failed | {load['ops']}, {load['failed_ops']} | 0 failed |")
print(f"| history (kvhistory) | {'linearizable' if hrc == 0 else f'NOT linearizable (exit {hrc})'} | "
      f"linearizable |")
sys.exit(0 if hrc == 0 and load["failed_ops"] == 0 else 1)
PY
  echo "figures: $out/bench-roll.json"
  ((rc == 0)) || echo "bench-roll.sh: operations failed or the history is not linearizable (see above)" >&2
  exit "$rc"
fi

if [[ $mode != --no-build ]]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$build" -j 2 --target kvnode kvload kvctl kvhistory kvnode_admin_request \
    kvnode_key_owner
fi
if kv_active_device >/dev/null; then
  KVNODE_BUILD_DIR=$build exec deploy/bench/bench-roll.sh --inner
fi
settings=(KVNODE_BUILD_DIR="$build")
for v in BENCH_OUT BENCH_TRIALS BENCH_GATE_S BENCH_KEYS BENCH_CLIENTS BENCH_DEPTH BENCH_TTL; do
  [[ -z ${!v:-} ]] || settings+=("$v=${!v}")
done
exec deploy/vm/rxe-vm --rw "$build" --timeout "${BENCH_VM_TIMEOUT:-$((300 + 150 * trials))}" -- \
  env "${settings[@]}" "$PWD/deploy/bench/bench-roll.sh" --inner
