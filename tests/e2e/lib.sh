# Shared helpers for the e2e scripts (bash; `source` it). Every node runs in a
# fresh temp dir with its own port (kernel-chosen), shm name, admin socket,
# RocksDB and log. No fixed sleeps: every wait polls a condition with a
# deadline.
#
#   source "$(dirname "$0")/lib.sh"
#   kv_require_device                    # exit 1 with a reason when none
#   kv_start_node [kvnode flags...]      # sets KV_PID KV_ADDR KV_ADMIN KV_DIR KV_SHM KV_LOG KV_TOKEN
#   kv_admin stats                       # one admin request, prints the answer
#   kv_stat KEY                          # a number from `stats` (dotted path: errors.auth_failed)
#   kv_rdma_count qp|mr [PID]            # objects of PID in `rdma resource show`
#   kv_stop_node                         # SIGTERM; exit 0 within KV_STOP_TIMEOUT s, no leaks
#   kv_fail MSG / kv_ok MSG
set -euo pipefail
# kv_nap (a sleep without an exec) and the device helpers are shared with deploy/.
source "$(dirname "${BASH_SOURCE[0]}")/../../deploy/lib.sh"
kv_nap 0 # opens its FIFO here, so that subshells share it

KV_BUILD=${KVNODE_BUILD_DIR:?KVNODE_BUILD_DIR must point at the build directory}
KV_NODE_BIN=${KV_NODE_BIN:-$KV_BUILD/node/kvnode}
KV_RAW_CLIENT=${KV_RAW_CLIENT:-$KV_BUILD/tests/e2e/kvnode_raw_client}
KV_ADMIN_REQUEST=${KV_ADMIN_REQUEST:-$KV_BUILD/tests/e2e/kvnode_admin_request}
KV_KVCTL=${KV_KVCTL:-$KV_BUILD/tools/kvctl}
KV_KVLOAD=${KV_KVLOAD:-$KV_BUILD/tools/kvload}
KV_STOP_TIMEOUT=${KV_STOP_TIMEOUT:-15}
KV_TEST=$(basename "${BASH_SOURCE[1]:-$0}" .sh)
KV_PID=""

# Under TCG every fork+exec costs 40-150 ms (a `date`, a `sleep`, each stage of a
# pipe), and the upgrade scripts poll hundreds of times: the hot helpers below
# use bash builtins instead (printf's %(...)T, $EPOCHREALTIME, read -t, =~).
kv_log() { printf '[%s %(%H:%M:%S)T] %s\n' "$KV_TEST" -1 "$*" >&2; }
# Nanoseconds since the epoch, like `date +%s%N` (microsecond resolution);
# the separator of EPOCHREALTIME follows the locale, hence the strip.
kv_now_ns() { echo $((${EPOCHREALTIME//[!0-9]/} * 1000)); }
kv_ok() { kv_log "ok: $*"; }
kv_fail() {
  kv_log "FAIL: $*"
  if [[ -n ${KV_LOG:-} && -f ${KV_LOG:-} ]]; then
    # Warnings and errors first: a CI report may keep only the start of a
    # long output, and they usually say why.
    echo "---- last 20 warnings and errors in the node log ($KV_LOG)" >&2
    grep -a '^[WEF][0-9]' "$KV_LOG" | tail -n 20 >&2 || true
    echo "---- last 60 lines of the node log" >&2
    tail -n 60 "$KV_LOG" >&2
  fi
  exit 1
}

# Device tests must run: without a device say why and fail (contract).
kv_require_device() {
  local devs
  devs=$(rdma link show 2>/dev/null | grep -c 'state ACTIVE' || true)
  if [[ ${devs:-0} -eq 0 ]]; then
    kv_log "no ACTIVE RDMA device (rdma link show): run this inside deploy/vm/rxe-vm"
    exit 1
  fi
}

# Waits until COMMAND succeeds or DEADLINE_S passes: kv_wait_for 10 cmd args...
kv_wait_for() {
  local deadline=$((${EPOCHREALTIME//[!0-9]/} + $1 * 1000000))
  shift
  while ! "$@" >/dev/null 2>&1; do
    if ((${EPOCHREALTIME//[!0-9]/} > deadline)); then return 1; fi
    kv_nap 0.05 # poll interval of a condition with a deadline, not a synchronisation
  done
}

# One admin request through the Unix socket, by a static binary (python, kvctl
# or any dynamically linked client start far too slowly under TCG).
kv_admin() { "$KV_ADMIN_REQUEST" "$KV_ADMIN" "$*"; }
# kv_admin_until SECONDS REQUEST TEXT... -> the first answer to REQUEST that
# contains every TEXT, polled inside one process (no exec per poll); status 1
# when SECONDS pass first.
kv_admin_until() {
  local s=$1 req=$2 t args=()
  shift 2
  for t in "$@"; do args+=(--until "$t"); done
  "$KV_ADMIN_REQUEST" "${args[@]}" --wait_s "$s" "$KV_ADMIN" "$req"
}

# kv_stat KEY -> the number of a flat key of `stats`, or of an error kind
# (errors.KIND). Names are unique in the answer, so a grep suffices.
kv_stat() {
  local a
  a=$(kv_admin stats) || return 1
  kv_json_num "$a" "${1##*.}" # last component: names are unique in the answer
}
# kv_json_num ANSWER KEY -> the number of "KEY" in an admin answer; status 1
# when it has none.
kv_json_num() {
  local re="\"$2\":([0-9.]+)"
  [[ $1 =~ $re ]] && echo "${BASH_REMATCH[1]}"
}

# Number of objects (qp|mr) the kernel lists for PID (default: the node).
kv_rdma_count() {
  local kind=$1 pid=${2:-$KV_PID} l n=0
  while read -r l; do [[ " $l " == *" pid $pid "* ]] && n=$((n + 1)); done < <(rdma resource show "$kind" 2>/dev/null)
  echo "$n"
}

kv_start_node() {
  KV_DIR=$(mktemp -d "/tmp/kv-e2e-$KV_TEST.XXXXXX")
  KV_SHM="kvnode-e2e-$$-$RANDOM"
  KV_ADMIN="$KV_DIR/admin/admin.sock"
  KV_LOG="$KV_DIR/kvnode.log"
  KV_TOKEN="$KV_DIR/token"
  (umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$KV_TOKEN")
  "$KV_NODE_BIN" --listen 127.0.0.1:0 --db_path "$KV_DIR/db" --shm_name "$KV_SHM" \
    --admin_socket "$KV_ADMIN" --auth_token_file "$KV_TOKEN" --pid_file "$KV_DIR/pid" \
    --arena_size $((32 << 20)) --sync_writes=false --max_clients 16 "$@" >"$KV_LOG" 2>&1 &
  KV_PID=$!
  if ! kv_wait_for 60 kv_admin ping; then
    kv_fail "node did not answer ping within 60 s"
  fi
  KV_ADDR=$(kv_admin ping | grep -o '"listen":"[^"]*"' | cut -d'"' -f4)
  kv_log "node pid $KV_PID on $KV_ADDR (dir $KV_DIR, shm $KV_SHM)"
}

kv_raw() { "$KV_RAW_CLIENT" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" "$@"; }

# SIGTERM, then: exit 0 within KV_STOP_TIMEOUT s, "clean shutdown" logged,
# no verbs object of the pid left, the shm segment gone (unless --keep_arena).
kv_stop_node() {
  local keep=${1:-}
  [[ -n $KV_PID ]] || return 0
  local t0 rc=0
  t0=$(kv_now_ns)
  kill -TERM "$KV_PID"
  local deadline=$((t0 + KV_STOP_TIMEOUT * 1000000000))
  while kill -0 "$KV_PID" 2>/dev/null; do
    if (($(kv_now_ns) > deadline)); then
      kill -KILL "$KV_PID" || true
      kv_fail "node did not exit within $KV_STOP_TIMEOUT s of SIGTERM"
    fi
    kv_nap 0.05 # poll interval
  done
  wait "$KV_PID" || rc=$?
  local ms=$((($(kv_now_ns) - t0) / 1000000))
  [[ $rc -eq 0 ]] || kv_fail "node exited $rc after SIGTERM"
  kv_check_exited "$keep"
  kv_ok "node stopped by SIGTERM in ${ms} ms, exit 0, no verbs objects or shm left"
  KV_PID=""
}

# After the node (KV_PID) has exited: "clean shutdown" logged, no verbs object
# of the pid, the shm segment gone (unless `keep`), the admin socket gone.
kv_check_exited() {
  local keep=${1:-} qps mrs
  grep -q "clean shutdown: no verbs object left" "$KV_LOG" || kv_fail "no clean-shutdown line"
  qps=$(kv_rdma_count qp "$KV_PID")
  mrs=$(kv_rdma_count mr "$KV_PID")
  [[ $qps -eq 0 && $mrs -eq 0 ]] || kv_fail "kernel still lists $qps QPs / $mrs MRs of pid $KV_PID"
  if [[ $keep != keep ]] && [[ -e /dev/shm/$KV_SHM ]]; then
    kv_fail "shared-memory segment /dev/shm/$KV_SHM leaked"
  fi
  [[ ! -e $KV_ADMIN ]] || kv_fail "admin socket $KV_ADMIN left behind"
}

# Stops a background kvload (SIGINT: it drains and writes its report) and
# fails the test, with its log's tail, unless it exits 0.
kv_stop_kvload() { # PID LOG
  kill -INT "$1"
  local rc=0
  wait "$1" || rc=$?
  [[ $rc -eq 0 ]] || { tail -20 "$2" >&2; kv_fail "kvload exited $rc"; }
}

kv_cleanup() {
  if [[ -n $KV_PID ]] && kill -0 "$KV_PID" 2>/dev/null; then kill -KILL "$KV_PID" || true; fi
  # Background jobs of a failed test (kvload --duration 3600, a client...)
  # must not outlive it: the device tests share one VM, and a leftover
  # kvload keeps its MRs registered, which a later test's leak check reads
  # as "verbs objects of other processes".
  local j
  for j in $(jobs -p); do kill -KILL "$j" 2>/dev/null || true; done
  [[ -n ${KV_SHM:-} ]] && rm -f "/dev/shm/$KV_SHM"
  return 0
}
trap kv_cleanup EXIT

# Conditions for kv_wait_for.
kv_stat_is() { [[ $(kv_stat "$1") == "$2" ]]; }
kv_stat_at_least() { local v; v=$(kv_stat "$1"); [[ -n $v && ${v%.*} -ge $2 ]]; }
kv_qp_count_is() { [[ $(kv_rdma_count qp) -eq $1 ]]; }
