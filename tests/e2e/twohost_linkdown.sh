#!/usr/bin/env bash
# Two hosts, the link goes down under load (run by tests/e2e/twohost.sh on
# both guests). The client guest takes its eth0 down and up again while
# kvload --verify (YCSB A) runs:
#
# 1. Down for TH_SHORT_OUTAGE s (default 2), shorter than the operation
#    deadline (10 s): 0 failed operations, 0 verify errors, the clients'
#    sessions recover (a QP that ran out of retries reconnects and resumes)
#    and operations complete after the link returns; the audit passes.
# 2. Down for TH_LONG_OUTAGE s (default 8), longer than the deadline (3 s):
#    the operations caught in it fail, each with an error that names the
#    deadline; none is reported successful without being applied (the
#    ack-log audit of every acknowledged write passes, 0 verify errors), and
#    the clients recover on their own: operations complete after the link
#    returns, in the same kvload process.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/upgrade_lib.sh"
source "$(dirname "$0")/twohost_lib.sh"
kv_require_device
th_own_outages
short=${TH_SHORT_OUTAGE:-2}
long_outage=${TH_LONG_OUTAGE:-8}
clients=4

server() {
  th_start_node
  th_counters_begin
  th_wait client_done 600
  kv_wait_for 30 kv_stat_is clients 0 || kv_fail "clients did not go"
  th_counters_report "link down ${short}s and ${long_outage}s"
  kv_stop_node
  echo "twohost_linkdown/server: PASS"
}

# outage PREFIX SECONDS: takes eth0 down for SECONDS once the load runs;
# sets T_BASE (kvload's timeline origin, ns) and T_UP (link back, ns).
outage() {
  local p=$1 s=$2
  kv_wait_for 300 th_preloaded "$p" || kv_fail "$p: kvload did not finish its preload"
  T_BASE=$(kv_now_ns)
  has_progress() { grep -aq 'ops/s' "$KV_DIR/$p.log"; }
  kv_wait_for 30 has_progress || kv_fail "$p: no progress line"
  ip link set eth0 down
  kv_log "$p: eth0 down for $s s"
  kv_nap "$s" # the outage's length: a fault, not a synchronisation
  ip link set eth0 up
  T_UP=$(kv_now_ns)
  kv_log "$p: eth0 up"
  # Wait until the clients complete operations again after the link is back.
  local lines
  lines=$(grep -ac 'ops/s' "$KV_DIR/$p.log")
  recovered() {
    local l
    l=$(grep -a 'ops/s' "$KV_DIR/$p.log" | tail -n +$((lines + 1)) | grep -av ' 0 ops/s' | grep -ac . || true)
    ((l >= 3))
  }
  kv_wait_for 60 recovered || kv_fail "$p: no operations completed within 60 s of the link's return"
}

client() {
  th_connect_info
  th_counters_begin
  local out
  # --- 1. shorter than the deadline
  th_start_load short --workload A --clients $clients --threads 2 --depth 4 --keys 500 --preload \
    --duration 100000 --timeout_ms 10000 --progress=true
  outage short "$short"
  kv_log "short: stopping kvload"
  th_finish_load short no_failed "$T_BASE" "$T_UP"
  out=$TH_REPORT
  kv_ok "link down ${short}s (deadline 10 s): $out"
  th_audit short
  th_counters_report "link down ${short}s"

  # --- 2. longer than the deadline
  th_counters_begin
  local rc=0
  th_start_load long --workload A --clients $clients --threads 2 --depth 4 --keys 500 --preload \
    --duration 100000 --timeout_ms 3000 --progress=true
  outage long "$long_outage"
  kv_log "long: stopping kvload"
  th_stop_load || rc=$?
  kv_log "long: kvload exited $rc"
  [[ $rc -eq 1 ]] || { tail -20 "$KV_DIR/long.log" >&2; kv_fail "long outage: kvload exited $rc, expected 1 (failed operations)"; }
  out=$(th_check_report "$KV_DIR/long.json" expect_failed "$T_BASE" "$T_UP") ||
    { tail -20 "$KV_DIR/long.log" >&2; kv_fail "long outage: $out"; }
  # Every failure kvload logged names the deadline.
  local fails bad
  fails=$(grep -a ' failed: ' "$KV_DIR/long.log" || true)
  [[ -n $fails ]] || kv_fail "long outage: no failure logged"
  bad=$(grep -v -i 'deadline' <<<"$fails" || true)
  [[ -z $bad ]] || kv_fail "long outage: failures that do not name the deadline: $(head -3 <<<"$bad")"
  kv_ok "link down ${long_outage}s (deadline 3 s): $out"
  kv_log "long outage: first failure: $(head -1 <<<"$fails" | sed 's/^.*kvload: //')"
  th_audit long
  th_counters_report "link down ${long_outage}s"
  th_put client_done
  echo "twohost_linkdown/client: PASS"
}

th_main
