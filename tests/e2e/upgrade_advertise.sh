#!/usr/bin/env bash
# Where a live upgrade sends clients (--advertise_address), and the client's
# check of where it lands.
#
# 1. A node listening on the wildcard 0.0.0.0 (port 0) with
#    --advertise_address=127.0.0.1 (the guest has only loopback): KV_UPGRADES
#    (default 2) live upgrades under kvload --verify. The Move names
#    127.0.0.1:PORT (not 0.0.0.0), every client follows it to the next
#    generation, zero failed operations, zero verify errors, no Move refused.
# 2. A Move to a wrong node is refused: node B is an independent node with the
#    same token; node A advertises B's address (a misconfiguration). Upgrading
#    A sends its clients to B; each client finds another arena there, refuses
#    (kvload's client.moves_refused), stays, and when A's old process cuts it
#    reconnects to A's address, where A's next generation serves it. Zero
#    failed operations, zero verify errors (a client that had followed the
#    Move would read B's empty store: "missing" keys), and B served no
#    operation.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/upgrade_lib.sh"
kv_require_device
n=${KV_UPGRADES:-2}
clients=4

kv_tmpdir advertise-bins
bins=$KV_TMP
up_make_builds "$bins"
KV_NODE_BIN=$bins/kvnode-a

# kvload --verify against KV_ADDR in the background (LOAD_PID, LOAD_DIR).
start_load() {
  LOAD_DIR=$1
  "$KV_KVLOAD" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --workload A --clients $clients \
    --threads 2 --depth 4 --keys 500 --value_size 64 --preload --duration 100000 --verify \
    --report "$LOAD_DIR/report.json" --progress=false --connect_timeout_ms 5000 \
    --timeout_ms "${KV_OP_TIMEOUT_MS:-30000}" >"$LOAD_DIR/kvload.log" 2>&1 &
  LOAD_PID=$!
  kv_wait_for 120 kv_stat_is clients $clients || kv_fail "kvload's $clients clients did not connect"
  kv_wait_for 60 kv_stat_at_least ops_put 600 || kv_fail "no load"
}
# SIGINT kvload, then its report must show no failure; sets OPS MOVES REFUSED
# RECONNECTS from its client stats.
stop_load() {
  local out
  kv_stop_kvload "$LOAD_PID" "$LOAD_DIR/kvload.log"
  out=$(python3 - "$LOAD_DIR/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
c = r["client"]
assert r["failed_ops"] == 0, f"failed_ops {r['failed_ops']}"
assert r["verify_errors"] == 0, f"verify_errors {r['verify_errors']}"
assert r["stale_reads"] == 0, f"stale_reads {r['stale_reads']}"
print(f"{r['ops']} {c['moves']} {c['moves_refused']} {c['reconnects']}")
PY
  ) || { tail -20 "$LOAD_DIR/kvload.log" >&2; kv_fail "kvload report: $out"; }
  read -r OPS MOVES REFUSED RECONNECTS <<<"$out"
}

# --- 1. wildcard listener, advertised loopback address ------------------------
kv_start_node --listen 0.0.0.0:0 --advertise_address=127.0.0.1
UP_FIRST_PID=$KV_PID
[[ $KV_ADDR == 0.0.0.0:* ]] || kv_fail "node listens on $KV_ADDR, expected 0.0.0.0:PORT"
port=${KV_ADDR##*:}
KV_ADDR=127.0.0.1:$port # what clients dial (and what the node advertises)
start_load "$KV_DIR"
for ((i = 1; i <= n; i++)); do
  up_upgrade kill
  kv_wait_for 30 kv_stat_is clients $clients || kv_fail "upgrade $i: clients on the new process: $(kv_stat clients)"
  grep -q "upgrade: $clients clients told to move to 127.0.0.1:$port," "$KV_LOG" ||
    kv_fail "upgrade $i: no Move to 127.0.0.1:$port in the log: $(grep 'told to move' "$KV_LOG" | tail -n 1)"
  kv_ok "upgrade $i: $UP_OLD -> $UP_NEW, clients told to move to 127.0.0.1:$port"
done
stop_load
[[ $MOVES -ge $clients ]] || kv_fail "only $MOVES moves for $clients clients and $n upgrades"
[[ $REFUSED -eq 0 ]] || kv_fail "$REFUSED moves refused on the right node"
if grep -q "0\.0\.0\.0" "$KV_DIR/kvload.log"; then
  kv_fail "kvload saw 0.0.0.0: $(grep -m1 '0\.0\.0\.0' "$KV_DIR/kvload.log")"
fi
grep -q "moved to 127.0.0.1:$port" "$KV_DIR/kvload.log" || kv_fail "kvload never moved to 127.0.0.1:$port"
kv_ok "wildcard listener: $n upgrades, $OPS ops, 0 failed, $MOVES moves to 127.0.0.1:$port, $RECONNECTS reconnects"
up_stop_node
UP_FIRST_PID=""

# --- 2. a Move to a wrong node is refused ----------------------------------
KV_NODE_BIN=${KV_NODE_BIN_REAL:-$KV_BUILD/node/kvnode}
kv_start_node
B_PID=$KV_PID B_ADDR=$KV_ADDR B_ADMIN=$KV_ADMIN B_SHM=$KV_SHM B_LOG=$KV_LOG
token=$KV_TOKEN
b_cleanup() {
  local rc=$?
  if [[ -n ${B_PID:-} ]] && kill -0 "$B_PID" 2>/dev/null; then kill -KILL "$B_PID" || true; fi
  rm -f "/dev/shm/$B_SHM"
  kv_cleanup "$rc"
}
trap b_cleanup EXIT
KV_PID=""
KV_NODE_BIN=$bins/kvnode-a
# The same token: B would accept A's clients; only the client's check keeps
# them off it.
kv_start_node --auth_token_file "$token" --advertise_address="$B_ADDR"
KV_TOKEN=$token
UP_FIRST_PID=$KV_PID
A_ADDR=$KV_ADDR
start_load "$KV_DIR"
up_upgrade kill
kv_wait_for 60 kv_stat_is clients $clients || kv_fail "clients on A's new process: $(kv_stat clients)"
grep -q "upgrade: $clients clients told to move to $B_ADDR," "$KV_LOG" || kv_fail "no Move to $B_ADDR logged"
# A little load on the new process before stopping.
puts=$(kv_stat ops_put)
kv_wait_for 60 kv_stat_at_least ops_put $((${puts%.*} + 200)) || kv_fail "no load on A's new process"
stop_load
[[ $REFUSED -ge $clients ]] || kv_fail "$REFUSED moves refused, expected $clients (one per client)"
[[ $MOVES -eq 0 ]] || kv_fail "$MOVES clients moved to the wrong node"
grep -q "refused a Move: $B_ADDR is not where the Move said: another node" "$KV_DIR/kvload.log" ||
  kv_fail "kvload did not log why it refused the Move"
kv_log "kvload: $(grep -m1 'refused a Move' "$KV_DIR/kvload.log" | sed 's/^.*kvclient: //')"
b_puts=$(KV_ADMIN=$B_ADMIN kv_stat ops_put)
b_gets=$(KV_ADMIN=$B_ADMIN kv_stat ops_get_rpc)
[[ ${b_puts%.*} -eq 0 && ${b_gets%.*} -eq 0 ]] || kv_fail "node B served $b_puts PUTs / $b_gets RPC GETs"
KV_ADMIN=$B_ADMIN kv_wait_for 30 kv_stat_is clients 0 || kv_fail "clients left on node B"
kv_ok "wrong node refused: $REFUSED refusals, $RECONNECTS reconnects to $A_ADDR, $OPS ops, 0 failed; B served nothing"
# B first: up_stop_node counts every kvnode verbs object left.
A_PID=$KV_PID A_ADMIN=$KV_ADMIN A_SHM=$KV_SHM A_LOG=$KV_LOG
KV_PID=$B_PID KV_ADMIN=$B_ADMIN KV_SHM=$B_SHM KV_LOG=$B_LOG
kv_stop_node
B_PID=""
KV_PID=$A_PID KV_ADMIN=$A_ADMIN KV_SHM=$A_SHM KV_LOG=$A_LOG
up_stop_node
echo "upgrade_advertise: PASS"
