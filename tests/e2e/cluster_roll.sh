#!/usr/bin/env bash
# Fleet rolls (docs/cluster.md, "Fleet roll") of three nodes under
# `kvload --cluster --verify --history`, the nodes started as "build a"
# (up_make_builds: wrapper builds of one binary that differ in build id):
#   - three rolls, to builds b, a, b: each exits 0 with every node done; each
#     node's generation advances by one per roll and it ends on the roll's
#     build; no verbs object of an old process is left;
#   - while the third runs, a second `kvctl cluster roll` is refused (exit
#     1) naming the roll id;
#   - the load: zero failed operations, zero verify errors, its history
#     linearizable.
# KV_NODE_BIN_PREV=PATH makes build a that binary, a build of an earlier
# commit: the rolls then go new -> old -> new and the fleet mixes two real
# builds under the load of this build's clients (the mixed-version test).
# ~3 min in the TCG guest.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/upgrade_lib.sh"
source "$(dirname "$0")/roll_lib.sh"
kv_require_device

roll_fleet_start
roll_verified_load

before=$(roll_nodes)
kv_log "nodes before: $before"
declare -A gen0
for n in $before; do IFS=: read -r id g _ <<<"$n" && gen0[$id]=$g; done

k=0
for build in b a b; do
  k=$((k + 1))
  if ((k == 1)); then
    ROLL_PROBE=1 roll_run "$k" "$build" # the build id from `kvnode-b --print_build_id`
  elif ((k == 2)); then
    roll_run "$k" "$build"
  else
    # A long gate keeps it running while the second kvctl tries: kvctl's
    # own start (dynamic linking over 9p) takes seconds in a loaded guest.
    roll_start "$k" "$build" --gate_s 20
    kv_wait_for 60 roll_plan_is running ||
      kv_fail "roll $k: the plan does not say running within 60 s"
    id=$(kv_etcdctl get "/kvnode/$KV_CLUSTER/roll" --print-value-only |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["roll_id"])')
    rc=0
    second=$(roll_kvctl --binary "$KV_TEST_DIR/kvnode-a" --build_id build-a 2>&1) || rc=$?
    ((rc == 1)) && [[ $second == *"roll $id is being driven by kvctl on"* ]] ||
      kv_fail "a second kvctl cluster roll exited $rc, not refused naming $id: $second"
    kv_ok "a second kvctl cluster roll is refused: ${second##*kvctl cluster roll: }"
    roll_wait
  fi
  roll_expect 0 "roll $k to build-$build"
  grep -q "roll r-.*: done" "$ROLL_OUT" || { cat "$ROLL_OUT" >&2; kv_fail "roll $k: no 'done' line"; }
  now=$(roll_nodes)
  for n in $now; do
    IFS=: read -r id g b st <<<"$n"
    [[ $g == $((gen0[$id] + k)) && $b == "build-$build" && $st == serving ]] ||
      kv_fail "roll $k: node $id is '$n', not generation $((gen0[$id] + k)) on build-$build serving"
  done
  kv_ok "roll $k: every node on build-$build: $now ($(grep -c ': upgrading' "$ROLL_OUT") upgrades)"
  kv_cluster_more_puts 50 "roll $k"
done
tail -n 6 "$ROLL_OUT" >&2
kv_wait_for 30 roll_no_old_verbs_objects || kv_fail "verbs objects of an old process are left"
kv_ok "no verbs object of an old process is left"

kv_cluster_load_stop strict
kv_load_report_clean
kv_history_check "$ROLL_HISTORY"
kv_cluster_stop
echo "cluster_roll: PASS"
