#!/usr/bin/env bash
# GET /metrics over HTTP (--metrics_listen 127.0.0.1:0) on a node on a
# verbs device:
#  A. the page is what `kvctl metrics` prints (the same families) and
#     passes `promtool check metrics`;
#  B. kvnode_ops_total{op="put"} rises with kvload's traffic;
#  C. another path is 404, POST is 405, HEAD 405;
#  D. a live upgrade: a scraper polling through it gets 200 every time
#     (the old process pauses, the socket is handed over, the scrape waits
#     in the backlog for the new one, never refused); afterwards the same
#     address serves generation 2, the put counter did not go back, and
#     the page still passes promtool.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/upgrade_lib.sh"
kv_require_device
for t in curl promtool; do
  command -v "$t" >/dev/null || kv_fail "$t is missing (deploy/install-deps.sh: curl, prometheus)"
done
bins=$(mktemp -d /tmp/kv-e2e-metrics-http.XXXXXX)
up_make_builds "$bins"
KV_NODE_BIN=$bins/kvnode-a
kv_start_node "${UP_NODE_FLAGS[@]}" --metrics_listen 127.0.0.1:0
UP_FIRST_PID=$KV_PID
line=$(grep -a -m1 -o 'serving GET /metrics on http://[^ ]*' "$KV_LOG") ||
  kv_fail "the node did not log its metrics address"
url=${line##* }
kv_log "metrics at $url"

scrape() { # FILE -> 0 when GET $url answered 200 into FILE
  local code
  code=$(curl -sS --max-time 30 -o "$1" -w '%{http_code}' "$url") && [[ $code == 200 ]]
}
promtool_ok() { # FILE
  promtool check metrics <"$1" >"$1.promtool" 2>&1 ||
    kv_fail "promtool check metrics: $(cat "$1.promtool")"
}
value() { # FILE SERIES -> its value (status 1 when the page has no such series)
  awk -v s="$2" '$1 == s { print $2; found = 1; exit } END { exit !found }' "$1"
}

# --- A -----------------------------------------------------------------------
scrape "$KV_DIR/a.txt" || kv_fail "A: GET $url failed"
promtool_ok "$KV_DIR/a.txt"
"$KV_KVCTL" --admin_socket "$KV_ADMIN" metrics >"$KV_DIR/a.kvctl" || kv_fail "A: kvctl metrics failed"
diff <(grep '^# TYPE' "$KV_DIR/a.txt") <(grep '^# TYPE' "$KV_DIR/a.kvctl") >"$KV_DIR/a.diff" ||
  kv_fail "A: /metrics and kvctl metrics differ in families: $(cat "$KV_DIR/a.diff")"
[[ $(value "$KV_DIR/a.txt" kvnode_upgrade_generation) == 1 ]] || kv_fail "A: not generation 1"
kv_ok "A: $(grep -c '^# TYPE' "$KV_DIR/a.txt") families, as kvctl metrics prints them; promtool clean"

# --- B -----------------------------------------------------------------------
put='kvnode_ops_total{op="put"}'
before=$(value "$KV_DIR/a.txt" "$put") || kv_fail "B: no $put"
"$KV_KVLOAD" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --workload A --clients 2 \
  --threads 1 --keys 500 --value_size 32 --preload --duration 2 >"$KV_DIR/kvload.out" 2>&1 ||
  kv_fail "B: kvload failed: $(tail -n 5 "$KV_DIR/kvload.out")"
scrape "$KV_DIR/b.txt" || kv_fail "B: GET $url failed"
after=$(value "$KV_DIR/b.txt" "$put")
((after > before)) || kv_fail "B: $put $before -> $after after kvload"
kv_ok "B: $put $before -> $after after kvload"

# --- C -----------------------------------------------------------------------
code() { curl -sS --max-time 30 -o /dev/null -w '%{http_code}' "$@"; }
[[ $(code "${url%/metrics}/nope") == 404 ]] || kv_fail "C: /nope was not 404"
[[ $(code "${url%/metrics}/") == 404 ]] || kv_fail "C: / was not 404"
[[ $(code -X POST "$url") == 405 ]] || kv_fail "C: POST /metrics was not 405"
[[ $(code -I "$url") == 405 ]] || kv_fail "C: HEAD /metrics was not 405"
kv_ok "C: 404 for other paths, 405 for POST and HEAD"

# --- D -----------------------------------------------------------------------
stop=$KV_DIR/scraper.stop
(
  n=0
  while [[ ! -e $stop ]]; do
    n=$((n + 1))
    c=$(curl -sS --max-time 30 -o "$KV_DIR/d.$n.txt" -w '%{http_code}' "$url" 2>&1) || c="error $c"
    echo "$n $c $(grep -a -m1 '^kvnode_upgrade_generation ' "$KV_DIR/d.$n.txt" 2>/dev/null)"
  done >"$KV_DIR/scrapes.log"
) &
scraper=$!
kv_wait_for 30 test -s "$KV_DIR/scrapes.log" || kv_fail "D: the scraper did not start"
up_upgrade kill
# A few scrapes of the new process too, then stop.
kv_wait_for 60 grep -q 'kvnode_upgrade_generation 2' "$KV_DIR/scrapes.log" ||
  kv_fail "D: no scrape saw generation 2: $(tail -n 3 "$KV_DIR/scrapes.log")"
touch "$stop"
wait "$scraper"
total=$(wc -l <"$KV_DIR/scrapes.log")
bad=$(grep -v '^[0-9]* 200 kvnode_upgrade_generation [12]$' "$KV_DIR/scrapes.log" || true)
[[ -z $bad ]] || kv_fail "D: scrapes through the upgrade failed: $bad"
scrape "$KV_DIR/d.txt" || kv_fail "D: GET $url after the upgrade failed"
promtool_ok "$KV_DIR/d.txt"
[[ $(value "$KV_DIR/d.txt" kvnode_upgrade_generation) == 2 ]] || kv_fail "D: not generation 2"
[[ $(value "$KV_DIR/d.txt" kvnode_upgrades_total) == 1 ]] || kv_fail "D: upgrades_total not 1"
again=$(value "$KV_DIR/d.txt" "$put")
((again >= after)) || kv_fail "D: $put went back across the upgrade: $after -> $again"
served=$(grep -a 'serving GET /metrics on' "$KV_LOG")
if grep -vqF "$url" <<<"$served" || (($(wc -l <<<"$served") < 2)); then
  kv_fail "D: each process should have served $url: $served"
fi
kv_ok "D: $total scrapes through the upgrade, all 200; $url serves generation 2 ($UP_OLD -> $UP_NEW), $put $after -> $again"
up_stop_node
rm -rf "$bins"
echo "metrics_http: PASS"
