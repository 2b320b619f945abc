#!/usr/bin/env bash
# Write deduplication across a node crash (docs/security.md 2.2): a client
# whose answer was lost retries its write after the node was SIGKILLed and
# restarted. Before the dedupe records were persisted the retry was applied a
# second time; here it must be answered from the record stored with the write.
#   put     A's PUT k=a (seq 7) applied, then B's PUT k=b: A's retry of seq 7
#           gets A's original answer (OK, A's version) and k stays b
#   delete  A's DELETE k2 (seq 8) applied, then B's PUT k2=b2: A's retry of
#           seq 8 gets OK (the original answer) and k2 stays b2
#   old     C's seq 1 followed by 20 more writes of C: a retry of seq 1, older
#           than C's persisted entries, is REJECTED (never applied)
#   new     A's next sequence is applied normally (a newer version)
#   secrets A and C resume their ids after the restart with the resume
#           secrets their Welcomes gave (persisted with the records); a Hello
#           with A's id and no secret gets a fresh id and nothing of A's
#   hijack  kvnode_security_client --mode hijack: a live victim's id without
#           its secret (none, one bit off, another client's) and a guessed id
#           get fresh ids; the victim's session and dedupe window are untouched
# (The attacks come from kvnode_security_client --mode rpcs: a session per
# client id, resumed after the restart; the node cannot tell a retry whose
# answer was lost from one whose answer was received.)
source "$(dirname "$0")/lib.sh"
kv_require_device
SEC=${KV_SECURITY_CLIENT:-$KV_BUILD/tests/e2e/kvnode_security_client}

kv_start_node --sync_writes=true --max_clients 4 --rpc_credits 4 --arena_size $((8 << 20))
port=${KV_ADDR##*:}

# rpcs OUT ARGS...: one client run (kvnode_security_client --mode rpcs, one
# process: each start costs seconds under TCG); its answer lines go to OUT.
rpcs() {
  local out=$1
  shift
  "$SEC" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --mode rpcs "$@" >"$out.full" 2>&1 ||
    { cat "$out.full" >&2; kv_fail "rpcs $*: the client failed"; }
  grep '^rpcs:' "$out.full" >"$out"
}
line() { sed -n "$2p" "$1"; } # line FILE N
client_of() { sed -E 's/.* client ([0-9]+) .*/\1/' <<<"$1"; }
secret_of() { sed -E 's/.* secret ([0-9a-f]+) .*/\1/' <<<"$1"; }
status_of() { sed -E 's/.* -> ([A-Z_]+) version.*/\1/' <<<"$1"; }
version_of() { sed -E 's/.* version ([0-9]+) .*/\1/' <<<"$1"; }
value_of() { sed -E "s/.* value '(.*)'\$/\\1/" <<<"$1"; }
expect() { # expect LINE STATUS VERSION|"" WHAT
  local l=$1 st=$2 ver=$3 what=$4
  [[ $(status_of "$l") == "$st" ]] || kv_fail "$what: expected $st: $l"
  [[ -z $ver || $(version_of "$l") == "$ver" ]] || kv_fail "$what: expected version $ver: $l"
}

# --- before the crash ----------------------------------------------------------
pre="$KV_DIR/pre.out"
rpcs "$pre" --rpcs "B:put:k2:b-old:1,A:put:k:a:7,A:delete:k2::8,B:put:k:b:2,B:put:k2:b2:3,C:put:kc:c:1:21"
a=$(line "$pre" 2)
d=$(line "$pre" 3)
A=$(client_of "$a")
B=$(client_of "$(line "$pre" 1)")
C=$(client_of "$(line "$pre" 6)")
SA=$(secret_of "$a")
SC=$(secret_of "$(line "$pre" 6)")
[[ $SA =~ ^[0-9a-f]{32}$ && $SA != 00000000000000000000000000000000 ]] ||
  kv_fail "A's Welcome carried no resume secret: $a"
expect "$a" OK "" "A's PUT"
expect "$d" OK "" "A's DELETE of k2"
va=$(version_of "$a")
vb=$(version_of "$(line "$pre" 4)")
vb2=$(version_of "$(line "$pre" 5)")
vc=$(version_of "$(line "$pre" 6)")
((vb > va)) || kv_fail "B's PUT ($vb) is not newer than A's ($va)"
kv_ok "before the crash: A=$A PUT k v$va, DELETE k2; B=$B PUT k v$vb, k2 v$vb2; C=$C 21 PUTs of kc (last v$vc)"

# --- SIGKILL, restart on the same port, RocksDB, shm and admin socket ------------
kill -KILL "$KV_PID"
rc=0
{ wait "$KV_PID"; } 2>/dev/null || rc=$?
[[ $rc -eq 137 ]] || kv_fail "node exited $rc before its SIGKILL"
KV_LOG="$KV_DIR/kvnode-2.log"
"$KV_NODE_BIN" --listen "127.0.0.1:$port" --db_path "$KV_DIR/db" --shm_name "$KV_SHM" \
  --admin_socket "$KV_ADMIN" --auth_token_file "$KV_TOKEN" --pid_file "$KV_DIR/pid" \
  --arena_size $((8 << 20)) --sync_writes=true --max_clients 4 --rpc_credits 4 \
  >"$KV_LOG" 2>&1 &
KV_PID=$!
kv_wait_for 120 kv_admin ping || kv_fail "restarted node did not answer ping within 120 s"
loaded=$(grep -o 'dedupe: [0-9]* client records loaded' "$KV_LOG" || true)
[[ -n $loaded ]] || kv_fail "the restarted node did not load its dedupe records"
kv_ok "restarted after SIGKILL: $loaded"

# --- the retries (G reads with GET RPCs) -----------------------------------------
post="$KV_DIR/post.out"
# A and C resume with their secrets (rpcs fails if a resume gets another id):
# the secrets were persisted with the records and came back at the restart.
rpcs "$post" --ids "A=$A:$SA,C=$C:$SC" --rpcs "A:put:k:a:7,G:get:k::1,A:delete:k2::8,G:get:k2::2,C:put:kc:c-stale:1,G:get:kc::3,A:put:k:a2:9"
r=$(line "$post" 1)
g=$(line "$post" 2)
expect "$r" OK "$va" "put: A's retried PUT (seq 7)"
[[ $(value_of "$g") == b && $(version_of "$g") == "$vb" ]] ||
  kv_fail "put: A's retried PUT was applied again: k is now $g (B wrote 'b' at v$vb)"
kv_ok "put: A's retry answered OK v$va from the persisted record; k still 'b' v$vb"

r=$(line "$post" 3)
g=$(line "$post" 4)
expect "$r" OK "" "delete: A's retried DELETE (seq 8)"
[[ $(status_of "$g") == OK && $(value_of "$g") == b2 && $(version_of "$g") == "$vb2" ]] ||
  kv_fail "delete: A's retried DELETE was applied again: k2 is $g (B wrote 'b2' at v$vb2)"
kv_ok "delete: A's retry answered OK from the persisted record; k2 still 'b2' v$vb2"

r=$(line "$post" 5)
g=$(line "$post" 6)
expect "$r" REJECTED "" "old: C's retry of seq 1"
[[ $(version_of "$g") == "$vc" ]] || kv_fail "old: C's seq 1 was applied again: kc is $g"
kv_ok "old: C's seq 1 (older than its persisted entries) REJECTED: $(value_of "$r" | cut -c1-90)"

r=$(line "$post" 7)
expect "$r" OK "" "new: A's next write"
(($(version_of "$r") > vb2)) || kv_fail "new: A's next write got version $(version_of "$r")"
kv_ok "new: A's next sequence applied (v$(version_of "$r"))"

kv_ok "secrets: A ($A) and C ($C) resumed their ids after the cold start with their secrets"

# --- a Hello with A's id but not its secret ---------------------------------------
thief="$KV_DIR/thief.out"
zero=00000000000000000000000000000000
"$SEC" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --mode rpcs --ids "T=$A:$zero" \
  --rpcs "T:put:k:thief:9" >"$thief" 2>&1 && kv_fail "a Hello with A's id and no secret resumed A"
grep -q "asked to resume client $A, got " "$thief" || { cat "$thief" >&2; kv_fail "thief: $(tail -n 1 "$thief")"; }
post2="$KV_DIR/post2.out"
rpcs "$post2" --ids "A=$A:$SA" --rpcs "A:put:k:a2:9"
r=$(line "$post2" 1)
v9=$(version_of "$(line "$post" 7)")
expect "$r" OK "$v9" "A's retry of seq 9 after the thief (from A's window)"
kv_ok "thief: A's id without its secret got a fresh id ($(grep -o 'got [0-9]*' "$thief")); A's window intact (seq 9 answered v$v9)"

# --- live hijack attempts ----------------------------------------------------------
"$SEC" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --mode hijack >"$KV_DIR/hijack.out" 2>&1 ||
  { cat "$KV_DIR/hijack.out" >&2; kv_fail "hijack: the node did not defend as specified"; }
kv_ok "$(grep '^hijack:' "$KV_DIR/hijack.out")"
refused=$(kv_stat errors.resume_refused)
((refused >= 5)) || kv_fail "errors.resume_refused is $refused, expected >= 5"

hits=$(kv_stat dedupe_hits)
too_old=$(kv_stat errors.rpc_too_old)
((hits >= 2)) || kv_fail "dedupe_hits is $hits, expected >= 2"
((too_old >= 1)) || kv_fail "errors.rpc_too_old is $too_old, expected >= 1"
kv_ok "stats: dedupe_hits $hits, rpc_too_old $too_old"
kv_stop_node
echo "security_dedupe: PASS"
