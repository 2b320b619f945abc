# Helpers for the live-upgrade e2e scripts (source after lib.sh).
#
#   up_make_builds DIR          two wrapper "builds" of kvnode that differ in their
#                               build id and point --upgrade_binary at each other
#   up_gone PID                 true once PID has exited (or is a zombie)
#   up_exit_logged PID          the log says "kvnode: exit 0 (pid PID,"
#   up_upgrade [kill|kvctl]     one live upgrade of the current node: signal, wait for
#                               the next generation, for the old process's exit 0;
#                               sets UP_OLD UP_NEW UP_SIG_NS UP_OWNED_NS UP_EXIT_NS
#   up_stop_node                SIGTERM the current node (not necessarily our child)
#   up_window_stats REPORT T_BASE_NS T0:T1...
#                               blackout and max latency of kvload's timeline in
#                               each window (ns, same clock as T_BASE), one python run

# Node flags of the upgrade e2e tests: the defaults (3 missed keepalives cut a
# session). A client's Move handshake runs from Poll without blocking, so the
# clients that share its thread keep answering keepalives (a blocking one
# starved them into being cut). KV_UP_NODE_FLAGS adds flags (split at
# spaces), e.g. upgrade_hugetlbfs.sh's --arena_path.
read -ra UP_NODE_FLAGS <<<"${KV_UP_NODE_FLAGS:-}"

up_make_builds() {
  local dir=$1 real=${KV_NODE_BIN_REAL:-$KV_BUILD/node/kvnode}
  for b in a b; do
    local other=b bin=$real
    [[ $b == b ]] && other=a
    # KV_NODE_BIN_PREV: build a is that binary (a build of an earlier
    # commit), so that the two builds really differ.
    [[ $b == a ]] && bin=${KV_NODE_BIN_PREV:-$real}
    # The wrapper's flags come last so they win over the inherited argv.
    printf '#!/bin/sh\nexec "%s" "$@" --build_id=build-%s --upgrade_binary=%s\n' \
      "$bin" "$b" "$dir/kvnode-$other" >"$dir/kvnode-$b"
    chmod 755 "$dir/kvnode-$b"
  done
}

# `rdma resource show` names the THREAD that created an object (the data-plane
# thread creates client QPs), so objects are matched against every task of PID.
up_rdma_count() {
  local kind=$1 pid=$2 n=0 t
  local out
  out=$(rdma resource show "$kind" 2>/dev/null || true)
  for t in $(ls "/proc/$pid/task" 2>/dev/null); do
    n=$((n + $(grep -c " pid $t " <<<"$out" || true)))
  done
  echo "$n"
}
# kvnode objects (qp and mr) not owned by a thread of PID (nor by a pid in
# UP_IGNORE_PIDS: objects that existed before the test started).
UP_IGNORE_PIDS=""
up_rdma_foreign() {
  local pid=$1 tids
  tids=" $(ls "/proc/$pid/task" 2>/dev/null | tr '\n' ' ') $UP_IGNORE_PIDS "
  { rdma resource show qp; rdma resource show mr; } 2>/dev/null | grep ' comm kvnode' |
    grep -o ' pid [0-9]*' | awk '{print $2}' | sort -u | while read -r t; do
    [[ $tids == *" $t "* ]] || echo "$t"
  done
}

# Read whole with mapfile (see rss_kib in deploy/bench/soak.sh for why not `read`).
up_gone() {
  local l lines=()
  [[ -e /proc/$1 ]] || return 0
  { mapfile -t lines; } 2>/dev/null <"/proc/$1/status"
  for l in "${lines[@]}"; do
    [[ $l =~ ^State:[[:space:]]+(.) ]] && { [[ ${BASH_REMATCH[1]} == Z ]]; return; }
  done
  return 0 # the status file vanished: gone
}

up_exit_logged() { grep -q "kvnode: exit 0 (pid $1," "$KV_LOG"; }

up_ping_field() {
  local a
  a=$(kv_admin ping) || return 1
  kv_json_num "$a" "$1"
}
up_generation_is() { [[ $(up_ping_field generation) == "$1" ]]; }
up_not_in_progress() { [[ $(kv_admin stats) == *'"upgrade_in_progress":false'* ]]; }
# The last upgrade's phases (upgrade_last_phase_seconds) in ms, one line;
# complete once the upgrade is no longer in progress (O's come with Gone).
up_phases() {
  "$KV_KVCTL" --admin_socket "$KV_ADMIN" metrics |
    sed -nE 's/^kvnode_upgrade_last_phase_seconds\{phase="([^"]*)"\} (.*)/\1 \2/p' |
    awk '{printf "%s%s=%.0f", (NR == 1 ? "" : " "), $1, $2 * 1000}'
}

UP_FIRST_PID=""
# One live upgrade of the node (kill = SIGUSR2, kvctl = the admin command),
# waited for to the end. Sets UP_OLD UP_NEW, UP_SIG_NS UP_OWNED_NS (the new
# generation answers) UP_EXIT_NS (the old process is gone), UP_STATS (the new
# process's stats once no upgrade is in progress) and KV_PID.
up_upgrade() {
  local how=${1:-kill} a gen
  a=$(kv_admin ping) || kv_fail "node does not answer ping before the upgrade"
  gen=$(kv_json_num "$a" generation)
  UP_OLD=$(kv_json_num "$a" pid)
  UP_SIG_NS=$(kv_now_ns)
  if [[ $how == kvctl ]]; then
    "$KV_KVCTL" --admin_socket "$KV_ADMIN" upgrade >/dev/null || kv_fail "kvctl upgrade refused"
  else
    kill -USR2 "$UP_OLD"
  fi
  a=$(kv_admin_until 90 ping "\"generation\":$((gen + 1)),") ||
    kv_fail "generation $((gen + 1)) did not answer within 90 s of the upgrade request"
  UP_OWNED_NS=$(kv_now_ns)
  UP_NEW=$(kv_json_num "$a" pid)
  kv_wait_for 30 up_gone "$UP_OLD" || up_fail "old process $UP_OLD still alive 30 s after Owned"
  UP_EXIT_NS=$(kv_now_ns)
  if [[ $UP_OLD == "$UP_FIRST_PID" ]]; then
    local rc=0
    wait "$UP_OLD" || rc=$?
    [[ $rc -eq 0 ]] || kv_fail "old process $UP_OLD exited $rc"
  fi
  UP_STATS=$(kv_admin_until 30 stats '"upgrade_in_progress":false') ||
    up_fail "upgrade still in progress on $UP_NEW 30 s after the old process exited"
  kv_wait_for 5 up_exit_logged "$UP_OLD" || up_fail "old process $UP_OLD did not log exit 0"
  KV_PID=$UP_NEW
}

# kv_fail, with this upgrade's story first: the log's upgrade, shutdown and
# exit lines since it started (either process).
up_fail() {
  if [[ -f ${KV_LOG:-} ]]; then
    echo "---- this upgrade in the node log (upgrade, shutdown and exit lines)" >&2
    awk '/upgrade: starting/ { n = 0 } { l[n++] = $0 } END { for (i = 0; i < n; i++) print l[i] }' \
      "$KV_LOG" | grep -a 'upgrade\|shutdown\|kvnode: \|session closed' | tail -n 40 >&2 || true
  fi
  kv_fail "$@"
}

up_stop_node() {
  local pid=$KV_PID
  kill -TERM "$pid"
  kv_wait_for "$KV_STOP_TIMEOUT" up_gone "$pid" || kv_fail "node $pid did not exit on SIGTERM"
  [[ $pid == "$UP_FIRST_PID" ]] && { wait "$pid" || kv_fail "node $pid exited non-zero"; }
  kv_wait_for 5 up_exit_logged "$pid" || kv_fail "node $pid did not log exit 0"
  local left
  left=$({ rdma resource show qp; rdma resource show mr; } 2>/dev/null | grep -c ' comm kvnode' || true)
  [[ $left -eq 0 ]] || kv_fail "kernel still lists $left kvnode QPs/MRs"
  KV_PID=""
  kv_ok "node $pid stopped by SIGTERM, exit 0, no verbs objects left"
}

up_window_stats() { # REPORT T_BASE_NS T0:T1 [T0:T1 ...] -> one line per window
  python3 - "$@" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
base = int(sys.argv[2])
slot = r["timeline_slot_ms"]
for i, w in enumerate(sys.argv[3:], 1):
    t0, t1 = (int(x) for x in w.split(":"))
    lo, hi = (t0 - base) / 1e6, (t1 - base) / 1e6
    gap = run = mx = 0.0
    for s in r["timeline"]:
        if s["t_ms"] + slot < lo or s["t_ms"] > hi:
            continue
        mx = max(mx, s["max_latency_us"])
        run = run + slot if s["ops"] == 0 else 0.0
        gap = max(gap, run)
    # Blackout: the longest run of 10 ms slots without a completed operation
    # (slot resolution); then the largest latency completed in the window.
    print(f"upgrade {i}: blackout {gap:.0f} ms, max latency {mx / 1000:.1f} ms")
PY
}
