#!/usr/bin/env bash
# Admin `drain [SECONDS]` (docs/server.md): the node refuses new sessions and
# live upgrades, keeps serving the clients it has, and exits 0 by itself once
# they have left, with no verbs object, shm segment or admin socket left.
#  1. kvload --verify runs its whole duration across the drain with 0 failed
#     ops; a new client is refused with "draining"; a second drain and an
#     upgrade are refused; then the node exits as kvload leaves.
#  2. A client that never leaves: the node shuts down at the drain deadline
#     (and cuts it).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/upgrade_lib.sh"
kv_require_device

# Waits for the node to exit by itself; checks exit 0 and what it left behind.
drained_exit() {
  local what=$1 rc=0
  kv_wait_for 120 up_gone "$KV_PID" || kv_fail "$what: node still running 120 s after the drain"
  wait "$KV_PID" || rc=$?
  [[ $rc -eq 0 ]] || kv_fail "$what: node exited $rc"
  kv_check_exited
  KV_PID=""
}

# --- 1. clients leave on their own --------------------------------------------
kv_start_node
report="$KV_DIR/report.json"
"$KV_KVLOAD" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --workload A --clients 2 \
  --threads 1 --depth 4 --keys 200 --preload --duration 15 --verify --report "$report" \
  >"$KV_DIR/kvload.out" 2>&1 &
load_pid=$!
progressed() { grep -qE '^\[ +[0-9]+s\] +[1-9]' "$KV_DIR/kvload.out"; }
kv_wait_for 120 progressed || { cat "$KV_DIR/kvload.out"; kv_fail "kvload made no progress"; }
[[ $(kv_admin stats) == *'"draining":false'* ]] || kv_fail "stats: draining is not false before the drain"

out=$("$KV_KVCTL" --admin_socket "$KV_ADMIN" drain 120) || kv_fail "kvctl drain refused: $out"
[[ $out == *"draining"*"2 client(s)"* ]] || kv_fail "kvctl drain printed: $out"
kv_ok "drain accepted: $out"
[[ $(kv_admin stats) == *'"draining":true'* ]] || kv_fail "stats: draining is not true"
grep -q '^kvnode_draining 1' <<<"$(kv_admin metrics)" || kv_fail "metrics: kvnode_draining is not 1"

rc=0
out=$(kv_raw --mode put_get --n 1 2>&1) || rc=$?
[[ $rc -ne 0 && $out == *"draining"* ]] || kv_fail "a new client during the drain: exit $rc, $out"
kv_ok "new client refused: ${out##*: }"
again=$(kv_admin drain)
[[ $again == *'"ok":false'* && $again == *'already draining'* ]] || kv_fail "second drain: $again"
up=$(kv_admin upgrade)
[[ $up == *'"ok":false'* && $up == *'draining'* ]] || kv_fail "upgrade during the drain: $up"
kill -USR2 "$KV_PID"
kv_wait_for 30 grep -q 'live upgrade refused: the node is draining' "$KV_LOG" ||
  kv_fail "SIGUSR2 during the drain was not refused"
kv_ok "second drain, admin upgrade and SIGUSR2 refused"
kill -0 "$load_pid" 2>/dev/null || kv_fail "kvload ended before the checks were done (raise --duration)"

rc=0
wait "$load_pid" || rc=$?
[[ $rc -eq 0 ]] || { cat "$KV_DIR/kvload.out"; kv_fail "kvload exited $rc across the drain"; }
# grep, not python: a python start takes ~6 s in the TCG guest.
report_field() { grep -o "\"$1\": *[0-9]*" "$report" | head -n 1 | grep -o '[0-9]*$'; }
ops=$(report_field ops) failed=$(report_field failed_ops) verr=$(report_field verify_errors)
[[ ${ops:-0} -gt 0 && $failed == 0 && $verr == 0 ]] ||
  kv_fail "kvload across the drain: ops ${ops:-?}, failed ${failed:-?}, verify errors ${verr:-?}"
kv_ok "kvload ran its whole duration across the drain: $ops ops, 0 failed, 0 verify errors"
drained_exit "clients left"
grep -q 'drain: every client has left; shutting down' "$KV_LOG" || kv_fail "no 'every client has left' line"
kv_ok "node exited 0 once kvload had left"

# --- 2. a client that does not leave: the deadline ----------------------------
kv_start_node
kv_raw --mode steady --n 5 --duration_s 600 --key_prefix stay- >"$KV_DIR/steady.out" 2>&1 &
steady_pid=$!
kv_wait_for 120 kv_stat_is clients 1 || kv_fail "steady client did not connect"
t0=$(kv_now_ns)
out=$(kv_admin drain 3)
[[ $out == *'"ok":true'* && $out == *'"clients":1'* ]] || kv_fail "drain 3: $out"
drained_exit "deadline"
ms=$((($(kv_now_ns) - t0) / 1000000))
grep -q 'drain: 1 client(s) still connected at the deadline' "$KV_LOG" || kv_fail "no deadline line"
((ms >= 3000)) || kv_fail "node exited ${ms} ms after 'drain 3', before its deadline"
rc=0
wait "$steady_pid" || rc=$?
[[ $rc -ne 0 ]] || kv_fail "the client that stayed was not cut"
kv_ok "deadline: node exited 0 after ${ms} ms; the client that stayed was cut: $(tail -n 1 "$KV_DIR/steady.out")"
