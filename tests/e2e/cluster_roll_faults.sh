#!/usr/bin/env bash
# A fleet roll's faults (docs/cluster.md, "Fleet roll", the fault matrix),
# three nodes started as build a under `kvload --cluster --verify
# --history` for the whole test:
#   1. a binary that fails on node b (its new process exits at once): b's
#      live upgrade rolls back and b reports it; the roll stops (exit 1),
#      c is untouched, `kvctl cluster status` shows the mixed fleet (a on
#      build b, b and c on build a). The binary fixed, `--resume` finishes.
#   2. kvctl killed (SIGKILL) while a node upgrades: that upgrade finishes on
#      its own and no other starts; `--resume` (once the dead kvctl's lock
#      lease ends) finishes the roll.
#   3. etcd killed (SIGKILL) while a node upgrades: kvctl pauses (exit 3
#      after --etcd_wait_s); the node upgrading finishes, no other starts;
#      etcd back, `--resume` finishes.
#   4. node c's old process killed (an injected crash) past the point of no
#      return of its upgrade: its new process takes over alone, the roll is
#      done.
# The load: zero failed operations, zero verify errors, linearizable.
# ~3.5 min in the guest.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/upgrade_lib.sh"
source "$(dirname "$0")/roll_lib.sh"
kv_require_device

roll_fleet_start
roll_verified_load

# Each node's generation, by its own admin socket (etcd may be down).
generations() {
  local i g=()
  for i in "${!KV_C_IDS[@]}"; do
    g+=("${KV_C_IDS[i]}:$(kv_json_num "$(kv_node_admin "$i" ping)" generation)")
  done
  echo "${g[*]}"
}
expect_nodes() { # WHAT id:gen:build:state...
  local what=$1 now
  shift
  now=$(roll_nodes)
  [[ $now == "$*" ]] || kv_fail "$what: nodes are '$now', not '$*'"
}

# --- 1. A binary that fails on node b. ---------------------------------------
bad="$KV_TEST_DIR/kvnode-c"
cat >"$bad" <<SH
#!/bin/bash
# build c: build b's binary, except that it cannot start as node b.
prev=""
for a in "\$@"; do
  [[ \$prev == --node_id && \$a == b ]] && { echo "kvnode-c: refusing to run as node b" >&2; exit 1; }
  prev=\$a
done
exec "$KV_TEST_DIR/kvnode-b" "\$@"
SH
chmod 755 "$bad"
roll_run bad c --build_id build-b
roll_expect 1 "the roll to a binary that fails on b"
grep -q "b: rolled back" "$ROLL_OUT" || { cat "$ROLL_OUT" >&2; kv_fail "kvctl did not say b rolled back"; }
roll_plan_is stopped a:done b:rolled_back c:pending || kv_fail "the plan: $(kv_etcdctl get "/kvnode/$KV_CLUSTER/roll" --print-value-only)"
expect_nodes "after b's rollback" a:2:build-b:serving b:1:build-a:serving c:1:build-a:serving
status=$(kv_cluster_status)
grep -q "roll r-.*: stopped, 1 of 3 nodes on build 'build-b'" <<<"$status" ||
  kv_fail "kvctl cluster status does not show the stopped roll: $status"
kv_ok "b rolled back, the roll stopped, c untouched; status shows the mixed fleet"
kv_log "$(grep -m1 'rolled back' "$ROLL_OUT")"
# The fix: the binary at the same path works on every node now.
cp "$KV_TEST_DIR/kvnode-b" "$bad"
roll_run resume-bad - --resume
roll_expect 0 "--resume after the fix"
expect_nodes "after the resumed roll" a:2:build-b:serving b:2:build-b:serving c:2:build-b:serving
kv_ok "--resume after the fix: every node on build-b"
kv_cluster_more_puts 50 "the first roll"

# --- 2. kvctl killed while a node upgrades. ----------------------------------
roll_start killed a --gate_s 2
kv_wait_for 60 roll_some_node_upgrading || kv_fail "no node upgrading within 60 s of the roll"
kill -KILL "$ROLL_PID"
roll_wait
kv_log "kvctl killed while a node upgrades: $(generations)"
# The upgrade under way finishes; nobody writes another intent.
kv_wait_for 60 kv_cluster_status_is 3 || kv_fail "not 3 serving after kvctl's death: $KV_STATUS_OUT"
after_kill=$(roll_nodes)
[[ $after_kill == *:build-a:* && $after_kill == *:build-b:* ]] ||
  kv_fail "after kvctl's death: '$after_kill' (one node upgraded, the others not)"
roll_run resume-killed - --resume
roll_expect 0 "--resume after kvctl's death"
expect_nodes "after the resumed roll" a:3:build-a:serving b:3:build-a:serving c:3:build-a:serving
kv_ok "kvctl killed mid-roll; --resume finished it"

# --- 3. etcd killed while a node upgrades. -----------------------------------
roll_start etcd b --gate_s 2 --etcd_wait_s 5
kv_wait_for 60 roll_some_node_upgrading || kv_fail "no node upgrading within 60 s of the roll"
kv_etcd_kill
roll_wait
roll_expect 3 "the roll with etcd gone"
grep -q "the roll is paused" "$ROLL_OUT" || { cat "$ROLL_OUT" >&2; kv_fail "kvctl did not say paused"; }
kv_cluster_more_puts 50 "etcd's loss mid-roll"
gens=$(generations)
[[ $gens == *:4* && $gens == *:3* ]] ||
  kv_fail "with etcd down: generations $gens (the node upgrading finishes, no other starts)"
kv_ok "etcd gone mid-roll: kvctl paused (exit 3), generations $gens"
kv_etcd_restart
kv_wait_for 60 kv_cluster_status_is 3 || kv_fail "not 3 serving after etcd's return: $KV_STATUS_OUT"
roll_run resume-etcd - --resume
roll_expect 0 "--resume after etcd's return"
expect_nodes "after the resumed roll" a:4:build-b:serving b:4:build-b:serving c:4:build-b:serving
kv_ok "etcd back: --resume finished the roll"

# --- 4. An old process killed past its point of no return. -------------------
# Build d is build a whose node c, when it is later the old side of an
# upgrade, crashes right after Owned (--upgrade_fault, armed by the flag the
# wrapper adds). Roll to d, then to b: c's new process takes over alone.
armed="$KV_TEST_DIR/kvnode-d"
cat >"$armed" <<SH
#!/bin/bash
# build a; as node c, its old side crashes at o_move_clients.
prev="" fault=()
for a in "\$@"; do
  [[ \$prev == --node_id && \$a == c ]] && fault=(--upgrade_fault=o_move_clients:crash)
  prev=\$a
done
exec "$KV_TEST_DIR/kvnode-a" "\$@" "\${fault[@]}"
SH
chmod 755 "$armed"
roll_run armed d --build_id build-a
roll_expect 0 "the roll to build d (a, armed on c)"
roll_run crash b
roll_expect 0 "the roll whose node c's old process crashes"
grep -aq "injected crash at o_move_clients" "${KV_C_LOG[2]}" ||
  kv_fail "c's old process did not crash at o_move_clients (log ${KV_C_LOG[2]})"
expect_nodes "after the crash" a:6:build-b:serving b:6:build-b:serving c:6:build-b:serving
kv_ok "c's old process crashed past its point of no return; its new process serves, the roll done"

kv_cluster_load_stop strict
kv_load_report_clean
kv_history_check "$ROLL_HISTORY"
kv_cluster_stop
echo "cluster_roll_faults: PASS"
