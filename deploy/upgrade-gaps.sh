#!/usr/bin/env bash
# Where a live upgrade's gaps fall: one node under YCSB A (kvload, 4 clients,
# depth 4, --sync_writes), one live upgrade after the preload, then kvload's
# longest gaps (any op, GETs, writes) and every 10 ms timeline slot with few
# completions or a slow one, beside the node's upgrade log lines, so that a
# gap can be set against the phase it falls in. Not a test, not a benchmark:
# a diagnostic. Needs a verbs device (run it in deploy/rxe-vm).
#
#   deploy/rxe-vm --memory 2048 --cpus 1 -- deploy/upgrade-gaps.sh
#   env: KVNODE_BUILD_DIR (default build), GAPS_KEYS (10000), GAPS_S (12),
#        GAPS_NODE_FLAGS (extra kvnode flags), GAPS_WORKLOAD (A; C: GETs only)
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,12p' "$0"; exit 0; }
root=$(cd "$(dirname "$0")/.." && pwd)
export KVNODE_BUILD_DIR=${KVNODE_BUILD_DIR:-$root/build}
source "$root/tests/e2e/lib.sh"
source "$root/tests/e2e/upgrade_lib.sh"
kv_require_device
bins=$(mktemp -d /tmp/gaps-bins.XXXXXX)
up_make_builds "$bins"
KV_NODE_BIN=$bins/kvnode-a
# shellcheck disable=SC2086
kv_start_node --sync_writes=true ${GAPS_NODE_FLAGS:-}
report=$KV_DIR/report.json
"$KV_KVLOAD" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --workload "${GAPS_WORKLOAD:-A}" --clients 4 \
  --threads 2 --depth 4 --keys "${GAPS_KEYS:-10000}" --value_size 64 --preload \
  --duration "${GAPS_S:-12}" --report "$report" --progress=false >"$KV_DIR/kvload.log" 2>&1 &
lp=$!
clients_are() { [[ $(kv_stat clients) == "$1" ]]; }
preloaded() { grep -q "preloaded" "$KV_DIR/kvload.log"; }
kv_wait_for 120 clients_are 4 || kv_fail "clients did not connect"
kv_wait_for 600 preloaded || kv_fail "no preload"
kv_nap 4
kv_log "signal"
kill -USR2 "$KV_PID"
wait "$lp" || true
python3 - "$report" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("blackout %.1f ms at %.0f ms; GETs %.1f ms; writes %.1f ms at %.0f ms" % (
    r["blackout_ms"], r["blackout_start_ms"], r["blackout_read_ms"], r["blackout_write_ms"],
    r["blackout_write_start_ms"]))
for s in r["timeline"]:
    if s["ops"] < 5 or s["max_latency_us"] > 200000:
        print("slot %7.0f ms: ops %4d reads %4d writes %4d max latency %8.0f us" % (
            s["t_ms"], s["ops"], s["reads"], s["writes"], s["max_latency_us"]))
PY
# The node's upgrade steps and the moved clients' new sessions, beside each
# client's own "moved" line: a move's time runs from O's Move to the client's.
{
  grep -E "upgrade:|takeover:|replayed|session ready" "$KV_LOG"
  grep -E "kvclient: client [0-9]+ (moved|told to move)" "$KV_DIR/kvload.log"
} | sort -k2,2 | cut -c1-300
KV_PID=$(up_ping_field pid) # the new process serves now
kv_wait_for 60 up_not_in_progress || kv_fail "upgrade still in progress"
echo "phases (upgrade_last_phase_seconds, ms): $(up_phases)"
up_stop_node
