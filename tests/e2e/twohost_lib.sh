# Helpers for the two-host e2e scripts (tests/e2e/twohost_*.sh), which run on
# both guests of `deploy/vm/rxe-vm --two-host` (tests/e2e/twohost.sh starts them):
# the node on "server" (10.77.0.1), kvload on "client" (10.77.0.2), rxe0 on
# each guest's eth0, one virtual link between them. Source after lib.sh and
# upgrade_lib.sh; the script then calls th_main, which runs its function
# `server` or `client` by RXE_VM_ROLE.
#
# The guests share no memory and no socket: they meet in TH_DIR, a directory
# of the host both mount (9p, no caching). A step publishes a file there
# (th_put NAME VALUE); the other side waits for it with a deadline (th_wait),
# and gives up at once when the other guest has already exited
# (RXE_VM_PEER_RC, written by deploy/vm/rxe-vm).
#
#   th_put NAME [VALUE]           publish NAME (atomically)
#   th_wait NAME SECONDS          wait for NAME; fail if the peer exits first
#   th_get NAME                   its value
#   th_start_node [flags]         (server) node on 0.0.0.0:0 advertising
#                                 RXE_VM_ADDR; publishes "addr" and "token"
#   th_start_upgradable_node [flags]
#                                 (server) th_start_node with the binaries and
#                                 flags of upgrade_lib.sh (up_upgrade works)
#   th_connect_info               (client) waits for them: sets KV_ADDR KV_TOKEN
#   th_netem SPEC...              tc qdisc netem SPEC on eth0 ("off" removes it)
#   th_own_outages                the script takes eth0 down itself: a failure
#                                 is never blamed on a dead link (see th_exit)
#   th_counters_begin / th_counters_report LABEL
#                                 rxe0's counters (rdma statistic) across a run;
#                                 the report line also goes to TH_DIR
#   th_check_report REPORT [no_failed|expect_failed] [T_BASE_NS T_UP_NS]
#                                 kvload's report: 0 verify errors and stale
#                                 reads, 0 failed (or some); with the times,
#                                 operations completed after T_UP; prints a line
#   th_finish_load PREFIX [check args]
#                                 stop the load, check its report (as above):
#                                 the line in TH_REPORT; fails with the load's
#                                 log tail
TH_DIR=${TH_DIR:?TH_DIR must name the directory both guests share}
TH_ROLE=${RXE_VM_ROLE:?run under deploy/vm/rxe-vm --two-host}
TH_NAME=$KV_TEST
KV_TEST="$TH_NAME-$TH_ROLE"

# RC transport timers of both ends (node and kvload): the ACK timeout
# exponent (16: 268 ms per try) and retries. The defaults (12: 16.8 ms, 2
# retries) suit a real link; between two TCG guests that share two host
# cores, a guest not scheduled for tens of milliseconds makes ACKs late, and
# QPs would fail with "retry counter exceeded" with no packet lost.
TH_QP_FLAGS=(--qp_timeout "${TH_QP_TIMEOUT:-16}" --qp_retry_cnt "${TH_QP_RETRY_CNT:-3}")

th_put() {
  printf '%s\n' "${2:-}" >"$TH_DIR/.$1.tmp"
  mv "$TH_DIR/.$1.tmp" "$TH_DIR/$1"
}
th_get() { cat "$TH_DIR/$1"; }
th_wait() { # NAME SECONDS
  local deadline=$((${EPOCHREALTIME//[!0-9]/} + $2 * 1000000))
  until [[ -e $TH_DIR/$1 ]]; do
    if [[ -s ${RXE_VM_PEER_RC:-/nonexistent} ]]; then
      kv_fail "the other guest exited ($(cat "$RXE_VM_PEER_RC")) before '$1'"
    fi
    ((${EPOCHREALTIME//[!0-9]/} < deadline)) || kv_fail "no '$1' from the other guest within $2 s"
    kv_nap 0.1 # poll interval of a condition with a deadline
  done
}

th_start_node() {
  kv_start_node --listen 0.0.0.0:0 --advertise_address="$RXE_VM_ADDR" "${TH_QP_FLAGS[@]}" "$@"
  [[ $KV_ADDR == 0.0.0.0:* ]] || kv_fail "node listens on $KV_ADDR, expected 0.0.0.0:PORT"
  TH_ADDR=$RXE_VM_ADDR:${KV_ADDR##*:}
  (umask 077 && cp "$KV_TOKEN" "$TH_DIR/token")
  th_put addr "$TH_ADDR"
}

th_start_upgradable_node() {
  local bins
  bins=$(mktemp -d /tmp/kv-e2e-twohost-bins.XXXXXX)
  up_make_builds "$bins"
  KV_NODE_BIN=$bins/kvnode-a
  th_start_node "${UP_NODE_FLAGS[@]}" "$@"
  UP_FIRST_PID=$KV_PID
}

th_connect_info() {
  th_wait addr 180
  KV_ADDR=$(th_get addr)
  KV_TOKEN=$TH_DIR/token
}

th_netem() {
  if [[ $1 == off ]]; then
    tc qdisc del dev eth0 root 2>/dev/null || true
    kv_log "netem off on eth0"
    return
  fi
  tc qdisc replace dev eth0 root netem "$@" || kv_fail "tc qdisc replace dev eth0 root netem $*"
  kv_log "netem on eth0 ($RXE_VM_ADDR egress): $*"
}

# rxe's counters: the retransmissions (the requester's timeouts and NAK-driven
# resends show as the responder's duplicate_request and out_of_seq_request,
# and its own rcvd_seq_err), what ran out of retries, and the packet totals.
TH_COUNTERS=(sent_pkts rcvd_pkts duplicate_request out_of_seq_request rcvd_seq_err
  ack_deferred retry_exceeded_err completer_retry_err link_downed)
declare -A TH_C0=()
th_counters_now() { kv_port_counters rxe0; } # -> "name value" lines
th_counters_begin() {
  local k v
  TH_C0=()
  while read -r k v; do TH_C0[$k]=$v; done < <(th_counters_now)
}
th_counters_report() { # LABEL
  local k v line=""
  declare -A now=()
  while read -r k v; do now[$k]=$v; done < <(th_counters_now)
  for k in "${TH_COUNTERS[@]}"; do
    [[ -n ${now[$k]:-} ]] || continue
    line+=" $k=$((now[$k] - ${TH_C0[$k]:-0}))"
  done
  # Damaged packets never reach rxe's counters: the IP or UDP checksum
  # drops them first (kernel counters since the guest booted), else rxe's
  # ICRC check does (no counter; it shows as the peer's sent_pkts minus our
  # rcvd_pkts).
  line+=$(nstat -asz 2>/dev/null | awk '$1 ~ /^(IpExtInCsumErrors|UdpInCsumErrors|TcpInCsumErrors)$/ {printf " %s=%s", $1, $2}')
  kv_log "rxe0 counters ($TH_ROLE, $1):$line"
  echo "$TH_NAME $TH_ROLE $1:$line" >>"$TH_DIR/counters.txt"
}

th_check_report() { # REPORT [no_failed|expect_failed] [T_BASE_NS T_UP_NS]
  python3 - "$@" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
mode = sys.argv[2] if len(sys.argv) > 2 else "no_failed"
c = r["client"]
assert r["verify_errors"] == 0, f"verify_errors {r['verify_errors']}: {r['verify']}"
assert r["stale_reads"] == 0, f"stale_reads {r['stale_reads']}"
if mode == "no_failed":
    assert r["failed_ops"] == 0, f"failed_ops {r['failed_ops']}"
else:
    assert r["failed_ops"] > 0, "no operation failed"
lat = r["latency_us"]
line = (f"{r['ops']} ops ({r['ops_per_s']:.0f}/s), failed {r['failed_ops']}, verify errors 0, "
        f"stale 0, GETs by READ {c['gets_by_read']} by RPC {c['gets_by_rpc']}, "
        f"reconnects {c['reconnects']}, moves {c['moves']}, timeouts {c['timeouts']}, "
        f"p50 {lat['p50']:.0f} us p99 {lat['p99']:.0f} us, longest gap {r['blackout_ms']:.0f} ms "
        f"(GETs {r['blackout_read_ms']:.0f} ms, writes {r['blackout_write_ms']:.0f} ms)")
if len(sys.argv) > 4:
    # Operations completed after the link came back (the timeline counts
    # from kvload's start of the run, T_BASE on this clock).
    up_ms = (int(sys.argv[4]) - int(sys.argv[3])) / 1e6
    after = sum(s["ops"] for s in r["timeline"] if s["t_ms"] > up_ms)
    assert after > 0, "no operation completed after the link returned"
    line += f"; {after} ops after the link returned"
print(line)
PY
}

# kvload --verify in the background against KV_ADDR: sets LOAD_PID. Writes
# its log, report and ack log into KV_DIR with the prefix given.
th_start_load() { # PREFIX [kvload flags...]
  local p=$1
  shift
  "$KV_KVLOAD" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --value_size 64 --verify \
    --ack_log "$KV_DIR/$p.acks" --report "$KV_DIR/$p.json" --progress=false \
    --connect_timeout_ms 5000 "${TH_QP_FLAGS[@]}" "$@" >"$KV_DIR/$p.log" 2>&1 &
  LOAD_PID=$!
}
th_preloaded() { grep -aq '^kvload: preloaded' "$KV_DIR/$1.log"; }
# SIGINT the load and wait; returns kvload's exit code.
th_stop_load() {
  local rc=0
  kill -INT "$LOAD_PID" 2>/dev/null || true
  wait "$LOAD_PID" || rc=$?
  LOAD_PID=""
  return "$rc"
}
th_finish_load() { # PREFIX [no_failed|expect_failed] [T_BASE_NS T_UP_NS]
  local p=$1
  shift
  th_stop_load || { tail -20 "$KV_DIR/$p.log" >&2; kv_fail "$p: kvload exited non-zero"; }
  TH_REPORT=$(th_check_report "$KV_DIR/$p.json" "$@") ||
    { tail -20 "$KV_DIR/$p.log" >&2; kv_fail "$p: kvload report: $TH_REPORT"; }
}
th_audit() { # PREFIX
  local rc=0
  "$KV_KVLOAD" --audit "$KV_DIR/$1.acks" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" \
    --report "$KV_DIR/$1.audit.json" >"$KV_DIR/$1.audit.log" 2>&1 || rc=$?
  [[ $rc -eq 0 ]] || { tail "$KV_DIR/$1.audit.log" >&2; kv_fail "$1: ack-log audit failed (exit $rc)"; }
  kv_ok "$1: ack-log audit passed ($(grep -ac . "$KV_DIR/$1.acks") acknowledged writes)"
}
# On failure the load's log is the evidence: copy it where the host sees it.
th_keep_logs() {
  [[ -n ${KV_DIR:-} ]] || return 0
  cp "$KV_DIR"/*.log "$KV_DIR"/*.json "$TH_DIR/" 2>/dev/null || true
}

# Opens (and closes) a TCP connection to HOST:PORT within 3 s.
th_tcp_connect() { timeout 3 bash -c ": <>/dev/tcp/$1/$2"; } # HOST PORT

# How often the guest kernel's watchdog found eth0's TX queue stalled.
th_tx_stalls() { cat /sys/class/net/eth0/queues/tx-0/tx_timeout 2>/dev/null || echo 0; }

# A failed run prints what this guest saw, while it still can: CI keeps only
# the test's output. Tells a dead link (eth0's counters standing still,
# neighbours FAILED), a process stuck in the kernel (its threads' states and
# kernel stacks) and the guest kernel's complaints apart from a fault of the
# node or the client.
th_diagnose() {
  local pid t f
  {
    echo "---- $TH_ROLE diagnosis $(date +%T.%N)"
    for f in "${KV_DIR:-/nonexistent}"/*.log; do
      [[ -f $f && $f != "${KV_LOG:-}" ]] || continue
      echo "-- last 40 lines of $f"
      tail -n 40 "$f"
    done
    if [[ -n ${KV_ADDR:-} ]]; then
      local host=${KV_ADDR%:*} verdict=ok
      [[ $host == 0.0.0.0 ]] && host=127.0.0.1
      th_tcp_connect "$host" "${KV_ADDR##*:}" || verdict=failed
      echo "-- TCP connect to the node at $host:${KV_ADDR##*:}: $verdict"
    fi
    echo "-- eth0 (twice, 1 s apart: do frames still arrive from $RXE_VM_PEER?)"
    # With them the virtio interrupt counts and the TX queue's timeouts: a
    # guest that stopped taking the NIC's interrupts would show here.
    ip -s link show eth0
    ip neigh show dev eth0
    grep virtio /proc/interrupts
    kv_nap 1
    ip -s link show eth0
    grep virtio /proc/interrupts
    echo "tx-0 timeouts: $(th_tx_stalls)"
    echo "-- rdma resource show qp"
    rdma resource show qp
    # The kvnode-a/-b wrappers exec kvnode: its processes are named kvnode.
    for pid in $(pgrep -x kvload) $(pgrep -x kvnode); do
      echo "-- threads of $(cat "/proc/$pid/comm") $pid (state, wait channel, kernel stack)"
      for t in /proc/"$pid"/task/*; do
        echo "$(awk '{print $3}' "$t/stat") $(cat "$t/wchan") $(tr '\n' ' ' <"$t/stack" 2>/dev/null | cut -c1-300)"
      done
    done
    echo "-- dmesg (last 30 lines)"
    dmesg | tail -n 30
  } >&2 2>&1 || true
}
# Whether the virtual link is dead while the other guest still runs: a TCP
# connect to a closed port of the peer draws an answer (ARP, then a RST)
# over a live link, so eth0's receive counter stands still only when
# nothing gets across; its transmit counter stands still while the guest
# kernel's watchdog has found the TX queue stalled (tx_timeout; counted at
# completion, so a live link's last frame may not show yet). Under two TCG
# guests on a loaded host the link has been seen to stop for good, in both
# directions (frames sent by each guest never reached the other, neighbour
# entries FAILED) and in one: QEMU stopped taking a guest's frames off its
# virtio TX queue (the guest kernel's "NETDEV WATCHDOG ... transmit queue 0
# timed out"; its rxe QPs then cannot be destroyed, so a process that had
# them hangs in the kernel, SIGKILL included). No node or client survives
# that. Says nothing once the peer has exited, nor in a test that takes the
# link down itself (th_own_outages).
TH_LINK_CHECK=1
th_own_outages() { TH_LINK_CHECK=0; }
th_link_dead() {
  local rx0 rx1 tx0 tx1 d=/sys/class/net/eth0/statistics
  ((TH_LINK_CHECK)) || return 1
  [[ -s ${RXE_VM_PEER_RC:-/nonexistent} ]] && return 1
  rx0=$(<$d/rx_packets) tx0=$(<$d/tx_packets)
  th_tcp_connect "$RXE_VM_PEER" 9 2>/dev/null || true
  rx1=$(<$d/rx_packets) tx1=$(<$d/tx_packets)
  [[ ($rx0 == "$rx1" || ($tx0 == "$tx1" && $(th_tx_stalls) -gt 0)) && ! -s ${RXE_VM_PEER_RC:-/nonexistent} ]]
}
# A failure over a dead link is the test bed's: exit 125, which
# tests/e2e/twohost.sh runs once more (as deploy/vm/rxe-vm's boot failures).
th_exit() {
  local rc=$?
  if ((rc != 0)); then
    th_diagnose
    if th_link_dead; then
      kv_log "the link to $RXE_VM_PEER is dead (eth0 sent or received nothing while probing it, TX queue timeouts $(th_tx_stalls), the peer still runs): the test bed failed, not the test (exit 125)"
      rc=125
    fi
  fi
  th_keep_logs
  kv_cleanup
  exit "$rc"
}

th_main() {
  case "$TH_ROLE" in
    server)
      trap th_exit EXIT
      server
      ;;
    client)
      KV_DIR=$(mktemp -d "/tmp/kv-e2e-$TH_NAME.XXXXXX")
      trap th_exit EXIT
      client
      ;;
    *) kv_fail "unknown role $TH_ROLE" ;;
  esac
}
