#!/usr/bin/env bash
# Two hosts, damaged packets (run by tests/e2e/twohost.sh on both guests):
# netem corrupt TH_CORRUPT (default 1 %: one random bit flipped in that share
# of frames) on both ends of the link, TH_CORRUPT_SECONDS (default 15;
# TH_LONG=1: 60) of kvload --verify YCSB A. A damaged RoCE packet is dropped
# by the UDP checksum or rxe's ICRC and resent; a damaged value that got
# past them would fail the object checksum or kvload's value checksum. No
# read may return a wrong value: 0 verify errors, 0 stale reads, 0 failed
# operations, the ack-log audit passes; the drops are reported.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/upgrade_lib.sh"
source "$(dirname "$0")/twohost_lib.sh"
kv_require_device
long=${TH_LONG:-0}
secs=${TH_CORRUPT_SECONDS:-$([[ $long == 1 ]] && echo 60 || echo 15)}
rate=${TH_CORRUPT:-1%}
clients=4

server() {
  th_start_node
  th_counters_begin
  th_netem corrupt "$rate"
  th_wait client_done $((secs + 400))
  th_netem off
  th_counters_report "corrupt $rate, ${secs}s"
  kv_stop_node
  echo "twohost_corrupt/server: PASS"
}

client() {
  th_connect_info
  th_counters_begin
  th_netem corrupt "$rate"
  th_start_load corrupt --workload A --clients $clients --threads 2 --depth 4 --keys 1000 \
    --preload --duration 100000 --timeout_ms 30000
  kv_wait_for 300 th_preloaded corrupt || kv_fail "kvload did not finish its preload"
  local t0=$SECONDS
  ran_long_enough() { ((SECONDS - t0 >= secs)); } # load duration, polled
  kv_wait_for $((secs + 5)) ran_long_enough
  th_finish_load corrupt
  local out=$TH_REPORT
  kv_ok "kvload under netem corrupt $rate, $secs s: $out"
  th_netem off
  th_audit corrupt
  th_counters_report "corrupt $rate, ${secs}s"
  th_put client_done
  echo "twohost_corrupt/client: PASS"
}

th_main
