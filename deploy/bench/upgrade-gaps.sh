#!/usr/bin/env bash
# Where a live upgrade's gaps fall: one node under YCSB A (kvload, 4 clients,
# depth 4, --sync_writes), one live upgrade after the preload, then kvload's
# longest gaps (any op, GETs, writes) and every 10 ms timeline slot with few
# completions or a slow one, beside the node's upgrade log lines, so that a
# gap can be set against the phase it falls in. Not a test, not a benchmark:
# a diagnostic. Needs a verbs device (run it in deploy/vm/rxe-vm).
#
#   deploy/vm/rxe-vm --memory 2048 --cpus 1 -- deploy/bench/upgrade-gaps.sh
#   env: KVNODE_BUILD_DIR (default build), GAPS_KEYS (10000), GAPS_S (12),
#        GAPS_NODE_FLAGS (extra kvnode flags), GAPS_WORKLOAD (A; C: GETs only),
#        GAPS_SCHED (1: a scheduler trace, `perf sched record -g`, from 8 s
#        before the signal to kvload's end; then every kvload client thread
#        off the CPU > 20 ms, every kvload or kvnode thread runnable but not
#        run > 5 ms, where it left the CPU, every window in which no vCPU
#        switched tasks, in wall-clock times to set against the node's log,
#        and every task that ran during kvload's longest gap)
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,17p' "$0"; exit 0; }
root=$(cd "$(dirname "$0")/../.." && pwd)
export KVNODE_BUILD_DIR=${KVNODE_BUILD_DIR:-$root/build}
source "$root/tests/e2e/lib.sh"
source "$root/tests/e2e/upgrade_lib.sh"
kv_require_device
bins=$(mktemp -d /tmp/gaps-bins.XXXXXX)
up_make_builds "$bins"
KV_NODE_BIN=$bins/kvnode-a
# shellcheck disable=SC2086
kv_start_node --sync_writes=true ${GAPS_NODE_FLAGS:-}
report=$KV_DIR/report.json
"$KV_KVLOAD" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --workload "${GAPS_WORKLOAD:-A}" --clients 4 \
  --threads 2 --depth 4 --keys "${GAPS_KEYS:-10000}" --value_size 64 --preload \
  --duration "${GAPS_S:-12}" --report "$report" --progress=false >"$KV_DIR/kvload.log" 2>&1 &
lp=$!
clients_are() { [[ $(kv_stat clients) == "$1" ]]; }
preloaded() { grep -q "preloaded" "$KV_DIR/kvload.log"; }
kv_wait_for 120 clients_are 4 || kv_fail "clients did not connect"
kv_wait_for 600 preloaded || kv_fail "no preload"
sched=
if [[ ${GAPS_SCHED:-0} == 1 ]] && command -v perf >/dev/null; then
  [[ -d /sys/kernel/tracing/events ]] || mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
  kv_nap 3
  sched=$KV_DIR/sched.data
  # CLOCK_MONOTONIC stamps (perf refuses CLOCK_REALTIME), set against the
  # node's wall-clock log lines through one offset; -g: where each thread
  # blocked.
  mono_to_wall=$(python3 -c 'import time; print(time.time() - time.monotonic())')
  perf sched record -a -g -k mono -o "$sched" >"$KV_DIR/sched.log" 2>&1 &
  sp=$!
  kv_nap 8 # perf sched record takes seconds to start under TCG
else
  kv_nap 4
fi
kv_log "signal at $(date +%T.%N)"
kill -USR2 "$KV_PID"
wait "$lp" || true
if [[ -n $sched ]]; then
  kill -INT "$sp" 2>/dev/null || true
  wait "$sp" 2>/dev/null || true
  perf sched timehist -i "$sched" >"$KV_DIR/timehist.txt" 2>"$KV_DIR/timehist.err" || true
  [[ -s $KV_DIR/timehist.txt ]] || cat "$KV_DIR/sched.log" "$KV_DIR/timehist.err"
  # timehist columns: time, cpu, task, wait time, sch delay, run time (ms),
  # then where the task left the CPU. Every kvload thread that was off the
  # CPU for > 20 ms other than in a futex wait (its busy-polling client
  # threads never sleep; its reporter does), and every kvload or kvnode
  # thread runnable and not run for > 5 ms. The node's control threads
  # sleep by design and are not listed.
  echo "threads off the CPU > 20 ms or runnable but not run > 5 ms (wall clock of the switch back in):"
  awk -v off="$mono_to_wall" '($3 ~ /kvload/ && $4 + 0 > 20 && $7 !~ /futex/) || ($3 ~ /kvload|kvnode/ && $5 + 0 > 5) {
    w = $1 + off; cmd = "date -u -d @" int(w) " +%T"; cmd | getline t; close(cmd)
    line = sprintf("%s.%06d %-16s wait %8s ms sch delay %7s ms run %7s ms", t, (w - int(w)) * 1e6, $3, $4, $5, $6)
    for (i = 7; i <= NF && i <= 40; ++i) line = line " " $i
    print line
  }' "$KV_DIR/timehist.txt" | head -80 || true
  # A window in which neither vCPU switched tasks although they were busy
  # (the next switch is not out of idle) is the emulator standing still,
  # not the guest's scheduler: every task in it appears to have run throughout.
  echo "windows > 40 ms without a task switch on any vCPU (the guest stood still), wall clock of their start:"
  awk -v off="$mono_to_wall" 'NR > 3 && $1 + 0 > 0 {
    if (last > 0 && $1 - last > 0.04 && $3 !~ /idle/) {
      w = last + off; cmd = "date -u -d @" int(w) " +%T"; cmd | getline t; close(cmd)
      printf "%s.%06d %4.0f ms (then %s, which ran %s ms)\n", t, (w - int(w)) * 1e6, ($1 - last) * 1000, $3, $6
    }
    last = $1
  }' "$KV_DIR/timehist.txt" | head -40 || true
fi
python3 - "$report" "${sched:+$KV_DIR/timehist.txt}" "${mono_to_wall:-0}" <<'PY'
import json, sys, time
r = json.load(open(sys.argv[1]))
t0 = r["start_unix_s"]  # the timeline's t = 0 on the wall clock, as the node's log


def wall(ms):
    return time.strftime("%H:%M:%S", time.gmtime(t0 + ms / 1000)) + ".%03d" % ((t0 * 1000 + ms) % 1000)


print("blackout %.1f ms at %.0f ms (%s UTC); GETs %.1f ms; writes %.1f ms at %.0f ms (%s UTC)" % (
    r["blackout_ms"], r["blackout_start_ms"], wall(r["blackout_start_ms"]), r["blackout_read_ms"],
    r["blackout_write_ms"], r["blackout_write_start_ms"], wall(r["blackout_write_start_ms"])))
for s in r["timeline"]:
    if s["ops"] < 5 or s["max_latency_us"] > 200000:
        print("slot %7.0f ms (%s): ops %4d reads %4d writes %4d max latency %8.0f us" % (
            s["t_ms"], wall(s["t_ms"]), s["ops"], s["reads"], s["writes"], s["max_latency_us"]))
if sys.argv[2]:
    # Every stint on a vCPU that overlapped the longest gap (timehist: a line
    # per switch out, its run time before it): what kept kvload off both.
    mono0 = t0 - float(sys.argv[3])
    g0 = mono0 + r["blackout_start_ms"] / 1000 - 0.002
    g1 = g0 + r["blackout_ms"] / 1000 + 0.004
    print("on the vCPUs during the longest gap (switch-out time, cpu, task, run ms, where it left):")
    for line in open(sys.argv[2]):
        f = line.split()
        try:
            end, run = float(f[0]), float(f[5]) / 1000
        except (ValueError, IndexError):
            continue
        if end >= g0 and end - run <= g1:
            print("  %+8.1f ms %s %-20s run %7s %s" % ((end - g0) * 1000 - 2, f[1], f[2], f[5],
                                                      " ".join(f[6:40])))
PY
# The node's upgrade steps and the moved clients' new sessions, beside each
# client's own "moved" line: a move's time runs from O's Move to the client's.
{
  grep -E "upgrade:|takeover:|replayed|session ready" "$KV_LOG"
  grep -E "kvclient: client [0-9]+ (moved|told to move)" "$KV_DIR/kvload.log"
} | sort -k2,2 | cut -c1-300
KV_PID=$(up_ping_field pid) # the new process serves now
kv_wait_for 60 up_not_in_progress || kv_fail "upgrade still in progress"
echo "phases (upgrade_last_phase_seconds, ms): $(up_phases)"
up_stop_node
