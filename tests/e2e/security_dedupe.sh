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
rpcs "$post" --ids "A=$A,C=$C" --rpcs "A:put:k:a:7,G:get:k::1,A:delete:k2::8,G:get:k2::2,C:put:kc:c-stale:1,G:get:kc::3,A:put:k:a2:9"
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

hits=$(kv_stat dedupe_hits)
too_old=$(kv_stat errors.rpc_too_old)
((hits >= 2)) || kv_fail "dedupe_hits is $hits, expected >= 2"
((too_old >= 1)) || kv_fail "errors.rpc_too_old is $too_old, expected >= 1"
kv_ok "stats: dedupe_hits $hits, rpc_too_old $too_old"
kv_stop_node
echo "security_dedupe: PASS"
