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
#     the page still passes promtool;
#  E. an upgrade that fails after the old process paused the endpoint
#     (o_handover:fail) rolls back: the scraper again gets 200 every time,
#     and generation 2 serves on, kvnode_rollbacks_total 1.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/upgrade_lib.sh"
kv_require_device
for t in curl promtool; do
  command -v "$t" >/dev/null || kv_fail "$t is missing (deploy/install-deps.sh: curl, prometheus)"
done
kv_tmpdir metrics-http-bins
bins=$KV_TMP
up_make_builds "$bins"
# Build b, as the old process, fails its upgrades at o_handover: after it
# stopped accepting (E).
sed -i 's|--build_id=build-b|--build_id=build-b --upgrade_fault=o_handover:fail|' "$bins/kvnode-b"
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
# A scraper in the background: one line per scrape, "N CODE generation-line".
start_scraper() { # TAG
  SCRAPES=$KV_DIR/scrapes-$1.log
  rm -f "$KV_DIR/scraper.stop"
  (
    n=0
    while [[ ! -e $KV_DIR/scraper.stop ]]; do
      n=$((n + 1))
      c=$(curl -sS --max-time 30 -o "$KV_DIR/s.txt" -w '%{http_code}' "$url" 2>&1) || c="error $c"
      echo "$n $c $(grep -a -m1 '^kvnode_upgrade_generation ' "$KV_DIR/s.txt" 2>/dev/null)"
    done >"$SCRAPES"
  ) &
  SCRAPER=$!
  kv_wait_for 30 test -s "$SCRAPES" || kv_fail "$1: the scraper did not start"
}
stop_scraper() { # TAG GENERATIONS(regex) -> every scrape was 200 of one of them
  touch "$KV_DIR/scraper.stop"
  wait "$SCRAPER"
  local bad
  bad=$(grep -v "^[0-9]* 200 kvnode_upgrade_generation $2\$" "$SCRAPES" || true)
  [[ -z $bad ]] || kv_fail "$1: scrapes failed: $bad"
  SCRAPED=$(wc -l <"$SCRAPES")
}
start_scraper D
up_upgrade kill
# A scrape of the new process too, then stop.
kv_wait_for 60 grep -q 'kvnode_upgrade_generation 2' "$SCRAPES" ||
  kv_fail "D: no scrape saw generation 2: $(tail -n 3 "$SCRAPES")"
stop_scraper D '[12]'
total=$SCRAPED
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

# --- E -----------------------------------------------------------------------
start_scraper E
RC=0
"$KV_KVCTL" --admin_socket "$KV_ADMIN" upgrade >"$KV_DIR/e.out" 2>&1 || RC=$?
[[ $RC -eq 1 ]] && grep -q "rolled back" "$KV_DIR/e.out" ||
  kv_fail "E: expected a rollback (exit 1), got exit $RC: $(cat "$KV_DIR/e.out")"
kv_wait_for 30 up_not_in_progress || kv_fail "E: the rollback did not finish"
n0=$(wc -l <"$SCRAPES")
kv_wait_for 60 eval '(($(wc -l <"$SCRAPES") > n0 + 1))' || kv_fail "E: no scrape after the rollback"
stop_scraper E 2
scrape "$KV_DIR/e.txt" || kv_fail "E: GET $url after the rollback failed"
[[ $(value "$KV_DIR/e.txt" kvnode_rollbacks_total) == 1 ]] || kv_fail "E: rollbacks_total not 1"
[[ $(value "$KV_DIR/e.txt" kvnode_upgrade_in_progress) == 0 ]] || kv_fail "E: still upgrading"
kv_ok "E: rolled back at o_handover; $SCRAPED scrapes through it, all 200 from generation 2"
up_stop_node
echo "metrics_http: PASS"
