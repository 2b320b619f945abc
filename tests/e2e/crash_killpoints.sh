#!/usr/bin/env bash
# Crash kill points outside upgrades: nothing acknowledged may be lost. Under
# kvload --verify write load (YCSB A with 10% of writes DELETEs, --ack_log), the
# node is SIGKILLed ITERATIONS times (default 5) at a random kill point and
# restarted on the same port, RocksDB and shared-memory name (the killed node's
# arena is dirty: the restart takes it back, "recovered", and rebuilds it from
# RocksDB only when a check fails, e.g. a kill inside the heap allocator; at
# least one restart must have taken it back). Kill points, picked at random:
#   writes    once the node has acknowledged a random number (1..400) more
#             writes since it started: anywhere in the write path
#   ready     as soon as a restarted node answers ping, while the clients are
#             reconnecting and resending what was in flight
#   recovery  a restarted node is killed again as soon as it has opened
#             RocksDB and taken back (or rebuilt) the arena, before it serves
# Restarts alternate --sync_writes=true and =false (CRASH_SYNC=true|false to
# pin one). A process kill loses nothing in either mode: RocksDB appends each
# write to its WAL with write(2) before the node acknowledges it, so the
# bytes are in the kernel's page cache when the process dies (only a machine
# or kernel crash can lose the unsynced tail with --sync_writes=false; see
# docs/security.md). Checked: kvload sees zero failed operations, zero
# verification errors and zero stale reads across every restart; after the
# load stops, one more SIGKILL and restart, then `kvload --audit` of the ack
# log: every acknowledged write is readable at its version or newer, every
# acknowledged DELETE reads NOT_FOUND or newer. After every restart `kvctl
# check` (under the load) must find the arena and RocksDB in agreement: no
# key a reader of the arena would miss or read stale. Finally a clean SIGTERM
# with no leaked verbs objects.
source "$(dirname "$0")/lib.sh"
kv_require_device

iterations=${ITERATIONS:-5}
sync_pin=${CRASH_SYNC:-}
seed=${CRASH_SEED:-$RANDOM}
RANDOM=$seed
kv_log "ITERATIONS=$iterations, seed $seed (CRASH_SEED=$seed reproduces the kill points)"

kv_start_node --sync_writes=true
port=${KV_ADDR##*:}
dir=$KV_DIR
acks="$dir/acks.log"
report="$dir/report.json"
restarts=0
sync_now=true

# Starts the node on the same port, RocksDB, shm name and admin socket.
# $1: --sync_writes value. Sets KV_PID, KV_LOG (a new log per start).
spawn_node() {
  restarts=$((restarts + 1))
  KV_LOG="$dir/kvnode-$restarts.log"
  "$KV_NODE_BIN" --listen "127.0.0.1:$port" --db_path "$dir/db" --shm_name "$KV_SHM" \
    --admin_socket "$KV_ADMIN" --auth_token_file "$KV_TOKEN" --pid_file "$dir/pid" \
    --arena_size $((32 << 20)) --sync_writes="$1" --max_clients 16 >"$KV_LOG" 2>&1 &
  KV_PID=$!
}
next_sync() {
  if [[ -n $sync_pin ]]; then
    sync_now=$sync_pin
  elif [[ $sync_now == true ]]; then
    sync_now=false
  else
    sync_now=true
  fi
}
kill9() {
  kill -KILL "$KV_PID"
  local rc=0
  { wait "$KV_PID"; } 2>/dev/null || rc=$?  # (no "Killed" job notice)
  [[ $rc -eq 137 ]] || kv_fail "node pid $KV_PID exited $rc before its SIGKILL"
}
restart_and_wait() {
  next_sync
  spawn_node "$sync_now"
  kv_wait_for 120 kv_admin ping || kv_fail "restarted node did not answer ping within 120 s"
  arena_checked
}
arena_checked() {
  local out rc=0
  out=$("$KV_KVCTL" --admin_socket "$KV_ADMIN" check 2>&1) || rc=$?
  ((rc == 0)) || kv_fail "kvctl check after restart $restarts (exit $rc): $out"
  kv_log "restart $restarts: $(grep -o '^check: clean in [0-9.]* s: [0-9]* keys' <<<"$out")"
}
store_opened() { grep -q "keys (.* resident), arena" "$KV_LOG"; }
node_died() { ! kill -0 "$KV_PID" 2>/dev/null; }

"$KV_KVLOAD" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --workload A --delete_ratio 0.1 \
  --clients 4 --threads 1 --depth 4 --keys 2000 --value_size 64 --preload --duration 3600 \
  --verify --timeout_ms 120000 --connect_timeout_ms 10000 --ack_log "$acks" --report "$report" \
  --seed "$seed" \
  >"$dir/kvload.out" 2>&1 &
load_pid=$!
progressed() { grep -qE '^\[ +[0-9]+s\] +[1-9]' "$dir/kvload.out"; }
kv_wait_for 120 progressed || { cat "$dir/kvload.out" >&2; kv_fail "kvload made no progress"; }

declare -A points=([writes]=0 [ready]=0 [recovery]=0)
t_start=$(date +%s)
for ((i = 1; i <= iterations; i++)); do
  r=$((RANDOM % 100))
  point=writes
  if ((i > 1 && r < 15)); then
    point=ready
  elif ((r >= 85)); then
    point=recovery
  fi
  case $point in
    writes)
      target=$((1 + RANDOM % 400))
      kv_wait_for 120 kv_stat_at_least ops_put "$target" ||
        kv_fail "iteration $i: the node did not acknowledge $target writes"
      kill9
      ;;
    ready)
      kill9
      ;;
    recovery)
      kill9
      next_sync
      spawn_node "$sync_now"
      kv_wait_for 120 store_opened || kv_wait_for 1 node_died ||
        kv_fail "iteration $i: restarted node never opened its store"
      kill9
      ;;
  esac
  points[$point]=$((points[$point] + 1))
  kill -0 "$load_pid" 2>/dev/null || { tail -n 30 "$dir/kvload.out" >&2; kv_fail "kvload died"; }
  restart_and_wait
  kv_log "iteration $i/$iterations: killed at '$point', restarted (--sync_writes=$sync_now)"
done
t_loop=$(($(date +%s) - t_start))

# The last node serves some writes, then the load stops.
kv_wait_for 120 kv_stat_at_least ops_put 50 || kv_fail "the last node served no writes"
kill -INT "$load_pid"
rc=0
wait "$load_pid" || rc=$?
tail -n 5 "$dir/kvload.out" >&2
python3 - "$report" <<'PY' || kv_fail "kvload report"
import json, sys
r = json.load(open(sys.argv[1]))
bad = {k: r[k] for k in ("failed_ops", "verify_errors", "stale_reads") if r[k] != 0}
assert not bad, f"kvload across the kills: {bad}"
c = r["client"]
print(f"kvload: {r['ops']} ops ({r['writes']} writes) in {r['duration_s']:.0f}s, "
      f"0 failed, 0 verify errors, 0 stale reads; reconnects {c['reconnects']}, "
      f"resends {c['rpc_resends']}")
PY
[[ $rc -eq 0 ]] || kv_fail "kvload exited $rc"

# One more crash with every acknowledged write in the log, then the audit.
kill9
restart_and_wait
rc=0
"$KV_KVLOAD" --audit "$acks" --server "127.0.0.1:$port" --auth_token_file "$KV_TOKEN" \
  --connect_timeout_ms 10000 --report "$dir/audit.json" >"$dir/audit.out" 2>&1 || rc=$?
cat "$dir/audit.out" >&2
[[ $rc -eq 0 ]] || kv_fail "audit of the ack log failed after the last crash (exit $rc)"
recovered=$(cat "$dir"/kvnode-*.log | grep -c "arena .* recovered (") || true
rebuilt=$(cat "$dir"/kvnode-*.log | grep -c "rebuilding arena") || true
kv_log "restarts: $recovered took the dirty arena back, $rebuilt rebuilt it"
((recovered > 0)) || kv_fail "no restart took the dirty arena back (rebuilt $rebuilt times)"
kv_ok "$iterations kill points (writes ${points[writes]}, ready ${points[ready]}, recovery ${points[recovery]}) in ${t_loop}s: no acknowledged write lost, no stale read"
kv_stop_node
echo "crash_killpoints: PASS"
