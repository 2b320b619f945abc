#!/usr/bin/env bash
# `kvctl upgrade` reports how a live upgrade ended, and fails when it rolled
# back (what the unit's ExecReload, and so `systemctl reload`, relies on):
#  A. --binary /bin/false: the new process exits before its Hello and the node
#     rolls back; kvctl exits 1 and prints "rolled back" with the reason; the
#     node serves on as generation 1.
#  B. --no_wait: the answer of the start alone ("started: ... as generation
#     2"), exit 0, even for /bin/false, which then rolls back as in A.
#  C. --timeout_s 2 with a binary that never says Hello: kvctl gives up at its
#     deadline (exit 2) and says the upgrade may still be running; the node
#     rolls back at its Hello deadline.
#  D. a good upgrade (build-a -> build-b): exit 0, "generation 1 -> 2" with
#     both builds and pids, the write pause and the time taken; generation 2
#     serves; then the same with --json: ok true and the new generation.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/upgrade_lib.sh"
kv_require_device
kv_tmpdir upgrade-kvctl-bins
bins=$KV_TMP
up_make_builds "$bins"
printf '#!/bin/sh\nexec sleep 600\n' >"$bins/silent"
chmod 755 "$bins/silent"
KV_NODE_BIN=$bins/kvnode-a
kv_start_node "${UP_NODE_FLAGS[@]}" --upgrade_hello_deadline_ms=8000
UP_FIRST_PID=$KV_PID
o=$KV_PID
kvctl_upgrade() { # OUT ARGS...: kvctl upgrade, its output in OUT, its status in RC
  local out=$1
  shift
  RC=0
  "$KV_KVCTL" --admin_socket "$KV_ADMIN" upgrade "$@" >"$out" 2>&1 || RC=$?
  kv_log "kvctl upgrade $*: exit $RC: $(tr '\n' ' ' <"$out")"
}

# --- A ---------------------------------------------------------------------------
kvctl_upgrade "$KV_DIR/a.out" --binary /bin/false
[[ $RC -eq 1 ]] || kv_fail "A: kvctl upgrade --binary /bin/false exited $RC, expected 1"
grep -q "rolled back" "$KV_DIR/a.out" || kv_fail "A: no rollback reported"
grep -q "Hello" "$KV_DIR/a.out" || kv_fail "A: the reason (no Hello) is missing"
[[ $(kv_stat rollbacks) == 1 ]] || kv_fail "A: rollbacks $(kv_stat rollbacks), expected 1"
up_generation_is 1 && [[ $(up_ping_field pid) == "$o" ]] || kv_fail "A: $o does not serve generation 1"
kv_ok "A: /bin/false: exit 1, $(<"$KV_DIR/a.out")"

# --- B ---------------------------------------------------------------------------
kvctl_upgrade "$KV_DIR/b.out" --no_wait --binary /bin/false
[[ $RC -eq 0 ]] || kv_fail "B: kvctl upgrade --no_wait exited $RC"
grep -q "started: /bin/false as generation 2" "$KV_DIR/b.out" || kv_fail "B: no start reported"
kv_wait_for 30 kv_stat_is rollbacks 2 || kv_fail "B: /bin/false was not rolled back"
kv_wait_for 30 up_not_in_progress || kv_fail "B: the rollback did not finish"
kv_ok "B: --no_wait: exit 0 at the start, the rollback came after"

# --- C ---------------------------------------------------------------------------
t0=$(kv_now_ns)
kvctl_upgrade "$KV_DIR/c.out" --timeout_s 2 --binary "$bins/silent"
ms=$((($(kv_now_ns) - t0) / 1000000))
[[ $RC -eq 2 ]] || kv_fail "C: kvctl exited $RC at its deadline, expected 2"
((ms < 7000)) || kv_fail "C: kvctl took $ms ms with --timeout_s 2"
grep -q "no outcome within 2 s" "$KV_DIR/c.out" || kv_fail "C: the deadline was not explained"
kv_wait_for 60 kv_stat_is rollbacks 3 || kv_fail "C: the silent binary was not rolled back"
kv_wait_for 30 up_not_in_progress || kv_fail "C: the rollback did not finish"
kv_ok "C: --timeout_s 2: exit 2 after $ms ms; the node rolled back at its Hello deadline"

# --- D ---------------------------------------------------------------------------
kvctl_upgrade "$KV_DIR/d.out"
[[ $RC -eq 0 ]] || kv_fail "D: kvctl upgrade exited $RC"
kv_wait_for 90 up_generation_is 2 || kv_fail "D: generation 2 does not serve"
n=$(up_ping_field pid)
for want in "generation 1 -> 2" "build-a" "build-b" "pid $o -> $n" "writes paused"; do
  grep -qF -- "$want" "$KV_DIR/d.out" || kv_fail "D: '$want' missing from the report"
done
kv_wait_for 30 up_gone "$o" || kv_fail "D: old process $o still alive"
wait "$o" || kv_fail "D: old process $o exited non-zero"
KV_PID=$n
kv_wait_for 30 up_not_in_progress || kv_fail "D: upgrade still in progress on $n"
"$KV_KVCTL" --admin_socket "$KV_ADMIN" --json upgrade >"$KV_DIR/d.json" ||
  kv_fail "D: kvctl --json upgrade failed: $(cat "$KV_DIR/d.json")"
python3 - "$KV_DIR/d.json" <<'PY' || kv_fail "D: --json answer: $(cat "$KV_DIR/d.json")"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["ok"] is True and j["old_generation"] == 2 and j["new_generation"] == 3, j
assert j["old_build"] == "build-b" and j["new_build"] == "build-a", j
assert j["write_pause_ms"] >= 0 and j["elapsed_ms"] >= j["write_pause_ms"], j
PY
kv_wait_for 90 up_generation_is 3 || kv_fail "D: generation 3 does not serve"
KV_PID=$(up_ping_field pid)
kv_wait_for 30 up_not_in_progress || kv_fail "D: upgrade to 3 still in progress"
up_stop_node
kv_ok "D: good upgrades: exit 0, $(head -n 1 "$KV_DIR/d.out")"
echo "upgrade_kvctl: PASS"
