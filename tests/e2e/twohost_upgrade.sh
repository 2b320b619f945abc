#!/usr/bin/env bash
# Two hosts, live upgrades (run by tests/e2e/twohost.sh on both guests).
#
# server (10.77.0.1): kvnode listening on the wildcard 0.0.0.0 (port 0) with
#   --advertise_address=10.77.0.1; TH_UPGRADES live upgrades (default 5,
#   alternating SIGUSR2 and `kvctl upgrade`) while the client's load runs.
#   Each Move must name 10.77.0.1:PORT, the address clients on another host
#   can reach (not the listener's 0.0.0.0), and every client must be back on
#   the next generation. The upgrade counters carry over, no client lost its
#   id (resume_refused 0), and the node stops clean.
# client (10.77.0.2): kvload --verify, YCSB A, GETs by RDMA READ across the
#   link, PUTs by RPC; afterwards 0 failed operations, 0 verify errors, 0
#   stale reads, GETs by READ > 0, every client moved, kvload never saw
#   0.0.0.0, and the ack-log audit passes.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/upgrade_lib.sh"
source "$(dirname "$0")/twohost_lib.sh"
kv_require_device
n=${TH_UPGRADES:-5}
clients=4

server() {
  local i how
  th_start_upgradable_node
  th_counters_begin
  th_wait loaded 300
  kv_wait_for 60 kv_stat_is clients $clients || kv_fail "$clients clients did not connect: $(kv_stat clients)"
  for ((i = 1; i <= n; i++)); do
    how="kill"
    ((i % 2 == 0)) && how=kvctl
    up_upgrade "$how"
    kv_log "upgrade $i phases (ms): $(up_phases)"
    kv_wait_for 60 kv_stat_is clients $clients || kv_fail "upgrade $i: clients on the new process: $(kv_stat clients)"
    # The Move must name the advertised address, never the listener's
    # 0.0.0.0. A client between two sessions at that moment (its QP timed
    # out) is not told, reconnects to the same address and is counted below.
    local told
    told=$(grep 'clients told to move to' "$KV_LOG" | tail -n 1)
    [[ $told =~ upgrade:\ ([0-9]+)\ clients\ told\ to\ move\ to\ ([^,]+), ]] ||
      kv_fail "upgrade $i: no Move logged: $told"
    [[ ${BASH_REMATCH[2]} == "$TH_ADDR" ]] || kv_fail "upgrade $i: Move to ${BASH_REMATCH[2]}, expected $TH_ADDR"
    ((BASH_REMATCH[1] >= 1)) || kv_fail "upgrade $i: no client told to move: $told"
    ((BASH_REMATCH[1] == clients)) || kv_log "note: upgrade $i: ${BASH_REMATCH[1]} of $clients clients told to move (the others were reconnecting)"
    kv_ok "upgrade $i ($how): $UP_OLD -> $UP_NEW, owned after $(((UP_OWNED_NS - UP_SIG_NS) / 1000000)) ms, ${BASH_REMATCH[1]} clients told to move to $TH_ADDR"
  done
  th_put upgrades_done
  th_wait client_done 300
  local ups refused
  ups=$(kv_stat upgrades)
  [[ ${ups%.*} -eq $n ]] || kv_fail "stats upgrades=$ups, expected $n"
  refused=$(kv_stat errors.resume_refused)
  [[ $refused == 0 ]] || kv_fail "errors.resume_refused=$refused: clients lost their ids"
  kv_wait_for 30 kv_stat_is clients 0 || kv_fail "clients did not go"
  th_counters_report "$n upgrades"
  up_stop_node
  echo "twohost_upgrade/server: PASS ($n upgrades)"
}

client() {
  th_connect_info
  th_counters_begin
  th_start_load up --workload A --clients $clients --threads 2 --depth 4 --keys 1000 --preload \
    --duration 100000 --timeout_ms 30000
  kv_wait_for 240 th_preloaded up || kv_fail "kvload did not finish its preload"
  th_put loaded
  th_wait upgrades_done $((n * 150))
  th_finish_load up
  local out=$TH_REPORT
  kv_ok "kvload across the link: $out"
  python3 - "$KV_DIR/up.json" "$clients" <<'PY' || kv_fail "report"
import json, sys
r = json.load(open(sys.argv[1]))
c = r["client"]
assert c["gets_by_read"] > 0, "no GET by RDMA READ"
assert c["moves"] >= int(sys.argv[2]), f"only {c['moves']} moves"
# A Move that named an unreachable address would have failed operations
# (checked above) or show as refused here.
assert c["moves_refused"] == 0, f"{c['moves_refused']} moves refused"
PY
  if grep -q '0\.0\.0\.0' "$KV_DIR/up.log"; then
    kv_fail "kvload saw 0.0.0.0: $(grep -m1 '0\.0\.0\.0' "$KV_DIR/up.log")"
  fi
  grep -q "moved to $KV_ADDR" "$KV_DIR/up.log" || kv_fail "kvload never logged a move to $KV_ADDR"
  th_audit up
  th_counters_report "$n upgrades"
  th_put client_done
  echo "twohost_upgrade/client: PASS"
}

th_main
