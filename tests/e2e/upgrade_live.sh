#!/usr/bin/env bash
# Live upgrades under load: 8 kvload clients (YCSB A, depth 4, --verify) while
# the node is upgraded KV_UPGRADES times in a row (default 2 under ctest, each
# ~20-60 s in the TCG guest; KV_UPGRADES=20 is the full run), alternating
# between two builds that differ in their build id, by SIGUSR2 and by
# `kvctl upgrade` (every fifth and the last, so that ctest's two upgrades use
# both ways). For each: the next
# generation answers, the old process exits 0, the new one holds exactly the
# verbs objects of the first. Afterwards: zero failed operations, zero verify
# errors, zero stale reads, the ack-log audit passes, `rdma resource show`
# lists only the current process's QPs/MRs (at the baseline counts), no
# handoff header or shm object leaked, and counters stayed monotonic.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/upgrade_lib.sh"
kv_require_device
# Two by default: one upgrade takes ~20 s to Owned and ~60 s with the checks
# in a TCG guest on a loaded host.
n=${KV_UPGRADES:-2}

# Verbs objects of user processes that exist before this test (an earlier
# test that failed may have left a client running in the shared VM): named
# now, and not attributed to this test at the end.
user_objects() { { rdma resource show qp; rdma resource show mr; } 2>/dev/null | grep -v 'comm \[' || true; }
pre_pids=$(user_objects | { grep -o ' pid [0-9]*' || true; } | awk '{print $2}' | sort -u | tr '\n' ' ')
UP_IGNORE_PIDS=$pre_pids
[[ -z $pre_pids ]] || kv_log "note: verbs objects of other processes before this test (not ours): $(user_objects)"

kv_tmpdir upgrade-bins
bins=$KV_TMP
up_make_builds "$bins"
KV_NODE_BIN=$bins/kvnode-a
kv_start_node "${UP_NODE_FLAGS[@]}"
UP_FIRST_PID=$KV_PID
base_qp=$(up_rdma_count qp "$KV_PID")
base_mr=$(up_rdma_count mr "$KV_PID")
kv_log "baseline: $base_qp QPs, $base_mr MRs, $(grep -o 'arena /[^ ]* [0-9]* bytes' "$KV_LOG" | head -1);" \
  "starting kvload, then $n upgrades"

acks="$KV_DIR/acks.log"
report="$KV_DIR/report.json"
"$KV_KVLOAD" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --workload A --clients 8 \
  --threads "$(kv_load_threads)" --depth 4 --keys 2000 --value_size 64 --preload --duration 100000 --verify \
  --ack_log "$acks" --report "$report" --progress=false --connect_timeout_ms 5000 --timeout_ms "${KV_OP_TIMEOUT_MS:-30000}" \
  >"$KV_DIR/kvload.log" 2>&1 &
load_pid=$!
kv_wait_for 120 kv_stat_is clients 8 || kv_fail "kvload's 8 clients did not connect"
# kvload's timeline starts when its preload ends (it logs that line then): the
# upgrade windows are placed on it from that moment, and come after it.
preloaded() { grep -aq '^kvload: preloaded' "$KV_DIR/kvload.log"; }
kv_wait_for 120 preloaded || kv_fail "kvload did not finish its preload within 120 s"
t_base=$(kv_now_ns)
kv_wait_for 60 kv_stat_at_least ops_put 2100 || kv_fail "no load after the 2000-key preload"

windows=()
for ((i = 1; i <= n; i++)); do
  how=kill
  ((i % 5 == 0 || i == n)) && how=kvctl
  up_upgrade "$how"
  kv_wait_for 30 kv_stat_is clients 8 || kv_fail "upgrade $i: clients on the new process: $(kv_stat clients)"
  bid=$(kv_admin stats | grep -o '"build_id":"[^"]*"' | cut -d'"' -f4)
  want=build-b
  ((i % 2 == 0)) && want=build-a
  [[ $bid == "$want" ]] || kv_fail "upgrade $i: build id $bid, expected $want"
  q=$(up_rdma_count qp "$UP_NEW")
  m=$(up_rdma_count mr "$UP_NEW")
  foreign=$(up_rdma_foreign "$UP_NEW")
  [[ -z $foreign ]] || kv_fail "upgrade $i: kvnode verbs objects of other threads/processes: $foreign"
  # 8 client QPs on top of the idle baseline.
  [[ $q -eq $((base_qp + 8)) && $m -eq $base_mr ]] || {
    rdma resource show qp >&2
    rdma resource show mr >&2
    false
  } ||
    kv_fail "upgrade $i: new pid $UP_NEW holds $q QPs / $m MRs, expected $((base_qp + 8)) / $base_mr"
  windows+=("$UP_SIG_NS:$UP_EXIT_NS")
  kv_ok "upgrade $i ($how): $UP_OLD -> $UP_NEW ($bid), owned after $(((UP_OWNED_NS - UP_SIG_NS) / 1000000)) ms, old exited after $(((UP_EXIT_NS - UP_SIG_NS) / 1000000)) ms"
done

kv_stop_kvload "$load_pid" "$KV_DIR/kvload.log"
python3 - "$report" <<'PY' || kv_fail "report check"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["failed_ops"] == 0, f"failed_ops {r['failed_ops']}"
assert r["verify_errors"] == 0, f"verify_errors {r['verify_errors']}"
assert r["stale_reads"] == 0, f"stale_reads {r['stale_reads']}"
c = r["client"]
assert c["moves"] > 0, "no client moved"
print(f"kvload: {r['ops']} ops, failed 0, verify errors 0, stale 0, moves {c['moves']}, "
      f"reconnects {c['reconnects']}, longest gap {r['blackout_ms']:.1f} ms")
PY
up_window_stats "$report" "$t_base" "${windows[@]}" | while read -r line; do kv_log "$line"; done
# Reads never stop: while writes are paused (answered BUSY from the old
# process's pause until the new one owns RocksDB, and held by libkvclient
# outside its read budget), GETs keep completing. Counts, not durations: in
# each upgrade's longest stretch of timeline slots without a completed
# write, the GETs completed; and the GETs completed while their client held
# a write. A client whose slots all hold paused writes completes about one
# GET per slot after the pause starts, so more than 4 per slot of the run
# (8 clients x depth 4) shows that reads went on.
python3 - "$report" "$t_base" "${windows[@]}" <<'PY' || kv_fail "reads stopped while writes waited"
import json, sys
r = json.load(open(sys.argv[1]))
base = int(sys.argv[2])
slot = r["timeline_slot_ms"]
in_pauses = 0
for i, w in enumerate(sys.argv[3:], 1):
    t0, t1 = (int(x) for x in w.split(":"))
    lo, hi = (t0 - base) / 1e6, (t1 - base) / 1e6
    best = (0, 0)  # (slots without a write, GETs completed in them)
    run = (0, 0)
    for s in r["timeline"]:
        if s["t_ms"] + slot < lo or s["t_ms"] > hi:
            continue
        run = (run[0] + 1, run[1] + s["reads"]) if s["writes"] == 0 else (0, 0)
        best = max(best, run)
    in_pauses += best[1]
    print(f"upgrade {i}: longest stretch without a completed write {best[0] * slot:.0f} ms, "
          f"GETs completed in it {best[1]}")
held = r["reads_while_writes_held"]
print(f"run: blackout {r['blackout_ms']:.1f} ms, GETs {r['blackout_read_ms']:.1f} ms, "
      f"writes {r['blackout_write_ms']:.1f} ms; GETs in the longest write gap "
      f"{r['reads_in_write_blackout']}; GETs completed while writes were held {held}")
assert held > 0, "no GET completed while a write was held"
assert in_pauses > 4 * 8 * 4, f"only {in_pauses} GETs completed while writes were paused"
PY

moved=$(kv_stat upgrade_clients_migrated_total)
cut=$(kv_stat upgrade_clients_cut_total)
ups=$(kv_stat upgrades)
[[ ${ups%.*} -eq $n ]] || kv_fail "stats upgrades=$ups, expected $n (counters not carried over?)"
# A client that does not acknowledge Move within --upgrade_move_deadline_ms is
# cut and reconnects (no failed operation, checked above); under TCG on a
# loaded host that happens now and then, so cuts are reported, not failed.
[[ ${cut%.*} -eq 0 ]] || kv_log "note: $cut clients were cut at the Move deadline (they reconnected)"
kv_ok "counters carried over: upgrades=$ups, clients migrated=$moved, cut=$cut"
# Every client that moved (or reconnected after a cut) presented its id's
# resume secret -- libkvclient keeps it, the handoff carries it -- so none
# was given a fresh id (which would drop its dedupe window).
refused=$(kv_stat errors.resume_refused)
[[ $refused == 0 ]] || kv_fail "errors.resume_refused=$refused: clients lost their ids"

rc=0
"$KV_KVLOAD" --audit "$acks" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" \
  --report "$KV_DIR/audit.json" >"$KV_DIR/audit.log" 2>&1 || rc=$?
[[ $rc -eq 0 ]] || { tail "$KV_DIR/audit.log" >&2; kv_fail "ack-log audit failed (exit $rc)"; }
kv_ok "ack-log audit passed"

kv_wait_for 10 kv_stat_is clients 0 || kv_fail "clients did not go"
qp_back() { [[ $(up_rdma_count qp "$KV_PID") -eq $base_qp ]]; }
kv_wait_for 10 qp_back || kv_fail "QPs $(up_rdma_count qp "$KV_PID") != $base_qp"
foreign=$(user_objects | grep -v "comm kvnode" || true)
for p in $pre_pids; do foreign=$(grep -v " pid $p " <<<"$foreign" || true); done
[[ -z $foreign ]] || kv_fail "verbs objects of other processes: $foreign"
foreign=$(up_rdma_foreign "$KV_PID")
[[ -z $foreign ]] || kv_fail "kvnode objects of other threads/processes: $foreign"
[[ $(up_rdma_count mr "$KV_PID") -eq $base_mr ]] || kv_fail "MRs $(up_rdma_count mr "$KV_PID") != $base_mr"
kv_ok "rdma resource show: only pid $KV_PID, $base_qp QPs / $base_mr MRs as before the upgrades"
[[ ! -e /dev/shm/$KV_SHM.handoff ]] || kv_fail "handoff header leaked"
leaked=$(ls /dev/shm | grep -v "^$KV_SHM\$" | grep "$KV_SHM" || true)
[[ -z $leaked ]] || kv_fail "shm objects leaked: $leaked"
up_stop_node
[[ ! -e /dev/shm/$KV_SHM ]] || kv_fail "arena segment left after SIGTERM"
[[ ! -e $KV_ADMIN ]] || kv_fail "admin socket left after SIGTERM"
echo "upgrade_live: PASS ($n upgrades)"
