#!/usr/bin/env bash
# Live-upgrade refusals and kills, each under 4 kvload --verify clients:
#  A. an incompatible new binary (--upgrade_test_incompatible=layout, given only
#     to N through a wrapper) is refused before any client notices: rollback
#     counted, generation unchanged, no client reconnected or moved;
#     a second request during an upgrade is refused; one right after it works;
#  B. SIGKILL of N before it owns RocksDB (N hung at n_ready): O serves on;
#  C. SIGKILL of O right after the handoff (O hung at o_move_clients): N serves
#     on, O's clients reconnect to it.
# Every scenario: zero failed operations, zero verify errors, ack-log audit.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/upgrade_lib.sh"
kv_require_device
real=$KV_BUILD/node/kvnode
kv_tmpdir upgrade-refusals-bins
bins=$KV_TMP
printf '#!/bin/sh\nexec "%s" "$@" --upgrade_test_incompatible=layout\n' "$real" >"$bins/incompatible"
chmod 755 "$bins/incompatible"

children_of() { cat /proc/"$1"/task/*/children 2>/dev/null || true; }
start_load() {
  "$KV_KVLOAD" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --workload A --clients 4 \
    --threads 2 --depth 4 --keys 1000 --value_size 64 --preload --duration 100000 --verify \
    --ack_log "$KV_DIR/acks.log" --report "$KV_DIR/report.json" --progress=false \
    --connect_timeout_ms 5000 --timeout_ms 30000 >"$KV_DIR/kvload.log" 2>&1 &
  LOAD_PID=$!
  kv_wait_for 120 kv_stat_is clients 4 || kv_fail "clients did not connect"
}
finish_load() { # finish_load WHAT
  kill -INT "$LOAD_PID"
  local rc=0
  wait "$LOAD_PID" || rc=$?
  [[ $rc -eq 0 ]] || { tail "$KV_DIR/kvload.log" >&2; kv_fail "$1: kvload exited $rc"; }
  python3 - "$KV_DIR/report.json" "$1" <<'PY' || kv_fail "$1: report"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["failed_ops"] == 0 and r["verify_errors"] == 0 and r["stale_reads"] == 0, r
print(f"{sys.argv[2]}: {r['ops']} ops, failed 0, verify errors 0, stale 0, "
      f"moves {r['client']['moves']}, reconnects {r['client']['reconnects']}")
PY
  "$KV_KVLOAD" --audit "$KV_DIR/acks.log" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" \
    >"$KV_DIR/audit.log" 2>&1 || kv_fail "$1: ack-log audit failed"
}
rollbacks_are() { [[ $(kv_stat rollbacks) == "$1" ]]; }
kill_all() { for p in "$@"; do kill -KILL "$p" 2>/dev/null || true; done; }

# --- A ---------------------------------------------------------------------------
kv_start_node "${UP_NODE_FLAGS[@]}" --upgrade_binary="$bins/incompatible"
UP_FIRST_PID=$KV_PID
start_load
accepted=$(kv_stat sessions_accepted)
t0=$(date +%s%N)
kill -USR2 "$KV_PID"
kv_wait_for 60 rollbacks_are 1 || kv_fail "A: incompatible binary not rolled back"
kv_log "A: incompatible binary refused and rolled back in $((($(date +%s%N) - t0) / 1000000)) ms"
v=$(kv_stat upgrade_incompatible_refused_total)
[[ ${v%.*} == 1 ]] || kv_fail "A: not counted as incompatible ($v)"
grep -q "arena_layout_version: expected" "$KV_LOG" || kv_fail "A: N did not say which field"
[[ $(up_ping_field generation) == 1 ]] || kv_fail "A: generation changed"
[[ $(kv_stat sessions_accepted) == "$accepted" ]] || kv_fail "A: a client noticed (new sessions)"
kv_wait_for 30 up_not_in_progress || kv_fail "A: still in progress"

# --no_wait: the SIGUSR2 must come while this upgrade runs.
"$KV_KVCTL" --admin_socket "$KV_ADMIN" upgrade --no_wait --binary "$real" >/dev/null ||
  kv_fail "A: kvctl upgrade"
kill -USR2 "$KV_PID"
kv_wait_for 30 kv_stat_at_least upgrade_refused_total 1 || kv_fail "A: second request not refused"
grep -q "refused: an upgrade is already in progress" "$KV_LOG" || kv_fail "A: refusal not logged"
kv_wait_for 90 up_generation_is 2 || kv_fail "A: the first upgrade did not complete"
old=$UP_FIRST_PID
kv_wait_for 30 up_gone "$old" || kv_fail "A: old process alive"
wait "$old" || kv_fail "A: old process exited non-zero"
kv_wait_for 30 up_not_in_progress || kv_fail "A: upgrade not finished"
KV_PID=$(up_ping_field pid)
"$KV_KVCTL" --admin_socket "$KV_ADMIN" upgrade --binary "$real" >/dev/null ||
  kv_fail "A: request right after an upgrade refused"
kv_wait_for 90 up_generation_is 3 || kv_fail "A: the upgrade right after did not complete"
kv_wait_for 30 kv_stat_is clients 4 || kv_fail "A: clients did not all move"
finish_load A
KV_PID=$(up_ping_field pid)
kv_wait_for 30 up_not_in_progress || true
up_stop_node
kv_ok "A: incompatible refused unnoticed; second request refused; next one works"

# --- B ---------------------------------------------------------------------------
kv_start_node "${UP_NODE_FLAGS[@]}" --upgrade_fault=n_ready:hang
UP_FIRST_PID=$KV_PID
start_load
kill -USR2 "$KV_PID"
hung() { grep -q "injected hang at n_ready" "$KV_LOG"; }
kv_wait_for 60 hung || kv_fail "B: N did not reach n_ready"
n_pid=$(children_of "$KV_PID")
[[ -n $n_pid ]] || kv_fail "B: no child N"
t0=$(date +%s%N)
kill -KILL $n_pid
kv_wait_for 30 rollbacks_are 1 || kv_fail "B: O did not roll back after N was killed"
kv_log "B: N ($n_pid) killed before owning RocksDB; O rolled back in $((($(date +%s%N) - t0) / 1000000)) ms"
[[ $(up_ping_field pid) == "$KV_PID" ]] || kv_fail "B: O does not serve"
finish_load B
up_stop_node
kv_ok "B: SIGKILL of N before it owned RocksDB: O serves on"

# --- C ---------------------------------------------------------------------------
kv_start_node "${UP_NODE_FLAGS[@]}" --upgrade_fault=o_move_clients:hang
UP_FIRST_PID=$KV_PID
o_pid=$KV_PID
start_load
kill -USR2 "$o_pid"
kv_wait_for 90 up_generation_is 2 || kv_fail "C: N did not take over"
ohung() { grep -q "injected hang at o_move_clients" "$KV_LOG"; }
kv_wait_for 30 ohung || kv_fail "C: O did not reach o_move_clients"
t0=$(date +%s%N)
kill -KILL "$o_pid"
wait "$o_pid" 2>/dev/null || true
KV_PID=$(up_ping_field pid)
kv_wait_for 60 kv_stat_is clients 4 || kv_fail "C: clients did not reconnect to N"
kv_log "C: O killed after the handoff; clients on N after $((($(date +%s%N) - t0) / 1000000)) ms"
finish_load C
kv_wait_for 30 up_not_in_progress || kv_fail "C: N did not finish the upgrade"
up_stop_node
kv_ok "C: SIGKILL of O right after the handoff: N serves on"
echo "upgrade_refusals: PASS"
