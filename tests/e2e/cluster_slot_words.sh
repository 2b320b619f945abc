#!/usr/bin/env bash
# Slot words (docs/format.md "Slot words"): a client kept on an old shard map
# GETs by RDMA READ from a node that has given the key's slot away. Two nodes
# a and b and etcd; kvnode_pinned_client does the client side:
#   1. without slot words (the reader does not ask for kFeatureSlotWords),
#      a's slots 1024..2047 move to b (epoch 2) after the reader cached k's
#      location at a; k is rewritten and k2 created at b: the reader must get
#      the stale value and a false NOT_FOUND from a's arena. This proves the
#      scenario exposes the hazard (the check below cannot pass vacuously);
#   2. with slot words, the slots move back to a (epoch 3) under a reader
#      pinned to epoch 2 at b, inside b's guard: raised before the map
#      changes (the reader acknowledges it), lowered once b serves epoch 3
#      (the reader, on epoch 2, goes on checking). The reader must get the
#      new values, through READs recognised as not served
#      (reads_not_served) and rerouted after WRONG_SHARD.
#   3. under kvload --cluster --verify, a's guard goes up (every session
#      acknowledges, none is cut; a live upgrade is refused) and down;
#   4. the same guard raised by a itself for a migration plan with a move
#      from it copying, and lowered once it serves the map of the commit.
# Each move waits until both nodes report that their slot words show the new
# map (cluster_slot_words_epoch). ~30 s in the TCG guest.
# KV_SLOT_WORDS=false runs step 2's reader without slot words too: the test
# must then fail (a check of the check).
source "$(dirname "$0")/lib.sh"
kv_require_device
KV_PINNED=${KV_PINNED:-$KV_BUILD/tests/e2e/kvnode_pinned_client}

map_json() { # EPOCH B_FIRST
  echo "{\"cluster\":\"$KV_CLUSTER\",\"epoch\":$1,\"slots\":4096,\"nodes\":[\"a\",\"b\"],\"ranges\":[[0,\"a\"],[$2,\"b\"]]}"
}

kv_cluster_start 2
[[ $(kv_cluster_ranges) == "0:a,2048:b" ]] ||
  kv_fail "kvctl cluster init wrote ranges $(kv_cluster_ranges), not 0:a,2048:b"
for i in 0 1; do
  kv_wait_for 60 kv_node_stat_is "$i" cluster_slot_words_epoch 1 ||
    kv_fail "node ${KV_C_IDS[i]}: slot words not at map epoch 1 within 60 s"
done

# Runs the pinned reader on slots [LO, HI); once it has read, writes map
# EPOCH (b's first slot B_FIRST), waits for both nodes' slot words, then
# lets it go on. With GUARD=I, node I's guard is up from before the map
# write until after the words. Its exit status in RUN_RC, its output in
# RUN_OUT.
run_pinned() { # NAME LO HI EPOCH B_FIRST [pinned_client flags...]
  local name=$1 lo=$2 hi=$3 epoch=$4 b_first=$5 pid i
  shift 5
  RUN_OUT="$KV_TEST_DIR/$name.out"
  local ready="$KV_TEST_DIR/$name.ready" go="$KV_TEST_DIR/$name.go"
  "$KV_PINNED" --cluster "$(kv_cluster_seeds)" --auth_token_file "$KV_TOKEN" --prefix "$name" \
    --slot_lo "$lo" --slot_hi "$hi" --ready "$ready" --go "$go" "$@" >"$RUN_OUT" 2>&1 &
  pid=$!
  kv_wait_for 60 test -e "$ready" ||
    { cat "$RUN_OUT" >&2; kv_fail "$name: the reader did not read k within 60 s"; }
  if [[ -n ${GUARD:-} ]]; then
    local up
    up=$(kv_node_admin "$GUARD" guard up) || kv_fail "guard up on ${KV_C_IDS[GUARD]}: $up"
    [[ $(kv_json_num "$up" acknowledged) -ge 1 ]] ||
      kv_fail "guard up on ${KV_C_IDS[GUARD]}: the reader did not acknowledge it: $up"
    kv_log "guard up on ${KV_C_IDS[GUARD]}: $up"
  fi
  kv_etcdctl put "/kvnode/$KV_CLUSTER/map" "$(map_json "$epoch" "$b_first")" >/dev/null ||
    kv_fail "cannot write map epoch $epoch"
  for i in 0 1; do
    kv_wait_for 60 kv_node_stat_is "$i" cluster_slot_words_epoch "$epoch" ||
      kv_fail "node ${KV_C_IDS[i]}: slot words not at map epoch $epoch within 60 s"
  done
  if [[ -n ${GUARD:-} ]]; then
    local down
    down=$(kv_node_admin "$GUARD" guard down) || kv_fail "guard down on ${KV_C_IDS[GUARD]}: $down"
    [[ $(kv_json_num "$down" check_below_epoch) == "$epoch" ]] ||
      kv_fail "guard down on ${KV_C_IDS[GUARD]}: not checked below epoch $epoch: $down"
  fi
  : >"$go"
  RUN_RC=0
  wait "$pid" || RUN_RC=$?
  cat "$RUN_OUT" >&2
}

# 1. Without slot words: a's 1024..2047 go to b; the reader stays at a.
run_pinned without 1024 2048 2 1024 --slot_words=false
((RUN_RC == 1)) || kv_fail "without slot words the reader exited $RUN_RC, not 1 (a wrong GET)"
grep -q ': STALE' "$RUN_OUT" || kv_fail "without slot words: no stale value of k"
grep -q ': NOT_FOUND' "$RUN_OUT" || kv_fail "without slot words: no false NOT_FOUND of k2"
kv_ok "without slot words a reader on map epoch 1 read a stale value and a false NOT_FOUND at a"

# 2. With slot words: 1024..2047 go back to a; the reader stays at b.
GUARD=1 run_pinned with 1024 2048 3 2048 --slot_words="${KV_SLOT_WORDS:-true}"
((RUN_RC == 0)) || kv_fail "with slot words the reader exited $RUN_RC (see above)"
grep -q 'reads_not_served [1-9]' "$RUN_OUT" || kv_fail "no READ recognised as not served"
grep -q 'map epoch 2 -> 3' "$RUN_OUT" || kv_fail "the reader was not rerouted by map epoch 3"
kv_ok "with slot words the reader on map epoch 2 got the new values from a (rerouted)"

# 3. The guard under load: every kvload session acknowledges it (none is
# cut), a live upgrade is refused while it is up, and the load runs clean.
kv_cluster_load guard --verify --clients 4
up=$(kv_node_admin 0 guard up 10) || kv_fail "guard up on a under load: $up"
[[ $(kv_json_num "$up" cut) == 0 && $(kv_json_num "$up" acknowledged) -ge 4 ]] ||
  kv_fail "guard up on a under load: not every kvload session acknowledged it: $up"
refused=$(kv_node_admin 0 upgrade) || true
[[ $refused == *'"ok":false'*guard* ]] || kv_fail "a live upgrade under the guard: $refused"
kv_cluster_more_puts 50 "the guard went up" 0
down=$(kv_node_admin 0 guard down) || kv_fail "guard down on a: $down"
kv_cluster_more_puts 50 "the guard went down" 0
kv_cluster_load_stop strict
kv_load_report_clean
kv_ok "the guard under load: $up; a live upgrade refused while it was up"

# 4. The guard by the migration plan: a move of a's slots 1024..1087 to b,
# copying, raises a's guard by itself (held: every kvload session
# acknowledged), not b's; once the move is committed (the map gives the
# slots to b, the move done), a lowers it when it serves that map. The load
# stops first: no record is moved here.
plan_json() { # MIGRATION_STATE MOVE_STATE
  printf '{"migration_id":"m-20261207T000000-0001","kind":"rebalance","node":"","rate_mb_s":0,'
  printf '"state":"%s","reason":"","from_epoch":3,"moves":[{"first":1024,"last":1087,' "$1"
  printf '"from":"a","to":"b","state":"%s","attempt":1,"keys":0,"bytes":0,"reason":""}]}' "$2"
}
kv_cluster_load plan --verify --clients 4
kv_etcdctl put "/kvnode/$KV_CLUSTER/migration" "$(plan_json running copying)" >/dev/null ||
  kv_fail "cannot write the migration plan"
kv_wait_for 30 kv_node_stat_is 0 cluster_guard_held 1 ||
  kv_fail "a's guard not held within 30 s of a move from it copying"
kv_node_stat_is 1 cluster_guard_wanted 0 || kv_fail "b, the move's target, wants its guard up"
kv_cluster_more_puts 50 "a's guard went up" 0
kv_cluster_load_stop strict
kv_load_report_clean
kv_etcdctl put "/kvnode/$KV_CLUSTER/map" \
  "{\"cluster\":\"$KV_CLUSTER\",\"epoch\":4,\"slots\":4096,\"nodes\":[\"a\",\"b\"],\"ranges\":[[0,\"a\"],[1024,\"b\"],[1088,\"a\"],[2048,\"b\"]]}" \
  >/dev/null || kv_fail "cannot write map epoch 4"
kv_etcdctl put "/kvnode/$KV_CLUSTER/migration" "$(plan_json done done)" >/dev/null ||
  kv_fail "cannot write the migration plan"
kv_wait_for 30 kv_node_stat_is 0 cluster_guard_wanted 0 ||
  kv_fail "a still wants its guard up 30 s after the move was committed"
kv_node_stat_is 0 cluster_map_epoch 4 || kv_fail "a lowered its guard before serving map epoch 4"
kv_node_stat_is 0 cluster_guard_held 0 || kv_fail "a's guard still held"
kv_ok "a's guard went up for its move copying, and down once it served the commit's map"

kv_cluster_stop
echo "cluster_slot_words: PASS"
