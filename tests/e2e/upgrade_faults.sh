#!/usr/bin/env bash
# Fault matrix of the live upgrade: for each PHASE:ACTION cell (ACTION = crash |
# hang | fail; phases in docs/upgrade.md section 8), a fresh node armed with
# --upgrade_fault=PHASE:ACTION (N inherits it), 4 kvload clients (YCSB A,
# depth 4, --verify, op deadline KV_OP_TIMEOUT_MS, default 30 s; 60 s,
# KV_RESTART_OP_TIMEOUT_MS, for n_journal and n_replay), one SIGUSR2,
# then the outcome the protocol promises for that cell:
#   rollback  O serves on as generation 1 (rollbacks = 1, writes resumed)
#   takeover  generation 2 serves (N took over, alone if O died before HandOver)
#             and completes the upgrade: RocksDB open, its write journal
#             replayed and removed (O closed it and said Released, or N opened
#             it after O's exit, killing an O that overran
#             --upgrade_old_exit_deadline_ms)
#   restart   nothing serves in the end, and the node is started again on the
#             same RocksDB (what systemd would do); clients reconnect. Either O
#             died before N existed (o_spawn:crash), or N exited after Owned
#             without RocksDB (n_journal, n_replay: the fault itself, or N's
#             deadline for opening RocksDB after a hang): the restart replays
#             the write journal N left, which must hold writes for n_replay
#             (the count is the line's "replayed")
#   rollback  also when O's upgrade thread hangs (o_spawn, o_pause, o_flush,
#             o_handover): O's watchdog rolls back in its place once the step
#             is 2 s past its deadline (--upgrade_step_deadline_ms, here 15 s;
#             once writes are paused --upgrade_write_pause_limit_ms, here 15 s,
#             below kvload's op deadline)
# and then: kvload's failed ops / verify errors / stale reads, the ack-log audit
# and `kvctl check` (the arena against RocksDB)
# on the surviving node, and the recovery time (signal -> outcome observed; for
# a restart, -> the restarted node answers).
# One line per cell in $KV_FAULT_REPORT (default $TMPDIR/upgrade_faults.txt).
# Each cell's directory (RocksDB, ack log) and shared memory are removed after
# the cell: 39 cells' data filled the guest's tmpfs. A failing cell's logs
# (node, kvload, audit, reports; the ack log too when the audit failed) are
# kept in $KV_FAULT_LOGS/CELL (default: the report's name without .txt, plus
# -logs).
#
#   KV_FAULT_CELLS="n_ready:crash o_flush:crash"   cells to run (default: a CI
#                                                   subset; "all" = 17 x 3)
#   KV_FAULT_SYNC_WRITES=true   the node's --sync_writes (default false). With
#                               true, a write's window between RocksDB and the
#                               arena is the whole fsync, so an O killed while
#                               writes flow (o_pause:crash) dies inside one;
#                               N must republish it (the arena's write intent).
#                               And n_replay:crash is N dead after it
#                               acknowledged fdatasync'd journal records,
#                               before RocksDB: the cold start must have each
#                               one (audit), none twice (verify).
# ACTION sigkill (n_journal, n_replay only; not in "all") is hang for the node,
# and the harness SIGKILLs N once O has exited and N acknowledged 100 writes
# that only its journal holds: N killed before it opened RocksDB, then a
# cold start that must replay them (at least as many as N had acknowledged).
# n_accepting:crash is N killed right after it claimed RocksDB, before any
# write: O must take RocksDB back under a new generation (not reuse versions).
# ACTION killed_in_heap (o_pause only; not in "all") is hang for the node; the
# harness stops O while writes flow, marks the arena as if O had died inside
# its heap allocator (kvnode_arena_heap_busy) and SIGKILLs it: N, alone, must
# not trust the arena and still serve (a cold start that rebuilds it from
# RocksDB), with every acknowledged write there.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/upgrade_lib.sh"
kv_require_device

phases="o_spawn n_attach n_register n_ready o_pause o_flush o_handover n_open_db n_accepting o_owned o_move_clients o_close_db n_journal n_replay o_drain o_dereg o_exit"
cells=${KV_FAULT_CELLS:-"n_ready:crash n_open_db:fail n_accepting:crash o_handover:crash o_move_clients:crash o_flush:hang o_close_db:hang n_replay:crash"}
if [[ $cells == all ]]; then
  cells=""
  for p in $phases; do for a in crash hang fail; do cells+=" $p:$a"; done; done
fi
out=${KV_FAULT_REPORT:-${TMPDIR:-/tmp}/upgrade_faults.txt}
: >"$out"
logs=${KV_FAULT_LOGS:-${out%.txt}-logs}
op_timeout=${KV_OP_TIMEOUT_MS:-30000}
# N dead after Owned: nothing serves writes from O's pause until O has exited
# (after its Move to the dead N timed out) and the restarted node has opened
# RocksDB, replayed the journal and rebuilt the arena: 25-30 s in the TCG
# guest on a busy host (n_journal:crash: writes held 28 s, 8 of them past a
# 30 s deadline). The clients must outwait a restart, not an upgrade.
restart_op_timeout=${KV_RESTART_OP_TIMEOUT_MS:-60000}

expect_for() {
  local p=${1%%:*} a=${1##*:}
  case $p in
    # After Owned (the point of no return) N is the only writer; without
    # RocksDB it exits, and only a restart replays its journal.
    n_journal | n_replay) echo restart ;;
    n_*) echo rollback ;;
    o_spawn) case $a in crash) echo restart ;; *) echo rollback ;; esac ;;
    o_pause | o_flush | o_handover)
      case $a in crash | killed_in_heap) echo takeover ;; *) echo rollback ;; esac ;;
    # o_owned: Owned received, not yet taken in. A failure there rolls back
    # and kills an N that has said Owned. A hang meets two deadlines: O's
    # watchdog (the pause limit + 2 s, 17 s here) and N's for O's exit (10 s
    # after Owned here), which kills the hung O first: a takeover.
    o_owned) case $a in fail) echo rollback ;; *) echo takeover ;; esac ;;
    # Past Owned on O's side. o_close_db: O keeps RocksDB open, so N opens it
    # after O's exit (crash, fail) or after killing it (hang).
    *) echo takeover ;;
  esac
}

# PID's descendants (by /proc/*/task/*/children), deepest first.
up_descendants() {
  local c
  for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do
    up_descendants "$c"
    echo "$c"
  done
}

failures=0
for cell in $cells; do
  expect=$(expect_for "$cell")
  action=${cell##*:}
  fault=$cell
  [[ $action == sigkill || $action == killed_in_heap ]] && fault=${cell%%:*}:hang
  killed="" heap_marked=""
  cell_op_timeout=$op_timeout
  case ${cell%%:*} in n_journal | n_replay) cell_op_timeout=$restart_op_timeout ;; esac
  UP_FIRST_PID=""
  KV_NODE_BIN=${KV_BUILD}/node/kvnode
  kv_start_node "${UP_NODE_FLAGS[@]}" --sync_writes="${KV_FAULT_SYNC_WRITES:-false}" \
    --upgrade_fault="$fault" --upgrade_ready_deadline_ms=20000 \
    --upgrade_owned_deadline_ms=20000 --upgrade_old_exit_deadline_ms=10000 \
    --upgrade_step_deadline_ms=15000 --upgrade_write_pause_limit_ms=15000
  UP_FIRST_PID=$KV_PID
  o_pid=$KV_PID
  acks="$KV_DIR/acks.log"
  report="$KV_DIR/report.json"
  "$KV_KVLOAD" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --workload A --clients 4 \
    --threads 2 --depth 4 --keys 1000 --value_size 64 --preload --duration 100000 --verify \
    --ack_log "$acks" --report "$report" --progress=false --connect_timeout_ms 5000 \
    --timeout_ms "$cell_op_timeout" >"$KV_DIR/kvload.log" 2>&1 &
  load_pid=$!
  kv_wait_for 120 kv_stat_is clients 4 || kv_fail "$cell: clients did not connect"
  t_sig=$(date +%s%N)
  kill -USR2 "$o_pid"
  outcome=""
  deadline=$((t_sig + 120 * 1000000000))
  # restart cells: every process that served or could serve (O, N) must be
  # gone before the node is started again. N's pid comes from ping (it answers
  # as generation 2 after Owned) or, if it dies before answering, from O's
  # children while O lives.
  n_pids=""
  while [[ -z $outcome ]] && (($(date +%s%N) < deadline)); do
    ping=$(kv_admin ping 2>/dev/null || true)
    gen=$(grep -o '"generation":[0-9]*' <<<"$ping" | cut -d: -f2 || true)
    n_now=""
    [[ $ping =~ \"pid\":([0-9]+) && $gen == 2 ]] && n_now=${BASH_REMATCH[1]}
    if [[ $expect == restart ]]; then
      n_pids+=" $n_now"
      up_gone "$o_pid" || n_pids+=" $(up_descendants "$o_pid" | tr '\n' ' ')"
      # sigkill: N is stuck before RocksDB (the hang), O is gone, so every
      # write N acknowledged is in its journal only.
      if [[ $action == sigkill && -z $killed && -n $n_now ]] && up_gone "$o_pid"; then
        journaled=$(kv_stat journaled_writes || echo 0)
        if ((journaled >= 100)); then
          kill -KILL "$n_now" 2>/dev/null || true
          killed=$journaled
          kv_log "$cell: SIGKILL of N (pid $n_now) after $journaled journaled writes"
        fi
      fi
    fi
    if [[ $action == killed_in_heap && -z $heap_marked ]] &&
      grep -q "injected hang at ${cell%%:*}" "$KV_LOG"; then
      kill -STOP "$o_pid"
      "$KV_BUILD/tests/e2e/kvnode_arena_heap_busy" --shm_name "$KV_SHM" \
        --arena_size $((32 << 20)) >&2 || kv_fail "$cell: could not mark the arena's heap"
      kill -KILL "$o_pid"
      wait "$o_pid" 2>/dev/null || true  # quietly: its death is the point
      heap_marked=yes
      kv_log "$cell: O (pid $o_pid) stopped, its arena's heap marked busy, SIGKILLed"
    fi
    if [[ $gen == 2 && $expect != restart ]]; then
      outcome=takeover
    elif [[ $gen == 1 ]] && [[ $(kv_stat rollbacks) -ge 1 ]]; then
      outcome=rollback
    elif up_gone "$o_pid" && [[ -z $gen ]] && [[ $expect == restart ]]; then
      outcome=down
      for p in $n_pids; do up_gone "$p" || outcome=""; done
    fi
    [[ -n $outcome ]] || sleep 0.1  # poll interval of a condition with a deadline
  done
  t_out=$(date +%s%N)
  replayed=-
  if [[ $outcome == down ]]; then
    # Nothing serves: start the node again (what systemd would do). Its
    # store replays a write journal left behind before it serves.
    wait "$o_pid" 2>/dev/null || true
    log_lines=$(wc -l <"$KV_LOG")
    "$KV_BUILD/node/kvnode" --listen "$KV_ADDR" --db_path "$KV_DIR/db" --shm_name "$KV_SHM" \
      --admin_socket "$KV_ADMIN" --auth_token_file "$KV_TOKEN" --pid_file "$KV_DIR/pid" \
      --arena_size $((32 << 20)) --sync_writes="${KV_FAULT_SYNC_WRITES:-false}" --max_clients 16 \
      "${UP_NODE_FLAGS[@]}" \
      >>"$KV_LOG" 2>&1 &
    KV_PID=$!
    UP_FIRST_PID=$KV_PID
    kv_wait_for 60 kv_admin ping || kv_fail "$cell: restarted node did not answer"
    t_out=$(date +%s%N)
    outcome=restart
    replayed=$(tail -n +$((log_lines + 1)) "$KV_LOG" |
      grep -o 'replayed [0-9]* journaled writes' | grep -o '[0-9][0-9]*' | head -n 1 || true)
    replayed=${replayed:-0}
  fi
  recovery_ms=$(((t_out - t_sig) / 1000000))
  KV_PID=$(up_ping_field pid || echo "$KV_PID")
  # Let the clients settle on the survivor, then stop the load. A takeover
  # must also complete under that load: N opened RocksDB (writes going on
  # into the journal meanwhile), replayed the journal and removed it.
  kv_wait_for 60 kv_stat_is clients 4 || true
  upgrade_done=yes
  if [[ $outcome == takeover ]]; then
    kv_wait_for 90 up_not_in_progress || upgrade_done=no
    replayed=$(kv_stat journal_replayed || echo '?')
  fi
  kill -INT "$load_pid" 2>/dev/null || true
  wait "$load_pid" || true
  read -r failed verr stale < <(python3 -c '
import json, sys
try:
    r = json.load(open(sys.argv[1])); print(r["failed_ops"], r["verify_errors"], r["stale_reads"])
except Exception:
    print("? ? ?")' "$report")
  # An audit needs a node to read from: with none, it proves nothing lost.
  audit=pass
  if ! kv_admin ping >/dev/null 2>&1; then
    audit=no_node
  elif ! "$KV_KVLOAD" --audit "$acks" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" \
    --report "$KV_DIR/audit.json" >"$KV_DIR/audit.log" 2>&1; then
    audit=FAIL
  fi
  # What serves now, its arena against RocksDB (kvctl check).
  check=n/a
  if [[ $audit == pass && $upgrade_done == yes ]]; then
    check=clean
    "$KV_KVCTL" --admin_socket "$KV_ADMIN" check >"$KV_DIR/check.log" 2>&1 || check=FAIL
  fi
  verdict=ok
  [[ $outcome == "$expect" ]] || verdict=UNEXPECTED
  [[ $audit != FAIL ]] || verdict=LOST_ACKED_WRITE
  [[ $audit != no_node ]] || verdict="${verdict}+nothing_serves"
  [[ $failed == 0 && $verr == 0 && $stale == 0 ]] || verdict="${verdict}+client_errors"
  [[ $upgrade_done == yes ]] || verdict="${verdict}+upgrade_not_complete"
  [[ $check != FAIL ]] || verdict="${verdict}+arena_check"
  if [[ $outcome == takeover || $outcome == restart ]] && [[ -e $KV_DIR/db/kvnode-writes.journal ]]; then
    verdict="${verdict}+journal_left"
  fi
  # n_replay: N died holding acknowledged writes only in its journal; a cell
  # where none was journaled would prove nothing about their replay.
  if [[ ${cell%%:*} == n_replay || $action == sigkill ]] && [[ $outcome == restart && $replayed == 0 ]]; then
    verdict="${verdict}+nothing_journaled"
  fi
  if [[ $action == killed_in_heap ]]; then
    if [[ -z $heap_marked ]]; then
      verdict="${verdict}+not_killed"
    elif ! grep -q 'rebuilding arena ' "$KV_LOG"; then
      verdict="${verdict}+arena_not_rebuilt"
    fi
  fi
  if [[ $action == sigkill ]]; then
    if [[ -z $killed ]]; then
      verdict="${verdict}+not_killed"
    elif [[ $outcome == restart ]] && ((replayed < killed)); then
      verdict="${verdict}+replayed_fewer_than_acknowledged"
    fi
  fi
  # A full disk fails writes (INTERNAL answers): say so rather than blame the
  # protocol (o_move_clients:crash failures were once the guest's full tmpfs).
  if grep -qs 'No space left on device' "$KV_LOG" "$KV_DIR/kvload.log" "$KV_DIR/db/LOG"; then
    verdict="${verdict}+ENOSPC"
  fi
  # Writes a takeover found cut between RocksDB and the arena (the store logs
  # each one it republished): shows whether a cell exercised that window.
  republished=$(cat "$KV_DIR"/*.log 2>/dev/null | grep -c 'republished a key' || true)
  [[ -z $killed ]] || replayed="$replayed (SIGKILL after $killed)"
  line=$(printf '%-22s expect %-8s got %-8s recovery %6d ms  failed %s verify %s stale %s audit %s check %s  republished %s  replayed %s  %s' \
    "$cell" "$expect" "$outcome" "$recovery_ms" "$failed" "$verr" "$stale" "$audit" "$check" \
    "$republished" "$replayed" "$verdict")
  echo "$line" | tee -a "$out" >&2
  [[ $verdict == ok ]] || failures=$((failures + 1))
  # Stop whatever serves now (and a hung O, if any), clean up.
  for p in $(up_descendants "$o_pid") "$o_pid" "$KV_PID"; do kill -KILL "$p" 2>/dev/null || true; done
  kv_wait_for 15 up_gone "$KV_PID" || true
  wait 2>/dev/null || true
  if [[ $verdict != ok ]]; then
    mkdir -p "$logs/$cell"
    cp "$KV_DIR"/*.log "$KV_DIR"/*.json "$logs/$cell/" 2>/dev/null || true
    [[ $audit == pass ]] && rm -f "$logs/$cell/acks.log"
    echo "  logs of $cell kept in $logs/$cell; the node log ends:" >&2
    tail -n 40 "$KV_LOG" | sed 's/^/    /' >&2
  fi
  rm -rf "$KV_DIR"
  rm -f "/dev/shm/$KV_SHM" "/dev/shm/$KV_SHM".*
  KV_PID=""
done
echo "fault matrix report: $out" >&2
cat "$out"
((failures == 0)) || kv_fail "$failures cells failed"
echo "upgrade_faults: PASS"
