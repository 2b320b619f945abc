#!/usr/bin/env bash
# The security model from the host side (docs/security.md): local users.
#   memlock   a non-root node whose arena exceeds its RLIMIT_MEMLOCK (8 MiB for
#             non-root users in deploy/vm/rxe-vm) refuses to start with a message
#             naming the limit and how to raise it; within the limit the same
#             user's node starts; the refused start (after its arena was
#             created) leaves no shm object behind
#   owner     that non-root node's arena shm object (0600), admin socket (0600)
#             and its directory (0700) belong to the node's user; root's
#             admin requests are accepted (SO_PEERCRED: same uid or root)
#   squat     a shm object another user created under the node's arena name
#             (readable by all, or owned by that user) is refused, never
#             rebuilt over, and left as it was
#   handoff   a shm object another user created under the node's handoff
#             header name (/dev/shm/<shm_name>.handoff) makes a live upgrade
#             fail with an error naming the file and its owner's uid (not an
#             EEXIST from deep inside), and is left as it was
#   pidfile   --pid_file is never written through a symbolic link (the start
#             is refused and the link's target left as it was), nor in a
#             directory that others can write (0777 without sticky bit, 1777):
#             refused before anything is created, naming the directory
# Needs root in the VM (to become uid 65534 with setpriv).
source "$(dirname "$0")/lib.sh"
kv_require_device
[[ $(id -u) -eq 0 ]] || kv_fail "needs root (the VM runs tests as root) to act as a second uid"
id nobody >/dev/null 2>&1 || kv_fail "no user nobody"
as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }

kv_tmpdir "$KV_TEST"
base=$KV_TMP
chmod 755 "$base"
# The node runs as nobody, who may not reach this build (a checkout in a
# directory only its owner can enter: root's home, a mktemp -d); a live
# upgrade re-executes the node's own binary. So the binary comes from a
# directory of this test's own that nobody can enter and read.
install -d -m 755 "$base/bin"
install -m 755 "$KV_NODE_BIN" "$base/bin/kvnode"
KV_NODE_BIN=$base/bin/kvnode
KV_DIR="$base/nobody"
mkdir -m 700 "$KV_DIR"
chown 65534:65534 "$KV_DIR"
KV_TOKEN="$KV_DIR/token"
(umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$KV_TOKEN")
chown 65534:65534 "$KV_TOKEN"
limit_kib=$(as_nobody bash -c 'ulimit -l')
kv_log "RLIMIT_MEMLOCK of uid 65534: $limit_kib KiB"
[[ $limit_kib != unlimited ]] || kv_fail "uid 65534 has no memlock limit here"

# Runs kvnode as nobody; $1 tag, rest: flags. Sets KV_PID KV_LOG KV_ADMIN KV_SHM.
nobody_node() {
  local tag=$1
  shift
  KV_SHM="kvnode-e2e-$$-$tag"
  KV_ADMIN="$KV_DIR/admin-$tag/admin.sock"
  KV_LOG="$base/kvnode-$tag.log"
  # setpriv execs the node: KV_PID is the node's pid (no subshell between).
  setpriv --reuid=65534 --regid=65534 --clear-groups "$KV_NODE_BIN" --listen 127.0.0.1:0 \
    --db_path "$KV_DIR/db-$tag" --shm_name "$KV_SHM" \
    --admin_socket "$KV_ADMIN" --auth_token_file "$KV_TOKEN" --sync_writes=false "$@" \
    >"$KV_LOG" 2>&1 &
  KV_PID=$!
}
exited() { ! kill -0 "$KV_PID" 2>/dev/null; }

# --- memlock: arena 4x the limit ---------------------------------------------
nobody_node big --arena_size $((limit_kib * 4 * 1024)) --max_clients 2 --rpc_credits 2
kv_wait_for 120 exited || kv_fail "a node over its memlock limit kept running"
rc=0
wait "$KV_PID" || rc=$?
[[ $rc -ne 0 ]] || kv_fail "over the memlock limit the node exited 0"
grep -q "RLIMIT_MEMLOCK" "$KV_LOG" || { cat "$KV_LOG" >&2; kv_fail "no message naming RLIMIT_MEMLOCK"; }
kv_ok "memlock: refused (exit $rc): $(grep -m1 -o 'cannot start: .*' "$KV_LOG" | cut -c1-300)"
# The refusal came after the arena was created (registration): it must be gone.
grep -q "arena segment .* removed" "$KV_LOG" || { cat "$KV_LOG" >&2; kv_fail "memlock: the failed start did not say it removed its arena"; }
[[ ! -e /dev/shm/$KV_SHM ]] || kv_fail "memlock: the refused node left /dev/shm/$KV_SHM behind"
kv_ok "memlock: the failed start removed its arena (/dev/shm/$KV_SHM absent)"
KV_PID=""

# --- the same user within its limit: starts; its files are its own ------------
nobody_node small --arena_size $((2 << 20)) --max_clients 2 --rpc_credits 2
kv_wait_for 120 kv_admin ping || { cat "$KV_LOG" >&2; kv_fail "a node within its memlock limit did not start"; }
KV_ADDR=$(kv_admin ping | grep -o '"listen":"[^"]*"' | cut -d'"' -f4)
for f in "/dev/shm/$KV_SHM:600" "$KV_ADMIN:600" "$(dirname "$KV_ADMIN"):700"; do
  got=$(stat -c '%a %U' "${f%:*}")
  [[ $got == "${f##*:} nobody" ]] || kv_fail "${f%:*} is '$got', expected '${f##*:} nobody'"
done
kv_ok "owner: uid 65534's node has its arena 0600, admin socket 0600 in a 0700 dir, all owned by nobody; root's admin requests answered"
kv_raw --mode put_get --n 20 >"$base/put_get.out" 2>&1 || { cat "$base/put_get.out" >&2; kv_fail "put_get against the non-root node"; }
kv_ok "non-root node serves: $(tail -n 1 "$base/put_get.out")"
kv_stop_node

# --- squat: another user's object under the arena's name -----------------------
KV_TOKEN="$base/root-token"
(umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$KV_TOKEN")
for squat in 666:nobody 600:nobody; do
  mode=${squat%:*}
  KV_SHM="kvnode-e2e-$$-squat-$mode"
  as_nobody bash -c "umask 0; head -c 4096 /dev/zero > /dev/shm/$KV_SHM; chmod $mode /dev/shm/$KV_SHM"
  sum=$(md5sum <"/dev/shm/$KV_SHM")
  KV_LOG="$base/kvnode-squat-$mode.log"
  KV_ADMIN="$base/admin-squat-$mode/admin.sock"
  "$KV_NODE_BIN" --listen 127.0.0.1:0 --db_path "$base/db-squat-$mode" --shm_name "$KV_SHM" \
    --admin_socket "$KV_ADMIN" --auth_token_file "$KV_TOKEN" --arena_size $((8 << 20)) \
    >"$KV_LOG" 2>&1 &
  KV_PID=$!
  kv_wait_for 120 exited || kv_fail "squat $mode: the node started on another user's arena"
  rc=0
  wait "$KV_PID" || rc=$?
  KV_PID=""
  [[ $rc -ne 0 ]] || kv_fail "squat $mode: exit 0"
  [[ $(md5sum <"/dev/shm/$KV_SHM") == "$sum" ]] || kv_fail "squat $mode: the object was modified"
  [[ $(stat -c '%a %U' "/dev/shm/$KV_SHM") == "$mode nobody" ]] || kv_fail "squat $mode: mode/owner changed"
  kv_ok "squat ($mode nobody): refused (exit $rc), object untouched: $(grep -m1 -o 'cannot start: .*' "$KV_LOG" | cut -c1-200)"
  rm -f "/dev/shm/$KV_SHM"
done
KV_SHM=""

# --- handoff: another user's object under the handoff header's name ---------
# The node runs as nobody; root (another uid to it) creates the object after
# the node started (a cold start clears a stale header of its own), 0600, so
# that the node cannot even open it to see whose it is.
KV_TOKEN="$KV_DIR/token"
nobody_node handoff --arena_size $((2 << 20)) --max_clients 2 --rpc_credits 2
kv_wait_for 120 kv_admin ping || { cat "$KV_LOG" >&2; kv_fail "handoff: the node did not start"; }
handoff="/dev/shm/$KV_SHM.handoff"
(umask 077 && echo "root's, not the node's" >"$handoff")
sum=$(md5sum <"$handoff")
rollbacks_are() { [[ $(kv_stat rollbacks) == "$1" ]]; }
kill -USR2 "$KV_PID"
kv_wait_for 120 rollbacks_are 1 || kv_fail "handoff: the upgrade did not roll back (rollbacks $(kv_stat rollbacks))"
want="$handoff already exists, owned by uid 0 (this node runs as uid 65534)"
grep -qF "$want" "$KV_LOG" || kv_fail "handoff: no error naming the file and its owner ('$want')"
[[ $(md5sum <"$handoff") == "$sum" && $(stat -c '%a %u' "$handoff") == "600 0" ]] ||
  kv_fail "handoff: the object was modified"
kv_admin ping >/dev/null || kv_fail "handoff: the node stopped serving after the refused upgrade"
kv_ok "handoff: refused and rolled back: $(grep -m1 -oF "$want" "$KV_LOG")"
rm -f "$handoff"
kv_stop_node

# --- pidfile: no write through a link, none in a directory others can write ---
KV_TOKEN="$base/pid-token"
(umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$KV_TOKEN")
# Starts a root node with --pid_file $2 that must be refused; $1 tag. Fails
# (after stopping it) if the node came up.
up_or_exited() { exited || kv_admin ping; }
pid_refused() {
  local tag=$1 pf=$2 rc=0
  KV_SHM="kvnode-e2e-$$-$tag"
  KV_LOG="$base/kvnode-$tag.log"
  KV_ADMIN="$base/admin-$tag/admin.sock"
  "$KV_NODE_BIN" --listen 127.0.0.1:0 --db_path "$base/db-$tag" --shm_name "$KV_SHM" \
    --admin_socket "$KV_ADMIN" --auth_token_file "$KV_TOKEN" --arena_size $((8 << 20)) \
    --pid_file "$pf" >"$KV_LOG" 2>&1 &
  KV_PID=$!
  kv_wait_for 120 up_or_exited || kv_fail "$tag: the node neither started nor exited"
  if ! exited; then
    kill -KILL "$KV_PID"
    wait "$KV_PID" || true
    kv_fail "$tag: the node started with --pid_file $pf"
  fi
  wait "$KV_PID" || rc=$?
  KV_PID=""
  [[ $rc -ne 0 ]] || kv_fail "$tag: exit 0"
  [[ ! -e /dev/shm/$KV_SHM ]] || kv_fail "$tag: the refused start left /dev/shm/$KV_SHM"
}
# A symbolic link under the pid file's name, to a file the node must not clobber.
mkdir -m 700 "$base/pid-link"
echo "precious" >"$base/precious"
ln -s "$base/precious" "$base/pid-link/pid"
pid_refused pid-link "$base/pid-link/pid"
grep -qF -- "--pid_file $base/pid-link/pid is a symbolic link" "$KV_LOG" ||
  kv_fail "pid-link: no message naming the link"
[[ $(cat "$base/precious") == precious && -L $base/pid-link/pid ]] ||
  kv_fail "pid-link: the link or its target was changed: $(cat "$base/precious")"
kv_ok "pidfile: a link refused, its target untouched: $(grep -m1 -o -- '--pid_file .*' "$KV_LOG" | cut -c1-200)"
# Directories that others can write: anyone could plant that link.
for mode in 777 1777; do
  d="$base/pid-$mode"
  mkdir "$d"
  chmod "$mode" "$d"
  pid_refused "pid-$mode" "$d/pid"
  want="--pid_file $d/pid: directory $d has mode $(printf %04d "$mode")"
  grep -qF -- "$want" "$KV_LOG" || kv_fail "pid-$mode: no message '$want'"
  [[ ! -e $d/pid ]] || kv_fail "pid-$mode: a pid file was written"
  kv_ok "pidfile: a directory with mode $mode refused: $(grep -m1 -o -- '--pid_file .*' "$KV_LOG" | cut -c1-200)"
done
KV_SHM=""
echo "security_local: PASS"
