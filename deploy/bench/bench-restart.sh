#!/usr/bin/env bash
# A node's restart after kill -9, under load: the dirty arena taken back
# ("recovered") against the same restart with the arena removed first
# ("cold": the start builds it from RocksDB, as every restart after a crash
# did before), and against a live upgrade of the same node (SIGUSR2, the
# baseline a crash is measured by). One node, KEYS keys written by kvfill
# straight into its RocksDB before its first start, then
# TRIALS rounds of each mode: kvload (YCSB A, 4 clients x depth 4, op
# deadline 30 s) runs; the node is SIGKILLed and started again with the same
# flags, or sent SIGUSR2. Measured: kill (signal) -> the new process answers
# ping, the clients' longest gap (kvload's blackout_ms) and failed
# operations, and the node's own start (or upgrade) phases. Prints a table
# and writes JSON. Needs a verbs device (run it in deploy/vm/rxe-vm).
#
#   deploy/vm/rxe-vm --memory 2048 -- deploy/bench/bench-restart.sh [--no-build]
#   env: KVNODE_BUILD_DIR (default build), KEYS (20000), TRIALS (3),
#        ARENA_MB (256), OUT (results JSON, default build/bench-restart.json:
#        the guest's /tmp does not outlive it)
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,18p' "$0"; exit 0; }
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export KVNODE_BUILD_DIR=${KVNODE_BUILD_DIR:-$root/build}
source "$root/tests/e2e/lib.sh"
source "$root/tests/e2e/upgrade_lib.sh"
kv_require_device
keys=${KEYS:-20000}
trials=${TRIALS:-3}
arena=$((${ARENA_MB:-256} << 20))
out=${OUT:-$KVNODE_BUILD_DIR/bench-restart.json}

kv_tmpdir bench-restart
KV_DIR=$KV_TMP
KV_SHM="kvnode-bench-restart-$$"
KV_ADMIN="$KV_DIR/admin/admin.sock"
KV_TOKEN="$KV_DIR/token"
(umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$KV_TOKEN")
kv_free_port
KV_ADDR=127.0.0.1:$KV_PORT
t0=$(kv_now_ns)
"$KV_BUILD/tools/kvfill" --db_path "$KV_DIR/db" --keys "$keys" --key_size 16 --value_size 64 \
  >"$KV_DIR/kvfill.log" 2>&1 || kv_fail "kvfill: $(tail -3 "$KV_DIR/kvfill.log")"
kv_log "kvfill: $keys keys in $((($(kv_now_ns) - t0) / 1000000)) ms"

# Starts the node on the same port, RocksDB, shm name and admin socket; its
# log is kvnode-N.log. Sets KV_PID.
spawn() { # N
  KV_LOG="$KV_DIR/kvnode-$1.log"
  "$KV_NODE_BIN" --listen "$KV_ADDR" --db_path "$KV_DIR/db" --shm_name "$KV_SHM" \
    --admin_socket "$KV_ADMIN" --auth_token_file "$KV_TOKEN" --pid_file "$KV_DIR/pid" \
    --arena_size "$arena" --sync_writes=true --max_clients 16 >"$KV_LOG" 2>&1 &
  KV_PID=$!
}
t0=$(kv_now_ns)
spawn 0
kv_wait_for 600 kv_admin ping || kv_fail "the first start did not answer ping"
kv_log "cold start (the arena built from RocksDB): $((($(kv_now_ns) - t0) / 1000000)) ms"
load() { # SECONDS REPORT
  "$KV_KVLOAD" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --workload A --clients 4 \
    --threads 2 --depth 4 --keys "$keys" --value_size 64 --duration "$1" --timeout_ms 30000 \
    --connect_timeout_ms 30000 --report "$2" --progress=false >"$2.log" 2>&1
}

generation_is_not() { [[ $(up_ping_field generation) != "$1" ]]; }
# A live upgrade (SIGUSR2); sets ms (signal -> the new process answers ping).
upgrade() {
  local gen t0
  gen=$(up_ping_field generation)
  t0=$(kv_now_ns)
  kill -USR2 "$KV_PID"
  kv_wait_for 300 generation_is_not "$gen" || kv_fail "upgrade $1: no new generation"
  ms=$((($(kv_now_ns) - t0) / 1000000))
  KV_PID=$(up_ping_field pid)
}
restart() { # MODE N: SIGKILL, then start again; sets ms (kill -> ping)
  kill -KILL "$KV_PID"
  # After an upgrade the node is not this shell's child: wait until it is gone.
  { wait "$KV_PID" || true; } 2>/dev/null
  kv_wait_for 30 kv_gone "$KV_PID" || kv_fail "pid $KV_PID outlived SIGKILL"
  local t0 t1
  t0=$(kv_now_ns)
  [[ $1 == cold ]] && rm -f "/dev/shm/$KV_SHM"
  spawn "$2"
  kv_wait_for 300 kv_admin ping || kv_fail "restart $2 did not answer ping"
  t1=$(kv_now_ns)
  ms=$(((t1 - t0) / 1000000))
}

rows=()
n=0
for ((t = 1; t <= trials; t++)); do
  for mode in upgrade recovered cold; do
    n=$((n + 1))
    rep="$KV_DIR/trial-$n.json"
    base=$(kv_stat ops_put)
    load 12 "$rep" &
    lp=$!
    progressed() { [[ $(kv_stat ops_put) -ge $((base + 200)) ]]; }
    kv_wait_for 60 progressed || kv_fail "trial $n: no load"
    if [[ $mode == upgrade ]]; then
      upgrade "$n"
    else
      restart "$mode" "$n"
    fi
    wait "$lp" || kv_fail "trial $n: kvload failed: $(tail -3 "$rep.log")"
    if [[ $mode == upgrade ]]; then
      opened=upgrade
      phases=$(grep -oE "upgrade: generation [0-9]+ complete.*" "$KV_LOG" | tail -1)
    else
      # "created": with no arena (cold), the start builds one from RocksDB.
      opened=$(grep -oE "arena [^ ]+ (recovered|rebuilt|reattached|created) " "$KV_LOG" |
        awk '{print $3}' | sed 's/^created$/cold/' || true)
      phases="$(grep -oE "start: serving .*" "$KV_LOG" | head -1); store: $(grep -oE \
        "[0-9]+ records replayed from the WAL, in .*" "$KV_LOG" | head -1)"
    fi
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
print(f"cold / recovered kill->ping: {med['cold'] / med['recovered']:.2f}")
print(f"recovered kill->ping / live upgrade signal->ping: {med['recovered'] / med['upgrade']:.2f}")
PY
