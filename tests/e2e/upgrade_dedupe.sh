#!/usr/bin/env bash
# Write deduplication across a live upgrade and then a crash: a write the new
# process applied, whose answer was lost to a SIGKILL, is retried after a cold
# start and must be answered from the record persisted with it, not applied a
# second time. The record holds entries the new process imported from the old
# one's session table: before the handoff carried each entry's opcode they
# came across as opcode 0, the cold start refused the whole record ("entry
# opcode") and the retry was applied again.
#   1. generation 1: D's PUT k=d1 (seq 1)
#   2. live upgrade: generation 2 imports D's window (seq 1)
#   3. generation 2: D resumes (its secret crossed too) and PUTs k=d2 (seq 2);
#      the record stored with it holds seq 1 (imported) and seq 2
#   4. SIGKILL generation 2, cold start on the same port and database
#   5. D resumes and retries seq 2 and seq 1: both answered from the record
#      with their original versions; k is still d2 at seq 2's version
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/upgrade_lib.sh"
kv_require_device
SEC=${KV_SECURITY_CLIENT:-$KV_BUILD/tests/e2e/kvnode_security_client}
flags=(--sync_writes=true --max_clients 4 --rpc_credits 4 --arena_size $((8 << 20)))
kv_start_node "${UP_NODE_FLAGS[@]}" "${flags[@]}"
UP_FIRST_PID=$KV_PID
port=${KV_ADDR##*:}

rpcs() { # rpcs OUT ARGS...: one kvnode_security_client --mode rpcs run
  local out=$1
  shift
  "$SEC" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --mode rpcs "$@" >"$out.full" 2>&1 ||
    { cat "$out.full" >&2; kv_fail "rpcs $*: the client failed"; }
  grep '^rpcs:' "$out.full" >"$out"
}
line() { sed -n "$2p" "$1"; }
client_of() { sed -E 's/.* client ([0-9]+) .*/\1/' <<<"$1"; }
secret_of() { sed -E 's/.* secret ([0-9a-f]+) .*/\1/' <<<"$1"; }
status_of() { sed -E 's/.* -> ([A-Z_]+) version.*/\1/' <<<"$1"; }
version_of() { sed -E 's/.* version ([0-9]+) .*/\1/' <<<"$1"; }
value_of() { sed -E "s/.* value '(.*)'\$/\\1/" <<<"$1"; }

# --- 1. generation 1 -------------------------------------------------------------
rpcs "$KV_DIR/g1.out" --rpcs "D:put:k:d1:1"
r=$(line "$KV_DIR/g1.out" 1)
[[ $(status_of "$r") == OK ]] || kv_fail "D's PUT on generation 1: $r"
D=$(client_of "$r")
SD=$(secret_of "$r")
v1=$(version_of "$r")
kv_ok "generation 1: client $D PUT k=d1 (seq 1) v$v1"

# --- 2. live upgrade -----------------------------------------------------------------
up_upgrade kill
kv_ok "live upgrade: generation 2 is pid $UP_NEW"

# --- 3. generation 2 -------------------------------------------------------------
rpcs "$KV_DIR/g2.out" --ids "D=$D:$SD" --rpcs "D:put:k:d2:2,D:put:k:d1:1"
r=$(line "$KV_DIR/g2.out" 1)
[[ $(status_of "$r") == OK ]] || kv_fail "D's PUT on generation 2: $r"
v2=$(version_of "$r")
((v2 > v1)) || kv_fail "D's seq 2 got v$v2, not newer than v$v1"
r=$(line "$KV_DIR/g2.out" 2)
[[ $(status_of "$r") == OK && $(version_of "$r") == "$v1" ]] ||
  kv_fail "D's retry of seq 1 on generation 2 was not answered from the imported window: $r"
kv_ok "generation 2: D resumed, PUT k=d2 (seq 2) v$v2; seq 1 answered v$v1 from the imported window"

# --- 4. SIGKILL, cold start ----------------------------------------------------------
kill -KILL "$KV_PID"
kv_wait_for 30 up_gone "$KV_PID" || kv_fail "generation 2 ($KV_PID) survived SIGKILL"
KV_LOG="$KV_DIR/kvnode-cold.log"
"$KV_NODE_BIN" --listen "127.0.0.1:$port" --db_path "$KV_DIR/db" --shm_name "$KV_SHM" \
  --admin_socket "$KV_ADMIN" --auth_token_file "$KV_TOKEN" --pid_file "$KV_DIR/pid" \
  "${flags[@]}" >"$KV_LOG" 2>&1 &
KV_PID=$!
UP_FIRST_PID=$KV_PID
kv_wait_for 120 kv_admin ping || kv_fail "the cold start did not answer ping within 120 s"
if grep -q 'ignoring a persisted dedupe record' "$KV_LOG"; then
  kv_fail "the cold start refused a dedupe record: $(grep 'ignoring a persisted' "$KV_LOG")"
fi
kv_ok "cold start: $(grep -o 'dedupe: [0-9]* client records loaded' "$KV_LOG" || echo 'no load line')"

# --- 5. the retries ---------------------------------------------------------------
rpcs "$KV_DIR/cold.out" --ids "D=$D:$SD" --rpcs "D:put:k:d2:2,D:put:k:d1:1,G:get:k::1"
r=$(line "$KV_DIR/cold.out" 1)
[[ $(status_of "$r") == OK && $(version_of "$r") == "$v2" ]] ||
  kv_fail "D's retry of seq 2 after the crash was applied again (or refused): $r (applied as v$v2)"
r=$(line "$KV_DIR/cold.out" 2)
[[ $(status_of "$r") == OK && $(version_of "$r") == "$v1" ]] ||
  kv_fail "D's retry of seq 1 (imported at the upgrade) after the crash: $r (applied as v$v1)"
g=$(line "$KV_DIR/cold.out" 3)
[[ $(value_of "$g") == d2 && $(version_of "$g") == "$v2" ]] ||
  kv_fail "k after the retries: $g (expected d2 at v$v2: each write applied once)"
kv_ok "after the crash: D's seq 2 answered v$v2 and seq 1 v$v1 from the persisted record; k is d2 v$v2"
kv_stop_node
echo "upgrade_dedupe: PASS"
