#!/usr/bin/env bash
# Two hosts on a lossy link (run by tests/e2e/twohost.sh on both guests):
# netem on both ends of the link (each guest's eth0 egress) with TH_NETEM
# (default 1 % loss, 0.5 ms delay, 1 % of packets sent ahead of the delayed
# ones, i.e. reordered), TH_NETEM_SECONDS (default 20; TH_LONG=1: 60) of
# kvload --verify YCSB A, during which the node is upgraded live twice.
# RC retransmission and the client's retries (a QP in error: reconnect and
# retry inside the deadline) must absorb the loss: 0 failed operations, 0
# verify errors, 0 stale reads, the ack-log audit passes. rxe0's counters
# (retransmissions) are reported beside the run.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/upgrade_lib.sh"
source "$(dirname "$0")/twohost_lib.sh"
kv_require_device
long=${TH_LONG:-0}
secs=${TH_NETEM_SECONDS:-$([[ $long == 1 ]] && echo 60 || echo 20)}
read -r -a spec <<<"${TH_NETEM:-loss 1% delay 0.5ms reorder 1%}"
n=2
clients=4

server() {
  local i
  th_start_upgradable_node
  th_counters_begin
  th_netem "${spec[@]}"
  th_wait loaded 300
  kv_wait_for 60 kv_stat_is clients $clients || kv_fail "$clients clients did not connect: $(kv_stat clients)"
  for ((i = 1; i <= n; i++)); do
    up_upgrade kill
    kv_wait_for 60 kv_stat_is clients $clients || kv_fail "upgrade $i: clients on the new process: $(kv_stat clients)"
    kv_ok "upgrade $i under netem: $UP_OLD -> $UP_NEW, owned after $(((UP_OWNED_NS - UP_SIG_NS) / 1000000)) ms"
  done
  th_put upgrades_done
  th_wait client_done $((secs + 300))
  th_netem off
  kv_wait_for 30 kv_stat_is clients 0 || kv_fail "clients did not go"
  th_counters_report "netem ${spec[*]}, ${secs}s, $n upgrades"
  up_stop_node
  echo "twohost_netem/server: PASS"
}

client() {
  th_connect_info
  th_counters_begin
  th_netem "${spec[@]}"
  th_start_load netem --workload A --clients $clients --threads 2 --depth 4 --keys 1000 --preload \
    --duration 100000 --timeout_ms 30000
  kv_wait_for 300 th_preloaded netem || kv_fail "kvload did not finish its preload"
  local t0=$SECONDS
  th_put loaded
  th_wait upgrades_done 400
  # The run lasts at least `secs` of load (a load duration, not a wait for
  # another party): polled like any condition.
  ran_long_enough() { ((SECONDS - t0 >= secs)); }
  kv_wait_for $((secs + 5)) ran_long_enough
  th_finish_load netem
  local out=$TH_REPORT
  kv_ok "kvload under netem (${spec[*]}), $((SECONDS - t0)) s, $n upgrades: $out"
  th_netem off
  th_audit netem
  th_counters_report "netem ${spec[*]}, ${secs}s, $n upgrades"
  th_put client_done
  echo "twohost_netem/client: PASS"
}

th_main
