#!/usr/bin/env bash
# A node's restart after kill -9, under load: the dirty arena taken back
# ("recovered") against the same restart with the arena removed first, so
# that it is rebuilt from RocksDB (what every restart after a crash did
# before). One node, KEYS keys preloaded, then TRIALS rounds of each mode
# alternating: kvload (YCSB A, 4 clients x depth 4, op deadline 30 s) runs, the
# node is SIGKILLed and started again with the same flags; measured: kill ->
# the node answers ping, the clients' longest gap (kvload's blackout_ms) and
# failed operations, and the node's own start phases. Prints a table and
# writes JSON. Needs a verbs device (run it in deploy/vm/rxe-vm).
#
#   deploy/vm/rxe-vm --memory 2048 -- deploy/bench/bench-restart.sh [--no-build]
#   env: KVNODE_BUILD_DIR (default build), KEYS (20000), TRIALS (3),
#        ARENA_MB (256), OUT (results JSON, default /tmp/bench-restart.json)
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,15p' "$0"; exit 0; }
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export KVNODE_BUILD_DIR=${KVNODE_BUILD_DIR:-$root/build}
source "$root/tests/e2e/lib.sh"
kv_require_device
keys=${KEYS:-20000}
trials=${TRIALS:-3}
arena=$((${ARENA_MB:-256} << 20))
out=${OUT:-/tmp/bench-restart.json}

kv_start_node --sync_writes=true --arena_size "$arena"
port=${KV_ADDR##*:}
load() { # SECONDS REPORT [--preload]
  "$KV_KVLOAD" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --workload A --clients 4 \
    --threads 2 --depth 4 --keys "$keys" --value_size 64 --duration "$1" --timeout_ms 30000 \
    --connect_timeout_ms 30000 --report "$2" --progress=false "${@:3}" >"$2.log" 2>&1
}
load 5 "$KV_DIR/preload.json" --preload || kv_fail "preload: $(tail -3 "$KV_DIR/preload.json.log")"

restart() { # MODE N: SIGKILL, then start again; sets ms (kill -> ping)
  kill -KILL "$KV_PID"
  { wait "$KV_PID" || true; } 2>/dev/null
  local t0 t1
  t0=$(kv_now_ns)
  [[ $1 == rebuilt ]] && rm -f "/dev/shm/$KV_SHM"
  KV_LOG="$KV_DIR/kvnode-$2.log"
  "$KV_NODE_BIN" --listen "127.0.0.1:$port" --db_path "$KV_DIR/db" --shm_name "$KV_SHM" \
    --admin_socket "$KV_ADMIN" --auth_token_file "$KV_TOKEN" --pid_file "$KV_DIR/pid" \
    --arena_size "$arena" --sync_writes=true --max_clients 16 >"$KV_LOG" 2>&1 &
  KV_PID=$!
  kv_wait_for 300 kv_admin ping || kv_fail "restart $2 did not answer ping"
  t1=$(kv_now_ns)
  ms=$(((t1 - t0) / 1000000))
}

rows=()
n=0
for ((t = 1; t <= trials; t++)); do
  for mode in recovered rebuilt; do
    n=$((n + 1))
    rep="$KV_DIR/trial-$n.json"
    base=$(kv_stat ops_put)
    load 12 "$rep" &
    lp=$!
    progressed() { [[ $(kv_stat ops_put) -ge $((base + 200)) ]]; }
    kv_wait_for 60 progressed || kv_fail "trial $n: no load"
    restart "$mode" "$n"
    wait "$lp" || kv_fail "trial $n: kvload failed: $(tail -3 "$rep.log")"
    opened=$(grep -oE "arena [^ ]+ (recovered|rebuilt|reattached) " "$KV_LOG" | awk '{print $3}')
    phases=$(grep -oE "start: serving .*" "$KV_LOG" | head -1)
    read -r gap failed < <(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["blackout_ms"], r["failed_ops"])' "$rep")
    kv_log "trial $n $mode: opened_as=$opened kill->ping ${ms} ms, longest gap ${gap} ms, failed $failed; $phases"
    [[ $opened == "$mode" ]] || kv_fail "trial $n: wanted $mode, the node says '$opened'"
    rows+=("{\"mode\":\"$mode\",\"kill_to_ping_ms\":$ms,\"blackout_ms\":$gap,\"failed_ops\":$failed}")
  done
done
kv_stop_node
(IFS=,; echo "{\"keys\":$keys,\"arena_bytes\":$arena,\"trials\":[${rows[*]}]}") >"$out"
python3 - "$out" <<'PY'
import json, statistics, sys
r = json.load(open(sys.argv[1]))
by = {}
for t in r["trials"]:
    by.setdefault(t["mode"], []).append(t)
print(f"restart after kill -9, {r['keys']} keys, arena {r['arena_bytes'] >> 20} MiB (median of {len(by['recovered'])})")
print(f"{'mode':10} {'kill->ping ms':>14} {'longest gap ms':>15} {'failed':>7}")
med = {}
for m, ts in by.items():
    med[m] = statistics.median(t["kill_to_ping_ms"] for t in ts)
    print(f"{m:10} {med[m]:14.0f} {statistics.median(t['blackout_ms'] for t in ts):15.0f} "
          f"{sum(t['failed_ops'] for t in ts):7d}")
print(f"recovered / rebuilt kill->ping: {med['recovered'] / med['rebuilt']:.2f}")
PY
