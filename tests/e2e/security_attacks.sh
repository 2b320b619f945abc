#!/usr/bin/env bash
# The security model attacked from the network side (docs/security.md), each
# attack by kvnode_security_client while kvload --verify (2 clients, RDMA READ
# GETs) keeps running against the same node and must see zero failed
# operations and zero verification errors; the node never dies, counts each
# refusal, and is back at its idle verbs baseline at the end.
#   files      arena shm object 0600 and admin socket 0600 in a 0700 dir, owned
#              by the node's user; nothing under the RocksDB dir group/world
#              accessible although the node was started with umask 022
#   auth       wrong tokens -> Error{auth failed}, no QP created (QPNs)
#   windows    READ with another client's rkey / the arena MR's / the RPC pool
#              MR's key, past the arena's end, RDMA WRITE: each fails on the
#              attacker's QP, only its session is cut
#   rejoin     a left or cut session's rkey fails from the next session's QP
#   sizes      key/value limits: at the limit OK, one byte over REJECTED
#   credits    more RPCs outstanding than credits: refused (RNR) on the
#              attacker's QP only
#   clients    --max_clients sessions, the next one refused, slot reusable
#   slowloris  unfinished handshakes cut at --handshake_timeout_ms
#   burst      1000 connection attempts at once: node fds stay bounded
#   arena      writes past the arena's capacity: acknowledged, evicted keys
#              served from RocksDB
#   admin      another uid on the admin socket: no access (mode), and refused
#              by SO_PEERCRED even when the mode lets it connect
source "$(dirname "$0")/lib.sh"
kv_require_device
SEC=${KV_SECURITY_CLIENT:-$KV_BUILD/tests/e2e/kvnode_security_client}
max_clients=8
# Start the node under the usual, permissive umask: it must make its own files
# private (files check below).
umask 022
kv_start_node --max_clients "$max_clients" --rpc_credits 4 --arena_size $((8 << 20)) \
  --handshake_timeout_ms 5000
sec() { "$SEC" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" "$@"; }
attack() {
  local name=$1
  shift
  local out="$KV_DIR/attack-$name.out"
  sec "$@" >"$out" 2>&1 || { cat "$out" >&2; kv_fail "$name: the node did not defend as specified"; }
  kill -0 "$KV_PID" 2>/dev/null || kv_fail "$name: the node died"
  grep -v '^security_client' "$out" | tail -n 1 | sed "s/^/[$KV_TEST] ok: /" >&2
}
admin_json() { kv_admin "$1" | python3 -c "import json,sys; v=json.load(sys.stdin); print(eval(sys.argv[1]))" "$2"; }
base_qp=$(kv_rdma_count qp)
base_mr=$(kv_rdma_count mr)

# --- files ------------------------------------------------------------------
me=$(id -un)
check_mode() {
  local path=$1 want=$2 got
  got=$(stat -c '%a %U' "$path")
  [[ $got == "$want $me" ]] || kv_fail "$path is '$got', expected '$want $me'"
}
check_mode "/dev/shm/$KV_SHM" 600
check_mode "$KV_ADMIN" 600
check_mode "$(dirname "$KV_ADMIN")" 700
kv_ok "files: arena /dev/shm/$KV_SHM 0600, admin socket 0600 in a 0700 dir, owner $me"
# RocksDB follows the umask: the node, started under 022, sets 077 itself, so
# nothing under its data directory may be group/world accessible.
open_files=$(find "$KV_DIR/db" -perm /077 -printf '%m %p\n')
[[ -z $open_files ]] || kv_fail "files under the data dir accessible to group/others:"$'\n'"$open_files"
n_db=$(find "$KV_DIR/db" | wc -l)
kv_ok "files: $n_db entries under $KV_DIR/db, none group/world accessible (db dir $(stat -c '%a' "$KV_DIR/db"), CURRENT $(stat -c '%a' "$KV_DIR/db/CURRENT"))"

# --- auth (before any other client: the QPN check needs a quiet device) -------
attack auth --mode bad_auth_qpn --n 30
[[ $(kv_rdma_count qp) -eq $base_qp ]] || kv_fail "QPs after the wrong tokens: $(kv_rdma_count qp)"

# --- the well-behaved load ----------------------------------------------------
"$KV_KVLOAD" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --workload A --clients 2 \
  --threads 1 --depth 4 --keys 300 --value_size 64 --preload --duration 3600 --verify \
  --timeout_ms 60000 --report "$KV_DIR/load.json" >"$KV_DIR/load.out" 2>&1 &
load=$!
progressed() { grep -qE '^\[ +[0-9]+s\] +[1-9]' "$KV_DIR/load.out"; }
kv_wait_for 120 progressed || { cat "$KV_DIR/load.out" >&2; kv_fail "kvload made no progress"; }
victim_rkey=$(admin_json clients 'v["clients"][0]["rkey"]')
arena_key=$(admin_json mrs '[m["lkey"] for m in v["mrs"] if m.get("label")=="arena"][0]')
pool_key=$(admin_json mrs '[m["lkey"] for m in v["mrs"] if m.get("label")=="rpc-pool"][0]')
kv_log "kvload running; victim rkey $victim_rkey, arena MR key $arena_key, pool MR key $pool_key (their rkeys: 0, no remote access)"

# --- the attacks --------------------------------------------------------------
attack windows --mode window_attack --victim_rkey "$victim_rkey" --arena_key "$arena_key" \
  --pool_key "$pool_key"
attack rejoin --mode rejoin
attack sizes --mode sizes
attack credits --mode credits --n 64
clients=$(kv_stat clients)
attack clients --mode max_clients --n $((max_clients - clients))
attack slowloris --mode slowloris --n 6 --handshake_timeout_s 5
node_fds=$(ls "/proc/$KV_PID/fd" | wc -l)
attack burst --mode burst --n 1000 --node_pid "$KV_PID" \
  --max_node_fds $((node_fds + max_clients + 64 + 4)) --timeout_s 60
attack arena --mode arena_fill --n 700 --value_size 16384
evictions=$(kv_stat arena.evictions)
[[ ${evictions:-0} -ge 1 ]] || kv_fail "arena_fill: no eviction counted"
attack aimed --mode aimed_keys --n 200
chain_full=$(kv_stat errors.index_chain_full)
[[ ${chain_full:-0} -ge 1 ]] || kv_fail "aimed_keys: errors.index_chain_full is ${chain_full:-unset}"

# --- admin socket and another uid ---------------------------------------------
if id nobody >/dev/null 2>&1 && [[ $(id -u) -eq 0 ]]; then
  as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
  adm_dir=$(dirname "$KV_ADMIN")
  out=$(as_nobody "$SEC" --mode admin_probe --admin_socket "$KV_ADMIN" --cmd stats)
  [[ $out == *"connect refused: Permission denied"* ]] || kv_fail "admin as nobody: $out"
  before=$(kv_stat admin_bad_request)
  chmod 711 "$KV_DIR" "$adm_dir"
  chmod 666 "$KV_ADMIN"
  out=$(as_nobody "$SEC" --mode admin_probe --admin_socket "$KV_ADMIN" --cmd stats)
  chmod 700 "$KV_DIR" "$adm_dir"
  chmod 600 "$KV_ADMIN"
  [[ $out == *"closed without an answer"* ]] || kv_fail "admin as nobody, open modes: $out"
  after=$(kv_stat admin_bad_request)
  ((after > ${before:-0})) || kv_fail "the SO_PEERCRED refusal was not counted"
  kv_ok "admin socket: uid 65534 gets EACCES; with the modes opened it is refused by SO_PEERCRED"
else
  kv_log "not root or no user nobody: the second-uid admin check is skipped"
fi

# --- the well-behaved clients saw nothing -------------------------------------
kill -INT "$load"
rc=0
wait "$load" || rc=$?
python3 - "$KV_DIR/load.json" <<'PY' || { tail -n 20 "$KV_DIR/load.out" >&2; kv_fail "kvload"; }
import json, sys
r = json.load(open(sys.argv[1]))
assert r["failed_ops"] == 0 and r["verify_errors"] == 0 and r["stale_reads"] == 0, r
c = r["client"]
assert c["gets_by_read"] > 0, c
print(f"kvload during the attacks: {r['ops']} ops in {r['duration_s']:.0f}s, "
      f"{c['gets_by_read']} GETs by READ, {c['gets_by_rpc']} by RPC, 0 failed, 0 verify errors")
PY
[[ $rc -eq 0 ]] || kv_fail "kvload exited $rc"

stats=$(kv_admin stats)
count() { grep -o "\"$1\":[0-9]*" <<<"$stats" | cut -d: -f2; }
for want in auth_failed:30 qp_error:7 rpc_oversize:2 too_many_clients:3 handshake_timeout:6; do
  kind=${want%%:*}
  n=$(count "$kind")
  [[ ${n:-0} -ge ${want##*:} ]] || kv_fail "errors.$kind = ${n:-0}, expected >= ${want##*:}"
done
kv_ok "refusals counted: $(grep -o '"errors":{[^}]*}' <<<"$stats")"
kv_wait_for 20 kv_qp_count_is "$base_qp" ||
  kv_fail "QPs not back at the idle baseline ($base_qp): $(kv_rdma_count qp)"
[[ $(kv_rdma_count mr) -eq $base_mr ]] || kv_fail "MRs not back at baseline: $(kv_rdma_count mr)"
kv_stop_node
echo "security_attacks: PASS"
