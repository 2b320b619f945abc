#!/usr/bin/env bash
# The README's run command: installs the dependencies, builds, starts kvnode
# on a verbs device (inside deploy/vm/rxe-vm, Soft-RoCE, when this host has
# none), preloads keys, runs `kvload --verify` with a live progress line,
# prints the summary and `kvctl stats`, and stops the node cleanly (SIGTERM,
# exit 0).
#
#   deploy/demo.sh                 everything, build in build/
#   DEMO_DURATION=30 deploy/demo.sh   seconds of steady load around the
#                                     upgrades (default 15; plus preload and
#                                     upgrade time)
#   DEMO_UPGRADES=N deploy/demo.sh    live upgrades in the run (default 3)
#   DEMO_KEYS=N deploy/demo.sh        keys preloaded and used (default 10000)
#   KVNODE_BUILD_DIR=DIR deploy/demo.sh   build (and run) in DIR instead
#   deploy/demo.sh --no-build      skip install and build (binaries must exist)
#   deploy/demo.sh --cluster [--no-build]   the cluster instead: etcd, three
#                                  nodes, a node's loss and return under
#                                  kvload --cluster, then a fleet roll under
#                                  load (deploy/demo-cluster.sh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source deploy/lib.sh

build=${KVNODE_BUILD_DIR:-$PWD/build}
inner=(deploy/demo.sh --inner) dur_default=15
if [[ ${1:-} == --cluster ]]; then
  inner=(deploy/demo-cluster.sh) dur_default=4
  shift
fi
mode=${1:-}

# --- inside: a device is present (natively or in the VM) -----------------------
if [[ $mode == --inner ]]; then
  dur=${DEMO_DURATION:-15}
  dir=$(mktemp -d /tmp/kvnode-demo.XXXXXX)
  token="$dir/token"
  (umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$token")
  admin="$dir/admin/admin.sock"
  port=${DEMO_PORT:-7000}
  node_pid=""
  cleanup() {
    if [[ -n $node_pid ]] && kill -0 "$node_pid" 2>/dev/null; then kill -KILL "$node_pid"; fi
    rm -f "/dev/shm/kvnode-demo-$$"
  }
  trap cleanup EXIT
  echo "== starting kvnode on $(kv_active_device) (127.0.0.1:$port, data in $dir)"
  "$build/node/kvnode" --listen "127.0.0.1:$port" --db_path "$dir/db" \
    --shm_name "kvnode-demo-$$" --admin_socket "$admin" --auth_token_file "$token" \
    --arena_size $((64 << 20)) --pid_file "$dir/pid" >"$dir/kvnode.log" 2>&1 &
  node_pid=$!
  deadline=$((SECONDS + 120))
  until "$build/tools/kvctl" --admin_socket "$admin" ping >/dev/null 2>&1; do
    if ! kill -0 "$node_pid" 2>/dev/null || ((SECONDS > deadline)); then
      echo "kvnode did not come up:"
      tail -20 "$dir/kvnode.log"
      exit 1
    fi
    sleep 0.1 # polling a condition under a deadline
  done
  "$build/tools/kvctl" --admin_socket "$admin" ping
  kvctl() { "$build/tools/kvctl" --admin_socket "$admin" "$@"; }
  ping_field() { kvctl --json ping | grep -o "\"$1\":[0-9]*" | cut -d: -f2; }
  # Every wait below has a deadline; a missed one shows what the node and
  # kvload said instead of hanging until the VM's timeout.
  fail() {
    echo "demo: $*"
    echo "== last lines of kvnode's log ($dir/kvnode.log)"
    tail -40 "$dir/kvnode.log"
    echo "== last lines of kvload's log"
    tail -10 "$dir/kvload.log"
    exit 1
  }
  upgrades=${DEMO_UPGRADES:-3}
  keys=${DEMO_KEYS:-10000}
  echo "== kvload: preload $keys keys, then YCSB A with --verify (8 clients, depth 4);"
  echo "   $upgrades live upgrades (SIGUSR2) in the middle of the run"
  "$build/tools/kvload" --server "127.0.0.1:$port" --auth_token_file "$token" \
    --workload A --keys "$keys" --value_size 64 --clients 8 --threads 2 --depth 4 --preload \
    --duration 100000 --verify --ack_log "$dir/acks.log" --report "$dir/report.json" \
    --connect_timeout_ms 5000 --timeout_ms 30000 --progress=false >"$dir/kvload.log" 2>&1 &
  load_pid=$!
  until [[ $(kvctl --json stats | grep -o '"clients":[0-9]*' | cut -d: -f2) == 8 ]]; do
    sleep 0.2 # polling a condition (kvload connected) under kvload's own deadline
    kill -0 "$load_pid" || { tail "$dir/kvload.log"; exit 1; }
  done
  # kvload's timeline (and its operation counts) start when its preload ends,
  # which it logs: the upgrades come after that, and their windows are placed
  # on the timeline from that moment.
  until grep -aq '^kvload: preloaded' "$dir/kvload.log"; do
    sleep 0.05 # polling a condition (preload done) under kvload's own deadlines
    kill -0 "$load_pid" || { tail "$dir/kvload.log"; exit 1; }
  done
  t_base=$(date +%s%N)
  # Steady load before, between and after the upgrades fills DEMO_DURATION.
  steady_ms=$((dur * 1000 / (upgrades + 1)))
  steady=${DEMO_STEADY_S:-$((steady_ms / 1000)).$(printf %03d $((steady_ms % 1000)))}
  sleep "$steady" # steady load before the first upgrade (the demo's pacing)
  windows=()
  idle() { [[ $(kvctl --json stats) == *'"upgrade_in_progress":false'* ]]; }
  at_generation() { [[ $(ping_field generation) == "$1" ]]; }
  for ((i = 1; i <= upgrades; i++)); do
    # A signal during the previous upgrade's tail (the new process opening
    # RocksDB) would be refused: start each upgrade from an idle node.
    kv_await 120 idle || fail "upgrade $((i - 1)) still in progress after 120 s"
    old=$(ping_field pid)
    gen=$(ping_field generation)
    t0=$(date +%s%N)
    kill -USR2 "$old"
    kv_await 120 at_generation $((gen + 1)) ||
      fail "no generation $((gen + 1)) within 120 s of upgrade $i's signal"
    new=$(ping_field pid)
    kv_await 120 kv_gone "$old" || fail "old process $old still alive 120 s after the signal"
    t1=$(date +%s%N)
    [[ $old == "$node_pid" ]] && { wait "$node_pid" || echo "old process exited non-zero"; }
    windows+=("$i $old $new $t0 $t1")
    echo "   upgrade $i: pid $old -> $new (generation $((gen + 1))), old process exited" \
      "$(((t1 - t0) / 1000000)) ms after the signal"
    sleep "$steady" # pacing between upgrades
  done
  node_pid=$(ping_field pid)
  kill -INT "$load_pid"
  rc=0
  wait "$load_pid" || rc=$?
  echo "== per upgrade (blackout = longest stretch without a completed operation, 10 ms slots)"
  # One python start for the whole summary (each costs seconds in the TCG
  # guest). No backslash or reused quote inside an f-string's braces: Python
  # 3.11 (Debian 12's) rejects both, and tests/deploy/python_syntax_test.py
  # checks every embedded snippet for that.
  python3 - "$dir/report.json" "$t_base" "${windows[@]}" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
base = int(sys.argv[2])
slot = r["timeline_slot_ms"]
for w in sys.argv[3:]:
    i, old, new, t0, t1 = w.split()
    lo, hi = (int(t0) - base) / 1e6, (int(t1) - base) / 1e6 + 1000
    gap = run = mx = 0.0
    for s in r["timeline"]:
        if s["t_ms"] + slot < lo or s["t_ms"] > hi:
            continue
        mx = max(mx, s["max_latency_us"])
        run = run + slot if s["ops"] == 0 else 0.0
        gap = max(gap, run)
    print(f"   upgrade {i}: blackout {gap:.0f} ms, max op latency {mx / 1000:.1f} ms, "
          f"failed ops {r['failed_ops']} (whole run), pid {old} -> {new}")
print(f"== kvload: {r['ops']} ops, failed {r['failed_ops']}, verify errors {r['verify_errors']}, "
      f"stale reads {r['stale_reads']}, moves {r['client']['moves']}")
PY
  echo "== kvctl stats"
  kvctl stats
  echo "== stopping kvnode (SIGTERM to pid $node_pid)"
  kill -TERM "$node_pid"
  kv_await 60 kv_gone "$node_pid" || fail "kvnode $node_pid still alive 60 s after SIGTERM"
  grep -E "kvnode: exit" "$dir/kvnode.log" | tail -1 || true
  echo "kvload exited $rc; report: $dir/report.json"
  ((rc == 0))
  exit 0
fi

# --- outside: install, build, then run here or in the VM ------------------------
if [[ $mode != --no-build ]]; then
  deploy/install-deps.sh
  echo "== configure and build ($build)"
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$build" -j "$(nproc)" --target kvnode kvload kvctl
fi
if dev=$(kv_active_device); then
  echo "== verbs device $dev found: running natively"
  KVNODE_BUILD_DIR=$build exec "${inner[@]}"
fi
echo "== no verbs device on this host: running in deploy/vm/rxe-vm (Soft-RoCE rxe0 in a QEMU guest)"
exec deploy/vm/rxe-vm --rw "$build" -- env KVNODE_BUILD_DIR="$build" \
  DEMO_DURATION="${DEMO_DURATION:-$dur_default}" "$PWD/${inner[0]}" "${inner[@]:1}"
