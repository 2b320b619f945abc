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
#   kv_tmpdir NAME                       # KV_TMP: a fresh dir under /tmp, removed at exit
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
  kv_cluster_story >&2
  exit 1
}

# The test's temp dirs, removed when it exits: the device tests share one
# guest whose /tmp is RAM, and each database holds a 32 MiB journal spare and
# each etcd a 64 MB WAL, so dirs left behind fill it within the suite.
KV_TMP_DIRS=()
kv_tmpdir() { # NAME -> KV_TMP
  KV_TMP=$(mktemp -d "/tmp/kv-e2e-$1.XXXXXX")
  KV_TMP_DIRS+=("$KV_TMP")
}

# A failed test's logs (not its databases) go to KV_KEEP_DIR/TEST/DIR
# [build/e2e-failed] before its temp dirs are removed.
kv_keep_logs() {
  local keep="${KV_KEEP_DIR:-$KV_BUILD/e2e-failed}/$KV_TEST" d
  rm -rf "$keep" && mkdir -p "$keep" || return 0
  for d in "${KV_TMP_DIRS[@]}"; do
    [[ -d $d ]] || continue
    mkdir -p "$keep/${d##*/}"
    (cd "$d" && find . -type f \( -name '*.log' -o -name '*.json' -o -name '*.tsv' \
      -o -name '*.out' \) -not -path '*/db/*' -not -path './etcd/*' -print0 |
      xargs -0r cp --parents -t "$keep/${d##*/}") 2>/dev/null || true
  done
  echo "---- logs kept in $keep" >&2
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
  kv_tmpdir "$KV_TEST"
  KV_DIR=$KV_TMP
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

kv_cleanup() { # [RC: the test's exit status, when a trap of its own runs first]
  local rc=${1:-$?}
  if [[ -n $KV_PID ]] && kill -0 "$KV_PID" 2>/dev/null; then kill -KILL "$KV_PID" || true; fi
  # Background jobs of a failed test (kvload --duration 3600, a client...)
  # must not outlive it: the device tests share one VM, and a leftover
  # kvload keeps its MRs registered, which a later test's leak check reads
  # as "verbs objects of other processes".
  local j
  for j in $(jobs -p); do kill -KILL "$j" 2>/dev/null || true; done
  [[ -n ${KV_SHM:-} ]] && rm -f "/dev/shm/$KV_SHM"
  kv_cluster_cleanup
  ((rc == 0)) || kv_keep_logs
  # A process killed above may still be closing files: removal is best effort.
  rm -rf "${KV_TMP_DIRS[@]}" 2>/dev/null || true
  return 0
}
trap kv_cleanup EXIT

# Conditions for kv_wait_for.
kv_stat_is() { [[ $(kv_stat "$1") == "$2" ]]; }
kv_stat_at_least() { local v; v=$(kv_stat "$1"); [[ -n $v && ${v%.*} -ge $2 ]]; }
kv_qp_count_is() { [[ $(kv_rdma_count qp) -eq $1 ]]; }

# ---- etcd and the cluster (docs/testing.md "Cluster tests") ------------------
#
#   kv_etcd_start                 /usr/bin/etcd on 127.0.0.1, free client and peer
#                                 ports, data in the test's temp dir; healthy within
#                                 a deadline; exports KV_ETCD_ENDPOINTS
#   kv_etcd_stop | kv_etcd_kill   SIGTERM (exit within a deadline) | SIGKILL
#   kv_etcd_restart               again on the same ports and data dir, healthy
#   kv_etcdctl ARGS...            etcdctl (v3 API) against it
#   kv_cluster_start N [flags]    etcd, `kvctl cluster init` of nodes a,b,c...
#                                 and N nodes (distinct ports, dirs, shm names)
#   kv_cluster_node_start I [flags]   (re)starts node I (0-based) on its port and db
#   kv_node_use I                 points KV_PID KV_ADDR KV_ADMIN KV_LOG... at node I,
#                                 so that kv_admin, kv_stat and up_upgrade act on it
#   kv_cluster_status [--json]    kvctl cluster status of the test's cluster
#   kv_cluster_serving N          condition: N members in etcd say "serving"
#   kv_cluster_stop               SIGTERM every node (exit 0), then etcd
KV_ETCD_BIN=${KV_ETCD_BIN:-/usr/bin/etcd}
KV_ETCDCTL_BIN=${KV_ETCDCTL_BIN:-/usr/bin/etcdctl}
KV_ETCD_PID=""
KV_ETCD_TTL=${KV_ETCD_TTL:-3} # the nodes' --etcd_lease_ttl_s
KV_CLUSTER=${KV_CLUSTER:-e2e$$}
KV_TEST_DIR=""
KV_C_IDS=() KV_C_PID=() KV_C_PORT=() KV_C_DIR=() KV_C_SHM=() KV_C_LOG=() KV_C_STARTS=()
read -ra KV_CLUSTER_NODE_FLAGS <<<"${KV_CLUSTER_NODE_FLAGS:-}"

# The test's own temp dir (etcd's data, the cluster's nodes), made on first use.
kv_test_dir() {
  [[ -n $KV_TEST_DIR ]] && return 0
  kv_tmpdir "$KV_TEST"
  KV_TEST_DIR=$KV_TMP
}

# Sets KV_PORT to a TCP port nobody listens on and this test has not drawn
# before, below the kernel's ephemeral range (32768-) so that no outgoing
# connection takes it meanwhile. Another process may still bind it before
# we do: kv_etcd_start draws again when etcd cannot bind.
KV_PORTS_TAKEN=" "
kv_free_port() {
  local i
  for ((i = 0; i < 200; i++)); do
    KV_PORT=$((20000 + RANDOM % 12000))
    [[ $KV_PORTS_TAKEN == *" $KV_PORT "* ]] && continue
    kv_port_listening "$KV_PORT" && continue
    KV_PORTS_TAKEN+="$KV_PORT "
    return 0
  done
  kv_fail "no free TCP port found"
}

kv_etcdctl() {
  ETCDCTL_API=3 "$KV_ETCDCTL_BIN" --endpoints "$KV_ETCD_ENDPOINTS" --dial-timeout 2s \
    --command-timeout 5s "$@"
}
kv_etcd_healthy() { kv_etcdctl endpoint health >/dev/null 2>&1; }

kv_etcd_launch() {
  local url_c="http://127.0.0.1:$KV_ETCD_CLIENT_PORT" url_p="http://127.0.0.1:$KV_ETCD_PEER_PORT"
  echo "---- etcd start $(printf '%(%H:%M:%S)T' -1) on $url_c" >>"$KV_ETCD_LOG"
  "$KV_ETCD_BIN" --name kv-e2e --data-dir "$KV_TEST_DIR/etcd" \
    --listen-client-urls "$url_c" --advertise-client-urls "$url_c" \
    --listen-peer-urls "$url_p" --initial-advertise-peer-urls "$url_p" \
    --initial-cluster "kv-e2e=$url_p" --initial-cluster-token "kv-e2e-$$" \
    --logger zap --log-outputs stderr >>"$KV_ETCD_LOG" 2>&1 &
  KV_ETCD_PID=$!
}

# Waits until etcd answers `endpoint health`; status 2 when it exited first,
# 1 when SECONDS passed.
kv_etcd_wait_healthy() { # SECONDS
  local deadline=$((SECONDS + $1))
  until kv_etcd_healthy; do
    kill -0 "$KV_ETCD_PID" 2>/dev/null || return 2
    ((SECONDS < deadline)) || return 1
    kv_nap 0.1 # poll interval of a condition with a deadline
  done
}

kv_etcd_start() {
  kv_test_dir
  KV_ETCD_LOG="$KV_TEST_DIR/etcd.log"
  local attempt rc
  for attempt in 1 2 3; do
    kv_free_port
    KV_ETCD_CLIENT_PORT=$KV_PORT
    kv_free_port
    KV_ETCD_PEER_PORT=$KV_PORT
    export KV_ETCD_ENDPOINTS="127.0.0.1:$KV_ETCD_CLIENT_PORT"
    kv_etcd_launch
    rc=0
    kv_etcd_wait_healthy 60 || rc=$?
    ((rc == 0)) && break
    kill -KILL "$KV_ETCD_PID" 2>/dev/null || true
    wait "$KV_ETCD_PID" 2>/dev/null || true
    KV_ETCD_PID=""
    # Another process took a port between the draw and the bind: draw again.
    grep -q 'address already in use' "$KV_ETCD_LOG" && ((rc == 2 && attempt < 3)) && continue
    tail -n 20 "$KV_ETCD_LOG" >&2
    kv_fail "etcd not healthy on $KV_ETCD_ENDPOINTS (exit or 60 s deadline; log $KV_ETCD_LOG)"
  done
  kv_log "etcd pid $KV_ETCD_PID on $KV_ETCD_ENDPOINTS (data $KV_TEST_DIR/etcd)"
}

kv_etcd_end() { # SIGNAL
  [[ -n $KV_ETCD_PID ]] || return 0
  kill "-$1" "$KV_ETCD_PID" 2>/dev/null || true
  kv_wait_for 20 kv_gone "$KV_ETCD_PID" || {
    kill -KILL "$KV_ETCD_PID" 2>/dev/null || true
    kv_fail "etcd $KV_ETCD_PID did not exit within 20 s of SIG$1"
  }
  wait "$KV_ETCD_PID" 2>/dev/null || true
  KV_ETCD_PID=""
}
kv_etcd_stop() { kv_etcd_end TERM; }
kv_etcd_kill() {
  kv_etcd_end KILL
  kv_log "etcd killed (SIGKILL)"
}
kv_etcd_restart() {
  [[ -z $KV_ETCD_PID ]] || kv_fail "kv_etcd_restart: etcd $KV_ETCD_PID still runs"
  kv_etcd_launch
  kv_etcd_wait_healthy 60 ||
    { tail -n 20 "$KV_ETCD_LOG" >&2; kv_fail "restarted etcd not healthy within 60 s"; }
  kv_log "etcd restarted, pid $KV_ETCD_PID on $KV_ETCD_ENDPOINTS"
}

kv_cluster_status() {
  "$KV_KVCTL" cluster status --etcd_endpoints "$KV_ETCD_ENDPOINTS" --cluster "$KV_CLUSTER" "$@"
}
# Condition: N member keys of the cluster in etcd say "serving".
kv_cluster_serving() { # N
  local v n=0
  v=$(kv_etcdctl get --prefix "/kvnode/$KV_CLUSTER/nodes/" --print-value-only) || return 1
  while [[ $v =~ \"state\":\"serving\" ]]; do
    n=$((n + 1))
    v=${v/\"state\":\"serving\"/}
  done
  ((n == $1))
}

# Points the single-node globals (KV_PID KV_ADDR KV_ADMIN KV_LOG KV_DIR
# KV_SHM) at cluster node I, after saving the current node's KV_PID (a live
# upgrade or a restart changes it).
KV_CUR=""
kv_node_use() { # I
  [[ -n $KV_CUR ]] && KV_C_PID[KV_CUR]=$KV_PID
  KV_CUR=$1
  KV_PID=${KV_C_PID[$1]}
  KV_DIR=${KV_C_DIR[$1]}
  KV_ADDR="127.0.0.1:${KV_C_PORT[$1]}"
  KV_ADMIN="$KV_DIR/admin/admin.sock"
  KV_LOG=${KV_C_LOG[$1]}
  KV_SHM=${KV_C_SHM[$1]}
}

# Node I's current pid as the node says (after live upgrades it is not our
# child), or its last known one.
kv_node_pid() { # I
  local a
  a=$("$KV_ADMIN_REQUEST" "${KV_C_DIR[$1]}/admin/admin.sock" ping 2>/dev/null) &&
    kv_json_num "$a" pid || echo "${KV_C_PID[$1]}"
}

# (Re)starts node I with the cluster's flags, on its port, database and shm
# name from the first start; a fresh log per start. Waits for ping.
kv_cluster_node_start() { # I [kvnode flags...]
  local i=$1 id=${KV_C_IDS[$1]}
  shift
  kv_cluster_node_launch "$i" --node_id "$id" "$@"
  kv_cluster_node_wait "$i"
}

kv_cluster_node_launch() { # I [kvnode flags...]
  local i=$1
  shift
  kv_test_dir
  local dir="$KV_TEST_DIR/node-${KV_C_IDS[i]}"
  if [[ -z ${KV_C_DIR[i]:-} ]]; then
    KV_C_DIR[i]=$dir
    kv_free_port
    KV_C_PORT[i]=$KV_PORT
    KV_C_SHM[i]="kvnode-e2e-$$-${KV_C_IDS[i]}"
    KV_C_STARTS[i]=0
    mkdir -m 700 "$dir" # the node refuses group- or world-accessible dirs
  fi
  KV_C_STARTS[i]=$((KV_C_STARTS[i] + 1))
  KV_C_LOG[i]="$dir/kvnode-${KV_C_STARTS[i]}.log"
  "$KV_NODE_BIN" --listen "127.0.0.1:${KV_C_PORT[i]}" --db_path "$dir/db" \
    --shm_name "${KV_C_SHM[i]}" --admin_socket "$dir/admin/admin.sock" \
    --auth_token_file "$KV_TOKEN" --pid_file "$dir/pid" --arena_size $((32 << 20)) \
    --sync_writes=false --max_clients 32 --cluster "$KV_CLUSTER" \
    --etcd_endpoints "$KV_ETCD_ENDPOINTS" --etcd_lease_ttl_s "$KV_ETCD_TTL" \
    "${KV_CLUSTER_NODE_FLAGS[@]}" "$@" >"${KV_C_LOG[i]}" 2>&1 &
  KV_C_PID[i]=$!
  [[ $KV_CUR == "$i" ]] && KV_PID=${KV_C_PID[i]} && KV_LOG=${KV_C_LOG[i]}
  return 0
}

kv_cluster_node_wait() { # I: ping answered within 90 s, the process alive
  local i=$1 sock="${KV_C_DIR[$1]}/admin/admin.sock" deadline=$((SECONDS + 90))
  until "$KV_ADMIN_REQUEST" "$sock" ping >/dev/null 2>&1; do
    if ! kill -0 "${KV_C_PID[i]}" 2>/dev/null || ((SECONDS > deadline)); then
      kv_node_use "$i"
      kv_fail "node ${KV_C_IDS[i]} (pid ${KV_C_PID[i]}) did not answer ping (exited or 90 s)"
    fi
    kv_nap 0.1 # poll interval of a condition with a deadline
  done
  kv_log "node ${KV_C_IDS[i]} pid ${KV_C_PID[i]} on 127.0.0.1:${KV_C_PORT[i]} (${KV_C_DIR[i]})"
}

kv_cluster_start() { # N [kvnode flags...]
  local n=$1 i ids=(a b c d e f g h)
  shift
  [[ -n $KV_ETCD_PID ]] || kv_etcd_start
  KV_TOKEN="$KV_TEST_DIR/token"
  (umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$KV_TOKEN")
  KV_C_IDS=("${ids[@]:0:n}")
  local list
  list=$(IFS=, && echo "${KV_C_IDS[*]}")
  "$KV_KVCTL" cluster init --etcd_endpoints "$KV_ETCD_ENDPOINTS" --cluster "$KV_CLUSTER" \
    --nodes "$list" >"$KV_TEST_DIR/init.out" 2>&1 ||
    { cat "$KV_TEST_DIR/init.out" >&2; kv_fail "kvctl cluster init --nodes $list failed"; }
  # All launched at once: a node's start is seconds of CPU in the TCG guest.
  for ((i = 0; i < n; i++)); do kv_cluster_node_launch "$i" --node_id "${KV_C_IDS[i]}" "$@"; done
  for ((i = 0; i < n; i++)); do kv_cluster_node_wait "$i"; done
  kv_wait_for 60 kv_cluster_serving "$n" ||
    { kv_cluster_status >&2 || true; kv_fail "not $n nodes serving within 60 s of their start"; }
  kv_node_use 0
  kv_ok "cluster $KV_CLUSTER: etcd and $n nodes ($list) serving"
}

# The seeds for kvload --cluster: every node's endpoint.
kv_cluster_seeds() {
  local i s=()
  for i in "${!KV_C_IDS[@]}"; do s+=("127.0.0.1:${KV_C_PORT[i]}"); done
  (IFS=, && echo "${s[*]}")
}

# SIGTERM to node I's current process; exit within KV_STOP_TIMEOUT s.
kv_cluster_node_stop() { # I
  local pid
  pid=$(kv_node_pid "$1")
  kill -TERM "$pid" 2>/dev/null || true
  kv_wait_for "$KV_STOP_TIMEOUT" kv_gone "$pid" ||
    { kv_node_use "$1"; kv_fail "node ${KV_C_IDS[$1]} ($pid) did not exit within $KV_STOP_TIMEOUT s of SIGTERM"; }
  local rc=0
  wait "$pid" 2>/dev/null || rc=$? # 127: not our child (a live upgrade's new process)
  ((rc == 0 || rc == 127)) || { kv_node_use "$1"; kv_fail "node ${KV_C_IDS[$1]} ($pid) exited $rc"; }
  grep -aq "kvnode: exit 0 (pid $pid," "${KV_C_LOG[$1]}" ||
    { kv_node_use "$1"; kv_fail "node ${KV_C_IDS[$1]} ($pid) did not log exit 0"; }
  KV_C_PID[$1]=""
  [[ $KV_CUR == "$1" ]] && KV_PID=""
  return 0
}

# SIGKILL to node I's current process, reaped.
kv_cluster_node_kill() { # I
  local pid
  pid=$(kv_node_pid "$1")
  kill -KILL "$pid"
  kv_wait_for 20 kv_gone "$pid" || kv_fail "node ${KV_C_IDS[$1]} ($pid) alive after SIGKILL"
  wait "$pid" 2>/dev/null || true
  KV_C_PID[$1]=""
  [[ $KV_CUR == "$1" ]] && KV_PID=""
  return 0
}

kv_cluster_stop() {
  local i
  [[ -n $KV_CUR ]] && KV_C_PID[KV_CUR]=$KV_PID
  for i in "${!KV_C_IDS[@]}"; do
    [[ -n ${KV_C_PID[i]:-} ]] && kv_cluster_node_stop "$i"
  done
  kv_etcd_stop
  KV_PID=""
  kv_ok "cluster stopped: every node exit 0, etcd stopped"
}

# For a failed test's output: every cluster node's last warnings and
# errors, and the member keys in etcd.
kv_cluster_story() {
  local i
  for i in "${!KV_C_IDS[@]}"; do
    [[ -f ${KV_C_LOG[i]:-} && ${KV_C_LOG[i]} != "${KV_LOG:-}" ]] || continue
    echo "---- node ${KV_C_IDS[i]}: last 10 warnings and errors (${KV_C_LOG[i]})"
    grep -a '^[WEF][0-9]' "${KV_C_LOG[i]}" | tail -n 10
  done
  if [[ -n $KV_ETCD_PID ]]; then
    echo "---- etcd: the cluster's keys"
    kv_etcdctl get --prefix "/kvnode/$KV_CLUSTER/" 2>&1 | tail -n 20
  fi
  return 0
}

# Leftovers of a failed test: every node's process (by its pid file too: a
# live upgrade's new process is nobody's child here), etcd, shm segments.
kv_cluster_cleanup() {
  local i p
  for i in "${!KV_C_IDS[@]}"; do
    for p in "${KV_C_PID[i]:-}" "$(cat "${KV_C_DIR[i]:-/nonexistent}/pid" 2>/dev/null)"; do
      [[ -n $p ]] && kill -KILL "$p" 2>/dev/null || true
    done
    [[ -n ${KV_C_SHM[i]:-} ]] && rm -f "/dev/shm/${KV_C_SHM[i]}" "/dev/shm/${KV_C_SHM[i]}".*
  done
  [[ -n $KV_ETCD_PID ]] && kill -KILL "$KV_ETCD_PID" 2>/dev/null
  return 0
}

# Node I's admin socket, stats and conditions (any node, not only KV_CUR).
kv_node_admin() { "$KV_ADMIN_REQUEST" "${KV_C_DIR[$1]}/admin/admin.sock" "${*:2}"; } # I REQUEST
kv_node_stat() { # I KEY
  local a
  a=$(kv_node_admin "$1" stats) || return 1
  kv_json_num "$a" "${2##*.}"
}
# Gauges the node adds (cluster_*) are doubles in the JSON: 1.0 is 1.
kv_node_stat_is() { local v; v=$(kv_node_stat "$1" "$2") && [[ ${v%.0} == "$3" ]]; }
kv_node_stat_at_least() { local v; v=$(kv_node_stat "$1" "$2") && [[ -n $v && ${v%.*} -ge $3 ]]; }

# Waits until every running node (or the nodes I...) has applied N more PUTs
# than now: the load flows through each.
kv_cluster_more_puts() { # N WHAT [I...]
  local n=$1 what=$2 i from=()
  shift 2
  local nodes=("$@")
  ((${#nodes[@]})) || nodes=("${!KV_C_IDS[@]}")
  for i in "${nodes[@]}"; do from[i]=$(kv_node_stat "$i" ops_put || echo 0); done
  for i in "${nodes[@]}"; do
    kv_wait_for 90 kv_node_stat_at_least "$i" ops_put $((from[i] + n)) ||
      kv_fail "node ${KV_C_IDS[i]}: not $n more PUTs within 90 s after $what"
  done
}

# kvload --cluster over every node in the background: KV_LOAD_PID, its
# output in KV_LOAD_LOG, its report in KV_LOAD_REPORT. Returns once every
# node has applied PUTs from it.
kv_cluster_load() { # NAME [kvload flags...]
  local name=$1
  shift
  KV_LOAD_LOG="$KV_TEST_DIR/$name.log"
  KV_LOAD_REPORT="$KV_TEST_DIR/$name.json"
  "$KV_KVLOAD" --cluster "$(kv_cluster_seeds)" --auth_token_file "$KV_TOKEN" \
    --threads "$(kv_load_threads)" --value_size 64 --duration 100000 --progress=false \
    --connect_timeout_ms 5000 --report "$KV_LOAD_REPORT" "$@" >"$KV_LOAD_LOG" 2>&1 &
  KV_LOAD_PID=$!
  kv_cluster_more_puts 50 "kvload $name started"
  kv_log "kvload $name (pid $KV_LOAD_PID) writes to every node"
}

# Stops the background kvload (SIGINT: it drains, writes its report and
# history). strict: exit 0 required; lenient: 1 (failed operations) allowed.
kv_cluster_load_stop() { # strict|lenient
  kill -INT "$KV_LOAD_PID" 2>/dev/null || true # it may have exited (crashed) already
  local rc=0
  wait "$KV_LOAD_PID" || rc=$?
  KV_LOAD_PID=""
  if [[ $rc -ne 0 && ($1 == strict || $rc -ne 1) ]]; then
    grep -a -m 5 'failed:\|verify' "$KV_LOAD_LOG" >&2 || true
    tail -n 12 "$KV_LOAD_LOG" >&2
    kv_fail "kvload exited $rc"
  fi
  ! grep -a -- "--history:" "$KV_LOAD_LOG" >&2 || kv_fail "kvload's history was not all written"
}

# kvload's report REPORT [KV_LOAD_REPORT]: zero failed operations, verify
# errors and stale reads; prints the ops and the longest gap.
kv_load_report_clean() { # [REPORT]
  python3 - "${1:-$KV_LOAD_REPORT}" <<'PY' || kv_fail "kvload's report ${1:-$KV_LOAD_REPORT}"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["failed_ops"] == 0 and r["verify_errors"] == 0 and r["stale_reads"] == 0, r
print(f"kvload: {r['ops']} ops, 0 failed, 0 verify errors, longest gap {r['blackout_ms']} ms")
PY
}

# kvhistory on HISTORY (kvload --history): linearizable, and not vacuously:
# every kind of answer in WANT (default PUT ok, GET ok, DELETE ok) is in it.
KV_KVHISTORY=${KV_KVHISTORY:-$KV_BUILD/tools/kvhistory}
kv_history_check() { # HISTORY [WANT...]
  local h=$1 kinds want out rc=0
  shift
  local wants=("$@")
  ((${#wants[@]})) || wants=("PUT ok" "GET ok" "DELETE ok")
  kinds=$(awk -F'\t' 'NR > 1 && $6 != "failed" { k[$2 " " $6] = 1 }
    END { for (x in k) print x }' "$h" | sort | tr '\n' ',')
  for want in "${wants[@]}"; do
    [[ $kinds == *"$want,"* ]] || kv_fail "no '$want' in the history $h ($kinds)"
  done
  out=$("$KV_KVHISTORY" "$h" 2>&1) || rc=$?
  grep -v ': linearizable (' <<<"$out" | tail -n 20 >&2 || true # one line per key otherwise
  ((rc == 0)) || kv_fail "kvhistory exited $rc on $h (kept in $KV_TEST_DIR)"
  kv_ok "$(($(wc -l <"$h") - 1)) operations in $h, linearizable"
}

# The map's ranges in etcd as FIRST:NODE,... (kvnode_key_owner --ranges).
kv_cluster_ranges() {
  local m
  m=$(kv_etcdctl get "/kvnode/$KV_CLUSTER/map" --print-value-only) || return 1
  grep -o '\[[0-9]*,"[^"]*"\]' <<<"$m" | tr -d '[]"' | tr ',' ':' | paste -sd,
}

# `kvctl cluster status --json` shows N nodes, each serving (and at
# generation GEN when given); status 1 otherwise. The answer goes to
# KV_STATUS_OUT.
kv_cluster_status_is() { # N [GEN]
  KV_STATUS_OUT=$(kv_cluster_status --json 2>&1) || return 1
  python3 - "$KV_STATUS_OUT" "$@" <<'PY'
import json, sys
s = json.loads(sys.argv[1])
n, gen = int(sys.argv[2]), (int(sys.argv[3]) if len(sys.argv) > 3 else None)
nodes = s["nodes"]
if isinstance(nodes, dict):
    nodes = [dict(v, node_id=k) for k, v in nodes.items()]
ok = s["etcd"]["ok"] and len(nodes) == n and all(x.get("state") == "serving" for x in nodes)
if gen is not None:
    ok = ok and all(int(x.get("generation", 0)) == gen for x in nodes)
sys.exit(0 if ok else 1)
PY
}
