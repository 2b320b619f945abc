#!/usr/bin/env bash
# deploy/kvnode.service and deploy/kvnode.env as shipped start a node and
# upgrade it live. The guest has no systemd, so tests/e2e/systemd_unit.py
# reads the unit's ExecStart= and ExecReload= exactly as written and does what
# systemd does with them (EnvironmentFile= variables, %S %t %E specifiers);
# the directories systemd would create (StateDirectory=, RuntimeDirectory=,
# both 0700) and /etc/kvnode (the env file, the token) live under a temp root.
# Only the binary is this build's, a copy under the temp root's
# /usr/local/bin/kvnode.
# KV_UNIT, KV_UNIT_ENV, KV_UNIT_EXEC (the unit, its env file, the ExecStart
# binary it names) and KV_NODE_BIN_REAL select another unit: e2e_deb_unit
# runs the one the .deb installs (package_deb unpacks it).
#
# The unit's User=/Group= (kvnode) run every Exec line, as systemd would
# (setpriv, with the unit's LimitMEMLOCK): the directories are that user's as
# systemd and the package's postinst make them (state and runtime
# directories the user's, 0700; /etc/kvnode root:GROUP 0750; the token the
# user's, 0600). The guest's root file system is the host's, read-only,
# without that user: the test adds it, as postinst's adduser --system would,
# to copies of /etc/passwd and /etc/group mounted over them in a mount
# namespace of its own. Needs root (the VM's).
#
# 1. The env file as shipped (listen on 0.0.0.0:7000, no advertise address):
#    the node refuses to start and names --advertise_address.
# 2. A reload that rolls back after the new process said Owned (O held at
#    the o_owned fault point until its watchdog rolls back and kills N): the
#    unit's main PID never names N and stays on O, which serves on, and
#    ExecReload fails with the rollback's reason.
# 3. With KVNODE_ADVERTISE_ADDRESS=127.0.0.1 (what the env file's comments ask
#    the operator to set) and a small arena in KVNODE_OPTS: the node starts,
#    authenticates clients with the token file, writes the pid file, keeps its
#    database under the state directory; kvload --verify runs while the
#    unit's ExecReload does a live upgrade and reports it: a new pid serves
#    generation 2 with the same arguments, the pid file and the unit's main
#    PID name it, the clients moved, zero failed operations. Both
#    processes run as the unit's user; the database, the pid file and the
#    arena are that user's.
# 4. A crash: the unit says Restart=on-failure with RestartSec=1; the serving
#    process is SIGKILLed under kvload --verify and ExecStart runs again as
#    systemd would: the new process takes the dirty arena back ("recovered")
#    as the unit's user, and the clients reconnect with zero failed
#    operations.
# systemd's notify socket (NOTIFY_SOCKET) is imitated by systemd_unit.py
# --notify: it logs what the node tells systemd and keeps the main PID, which
# ExecReload gets as $MAINPID, and says when the main process dies (systemd
# would then stop the unit).
repo=$(cd "$(dirname "$0")/../.." && pwd)
unit=${KV_UNIT:-$repo/deploy/kvnode.service}
unit_value() { python3 "$repo/tests/e2e/systemd_unit.py" --unit "$unit" --root "${root:-/}" --value "$1"; }
user=$(unit_value User)
group=$(unit_value Group)
# A storage node reachable from the network does not run as root.
[[ -n $user && $user != root && $user != 0 ]] ||
  { echo "deploy_unit: FAIL: $unit runs the node as root (User=${user:-unset})" >&2; exit 1; }
# The user as postinst makes it, visible to this script and its children only.
if ! getent passwd "$user" >/dev/null && [[ -z ${KV_UNIT_USER_NS:-} ]]; then
  [[ $(id -u) -eq 0 ]] || { echo "deploy_unit: FAIL: User=$user needs root to run as" >&2; exit 1; }
  KV_UNIT_USER_NS=1 exec unshare -m --propagation private bash -c '
    set -euo pipefail
    user=$1 group=$2
    shift 2
    etc=$(mktemp -d /tmp/kv-e2e-etc.XXXXXX)
    mount -t tmpfs -o mode=755 tmpfs "$etc"
    cp /etc/passwd /etc/group "$etc/"
    # A free system uid/gid (adduser --system picks one below 1000 alike).
    id=999
    while getent passwd "$id" >/dev/null || getent group "$id" >/dev/null; do id=$((id - 1)); done
    echo "${group:-$user}:x:$id:" >>"$etc/group"
    echo "$user:x:$id:$id::/var/lib/$user:/usr/sbin/nologin" >>"$etc/passwd"
    mount --bind "$etc/passwd" /etc/passwd
    mount --bind "$etc/group" /etc/group
    exec "$@"' deploy_unit "$user" "$group" "$0" "$@"
fi
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/upgrade_lib.sh"
kv_require_device
unit_exec=${KV_UNIT_EXEC:-/usr/local/bin/kvnode}
KV_NODE_BIN=${KV_NODE_BIN_REAL:-$KV_BUILD/node/kvnode}

kv_tmpdir "$KV_TEST"
root=$KV_TMP
KV_DIR=$root
mkdir -p "$root/var/lib" "$root/run" "$root/etc"
mkdir -m 700 "$root/var/lib/kvnode" "$root/run/kvnode" "$root/etc/kvnode"
KV_TOKEN=$root/etc/kvnode/token
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$KV_TOKEN")
cp "${KV_UNIT_ENV:-$repo/deploy/kvnode.env}" "$root/etc/kvnode/kvnode.env"
KV_ADMIN=$root/run/kvnode/admin.sock
pid_file=$root/run/kvnode/kvnode.pid
# "${as_unit_user[@]}" CMD...: CMD as the unit's User=/Group=, as systemd
# runs an Exec line; start_unit adds the unit's LimitMEMLOCK.
memlock=$(unit_value LimitMEMLOCK)
case $memlock in
"") memlock=$(ulimit -l) ;;
infinity) memlock=unlimited ;;
*) memlock=$((memlock / 1024)) ;;
esac
uid=$(id -u "$user")
group=${group:-$(id -gn "$user")}
as_unit_user=(setpriv --reuid="$user" --regid="$group" --init-groups --)
# What systemd does for StateDirectory=/RuntimeDirectory= with User=, and
# postinst for /etc/kvnode and the token. The temp root stands for /, whose
# directories anyone may traverse.
chmod 755 "$root" "$root/var" "$root/var/lib" "$root/run" "$root/etc"
# The unit's user may not reach this build (a checkout in a private directory)
# and a live upgrade re-executes the binary: it is installed where ExecStart
# names it, under the temp root, as the package would.
(umask 022 && install -D -m 755 "$KV_NODE_BIN" "$root$unit_exec")
KV_NODE_BIN=$root$unit_exec
chown "$user:$group" "$root/var/lib/kvnode" "$root/run/kvnode" "$KV_TOKEN"
chown "root:$group" "$root/etc/kvnode"
chmod 750 "$root/etc/kvnode"
kv_log "the unit runs as User=$user (uid $uid) Group=$group, LimitMEMLOCK=$memlock"
# runs_as_unit_user PID: the process's real, effective, saved and fs uids.
runs_as_unit_user() {
  local uids
  uids=$(sed -n 's/^Uid:[[:space:]]*//p' "/proc/$1/status" | tr -s '[:space:]' ' ')
  [[ $uids == "$uid $uid $uid $uid " || $uids == "$uid $uid $uid $uid" ]] ||
    kv_fail "pid $1 runs with uids $uids, not User=$user ($uid)"
}
owned_by_unit_user() {
  [[ $(stat -c %U "$1") == "$user" ]] || kv_fail "$1 is owned by $(stat -c %U "$1"), not $user"
}

# unit_command KEY [--set VAR=VALUE]: the command line into CMD (an array).
unit_command() {
  local key=$1
  shift
  CMD=()
  mapfile -d '' -t CMD < <(python3 "$(dirname "$0")/systemd_unit.py" --unit "$unit" --root "$root" \
    "$@" "$key")
  [[ ${#CMD[@]} -gt 0 ]] || kv_fail "no $key= command from $unit"
  kv_log "$key: ${CMD[*]}"
}
# systemd's notify socket and the main PID it keeps (systemd_unit.py --notify).
mkdir -m 755 "$root/run/systemd"
notify_sock=$root/run/systemd/notify
main_pid_file=$root/main.pid
notify_log=$root/notify.log
python3 "$(dirname "$0")/systemd_unit.py" --notify "$notify_sock" --main_pid_file "$main_pid_file" \
  --log "$notify_log" & # a background job: kv_cleanup ends it
kv_wait_for 30 test -S "$notify_sock" || kv_fail "no notify socket at $notify_sock"
main_pid() { cat "$main_pid_file"; }
main_pid_is() { [[ $(main_pid) == "$1" ]]; }
# start_unit LOG: runs the unit's ExecStart (this build's binary) in the background.
start_unit() {
  unit_command ExecStart
  [[ ${CMD[0]} == "$unit_exec" ]] || kv_fail "ExecStart runs ${CMD[0]}, expected $unit_exec"
  KV_LOG=$1
  (
    ulimit -l "$memlock"
    export NOTIFY_SOCKET=$notify_sock
    exec "${as_unit_user[@]}" "$KV_NODE_BIN" "${CMD[@]:1}"
  ) >"$KV_LOG" 2>&1 &
  KV_PID=$!
  echo "$KV_PID" >"$main_pid_file"
  echo "---- started $KV_PID" >>"$notify_log"
}
# reload OUT: the unit's ExecReload as its user ($MAINPID from the notify
# socket's main PID; a kvctl it names is this build's); RELOAD_RC its status.
kvctl_real=$KV_KVCTL
[[ -n ${KV_NODE_BIN_REAL:-} ]] && kvctl_real=$(dirname "$KV_NODE_BIN_REAL")/kvctl
reload() {
  unit_command ExecReload --set "MAINPID=$(main_pid)"
  [[ ${CMD[0]} == "$(dirname "$unit_exec")/kvctl" ]] && CMD[0]=$kvctl_real
  RELOAD_RC=0
  "${as_unit_user[@]}" "${CMD[@]}" >"$1" 2>&1 || RELOAD_RC=$?
  kv_log "ExecReload exited $RELOAD_RC: $(tr '\n' ' ' <"$1")"
}

# --- 1. as shipped: no advertise address for a wildcard listener -> refused --
start_unit "$root/shipped.log"
exited() { up_gone "$KV_PID"; }
kv_wait_for 60 exited || kv_fail "the node started with the env file as shipped (no advertise address)"
rc=0
wait "$KV_PID" || rc=$?
[[ $rc -ne 0 ]] || kv_fail "the node exited 0 with the env file as shipped"
grep -q "advertise_address: required when --listen 0.0.0.0:7000 is a wildcard address" "$KV_LOG" ||
  kv_fail "no message naming --advertise_address"
[[ ! -e $root/var/lib/kvnode/db ]] || kv_fail "the refused node created its database"
KV_PID=""
kv_ok "as shipped (KVNODE_ADVERTISE_ADDRESS empty): refused, exit $rc: $(grep -o 'advertise_address: required when --listen [^ ]* is a wildcard address' "$KV_LOG")"

# --- 2. a reload rolled back after Owned: the main PID stays on O -------------
# O's watchdog fires 2 s after the 5 s Owned deadline, long before N's own
# deadline for O's exit (30 s after Owned), which would kill the hung O.
KV_SHM="kvnode-e2e-deploy-rb-$$"
sed -i -e 's/^KVNODE_ADVERTISE_ADDRESS=.*/KVNODE_ADVERTISE_ADDRESS=127.0.0.1/' \
  -e "s/^KVNODE_OPTS=.*/KVNODE_OPTS=--arena_size=$((32 << 20)) --shm_name=$KV_SHM \
--upgrade_fault=o_owned:hang --upgrade_owned_deadline_ms=5000/" "$root/etc/kvnode/kvnode.env"
start_unit "$root/rollback.log"
UP_FIRST_PID=$KV_PID
o=$KV_PID
kv_wait_for 60 kv_admin ping || kv_fail "the node did not answer ping at $KV_ADMIN within 60 s"
said_ready() { grep -q "^pid $o: READY=1" "$notify_log"; }
kv_wait_for 30 said_ready || kv_fail "the node did not tell systemd READY=1: $(cat "$notify_log")"
(
  reload "$root/reload-rollback.out"
  echo "$RELOAD_RC" >"$root/reload-rollback.rc"
) &
kv_wait_for 90 kv_stat_is rollbacks 1 || kv_fail "the reload did not roll back"
grep -q "injected hang at o_owned" "$KV_LOG" || kv_fail "O did not stop at o_owned (after Owned)"
n=$(sed -n 's/.*upgrade: spawned .* as pid \([0-9]*\).*/\1/p' "$KV_LOG" | tail -n 1)
[[ -n $n ]] || kv_fail "no spawned new process in the log"
kv_wait_for 30 up_gone "$n" || kv_fail "the new process $n outlived the rollback"
kv_wait_for 10 main_pid_is "$o" ||
  kv_fail "the unit's main PID is $(main_pid) after the rollback, not the serving process $o: \
$(tr '\n' '|' <"$notify_log")"
! grep -q "main PID $o -> $n" "$notify_log" ||
  kv_fail "systemd was told the main PID is $n before $o committed: $(tr '\n' '|' <"$notify_log")"
up_generation_is 1 && [[ $(up_ping_field pid) == "$o" ]] || kv_fail "$o does not serve generation 1"
kv_wait_for 60 test -s "$root/reload-rollback.rc" || kv_fail "ExecReload still running"
[[ $(<"$root/reload-rollback.rc") -ne 0 ]] ||
  kv_fail "ExecReload exited 0 for an upgrade that rolled back: $(cat "$root/reload-rollback.out")"
grep -q "rolled back.*stuck in step n_owned" "$root/reload-rollback.out" ||
  kv_fail "ExecReload did not say why it failed: $(cat "$root/reload-rollback.out")"
up_stop_node
kv_ok "reload rolled back after Owned: main PID stayed $o (never $n), ExecReload failed: \
$(tr '\n' ' ' <"$root/reload-rollback.out")"

# --- 3. configured: starts, serves, ExecReload upgrades it live ---------------
KV_SHM="kvnode-e2e-deploy-$$"
sed -i -e 's/^KVNODE_ADVERTISE_ADDRESS=.*/KVNODE_ADVERTISE_ADDRESS=127.0.0.1/' \
  -e "s/^KVNODE_OPTS=.*/KVNODE_OPTS=--arena_size=$((32 << 20)) --shm_name=$KV_SHM/" \
  "$root/etc/kvnode/kvnode.env"
start_unit "$root/kvnode.log"
UP_FIRST_PID=$KV_PID
kv_wait_for 60 kv_admin ping || kv_fail "the node did not answer ping at $KV_ADMIN within 60 s"
listen=$(kv_admin ping | grep -o '"listen":"[^"]*"' | cut -d'"' -f4)
[[ $listen == 0.0.0.0:7000 ]] || kv_fail "listening on $listen, expected the env file's 0.0.0.0:7000"
KV_ADDR=127.0.0.1:7000
[[ $(<"$pid_file") == "$KV_PID" ]] || kv_fail "pid file says $(<"$pid_file"), node is $KV_PID"
[[ -d $root/var/lib/kvnode/db ]] || kv_fail "no database under the state directory"
runs_as_unit_user "$KV_PID"
for f in "$root/var/lib/kvnode/db" "$pid_file" "$KV_ADMIN" "/dev/shm/$KV_SHM"; do
  owned_by_unit_user "$f"
done
kv_ok "started from the unit: pid $KV_PID on $listen as $user, pid file and database in place"

# A client without the token is refused (the unit never runs unauthenticated).
(umask 077 && echo wrong-token >"$root/wrong-token")
rc=0
"$KV_KVLOAD" --server "$KV_ADDR" --auth_token_file "$root/wrong-token" --clients 1 --ops 1 \
  --keys 1 --progress=false --connect_timeout_ms 5000 >"$root/wrong.log" 2>&1 || rc=$?
[[ $rc -ne 0 ]] || kv_fail "a client with a wrong token was served"
grep -qi "auth" "$root/wrong.log" || kv_fail "a wrong token was not refused as such: $(cat "$root/wrong.log")"

"$KV_KVLOAD" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --workload A --clients 2 --threads 1 \
  --depth 4 --keys 300 --value_size 64 --preload --duration 100000 --verify \
  --report "$root/report.json" --progress=false --connect_timeout_ms 5000 --timeout_ms 30000 \
  >"$root/kvload.log" 2>&1 &
load_pid=$!
kv_wait_for 120 kv_stat_is clients 2 || kv_fail "kvload's clients did not connect"
kv_wait_for 60 kv_stat_at_least ops_put 400 || kv_fail "no load"

old=$KV_PID
reload "$root/reload.out"
[[ $RELOAD_RC -eq 0 ]] || kv_fail "ExecReload failed"
kv_wait_for 90 up_generation_is 2 || kv_fail "generation 2 did not answer within 90 s of ExecReload"
new=$(up_ping_field pid)
[[ $new != "$old" ]] || kv_fail "same pid $new after the upgrade"
grep -q "generation 1 -> 2" "$root/reload.out" || kv_fail "ExecReload did not report the upgrade"
kv_wait_for 10 main_pid_is "$new" || kv_fail "the unit's main PID is $(main_pid), not $new"
kv_wait_for 30 up_gone "$old" || kv_fail "old process $old still alive 30 s after the upgrade"
rc=0
wait "$old" || rc=$?
[[ $rc -eq 0 ]] || kv_fail "old process $old exited $rc"
KV_PID=$new
pid_is_new() { [[ $(<"$pid_file") == "$new" ]]; }
kv_wait_for 10 pid_is_new || kv_fail "pid file says $(<"$pid_file") after the upgrade, new pid is $new"
runs_as_unit_user "$new"
owned_by_unit_user "$pid_file"
kv_wait_for 30 up_not_in_progress || kv_fail "upgrade still in progress on $new"
kv_wait_for 30 kv_stat_is clients 2 || kv_fail "clients on the new process: $(kv_stat clients)"
# The new process runs with the unit's arguments (a live upgrade keeps them).
tr '\0' '\n' <"/proc/$new/cmdline" >"$root/new.cmdline"
for w in --advertise_address=127.0.0.1 "--db_path=$root/var/lib/kvnode/db" \
  "--auth_token_file=$KV_TOKEN" "--pid_file=$pid_file"; do
  grep -qxF -- "$w" "$root/new.cmdline" || kv_fail "the new process lacks $w: $(tr '\n' ' ' <"$root/new.cmdline")"
done
puts=$(kv_stat ops_put)
kv_wait_for 60 kv_stat_at_least ops_put $((${puts%.*} + 200)) || kv_fail "no load on the new process"
kv_stop_kvload "$load_pid" "$root/kvload.log"
python3 - "$root/report.json" <<'PY' || { tail -20 "$root/kvload.log" >&2; kv_fail "report check"; }
import json, sys
r = json.load(open(sys.argv[1]))
c = r["client"]
assert r["failed_ops"] == 0, f"failed_ops {r['failed_ops']}"
assert r["verify_errors"] == 0, f"verify_errors {r['verify_errors']}"
assert r["stale_reads"] == 0, f"stale_reads {r['stale_reads']}"
assert c["moves"] + c["reconnects"] >= 2, f"moves {c['moves']} reconnects {c['reconnects']}"
assert c["moves_refused"] == 0, f"moves_refused {c['moves_refused']}"
print(f"kvload: {r['ops']} ops, failed 0, verify errors 0, moves {c['moves']}, "
      f"reconnects {c['reconnects']}")
PY
grep -q "moved to 127.0.0.1:7000" "$root/kvload.log" || kv_fail "no client moved to 127.0.0.1:7000"
kv_ok "ExecReload: $old -> $new (generation 2), both as $user, clients moved to 127.0.0.1:7000"

# --- 4. a crash: Restart=on-failure runs ExecStart again ----------------------
[[ $(unit_value Restart) == on-failure ]] || kv_fail "Restart=$(unit_value Restart), not on-failure"
[[ $(unit_value RestartSec) =~ ^1s?$ ]] || kv_fail "RestartSec=$(unit_value RestartSec), not 1"
"$KV_KVLOAD" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --workload A --clients 2 --threads 1 \
  --depth 4 --keys 300 --value_size 64 --duration 100000 --verify --report "$root/crash.json" \
  --progress=false --connect_timeout_ms 30000 --timeout_ms 30000 >"$root/crash-kvload.log" 2>&1 &
load_pid=$!
puts=$(kv_stat ops_put)
kv_wait_for 60 kv_stat_at_least ops_put $((${puts%.*} + 200)) || kv_fail "no load before the crash"
crashed=$KV_PID
kill -KILL "$crashed"
kv_wait_for 30 up_gone "$crashed" || kv_fail "$crashed outlived SIGKILL"
start_unit "$root/kvnode-restarted.log" # what Restart=on-failure does, RestartSec later
UP_FIRST_PID=$KV_PID
kv_wait_for 60 kv_admin ping || kv_fail "the restarted node did not answer ping within 60 s"
grep -q "arena /dev/shm/$KV_SHM recovered (its writer (pid $crashed) died" "$KV_LOG" ||
  kv_fail "the restart did not take the arena back: $(grep -a 'arena ' "$KV_LOG" | head -3)"
[[ $(kv_admin stats) == *'"opened_as":"recovered"'* ]] || kv_fail "stats: arena.opened_as not recovered"
runs_as_unit_user "$KV_PID"
owned_by_unit_user "/dev/shm/$KV_SHM"
puts=$(kv_stat ops_put)
kv_wait_for 60 kv_stat_at_least ops_put $((${puts%.*} + 200)) || kv_fail "no load after the restart"
kv_stop_kvload "$load_pid" "$root/crash-kvload.log"
python3 - "$root/crash.json" <<'PY' || { tail -20 "$root/crash-kvload.log" >&2; kv_fail "report check"; }
import json, sys
r = json.load(open(sys.argv[1]))
bad = {k: r[k] for k in ("failed_ops", "verify_errors", "stale_reads") if r[k] != 0}
assert not bad, bad
assert r["client"]["reconnects"] >= 2, r["client"]
print(f"kvload across the crash: {r['ops']} ops, 0 failed, reconnects {r['client']['reconnects']}, "
      f"longest gap {r['blackout_ms']:.0f} ms")
PY
kv_ok "kill -9 of $crashed, ExecStart again: pid $KV_PID took the arena back as $user, 0 failed"
up_stop_node
[[ ! -e $pid_file ]] || kv_fail "pid file left after SIGTERM"
echo "deploy_unit: PASS"
