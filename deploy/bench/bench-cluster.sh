#!/usr/bin/env bash
# The cluster's costs, in one run on a verbs device (in deploy/vm/rxe-vm when
# the host has none): etcd on loopback and three nodes a, b, c, started by
# tests/e2e/lib.sh's kv_cluster_start (the e2e tests' harness). Not a test:
# it prints a table and writes BENCH_OUT/bench-cluster.json.
#
#   get        GET p50 through ClusterClient (kvload --cluster) against a
#              plain Client to the same node (kvload --server), same keys,
#              one client at depth 1, workload C, BENCH_GET_S s each,
#              alternated BENCH_REPS times: the map first gives node a every
#              slot (epoch 2), so both read the same node's arena. The ratio
#              is the median of the per-rep ratios.
#   map        a map epoch change (a CAS on the stored map, made by
#              kvnode_map_probe, which also holds BENCH_PROBE_CLIENTS
#              ClusterClients) until every client has the new epoch:
#              BENCH_CHANGES changes; p50/p99/max per client and for the
#              slowest client of each change
#   loss       kvload --cluster --history (4 clients, depth 4, YCSB A,
#              uniform, 5 s deadline) for BENCH_STEADY_S s, then SIGKILL of
#              node b: the time from b's last answered operation to its
#              slots' first failed one, and the p99 latency of a's and c's
#              operations in that window against their p99 in the steady
#              stretch before it (the history's one clock; kvnode_key_owner
#              names each key's node); and from the kill to kvload's first
#              SHARD_UNAVAILABLE (its log's time; the lease TTL is BENCH_TTL s)
#
#   deploy/bench/bench-cluster.sh                 build in build/, run (VM if needed)
#   KVNODE_BUILD_DIR=DIR deploy/bench/bench-cluster.sh --no-build
#   BENCH_OUT=DIR        raw output and the JSON [BUILD/bench-cluster]
#   BENCH_KEYS [10000] BENCH_REPS [3] BENCH_GET_S [5] BENCH_CHANGES [20]
#   BENCH_PROBE_CLIENTS [8] BENCH_STEADY_S [5] BENCH_TTL [3]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source deploy/lib.sh
build=${KVNODE_BUILD_DIR:-$PWD/build}
mode=${1:-}

if [[ $mode == --inner ]]; then
  export KVNODE_BUILD_DIR=$build KV_ETCD_TTL=${BENCH_TTL:-3}
  # The e2e harness: etcd and cluster start, kv_fail on a missed deadline.
  source tests/e2e/lib.sh
  out=${BENCH_OUT:-$build/bench-cluster}
  rm -rf "$out"
  mkdir -p "$out"
  keys=${BENCH_KEYS:-10000}
  reps=${BENCH_REPS:-3}
  get_s=${BENCH_GET_S:-5}
  kv_require_device
  kv_cluster_start 3
  stored=$(kv_etcdctl get "/kvnode/$KV_CLUSTER/map" --print-value-only)
  put_map() { kv_etcdctl put "/kvnode/$KV_CLUSTER/map" "$1" >/dev/null || kv_fail "put map"; }
  every_epoch() {
    local i
    for i in "${!KV_C_IDS[@]}"; do kv_node_stat_is "$i" cluster_map_epoch "$1" || return 1; done
  }

  echo "== get: node a owns every slot (map epoch 2); $keys keys preloaded through the cluster"
  put_map "$(sed -e 's/"epoch":1,/"epoch":2,/' -e 's/"ranges":\[.*\]/"ranges":[[0,"a"]]/' <<<"$stored")"
  kv_wait_for 30 every_epoch 2 || kv_fail "map epoch 2 not on every node"
  seeds=$(kv_cluster_seeds)
  "$KV_KVLOAD" --cluster "$seeds" --auth_token_file "$KV_TOKEN" --keys "$keys" --preload \
    --ops 1 --progress=false >"$out/preload.log" 2>&1 || kv_fail "preload (see $out/preload.log)"
  for ((r = 1; r <= reps; r++)); do
    for how in cluster direct; do
      target=(--cluster "$seeds")
      [[ $how == direct ]] && target=(--server "127.0.0.1:${KV_C_PORT[0]}")
      "$KV_KVLOAD" "${target[@]}" --auth_token_file "$KV_TOKEN" --keys "$keys" --workload C \
        --clients 1 --threads 1 --depth 1 --duration "$get_s" --progress=false \
        --report "$out/get-$how-$r.json" >"$out/get-$how-$r.log" 2>&1 ||
        kv_fail "get $how rep $r (see $out/get-$how-$r.log)"
    done
    echo "   rep $r done"
  done

  echo "== map: ${BENCH_CHANGES:-20} epoch changes, ${BENCH_PROBE_CLIENTS:-8} ClusterClients"
  put_map "$(sed 's/"epoch":1,/"epoch":3,/' <<<"$stored")"
  kv_wait_for 30 every_epoch 3 || kv_fail "map epoch 3 (the even split again) not on every node"
  "$KV_BUILD/tests/e2e/kvnode_map_probe" --seeds "$seeds" --auth_token_file "$KV_TOKEN" \
    --etcd_endpoints "$KV_ETCD_ENDPOINTS" --cluster "$KV_CLUSTER" \
    --clients "${BENCH_PROBE_CLIENTS:-8}" --changes "${BENCH_CHANGES:-20}" \
    --report "$out/map.json" >"$out/map.log" 2>&1 || kv_fail "kvnode_map_probe (see $out/map.log)"

  echo "== loss: ${BENCH_STEADY_S:-5} s steady, then SIGKILL of node b (lease TTL $KV_ETCD_TTL s)"
  ranges=$(kv_cluster_ranges)
  kv_cluster_load loss --keys "$keys" --workload A --distribution uniform --clients 4 --depth 4 \
    --history "$out/loss.tsv" --timeout_ms 5000
  kv_nap "${BENCH_STEADY_S:-5}" # the benchmark's steady stretch (pacing, not a synchronisation)
  t_kill=$EPOCHREALTIME
  kv_cluster_node_kill 1
  unavailable() { grep -aq SHARD_UNAVAILABLE "$KV_LOAD_LOG"; }
  kv_wait_for $((KV_ETCD_TTL + 30)) unavailable || kv_fail "no SHARD_UNAVAILABLE after b's loss"
  kv_cluster_more_puts 100 "b's loss" 0 2
  kv_cluster_load_stop lenient
  cp "$KV_LOAD_LOG" "$out/loss.log"
  cp "$KV_LOAD_REPORT" "$out/loss.json"
  "$KV_BUILD/tests/e2e/kvnode_key_owner" --ranges "$ranges" "$out/loss.tsv" >"$out/loss-owners.tsv"
  kv_cluster_stop

  python3 - "$out" "$reps" "$t_kill" <<'PY'
import datetime, json, os, statistics, sys
out, reps, t_kill_wall = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])

def p(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q / 100 * len(v)))] if v else None

get = {"cluster_p50_us": [], "direct_p50_us": [], "ratios": []}
for r in range(1, reps + 1):
    c = json.load(open(os.path.join(out, f"get-cluster-{r}.json")))["latency_us"]["read"]["p50"]
    d = json.load(open(os.path.join(out, f"get-direct-{r}.json")))["latency_us"]["read"]["p50"]
    get["cluster_p50_us"].append(c)
    get["direct_p50_us"].append(d)
    get["ratios"].append(c / d)
get["ratio"] = statistics.median(get["ratios"])
probe = json.load(open(os.path.join(out, "map.json")))

ops = []  # (owner, call_ns, return_ns, outcome)
for line in open(os.path.join(out, "loss-owners.tsv")):
    if line.startswith("#") or not line.strip():
        continue
    f = line.rstrip("\n").split("\t")
    ops.append((f[7], int(f[3]), int(f[4]), f[5]))
b_ok = [o[2] for o in ops if o[0] == "b" and o[3] != "failed"]
t_kill = max(b_ok)  # b's last answer: b answered without pause until the kill
b_failed = [o[2] for o in ops if o[0] == "b" and o[3] == "failed" and o[2] > t_kill]
t_su = min(b_failed)  # b's first failed operation (a deadline or SHARD_UNAVAILABLE)
first_su_ms = None  # kvload's first SHARD_UNAVAILABLE line (glog, local time) since the kill
for line in open(os.path.join(out, "loss.log"), errors="replace"):
    if "SHARD_UNAVAILABLE" in line and line[:1] == "E":
        t = datetime.datetime.strptime(line[1:25], "%Y%m%d %H:%M:%S.%f").timestamp()
        first_su_ms = (t - t_kill_wall) * 1000
        break
win = [(o[2] - o[1]) / 1e3 for o in ops if o[0] != "b" and o[3] != "failed"
       and o[1] >= t_kill and o[2] <= t_su]
span = t_su - t_kill
steady = [(o[2] - o[1]) / 1e3 for o in ops if o[0] != "b" and o[3] != "failed"
          and t_kill - 2 * span <= o[1] and o[2] < t_kill]
loss = {"to_first_failure_ms": span / 1e6, "to_shard_unavailable_ms": first_su_ms,
        "window_ops": len(win),
        "other_p99_window_us": p(win, 99), "other_p99_steady_us": p(steady, 99),
        "steady_ops": len(steady)}
res = {"get": get, "map": probe, "loss": loss}
json.dump(res, open(os.path.join(out, "bench-cluster.json"), "w"), indent=1)
print("| figure | value | baseline (same run) |")
print("| --- | --- | --- |")
print(f"| GET p50, ClusterClient | {statistics.median(get['cluster_p50_us']):.1f} us "
      f"(ratio {get['ratio']:.2f}) | plain Client to the same node "
      f"{statistics.median(get['direct_p50_us']):.1f} us |")
print(f"| map epoch change -> every client | p50 {probe['every_client_ms']['p50']:.1f} ms, "
      f"p99 {probe['every_client_ms']['p99']:.1f} ms | per client p99 "
      f"{probe['client_ms']['p99']:.1f} ms |")
print(f"| node loss -> its slots' first failed op | {loss['to_first_failure_ms']:.0f} ms | "
      f"op deadline 5000 ms, lease TTL |")
su = loss["to_shard_unavailable_ms"]
print(f"| node loss -> first SHARD_UNAVAILABLE | {su if su is None else round(su)} ms | lease TTL |")
# No operation of a or c may complete in the window: each kvload client's
# depth is shared by every node, and b's operations can hold all of it.
w99 = loss["other_p99_window_us"]
print(f"| other slots' p99 in that window | "
      f"{'none completed' if w99 is None else f'{w99:.0f} us'} "
      f"({loss['window_ops']} ops) | steady {loss['other_p99_steady_us']:.0f} us |")
PY
  echo "figures: $out/bench-cluster.json"
  exit 0
fi

if [[ $mode != --no-build ]]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$build" -j 2 --target kvnode kvload kvctl kvnode_admin_request \
    kvnode_key_owner kvnode_map_probe
fi
if kv_active_device >/dev/null; then
  KVNODE_BUILD_DIR=$build exec deploy/bench/bench-cluster.sh --inner
fi
settings=(KVNODE_BUILD_DIR="$build")
for v in BENCH_OUT BENCH_KEYS BENCH_REPS BENCH_GET_S BENCH_CHANGES BENCH_PROBE_CLIENTS \
  BENCH_STEADY_S BENCH_TTL; do
  [[ -z ${!v:-} ]] || settings+=("$v=${!v}")
done
exec deploy/vm/rxe-vm --rw "$build" -- env "${settings[@]}" "$PWD/deploy/bench/bench-cluster.sh" --inner
