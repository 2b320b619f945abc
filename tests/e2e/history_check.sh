#!/usr/bin/env bash
# What clients see is linearizable, across the node's worst moments: six
# kvload clients hammer six hot keys (uniform, 50% GETs, 30% of the writes
# DELETEs, writes of one key racing each other: --serial_key_writes=false)
# and record every operation (kvload --history); kvhistory then checks the
# history against a register per key. It catches what --verify and the
# ack-log audit cannot: a GET that sees a value and then an older one, a
# DELETE answered not_found while the key existed, a write applied twice.
# Failed writes count as unknown outcome (applied or not, at any time after
# their call). Cases (HC_CASES, default all three), each on a fresh node:
#   upgrades    a live upgrade by SIGUSR2, a refused one (kvctl upgrade
#               --binary /bin/false: N dies at once, O rolls back and resumes
#               writes), a second SIGUSR2; zero failed operations
#   kill9       SIGKILL of the node and a cold restart on the same port,
#               RocksDB and shm name, HC_KILLS times (default 1; the clients
#               reconnect and retry with their ids; ops that outlive their
#               deadline fail, which the check allows)
#   old_killed  --sync_writes=true and --upgrade_fault=o_pause:crash: the old
#               process _exits while synced writes flow (a write cut between
#               RocksDB and the arena), the new one takes over alone
# Each case also requires the history to hold every kind of answer (PUT ok,
# DELETE ok and not_found, GET of a value and not_found) and ops after each
# event. HC_SAVE=DIR keeps each case's history as DIR/CASE.tsv.
# ~2.5 min in the TCG guest (each node start is ~20 s of it).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/upgrade_lib.sh"
kv_require_device

KV_KVHISTORY=${KV_KVHISTORY:-$KV_BUILD/tools/kvhistory}
cases=${HC_CASES:-"upgrades kill9 old_killed"}
keep=${HC_KEEP:-${TMPDIR:-/tmp}/history_check-failed}

puts_at_least() { kv_stat_at_least ops_put "$1"; }
# Waits until the node serving now has applied N more PUTs than `from`
# (its own counter: 0 after a cold start).
more_puts() { # FROM N WHAT
  kv_wait_for 120 puts_at_least $(($1 + $2)) || kv_fail "$CASE: no writes after $3"
}
puts_now() { kv_stat ops_put || echo 0; }

start_load() { # extra kvload flags...
  "$KV_KVLOAD" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --keys 6 \
    --distribution uniform --read_ratio 0.5 --delete_ratio 0.3 --clients 6 \
    --threads "$(kv_load_threads)" --depth 4 --value_size 64 --serial_key_writes=false \
    --duration 100000 --history "$KV_DIR/history.tsv" --report "$KV_DIR/report.json" \
    --progress=false --connect_timeout_ms 5000 "$@" >"$KV_DIR/kvload.log" 2>&1 &
  LOAD_PID=$!
  kv_wait_for 120 kv_stat_is clients 6 || kv_fail "$CASE: kvload's clients did not connect"
  more_puts 0 100 "kvload started"
}

# Stops kvload (SIGINT: it drains and writes its history) and checks the
# history. $1: "strict" requires zero failed operations; $2: a client counter
# of kvload's report (moves, reconnects) that must be >= $3, proof that the
# clients lived through the event.
check_history() {
  kill -INT "$LOAD_PID"
  local rc=0 h=$KV_DIR/history.tsv
  wait "$LOAD_PID" || rc=$?
  LOAD_PID=""
  if [[ $rc -ne 0 && ($1 == strict || $rc -ne 1) ]]; then
    tail -n 20 "$KV_DIR/kvload.log" >&2
    kv_fail "$CASE: kvload exited $rc"
  fi
  ! grep -a -- "--history:" "$KV_DIR/kvload.log" >&2 || kv_fail "$CASE: the history was not all written"
  python3 - "$KV_DIR/report.json" "$2" "$3" <<'PY' || kv_fail "$CASE: the clients did not see the event"
import json, sys
c = json.load(open(sys.argv[1]))["client"]
assert c[sys.argv[2]] >= int(sys.argv[3]), f"{sys.argv[2]} {c[sys.argv[2]]} < {sys.argv[3]}: {c}"
PY
  # Every kind of answer is in the history: the check cannot pass vacuously.
  local kinds
  kinds=$(awk -F'\t' 'NR > 1 && $6 != "failed" { k[$2 " " $6] = 1 }
    END { for (x in k) print x }' "$h" | sort | tr '\n' ',')
  for want in "DELETE not_found" "DELETE ok" "GET not_found" "GET ok" "PUT ok"; do
    [[ $kinds == *"$want,"* ]] || kv_fail "$CASE: no '$want' in the history ($kinds)"
  done
  local out
  rc=0
  out=$("$KV_KVHISTORY" "$h" 2>&1) || rc=$?
  echo "$out" >&2
  if [[ $rc -ne 0 ]]; then
    mkdir -p "$keep/$CASE"
    cp "$h" "$KV_DIR"/*.log "$keep/$CASE/" 2>/dev/null || true
    kv_fail "$CASE: kvhistory exited $rc (history kept in $keep/$CASE)"
  fi
  [[ -z ${HC_SAVE:-} ]] || { mkdir -p "$HC_SAVE" && cp "$h" "$HC_SAVE/$CASE.tsv"; }
  local failed
  failed=$(awk -F'\t' 'NR > 1 && $6 == "failed"' "$h" | wc -l)
  kv_ok "$CASE: $(($(wc -l <"$h") - 1)) operations ($failed failed) linearizable"
}

stop_node() { # the current node, whoever's child it is; and its leftovers
  kill -TERM "$KV_PID" 2>/dev/null || true
  kv_wait_for "$KV_STOP_TIMEOUT" up_gone "$KV_PID" || kill -KILL "$KV_PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$KV_DIR"
  rm -f "/dev/shm/$KV_SHM" "/dev/shm/$KV_SHM".*
  KV_PID=""
}

case_upgrades() {
  kv_start_node "${UP_NODE_FLAGS[@]}"
  UP_FIRST_PID=$KV_PID
  start_load --timeout_ms 30000
  up_upgrade kill
  more_puts "$(puts_now)" 200 "the first upgrade"
  local rb
  rb=$(kv_stat rollbacks)
  # kvctl waits for the outcome: exit 1 is the rollback it reports.
  local rc=0
  "$KV_KVCTL" --admin_socket "$KV_ADMIN" upgrade --binary /bin/false >/dev/null || rc=$?
  ((rc == 1)) || kv_fail "$CASE: kvctl upgrade --binary /bin/false exited $rc, not 1 (rolled back)"
  kv_wait_for 60 kv_stat_at_least rollbacks $((rb + 1)) || kv_fail "$CASE: /bin/false not rolled back"
  kv_wait_for 30 up_not_in_progress || kv_fail "$CASE: rollback not finished"
  more_puts "$(puts_now)" 200 "the refused upgrade"
  up_upgrade kill
  more_puts "$(puts_now)" 200 "the second upgrade"
  check_history strict moves 12
  stop_node
}

case_kill9() {
  kv_start_node
  local port=${KV_ADDR##*:} i
  # Deadlines shorter than a cold restart: writes in flight at the kill fail,
  # and the check must place each as applied or not (unknown outcome).
  start_load --timeout_ms 2000
  for ((i = 1; i <= ${HC_KILLS:-1}; i++)); do
    kill -KILL "$KV_PID"
    wait "$KV_PID" 2>/dev/null || true
    KV_LOG="$KV_DIR/kvnode-$i.log"
    "$KV_NODE_BIN" --listen "127.0.0.1:$port" --db_path "$KV_DIR/db" --shm_name "$KV_SHM" \
      --admin_socket "$KV_ADMIN" --auth_token_file "$KV_TOKEN" --pid_file "$KV_DIR/pid" \
      --arena_size $((32 << 20)) --sync_writes=false --max_clients 16 >"$KV_LOG" 2>&1 &
    KV_PID=$!
    kv_wait_for 120 kv_admin ping || kv_fail "$CASE: restart $i did not answer ping"
    more_puts 0 200 "restart $i"
    kv_log "$CASE: SIGKILL $i and cold restart; writes flow again"
  done
  check_history lenient reconnects 6
  stop_node
}

case_old_killed() {
  kv_start_node "${UP_NODE_FLAGS[@]}" --sync_writes=true --upgrade_fault=o_pause:crash \
    --upgrade_ready_deadline_ms=20000 --upgrade_owned_deadline_ms=20000 \
    --upgrade_old_exit_deadline_ms=10000 --upgrade_step_deadline_ms=15000 \
    --upgrade_write_pause_limit_ms=15000
  local o_pid=$KV_PID
  start_load --timeout_ms 60000
  kill -USR2 "$o_pid"
  kv_wait_for 120 up_generation_is 2 || kv_fail "$CASE: N did not take over"
  wait "$o_pid" 2>/dev/null || true
  grep -q "injected crash at o_pause" "$KV_LOG" || kv_fail "$CASE: O did not crash at o_pause"
  KV_PID=$(up_ping_field pid)
  kv_wait_for 60 kv_stat_is clients 6 || kv_fail "$CASE: clients did not reconnect to N"
  more_puts "$(puts_now)" 200 "the takeover"
  check_history lenient reconnects 6
  stop_node
}

LOAD_PID=""
for CASE in $cases; do
  t0=$(kv_now_ns)
  "case_$CASE"
  kv_log "$CASE: $((($(kv_now_ns) - t0) / 1000000)) ms"
done
echo "history_check: PASS"
