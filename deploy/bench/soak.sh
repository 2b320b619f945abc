#!/usr/bin/env bash
# Soak of the live upgrade: N consecutive live upgrades of one kvnode
# under `kvload --verify`, with client churn and, every few upgrades, a random
# cell of the new side's fault matrix injected first. Stops at the first
# failed operation, verification error or leak; prints a summary. Runs on the
# host's verbs device, or inside deploy/vm/rxe-vm (Soft-RoCE) when there is none.
# `deploy/bench/soak.sh --help` explains every option. A slow leak or a rare fault
# shows only over many upgrades: that is what this run is for. With --cluster:
# the same for fleet rolls (`kvctl cluster roll`) of three nodes on etcd.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source deploy/lib.sh

usage() {
  cat <<'EOF'
usage: deploy/bench/soak.sh [options]

N consecutive live upgrades (SIGUSR2; every 5th by `kvctl upgrade`) of one
kvnode, alternating between two builds that differ in their build id, under
`kvload --verify` (8 clients on a thread per CPU up to 4, YCSB A, depth 4, ack
log). Along the way:
  churn   every C upgrades a second, short-lived kvload (2 clients, --verify,
          its own keys) joins (before the signal, or right after it on every
          other round, i.e. while the upgrade runs) and leaves after the
          upgrade; its report must be clean too.
  faults  every K upgrades, before upgrade i, one attempt with a random cell
          PHASE:ACTION of the new side's fault matrix (phases n_attach
          n_register n_ready n_open_db n_accepting, actions crash hang fail;
          docs/upgrade.md section 8), given to N only through the
          --upgrade_binary wrapper. Expected outcome: rollback (the same
          generation serves on, rollbacks +1, N gone, writes resumed).
After every upgrade, within a deadline, the node must be back to the steady
state measured before the first upgrade: the same number of clients, of QPs
and MRs (rdma resource show, per process and system-wide), of open fds
(/proc/PID/fd, RocksDB's *.sst and WAL files excepted: their number follows
flushes and compactions), no child process, no handoff header and no shm object besides
the arena. The run stops at the first failed operation, verification error,
stale read, unexpected outcome or leak. At the end: kvload's report, the
ack-log audit, a clean SIGTERM (exit 0, no verbs object, no shm), then the
summary: upgrades done, faults by cell, failed ops, max blackout, RSS/fd/QP/MR
at start and end. Exit 0 only when clean. One progress line per upgrade.

options:
  --upgrades N       live upgrades to perform (default 1000)
  --max_minutes M    start no new upgrade after M minutes and finish cleanly
                     (default 0 = no limit); the summary says so
  --fault_every K    a fault attempt before every K-th upgrade (default 4;
                     0 = none)
  --cells LIST       comma-separated PHASE:ACTION cells to draw from (default:
                     the 15 new-side cells)
  --churn_every C    a churning second kvload around every C-th upgrade
                     (default 3; 0 = none)
  --seed S           seed of the fault draw and of both kvloads (default: from
                     the clock; printed, pass it again to replay the same cells)
  --clients M        clients of the main kvload (default 8)
  --keys K           keys of the main kvload (default 2000)
  --op_timeout_ms T  kvload's deadline per operation (default 60000: a hang at
                     n_open_db/n_accepting pauses writes for the Owned deadline
                     (20 s here) plus RocksDB close and reopen, ~30 s under TCG)
  --build DIR        build directory (default $KVNODE_BUILD_DIR or build/)
  --no-build         do not build kvnode kvload kvctl kvnode_admin_request first
  --vm_timeout S     guest time limit when run in deploy/vm/rxe-vm (default:
                     600 + 120 per upgrade, or 900 + 60 per --max_minutes
                     when that is less)
  --keep             keep the work directory (node log, kvload logs, reports;
                     in deploy/vm/rxe-vm also copied to its results dir, soak/)
  -h, --help         this text

--cluster: fleet rolls instead (docs/cluster.md, "Fleet roll"). etcd and three
nodes a, b, c (tests/e2e/lib.sh's harness) under `kvload --cluster --verify
--history` (M clients on one thread, YCSB A, depth 4, ack log), R rolls (`kvctl cluster
roll --gate_s G`) alternating between the two builds: 3 R node upgrades.
  churn   as above, around every C-th roll; its clients join every node.
  faults  every K-th roll is to a binary that refuses to start as one node
          (a, b, c in turn): that node's live upgrade rolls back, the roll
          stops (kvctl exit 1; the node rolled_back, the nodes before it done,
          those after it pending and untouched). Then the binary is fixed and
          `kvctl cluster roll --resume` finishes the roll (exit 0).
After every roll, within a deadline: every node serving on the roll's build,
its generation exactly one more, as many clients as the loads have, no child
process, no verbs object of an old process, and its QPs and MRs as before the
first roll. The run stops at the first failure. At the end: kvload's report
(0 failed, 0 verify errors, 0 stale), the ack-log audit, kvhistory on the
history (linearizable), every node stopped by SIGTERM (exit 0), then the
summary (also as JSON, --summary): CLEAN only when all of that held.

cluster options (--upgrades, --fault_every and --cells are refused with it):
  --cluster          this mode
  --rolls R          fleet rolls (default $SOAK_ROLLS, else 20: 9 min in the TCG
                     guest with its boot, up to twice that on a busy host;
                     SOAK_ROLLS=100 is the long variant, ~40 min)
  --roll_fault_every K  every K-th roll to the failing binary (default 5; 0 = none)
  --gate_s G         the rolls' health gate, s (default 1, as the e2e tests')
  --summary FILE     the summary as JSON (default BUILD/soak-cluster/summary.json;
                     with --keep or a failure the logs go beside it, in work/)
  --max_minutes, --churn_every, --seed, --clients, --keys, --op_timeout_ms,
  --build, --no-build, --keep as above (per roll instead of per upgrade);
  --vm_timeout default 900 + 90 per roll, or 900 + 60 per --max_minutes

Examples:
  deploy/bench/soak.sh --upgrades 200                 ~35 min in the TCG guest (idle 2-core host)
  deploy/bench/soak.sh --upgrades 20 --seed 42        replays the same fault cells
  deploy/bench/soak.sh --cluster                      20 rolls, 60 node upgrades, 4 rollbacks
  SOAK_ROLLS=100 deploy/bench/soak.sh --cluster       the long variant: 300 node upgrades, 20 rollbacks
EOF
}

upgrades=1000 fault_every=4 churn_every=3 seed="" clients=8 keys=2000 op_timeout=60000
max_minutes=0 cells="" build=${KVNODE_BUILD_DIR:-$PWD/build} do_build=1 vm_timeout="" keep=0 inner=0
cluster=0 rolls=${SOAK_ROLLS:-20} roll_fault_every=5 gate_s=1 summary_json="" single_only="" cluster_only=""
while (($#)); do
  case $1 in
    --upgrades | --fault_every | --max_minutes | --cells | --churn_every | --seed | --clients | --keys | \
      --op_timeout_ms | --build | --vm_timeout | --rolls | --roll_fault_every | --gate_s | --summary)
      (($# >= 2)) || { echo "soak.sh: $1 needs a value" >&2; exit 2; } ;;&
    --upgrades | --fault_every | --cells) single_only+=" $1" ;;&
    --rolls | --roll_fault_every | --gate_s | --summary) cluster_only+=" $1" ;;&
    --upgrades) upgrades=$2; shift ;;
    --fault_every) fault_every=$2; shift ;;
    --cluster) cluster=1 ;;
    --rolls) rolls=$2; shift ;;
    --roll_fault_every) roll_fault_every=$2; shift ;;
    --gate_s) gate_s=$2; shift ;;
    --summary) summary_json=$(realpath -m "$2"); shift ;;
    --max_minutes) max_minutes=$2; shift ;;
    --cells) cells=$2; shift ;;
    --churn_every) churn_every=$2; shift ;;
    --seed) seed=$2; shift ;;
    --clients) clients=$2; shift ;;
    --keys) keys=$2; shift ;;
    --op_timeout_ms) op_timeout=$2; shift ;;
    --build) build=$(realpath "$2"); shift ;;
    --no-build) do_build=0 ;;
    --vm_timeout) vm_timeout=$2; shift ;;
    --keep) keep=1 ;;
    --inner) inner=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "soak.sh: unknown option '$1' (--help lists them)" >&2; exit 2 ;;
  esac
  shift
done
for v in upgrades max_minutes fault_every churn_every clients keys op_timeout rolls roll_fault_every gate_s; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "soak.sh: --$v must be a number, not '${!v}'" >&2; exit 2; }
done
((upgrades >= 1 && clients >= 1)) || { echo "soak.sh: --upgrades and --clients must be >= 1" >&2; exit 2; }
if ((cluster)); then
  [[ -z $single_only ]] || { echo "soak.sh:$single_only: not with --cluster (see --rolls, --roll_fault_every)" >&2; exit 2; }
  ((rolls >= 1)) || { echo "soak.sh: --rolls (SOAK_ROLLS) must be >= 1" >&2; exit 2; }
  summary_json=${summary_json:-$build/soak-cluster/summary.json}
else
  [[ -z $cluster_only ]] || { echo "soak.sh:$cluster_only: only with --cluster" >&2; exit 2; }
fi
[[ -n $seed ]] || seed=$(($(date +%s%N) % 1000000007))
[[ $seed =~ ^[0-9]+$ ]] || { echo "soak.sh: --seed must be a number" >&2; exit 2; }

# --- outside: build, then run here (device present) or in the VM -------------
if ((inner == 0)); then
  if ((do_build)); then
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build "$build" -j 2 --target kvnode kvload kvctl kvnode_admin_request kvhistory
  fi
  args=(--inner --max_minutes "$max_minutes" --churn_every "$churn_every"
    --seed "$seed" --clients "$clients" --keys "$keys" --op_timeout_ms "$op_timeout")
  if ((cluster)); then
    args+=(--cluster --rolls "$rolls" --roll_fault_every "$roll_fault_every" --gate_s "$gate_s"
      --summary "$summary_json")
  else
    args+=(--upgrades "$upgrades" --fault_every "$fault_every")
  fi
  [[ -n $cells ]] && args+=(--cells "$cells")
  ((keep)) && args+=(--keep)
  if kv_active_device >/dev/null; then
    KVNODE_BUILD_DIR=$build exec "$PWD/deploy/bench/soak.sh" "${args[@]}"
  fi
  echo "== no verbs device on this host: running in deploy/vm/rxe-vm (Soft-RoCE rxe0 in a QEMU guest)"
  t=$((600 + 120 * upgrades))
  ((cluster)) && t=$((900 + 90 * rolls))
  ((max_minutes > 0 && 900 + 60 * max_minutes < t)) && t=$((900 + 60 * max_minutes))
  exec deploy/vm/rxe-vm --rw "$build" --timeout "${vm_timeout:-$t}" -- \
    env KVNODE_BUILD_DIR="$build" "$PWD/deploy/bench/soak.sh" "${args[@]}"
fi

# --- inside: a verbs device is present ------------------------------------------
export KVNODE_BUILD_DIR=$build
source tests/e2e/lib.sh
source tests/e2e/upgrade_lib.sh
kv_require_device

all_cells=""
for p in n_attach n_register n_ready n_open_db n_accepting; do
  for a in crash hang fail; do all_cells+="$p:$a "; done
done
read -r -a cell_list <<<"${cells//,/ }"
((${#cell_list[@]})) || read -r -a cell_list <<<"$all_cells"
for c in "${cell_list[@]}"; do
  [[ " $all_cells " == *" $c "* ]] || kv_fail "--cells: '$c' is not a new-side cell ($all_cells)"
done

# Reproducible draws that nothing else consumes (bash's $RANDOM is also used
# by lib.sh for names): a 31-bit LCG seeded by --seed.
rng=$seed
draw() { # N -> sets DRAW in [0, N)
  rng=$(((rng * 1103515245 + 12345) % 2147483648))
  DRAW=$(((rng >> 8) % $1))
}

# Two wrapper "builds" like up_make_builds (build id, --upgrade_binary = the
# other one), plus: --upgrade_fault from $dir/fault (read when N is exec'd,
# so only N is armed), and the flags each upgrade appends (--listen=, the
# wrapper's own) are collapsed so that the argv does not grow over 1000 upgrades.
soak_make_builds() {
  local dir=$1 real=$KV_BUILD/node/kvnode b other
  for b in a b; do
    other=b
    [[ $b == b ]] && other=a
    cat >"$dir/kvnode-$b" <<EOF
#!/bin/bash
args=() listen=()
while ((\$#)); do
  case \$1 in
    --build_id=* | --upgrade_binary=* | --upgrade_fault=*) ;;
    --listen=*) listen=("\$1") ;;
    --listen) listen=("--listen=\$2"); shift ;;
    *) args+=("\$1") ;;
  esac
  shift
done
fault=\$(<"$dir/fault") 2>/dev/null || true
exec "$real" "\${args[@]}" "\${listen[@]}" --build_id=build-$b \\
  --upgrade_binary="$dir/kvnode-$other" --upgrade_fault="\$fault"
EOF
    chmod 755 "$dir/kvnode-$b"
  done
  : >"$dir/fault"
}

# --- probes of the node's state ---------------------------------------------------
# Cheap on purpose: they are polled under TCG, where every fork+exec costs
# 40-150 ms. One `rdma` call per kind, one `find` of the fds, the rest builtins.
# Open fds of PID, RocksDB's table (*.sst) and WAL (*.log) files excepted: their
# number follows flushes and compactions (each upgrade and rollback flushes).
fd_count() {
  local l n=0 re='/db/[^/]*\.(sst|log)$'
  while read -r l; do [[ $l =~ $re ]] || n=$((n + 1)); done < <(find "/proc/$1/fd" -mindepth 1 -maxdepth 1 -printf '%l\n' 2>/dev/null)
  echo "$n"
}
fd_list() { find "/proc/$1/fd" -mindepth 1 -maxdepth 1 -printf '%l\n' 2>/dev/null | sed 's/.*\///' | sort | uniq -c | tr -s ' \n' ' '; }
# /proc files are read whole with mapfile: a `read` loop left early keeps the
# rest of the file in bash's input buffer for that fd number, and the next
# `read` from a redirected file gets those lines instead of its own.
# "RSS KiB (anon A, file F, shmem S)": the arena's pages count as shmem, the
# heap (RocksDB, the clients' dedupe windows) as anon.
rss_kib() {
  local l lines=() re='^(VmRSS|RssAnon|RssFile|RssShmem):[[:space:]]+([0-9]+)'
  local -A v=()
  { mapfile -t lines; } 2>/dev/null <"/proc/$1/status"
  for l in "${lines[@]}"; do [[ $l =~ $re ]] && v[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}; done
  echo "${v[VmRSS]:-?} KiB (anon ${v[RssAnon]:-?}, file ${v[RssFile]:-?}, shmem ${v[RssShmem]:-?})"
}
shm_list() {
  local f out=""
  for f in /dev/shm/*"$KV_SHM"*; do [[ -e $f ]] && out+="${f##*/} "; done
  echo "$out"
}
children_of() {
  local f all="" c words
  for f in /proc/"$1"/task/*/children; do
    c=()
    { mapfile -t c; } 2>/dev/null <"$f"
    all+=" ${c[*]}"
  done
  read -r -a words <<<"$all"
  echo "${words[*]}"
}
clients_are() { [[ $(kv_stat clients) == "$1" ]]; }
# PID -> "QPs: of-PID's-threads all kvnode's-of-other-pids MRs: the same", from
# one `rdma` call for both kinds (QP lines begin "link", MR lines "dev").
# `rdma resource show` names the thread that created an object, as
# up_rdma_count in upgrade_lib.sh explains.
rdma_counts() {
  local t tids=" " l p k re='.* pid ([0-9]+)( |$)'
  local -A n=([link_own]=0 [link_all]=0 [link_foreign]=0 [dev_own]=0 [dev_all]=0 [dev_foreign]=0)
  for t in /proc/"$1"/task/*; do tids+="${t##*/} "; done
  while read -r l; do
    k=${l%% *}
    [[ $k == link || $k == dev ]] || continue
    n[${k}_all]=$((n[${k}_all] + 1))
    p=""
    [[ " $l" =~ $re ]] && p=${BASH_REMATCH[1]}
    if [[ -n $p && $tids == *" $p "* ]]; then
      n[${k}_own]=$((n[${k}_own] + 1))
    elif [[ " $l" == *" comm kvnode"* ]]; then
      n[${k}_foreign]=$((n[${k}_foreign] + 1))
    fi
  done < <(printf 'resource show qp\nresource show mr\n' | rdma -b - 2>/dev/null)
  echo "${n[link_own]} ${n[link_all]} ${n[link_foreign]} ${n[dev_own]} ${n[dev_all]} ${n[dev_foreign]}"
}

# Sets S_QP S_MR (the node's) S_TQP S_TMR (system-wide: kvload's too) S_FOREIGN
# (kvnode objects of other processes) S_FD S_RSS S_CHILD S_SHM, and from one
# `stats` answer S_CLIENTS and S_RECORDS (dedupe records: the churn's clients
# close, so theirs must go).
snapshot() {
  local fq fm a
  a=$(kv_admin stats 2>/dev/null || true)
  S_CLIENTS=$(kv_json_num "$a" clients || echo '?')
  S_RECORDS=$(kv_json_num "$a" client_records || echo '?')
  read -r S_QP S_TQP fq S_MR S_TMR fm < <(rdma_counts "$KV_PID")
  S_FOREIGN=$((fq + fm))
  S_FD=$(fd_count "$KV_PID")
  S_RSS=$(rss_kib "$KV_PID")
  S_CHILD=$(children_of "$KV_PID")
  S_SHM=$(shm_list)
}
# True in the steady state; otherwise WAITED_FOR collects what differed.
steady() {
  local why=""
  snapshot
  [[ $S_CLIENTS == "$clients" ]] || why+=" clients"
  [[ $S_RECORDS == "$B_RECORDS" ]] || why+=" records"
  [[ $S_QP == "$B_QP" ]] || why+=" qp"
  [[ $S_MR == "$B_MR" ]] || why+=" mr"
  [[ $S_TQP == "$B_TQP" ]] || why+=" all_qp"
  [[ $S_TMR == "$B_TMR" ]] || why+=" all_mr"
  # The first process was started by this script (a cold start, holding what its
  # launcher leaked into it, e.g. ctest's log file); every later one by its
  # predecessor. So the fd baseline is taken again, once, from the first upgraded
  # process: when everything else is steady and its count held for two checks.
  if [[ $KV_PID != "$B_FD_PID" && -z $B_FD_UPGRADED ]]; then
    if [[ -z $why && $S_FD == "${B_FD_CAND:-}" ]]; then
      B_FD=$S_FD B_FDS=$(fd_list "$KV_PID") B_FD_UPGRADED=1
    else
      B_FD_CAND=$S_FD
      why+=" fd_settle"
    fi
  fi
  [[ $S_FD == "$B_FD" ]] || why+=" fd"
  [[ $S_FOREIGN == 0 ]] || why+=" foreign"
  [[ -z $S_CHILD ]] || why+=" child"
  [[ $S_SHM == "$B_SHM" ]] || why+=" shm"
  [[ -z $why ]] && return 0
  [[ " $WAITED_FOR " == *" ${why# } "* ]] || WAITED_FOR+="${WAITED_FOR:+,}${why# }"
  return 1
}
# malloc: the node's heap by mallinfo2 (admin `memory`), in use and free but
# kept, KiB.
state_line() {
  local m used free
  m=$(kv_admin memory 2>/dev/null || true)
  used=$(kv_json_num "$m" malloc_in_use_bytes || echo 0)
  free=$(kv_json_num "$m" malloc_free_bytes || echo 0)
  echo "clients $S_CLIENTS records $S_RECORDS QP $S_QP/$S_TQP MR $S_MR/$S_TMR fd $S_FD" \
    "rss $S_RSS malloc $((used >> 10))/$((free >> 10)) KiB"
}
# Waits up to 120 s for the steady state (WAITED_FOR then lists what had
# differed meanwhile); past that, fails the soak with the state now and at the
# start. $1: after what.
await_steady() {
  WAITED_FOR=""
  kv_wait_for 120 steady && return 0
  soak_fail "$1: not back to the steady state within 120 s (waited for: $WAITED_FOR): $(state_line) children '$S_CHILD' shm '$S_SHM' foreign $S_FOREIGN (start: records $B_RECORDS QP $B_QP/$B_TQP MR $B_MR/$B_TMR fd $B_FD shm $B_SHM; fds now: $(fd_list "$KV_PID"); at start: $B_FDS)"
}

# Last progress line of a kvload log -> "failed verify_err stale" ("0 0 0"
# before the first, which kvload prints after 1 s). One exec: the log's tail.
load_errors() {
  local l lines last="" re='failed ([0-9]+) +verify_err ([0-9]+) +stale ([0-9]+)'
  mapfile -t lines < <(tail -n 64 "$1" 2>/dev/null)
  for l in "${lines[@]}"; do [[ $l == '['* ]] && last=$l; done
  [[ $last =~ $re ]] || { echo "0 0 0"; return; }
  echo "${BASH_REMATCH[1]} ${BASH_REMATCH[2]} ${BASH_REMATCH[3]}"
}
check_load() { # LOG PID NAME: alive and no error yet
  local f v s
  read -r f v s < <(load_errors "$1")
  [[ $f == 0 && $v == 0 && $s == 0 ]] ||
    soak_fail "$3: failed ops $f, verify errors $v, stale reads $s (log $1: $(grep -a 'failed:' "$1" | head -n 3))"
  kill -0 "$2" 2>/dev/null || soak_fail "$3 (pid $2) exited early: $(tail -n 5 "$1")"
}

# --- bookkeeping and the summary ------------------------------------------------------
done_ups=0 faults=0 churns=0 summary_done=0 fail_msg="" load_pid="" churn_pid=""
declare -A cell_count=() cell_ms=()
owned_ms=() windows=() fault_cells=""
t_start=$(kv_now_ns) t_base=0 time_up=0
B_QP='?' B_MR='?' B_TQP='?' B_TMR='?' B_FD='?' B_RSS='?' B_RECORDS='?'
S_QP='?' S_MR='?' S_TQP='?' S_TMR='?' S_FD='?' S_RSS='?' S_CLIENTS='?' S_RECORDS='?'

# kv_fail (lib.sh) also records the reason for the summary.
eval "lib_kv_fail() $(declare -f kv_fail | tail -n +2)"
kv_fail() {
  fail_msg=$*
  lib_kv_fail "$@"
}
soak_fail() { kv_fail "$@"; }

stop_load() { # PID: SIGINT, wait with a deadline; sets LOAD_RC
  local pid=$1
  LOAD_RC=0
  [[ -n $pid ]] || return 0
  kill -INT "$pid" 2>/dev/null || true
  if ! kv_wait_for 60 up_gone "$pid"; then
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" || LOAD_RC=$?
}

# A second, short-lived kvload (2 clients, --verify, its own keys) beside
# the main one: CHURN_DIR holds its files, CHURN_TARGET says where it goes
# (--server ADDR or --cluster SEEDS). Its report must be clean too.
churn_start() {
  churns=$((churns + 1))
  "$KV_KVLOAD" "${CHURN_TARGET[@]}" --auth_token_file "$KV_TOKEN" --workload A --clients 2 \
    --threads 1 --depth 4 --keys 500 --key_size 24 --value_size 64 --duration 1000000 --verify \
    --seed $((seed + churns)) --report "$CHURN_DIR/churn.json" --connect_timeout_ms "$op_timeout" \
    --timeout_ms "$op_timeout" >"$CHURN_DIR/churn.out" 2>"$CHURN_DIR/churn.log" &
  churn_pid=$!
}
churn_stop() { # AROUND: what it ran beside ("upgrade 3", "roll 4")
  check_load "$CHURN_DIR/churn.log" "$churn_pid" "churn kvload $churns"
  stop_load "$churn_pid"
  churn_pid=""
  ((LOAD_RC == 0)) || soak_fail "churn kvload $churns exited $LOAD_RC: $(tail -n 5 "$CHURN_DIR/churn.log")"
  # grep, not python: a python start reads its modules over the guest's 9p
  # root and took minutes on a loaded host.
  local k v
  for k in failed_ops verify_errors stale_reads ops; do
    v=$(grep -o "\"$k\": *[0-9]*" "$CHURN_DIR/churn.json" | head -n 1 | grep -o '[0-9]*$' || true)
    if [[ $k == ops && ${v:-0} -eq 0 ]] || [[ $k != ops && ${v:-x} != 0 ]]; then
      soak_fail "churn kvload $churns (around $1): $k ${v:-missing} in its report"
    fi
  done
}

# The end of a run: the main kvload's report clean, then every write in its
# ack log audited against the node(s) (TARGET: --server ADDR or --cluster
# SEEDS); sets audit_line.
final_verdict() { # DIR ACKS TARGET...
  local dir=$1 acks=$2 rc=0
  shift 2
  python3 - "$dir/report.json" <<'PY' || soak_fail "kvload report not clean"
import json, sys
r = json.load(open(sys.argv[1]))
bad = {k: r[k] for k in ("failed_ops", "verify_errors", "stale_reads") if r[k]}
if bad:
    sys.exit(f"kvload: {bad}")
PY
  "$KV_KVLOAD" --audit "$acks" "$@" --auth_token_file "$KV_TOKEN" \
    --report "$dir/audit.json" >"$dir/audit.log" 2>&1 || rc=$?
  audit_line=$(grep -a 'audit of' "$dir/audit.log" | head -n 1 | sed 's/^audit of [^:]*: //')
  ((rc == 0)) || soak_fail "ack-log audit failed (exit $rc): $(tail -n 3 "$dir/audit.log")"
  kv_log "ack-log audit passed: $audit_line"
}

# --- --cluster: fleet rolls of three nodes -----------------------------------------
if ((cluster)); then
  source tests/e2e/roll_lib.sh
  ROLL_FLAGS=(--gate_s "$gate_s") # roll_lib's kvctl flags
  umask 077 # the nodes' --pid_file directories must be their own
  kv_test_dir
  work=$KV_TEST_DIR

  # The single-node soak's two wrapper builds (its fault file stays empty:
  # a roll's fault is kvnode-c), and kvnode-c: the roll's build, except that
  # it refuses to start as one node (written before each faulted roll).
  soak_make_builds "$work"
  make_bad_build() { # VICTIM BUILD
    cat >"$work/kvnode-c" <<EOF
#!/bin/bash
# build-$2, except that it cannot start as node $1
prev=""
for a in "\$@"; do
  [[ \$prev == --node_id && \$a == $1 ]] && { echo "kvnode-c: refusing to run as node $1" >&2; exit 1; }
  prev=\$a
done
exec "$work/kvnode-$2" "\$@"
EOF
    chmod 755 "$work/kvnode-c"
  }

  rolls_done=0 node_ups=0 rollbacks=0 resumes=0 roll_ms=() roll_lines=()
  declare -A gen_at=() base_qp=() base_mr=() start_state=() end_state=()
  fleet=a hrc="" audit_line="" linear_line=""

  # Cheap probes, as the single-node soak's: one `rdma` call for every node,
  # the static admin client, builtins otherwise.
  # Sets F_PID[I] (from the stats answers F_STATS[I]; fleet_stats), then
  # K_QP[I] K_MR[I] (the verbs objects the kernel lists for node I's threads)
  # and F_OLD (tids of kvnode objects of no current node process: an old
  # process's leftovers) from one `rdma` call (fleet_verbs).
  F_PID=() F_STATS=() K_QP=() K_MR=() F_OLD=""
  fleet_stats() {
    local i re='"pid":([0-9]+)'
    for i in 0 1 2; do
      F_STATS[i]=$(kv_node_admin "$i" stats 2>/dev/null) || F_STATS[i]=""
      F_PID[i]=0
      [[ ${F_STATS[i]} =~ $re ]] && F_PID[i]=${BASH_REMATCH[1]}
    done
  }
  fleet_verbs() {
    local i t l k p re='.* pid ([0-9]+)( |$)'
    local -A owner=()
    for i in 0 1 2; do
      K_QP[i]=0 K_MR[i]=0
      for t in /proc/"${F_PID[i]}"/task/*; do [[ -e $t ]] && owner[${t##*/}]=$i; done
    done
    F_OLD=""
    while read -r l; do
      k=${l%% *}
      [[ ($k == link || $k == dev) && " $l" =~ $re ]] || continue
      p=${BASH_REMATCH[1]}
      if [[ -n ${owner[$p]:-} ]]; then
        i=${owner[$p]}
        if [[ $k == link ]]; then K_QP[i]=$((K_QP[i] + 1)); else K_MR[i]=$((K_MR[i] + 1)); fi
      elif [[ " $l" == *" comm kvnode"* ]]; then
        F_OLD+=" $p"
      fi
    done < <(printf 'resource show qp\nresource show mr\n' | rdma -b - 2>/dev/null)
  }
  # Node I: "QP MR fd RSS-KiB" (the kernel's count of its verbs objects, its
  # fds but RocksDB's *.sst and WAL files, VmRSS), after fleet_stats and
  # fleet_verbs. With FD=0, "-" for the fds (a `find` exec per node).
  node_state() { # I [FD]
    local rss fd="-"
    rss=$(rss_kib "${F_PID[$1]}")
    [[ ${2:-1} == 0 ]] || fd=$(fd_count "${F_PID[$1]}")
    echo "${K_QP[$1]} ${K_MR[$1]} $fd ${rss%% *}"
  }
  # True when every node is as a roll must leave it; WAITED_FOR collects what
  # differed meanwhile. $1: the clients each node must have.
  fleet_steady() { # CLIENTS
    local i a f c why=""
    kv_cluster_serving 3 || why+=" serving"
    fleet_stats
    for i in 0 1 2; do
      a=${F_STATS[i]}
      [[ -n $a ]] || { why+=" ${KV_C_IDS[i]}:stats"; continue; }
      [[ $a == *'"upgrade_in_progress":false'* ]] || why+=" ${KV_C_IDS[i]}:upgrading"
      [[ $a == *"\"clients\":$1,"* ]] || why+=" ${KV_C_IDS[i]}:clients"
      # No child process (children_of without its subshell).
      for f in /proc/"${F_PID[i]}"/task/*/children; do
        c=""
        { read -r c; } 2>/dev/null <"$f" || true
        [[ -z $c ]] || { why+=" ${KV_C_IDS[i]}:child"; break; }
      done
    done
    fleet_verbs
    for i in 0 1 2; do
      [[ -z ${base_qp[$i]:-} || (${K_QP[i]} == "${base_qp[$i]}" && ${K_MR[i]} == "${base_mr[$i]}") ]] ||
        why+=" ${KV_C_IDS[i]}:qp_mr"
    done
    [[ -z $F_OLD ]] || why+=" old_verbs"
    [[ -z $why ]] && return 0
    [[ " $WAITED_FOR " == *" ${why# } "* ]] || WAITED_FOR+="${WAITED_FOR:+,}${why# }"
    return 1
  }
  counted_steady() { CHECKS=$((CHECKS + 1)); fleet_steady "$@"; }
  await_fleet() { # WHAT CLIENTS; CHECKS: how many checks it took
    WAITED_FOR="" CHECKS=0
    kv_wait_for 120 counted_steady "$2" && return 0
    local i s=""
    fleet_stats
    fleet_verbs
    for i in 0 1 2; do
      s+=" ${KV_C_IDS[i]}: $(node_state "$i") (QP MR fd RSS; before the first roll ${start_state[$i]:-?}), clients $(kv_json_num "${F_STATS[i]}" clients || echo '?');"
    done
    soak_fail "$1: the fleet not steady within 120 s (waited for: $WAITED_FOR):$s old processes' verbs objects (tids):${F_OLD:- none}; nodes $(roll_nodes)"
  }
  # Each node I must be on build-BUILD at generation gen_at[I] (+ 1 when its
  # turn in this roll came).
  expect_nodes() { # WHAT BUILD
    local i a
    for i in 0 1 2; do
      a=$(kv_node_admin "$i" ping) || soak_fail "$1: node ${KV_C_IDS[i]} does not answer ping"
      [[ $a == *"\"generation\":${gen_at[$i]},"* && $a == *"\"build_id\":\"build-$2\""* ]] ||
        soak_fail "$1: node ${KV_C_IDS[i]} is not generation ${gen_at[$i]} on build-$2: $a"
    done
  }

  # Seconds since T0_NS (or of MS ms) with one decimal.
  lap() { # T0_NS [MS]
    local ms=${2:-$((($(kv_now_ns) - $1) / 1000000))}
    echo "$((ms / 1000)).$(((ms % 1000) / 100))"
  }
  # The roll's plan in etcd (PLAN), and PLAN_STATES "STATE ID:STATE..." (the
  # roll's and each node's), read by regular expressions: a python start takes
  # seconds in the loaded guest. The plan's keys come sorted (nlohmann::json).
  plan_states() {
    local v re_r='"roll_id":"[^"]*","state":"([a-z_]+)"' re_n='"node_id":"([^"]*)"[^{}]*"state":"([a-z_]+)"'
    PLAN=$(kv_etcdctl get "/kvnode/$KV_CLUSTER/roll" --print-value-only 2>&1) || PLAN=""
    PLAN_STATES="?"
    [[ $PLAN =~ $re_r ]] && PLAN_STATES=${BASH_REMATCH[1]}
    v=$PLAN
    while [[ $v =~ $re_n ]]; do
      PLAN_STATES+=" ${BASH_REMATCH[1]}:${BASH_REMATCH[2]}"
      v=${v#*"${BASH_REMATCH[0]}"}
    done
  }
  every_node_has() { # N clients
    local i
    for i in 0 1 2; do [[ $(kv_node_stat "$i" clients) == "$1" ]] || return 1; done
  }

  c_summary() { # RC
    ((summary_done)) && return 0
    summary_done=1
    local rc=$1 i wall
    [[ -n $churn_pid ]] && stop_load "$churn_pid"
    churn_pid=""
    if [[ -n $load_pid ]]; then
      stop_load "$load_pid"
      load_pid=""
      ((LOAD_RC == 0)) || rc=1
    fi
    wall=$((($(kv_now_ns) - t_start) / 1000000000))
    for i in 0 1 2; do
      [[ -n ${KV_C_IDS[i]:-} && -z ${end_state[$i]:-} ]] && end_state[$i]=$(fleet_stats; fleet_verbs; node_state "$i" 2>/dev/null || echo '? ? ? ?')
    done
    echo "================ soak summary (--cluster) ================"
    echo "command:   deploy/bench/soak.sh --cluster --rolls $rolls --roll_fault_every $roll_fault_every --gate_s $gate_s --max_minutes $max_minutes --churn_every $churn_every --seed $seed --clients $clients --keys $keys --op_timeout_ms $op_timeout"
    echo "result:    $( ((rc == 0)) && echo CLEAN || echo "FAILED${fail_msg:+: $fail_msg}")"
    echo "rolls:     $rolls_done of $rolls done$( ((time_up)) && echo " (--max_minutes $max_minutes reached)") in $wall s wall; $node_ups node upgrades; $rollbacks rollbacks (each roll stopped, then --resume: $resumes)"
    if ((${#roll_ms[@]})); then
      printf '%s\n' "${roll_ms[@]}" | sort -n |
        awk '{a[NR]=$1} END {printf "roll time: min %.1f s, median %.1f s, max %.1f s (kvctl runs; a faulted roll: both)\n", a[1]/1000, a[int((NR+1)/2)]/1000, a[NR]/1000}'
    fi
    echo "churn:     $churns short-lived kvloads joined and left"
    echo "history:   ${linear_line:-not checked}"
    echo "audit:     ${audit_line:-not run}"
    for i in 0 1 2; do
      [[ -n ${KV_C_IDS[i]:-} ]] || continue
      echo "node ${KV_C_IDS[i]}:    QP MR fd RSS-KiB before the first roll: ${start_state[$i]:-?}; after the last: ${end_state[$i]:-?}"
    done
    echo "work dir:  $work$( ((keep || rc != 0)) && echo " (logs copied to ${summary_json%/*}/work)")"
    mkdir -p "${summary_json%/*}"
    python3 - "$work/report.json" "$summary_json" "$rc" "${fail_msg:-}" "$rolls" "$rolls_done" "$node_ups" \
      "$rollbacks" "$resumes" "$churns" "$wall" "$time_up" "${hrc:-}" "$seed" "$gate_s" "$roll_fault_every" \
      "$clients" "$keys" "$(printf '%s,' "${roll_ms[@]}")" "${audit_line:-}" "${linear_line:-}" \
      "${start_state[0]:-}" "${start_state[1]:-}" "${start_state[2]:-}" \
      "${end_state[0]:-}" "${end_state[1]:-}" "${end_state[2]:-}" <<'PY' || true
import json, os, sys
a = sys.argv[1:]
rep = json.load(open(a[0])) if os.path.exists(a[0]) else None
a = a[:19] + a[21:]  # the audit's and kvhistory's lines: a[19], a[20] before
audit, history = sys.argv[20] or None, sys.argv[21] or None
num = lambda s: [int(x) if x.isdigit() else None for x in s.split()]
state = lambda s: dict(zip(("qp", "mr", "fd", "rss_kib"), num(s))) if s else None
ms = [int(x) for x in a[18].split(",") if x]
out = {
    "mode": "cluster", "result": "CLEAN" if a[2] == "0" else "FAILED", "failure": a[3] or None,
    "rolls": int(a[4]), "rolls_done": int(a[5]), "node_upgrades": int(a[6]),
    "rollbacks": int(a[7]), "resumes": int(a[8]), "churns": int(a[9]), "wall_s": int(a[10]),
    "max_minutes_reached": a[11] == "1",
    "linearizable": None if a[12] == "" else a[12] == "0",
    "seed": int(a[13]), "gate_s": int(a[14]), "roll_fault_every": int(a[15]),
    "clients": int(a[16]), "keys": int(a[17]), "audit": audit, "history": history,
    "roll_s": {"min": min(ms) / 1e3, "median": sorted(ms)[(len(ms) - 1) // 2] / 1e3,
               "max": max(ms) / 1e3} if ms else None,
    "nodes": {n: {"start": state(a[19 + i]), "end": state(a[22 + i])} for i, n in enumerate("abc")},
}
if rep:
    out["kvload"] = {k: rep.get(k) for k in ("ops", "failed_ops", "verify_errors", "stale_reads",
                                             "blackout_ms", "ops_per_s", "duration_s")}
    out["kvload"]["client"] = rep.get("client")
    print(f"kvload:    {rep['ops']} ops, failed {rep['failed_ops']}, verify errors "
          f"{rep['verify_errors']}, stale {rep['stale_reads']}; longest gap {rep['blackout_ms']:.0f} ms")
else:
    out["kvload"] = None
    print("kvload:    no report (kvload did not finish)")
json.dump(out, open(a[1], "w"), indent=1)
print(f"summary:   {a[1]}")
PY
    return 0
  }
  c_exit() {
    local rc=$?
    set +e
    c_summary "$rc"
    if ((keep || rc != 0)) && [[ -d $work ]]; then
      # Regular files only (9p refuses the admin sockets); not the databases or etcd's data.
      mkdir -p "${summary_json%/*}/work"
      (cd "$work" && find . \( -path '*/db' -o -path ./etcd \) -prune -o -type f \
        \( -name '*.log' -o -name '*.json' -o -name '*.out' -o -name '*.tsv' \) -print |
        tar -cf - -T - 2>/dev/null) | tar -xf - -C "${summary_json%/*}/work"
    fi
    kv_cleanup "$rc"
    exit "$rc"
  }
  trap c_exit EXIT

  echo "== soak --cluster: $rolls rolls (gate $gate_s s), a failing binary every $roll_fault_every, churn every $churn_every, seed $seed, on $(kv_active_device)"
  KV_NODE_BIN=$work/kvnode-a
  kv_cluster_start 3
  seeds=$(kv_cluster_seeds)
  CHURN_DIR=$work CHURN_TARGET=(--cluster "$seeds")
  # One thread (its clients polled in turn): the guest's other vCPU is left to
  # three nodes, their upgrades and this script's checks.
  "$KV_KVLOAD" --cluster "$seeds" --auth_token_file "$KV_TOKEN" --workload A --clients "$clients" \
    --threads 1 --depth 4 --keys "$keys" --value_size 64 --duration 1000000 --verify \
    --history "$work/history.tsv" --ack_log "$work/acks.log" --report "$work/report.json" \
    --seed "$seed" --connect_timeout_ms 5000 --timeout_ms "$op_timeout" \
    >"$work/kvload.out" 2>"$work/kvload.log" &
  load_pid=$!
  kv_wait_for 120 every_node_has "$clients" || soak_fail "kvload's $clients clients did not reach every node"
  kv_cluster_more_puts 200 "kvload's start"
  check_load "$work/kvload.log" "$load_pid" kvload
  await_fleet "before the first roll" "$clients"
  fleet_stats
  fleet_verbs
  for i in 0 1 2; do
    gen_at[$i]=$(kv_json_num "${F_STATS[i]}" generation)
    base_qp[$i]=${K_QP[i]} base_mr[$i]=${K_MR[i]}
    start_state[$i]=$(node_state "$i")
  done
  kv_log "steady: $clients clients on every node; QP MR fd RSS-KiB a: ${start_state[0]}, b: ${start_state[1]}, c: ${start_state[2]}"

  for ((r = 1; r <= rolls; r++)); do
    if ((max_minutes > 0 && $(kv_now_ns) - t_start > max_minutes * 60000000000)); then
      time_up=1
      kv_log "--max_minutes $max_minutes reached after $rolls_done rolls: finishing"
      break
    fi
    to=b
    [[ $fleet == b ]] && to=a
    note=""
    churn=0
    if ((churn_every > 0 && r % churn_every == 0)); then
      churn=1
      churn_start
      # Odd rounds join before the roll; even rounds as it starts (they
      # connect while the first node upgrades).
      if ((churns % 2 == 1)); then
        kv_wait_for 120 every_node_has $((clients + 2)) || soak_fail "roll $r: the churn kvload did not reach every node"
        note+=", churn before"
      else
        note+=", churn joining during"
      fi
    fi
    t0=$(kv_now_ns)
    if ((roll_fault_every > 0 && r % roll_fault_every == 0)); then
      vi=$(((r / roll_fault_every - 1) % 3))
      victim=${KV_C_IDS[vi]}
      make_bad_build "$victim" "$to"
      roll_run "$r-bad" c --build_id "build-$to"
      t_bad=$(kv_now_ns)
      roll_expect 1 "roll $r (a binary that fails on $victim)"
      grep -q "$victim: rolled back" "$ROLL_OUT" || { cat "$ROLL_OUT" >&2; soak_fail "roll $r: kvctl did not say $victim rolled back"; }
      want=()
      for i in 0 1 2; do
        if ((i < vi)); then
          want+=("${KV_C_IDS[i]}:done")
        elif ((i == vi)); then
          want+=("${KV_C_IDS[i]}:rolled_back")
        else
          want+=("${KV_C_IDS[i]}:pending")
        fi
      done
      plan_states
      [[ $PLAN_STATES == "stopped ${want[*]}" ]] ||
        soak_fail "roll $r: the plan is '$PLAN_STATES', not 'stopped ${want[*]}': $PLAN"
      for i in 0 1 2; do
        a=$(kv_node_admin "$i" ping) || soak_fail "roll $r: node ${KV_C_IDS[i]} does not answer ping after the stop"
        if ((i < vi)); then
          [[ $a == *"\"generation\":$((gen_at[$i] + 1)),"* && $a == *"\"build_id\":\"build-$to\""* ]] ||
            soak_fail "roll $r: node ${KV_C_IDS[i]} (before $victim) not upgraded: $a"
        else
          [[ $a == *"\"generation\":${gen_at[$i]},"* && $a == *"\"build_id\":\"build-$fleet\""* ]] ||
            soak_fail "roll $r: node ${KV_C_IDS[i]} ($( ((i == vi)) && echo "rolled back" || echo "after $victim")) not untouched: $a"
        fi
      done
      rollbacks=$((rollbacks + 1))
      kv_log "roll $r: $victim rolled back, the roll stopped: $(grep -m1 'rolled back' "$ROLL_OUT")"
      cp "$work/kvnode-$to" "$work/kvnode-c" # the fix: the same path works on every node now
      t1=$(kv_now_ns)
      note+=", $victim rolled back (kvctl $(lap "$t0" $(((t_bad - t0) / 1000000))) s, checks $(lap "$t_bad") s)"
      roll_run "$r-resume" - --resume
      roll_expect 0 "roll $r: --resume after the fix"
      resumes=$((resumes + 1))
      note+=", then --resume $(lap "$t1") s"
    else
      roll_run "$r" "$to"
      roll_expect 0 "roll $r to build-$to"
    fi
    ms=$((($(kv_now_ns) - t0) / 1000000))
    roll_ms+=("$ms")
    for i in 0 1 2; do gen_at[$i]=$((gen_at[$i] + 1)); done
    expect_nodes "roll $r" "$to"
    rolls_done=$r
    node_ups=$((node_ups + 3))
    fleet=$to
    if ((churn)); then
      t1=$(kv_now_ns)
      kv_wait_for 120 every_node_has $((clients + 2)) || soak_fail "roll $r: the churn kvload's clients not on every node"
      churn_stop "roll $r"
      note+=", churn stopped in $(lap "$t1") s"
    fi
    check_load "$work/kvload.log" "$load_pid" kvload
    t1=$(kv_now_ns)
    await_fleet "roll $r" "$clients"
    # The state after the last roll; its fds (a `find` per node) only then.
    for i in 0 1 2; do end_state[$i]=$(node_state "$i" $((r == rolls))); done
    # printf's %(...)T, not date: an exec costs under TCG.
    printf '[soak %(%H:%M:%S)T] roll %d/%d: build-%s in %s s%s; steady in %s s (%d checks%s); generations %s %s %s; QP MR fd RSS-KiB a: %s, b: %s, c: %s\n' \
      -1 "$r" "$rolls" "$to" "$(lap "$t0" "$ms")" "${note:+ (${note#, })}" "$(lap "$t1")" "$CHECKS" \
      "${WAITED_FOR:+; waited for: $WAITED_FOR}" \
      "${gen_at[0]}" "${gen_at[1]}" "${gen_at[2]}" "${end_state[0]}" "${end_state[1]}" "${end_state[2]}"
  done

  # --- the end: kvload's verdict, the audit, the history, a clean stop -------------
  stop_load "$load_pid"
  load_pid=""
  ((LOAD_RC == 0)) || soak_fail "kvload exited $LOAD_RC: $(tail -n 5 "$work/kvload.log")"
  final_verdict "$work" "$work/acks.log" --cluster "$seeds"
  hrc=0
  "$KV_BUILD/tools/kvhistory" "$work/history.tsv" >"$work/kvhistory.log" 2>&1 || hrc=$?
  linear_line=$(grep -a '^history ' "$work/kvhistory.log" | tail -n 1 | sed 's/^history [^:]*: //')
  ((hrc == 0)) || soak_fail "kvhistory exited $hrc: $(grep -av ': linearizable (' "$work/kvhistory.log" | tail -n 5)"
  kv_log "kvhistory: $linear_line"
  kv_wait_for 30 every_node_has 0 || soak_fail "clients did not leave every node"
  kv_cluster_stop
  left=$({ rdma resource show qp; rdma resource show mr; } 2>/dev/null | grep -c ' comm kvnode' || true)
  ((left == 0)) || soak_fail "kernel still lists $left kvnode QPs/MRs after every node's stop"
  exit 0
fi

summary() {
  ((summary_done)) && return 0
  summary_done=1
  local rc=$1 report=${KV_DIR:-/nonexistent}/report.json
  [[ -n $churn_pid ]] && stop_load "$churn_pid"
  churn_pid=""
  if [[ -n $load_pid ]]; then
    stop_load "$load_pid"
    load_pid=""
    ((LOAD_RC == 0)) || rc=1
  fi
  local wall=$((($(kv_now_ns) - t_start) / 1000000000))
  echo "================ soak summary ================"
  echo "command:   deploy/bench/soak.sh --upgrades $upgrades --max_minutes $max_minutes --fault_every $fault_every --churn_every $churn_every --seed $seed --clients $clients --keys $keys --op_timeout_ms $op_timeout${cells:+ --cells $cells}"
  echo "result:    $( ((rc == 0)) && echo CLEAN || echo "FAILED${fail_msg:+: $fail_msg}")"
  echo "upgrades:  $done_ups of $upgrades done$( ((time_up)) && echo " (--max_minutes $max_minutes reached)") in ${wall} s wall ($( ((done_ups)) && echo "$((wall / done_ups)) s per upgrade incl. faults and checks" || echo "-"))"
  if ((${#owned_ms[@]})); then
    printf '%s\n' "${owned_ms[@]}" | sort -n | awk '{a[NR]=$1} END {printf "signal->Owned: min %d ms, median %d ms, max %d ms\n", a[1], a[int((NR+1)/2)], a[NR]}'
  fi
  echo "faults:    $faults injected (new side, outcome rollback each)"
  local c
  for c in $(printf '%s\n' "${!cell_count[@]}" | sort); do
    printf '  %-18s x%-3d recovery (signal -> rolled back) max %d ms\n' "$c" "${cell_count[$c]}" "${cell_ms[$c]}"
  done
  echo "churn:     $churns short-lived kvloads joined and left"
  if [[ -f $report ]]; then
    python3 - "$report" "$t_base" "${windows[@]}" <<'PY' || true
import json, sys
r = json.load(open(sys.argv[1]))
base, slot = int(sys.argv[2]), r["timeline_slot_ms"]
tl = r["timeline"]
worst, worst_i, worst_lat = 0.0, 0, 0.0
for i, w in enumerate(sys.argv[3:], 1):
    t0, t1 = ((int(x) - base) / 1e6 for x in w.split(":"))
    run = 0.0
    for s in tl[max(0, int(t0 // slot) - 1):int(t1 // slot) + 2]:
        worst_lat = max(worst_lat, s["max_latency_us"])
        run = run + slot if s["ops"] == 0 else 0.0
        if run > worst:
            worst, worst_i = run, i
c = r["client"]
print(f"kvload:    {r['ops']} ops, failed {r['failed_ops']}, verify errors {r['verify_errors']}, "
      f"stale {r['stale_reads']}, moves {c['moves']}, reconnects {c['reconnects']}, BUSY {c['busy']}")
print(f"blackout:  max {worst:.0f} ms (upgrade window {worst_i}; 10 ms slots without a completed op), "
      f"max latency in upgrade windows {worst_lat / 1000:.1f} ms; whole run longest gap {r['blackout_ms']:.0f} ms")
PY
  else
    echo "kvload:    no report (kvload did not finish)"
  fi
  echo "state:     start: QP $B_QP (all $B_TQP), MR $B_MR (all $B_TMR), fd $B_FD, RSS $B_RSS"
  echo "           end:   QP $S_QP (all $S_TQP), MR $S_MR (all $S_TMR), fd $S_FD, RSS $S_RSS"
  [[ -n $fault_cells ]] && echo "cells drawn (seed $seed):$fault_cells"
  echo "work dir:  ${KV_DIR:-?}$( ((keep || rc != 0)) && echo " (kept)" || echo " (removed)")"
  return 0
}

soak_exit() {
  local rc=$?
  set +e
  summary "$rc"
  if [[ -n ${RXE_VM_RESULTS:-} && ($rc -ne 0 || $keep -eq 1) && -d ${KV_DIR:-} ]]; then
    # Regular files only: the admin socket is a special file 9p refuses.
    (cd "$KV_DIR" && find . -path ./db -prune -o -type f \( -name '*.log' -o -name '*.json' -o -name '*.out' \) -print |
      tar -cf - -T - 2>/dev/null) | (mkdir -p "$RXE_VM_RESULTS/soak" && tar -xf - -C "$RXE_VM_RESULTS/soak") &&
      echo "logs copied to $RXE_VM_RESULTS/soak" >&2
  fi
  kv_cleanup
  [[ -n ${bins:-} ]] && rm -rf "$bins"
  ((keep || rc != 0)) || rm -rf "${KV_DIR:-/nonexistent}"
  exit "$rc"
}
trap soak_exit EXIT

# --- the run -------------------------------------------------------------------------
echo "== soak: $upgrades upgrades, fault every $fault_every, churn every $churn_every, seed $seed, on $(kv_active_device)"
bins=$(mktemp -d /tmp/kv-soak-bins.XXXXXX)
soak_make_builds "$bins"
KV_NODE_BIN=$bins/kvnode-a
# Ready/Owned deadlines of 20 s (as upgrade_faults.sh): a hung N is caught
# sooner than with the defaults, still far above a healthy N under TCG.
kv_start_node "${UP_NODE_FLAGS[@]}" --upgrade_ready_deadline_ms=20000 --upgrade_owned_deadline_ms=20000
UP_FIRST_PID=$KV_PID
CHURN_DIR=$KV_DIR CHURN_TARGET=(--server "$KV_ADDR")

acks="$KV_DIR/acks.log"
"$KV_KVLOAD" --server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --workload A --clients "$clients" \
  --threads "$(kv_load_threads)" --depth 4 --keys "$keys" --value_size 64 --preload --duration 1000000 --verify \
  --ack_log "$acks" --report "$KV_DIR/report.json" --seed "$seed" --connect_timeout_ms 5000 \
  --timeout_ms "$op_timeout" >"$KV_DIR/kvload.out" 2>"$KV_DIR/kvload.log" &
load_pid=$!
# kvload's timeline starts when its preload ends (it logs that line then).
preloaded() { grep -aq 'kvload: preloaded' "$KV_DIR/kvload.log"; }
kv_wait_for 300 preloaded || soak_fail "kvload did not finish its preload within 300 s"
t_base=$(kv_now_ns)
kv_wait_for 120 clients_are "$clients" || soak_fail "kvload's $clients clients did not connect"
kv_wait_for 120 kv_stat_at_least ops_put $((keys + 1000)) || soak_fail "no load after the preload"
check_load "$KV_DIR/kvload.log" "$load_pid" kvload
snapshot
B_QP=$S_QP B_MR=$S_MR B_TQP=$S_TQP B_TMR=$S_TMR B_FD=$S_FD B_RSS=$S_RSS B_SHM=$S_SHM B_RECORDS=$S_RECORDS
B_FD_PID=$KV_PID B_FD_UPGRADED="" B_FD_CAND=""
B_FDS=$(fd_list "$KV_PID")
[[ -z $S_CHILD ]] || soak_fail "node has children before the first upgrade: $S_CHILD"
kv_log "steady state: $(state_line), shm: $B_SHM"

# One attempt with CELL armed in N: expect a rollback (same generation, rollbacks
# +1, writes resumed, N reaped), then the steady state.
fault_attempt() {
  local cell=$1 t0 ms a rb puts same
  a=$(kv_admin stats) || soak_fail "fault $cell: no stats before the attempt"
  rb=$(kv_json_num "$a" rollbacks)
  puts=$(kv_json_num "$a" ops_put)
  same="\"generation\":$(kv_json_num "$a" generation),"
  echo "$cell" >"$bins/fault"
  t0=$(kv_now_ns)
  kill -USR2 "$KV_PID"
  a=$(kv_admin_until 120 stats "\"rollbacks\":$((rb + 1))," '"upgrade_in_progress":false') ||
    soak_fail "fault $cell: no rollback within 120 s ($(kv_admin ping))"
  ms=$((($(kv_now_ns) - t0) / 1000000))
  : >"$bins/fault"
  [[ $a == *"$same"* && $a == *"\"pid\":$KV_PID,"* ]] ||
    soak_fail "fault $cell: expected $same on pid $KV_PID after the rollback, got $(kv_admin ping)"
  kv_wait_for 60 kv_stat_at_least ops_put $((puts + 100)) || soak_fail "fault $cell: writes did not resume"
  faults=$((faults + 1))
  cell_count[$cell]=$((${cell_count[$cell]:-0} + 1))
  ((ms > ${cell_ms[$cell]:-0})) && cell_ms[$cell]=$ms
  fault_cells+=" $cell"
  kv_log "fault $cell: rolled back in $ms ms"
}

time_up=0
for ((i = 1; i <= upgrades; i++)); do
  if ((max_minutes > 0 && $(kv_now_ns) - t_start > max_minutes * 60000000000)); then
    time_up=1
    kv_log "--max_minutes $max_minutes reached after $done_ups upgrades: finishing"
    break
  fi
  note=""
  if ((fault_every > 0 && i % fault_every == 0)); then
    draw ${#cell_list[@]}
    cell=${cell_list[$DRAW]}
    fault_attempt "$cell"
    await_steady "after fault $cell"
    check_load "$KV_DIR/kvload.log" "$load_pid" kvload
    note=" after fault $cell"
  fi
  churn=0
  if ((churn_every > 0 && i % churn_every == 0)); then
    churn=1
    # Odd rounds join before the signal (moved by the upgrade), even rounds
    # as it is sent (they connect while the upgrade runs).
    if ((churns % 2 == 0)); then
      churn_start
      kv_wait_for 120 clients_are $((clients + 2)) || soak_fail "churn kvload did not connect"
      kv_log "upgrade $i: churn kvload $churns connected"
    fi
  fi
  how="kill"
  ((i % 5 == 0)) && how=kvctl
  if ((churn)) && [[ -z $churn_pid ]]; then
    # Even round: kvload is started, not waited for, right before the signal:
    # its clients connect while the upgrade runs.
    churn_start
    up_upgrade "$how"
    how="$how, churn joining during"
  else
    up_upgrade "$how"
    ((churn)) && how="$how, churn moved"
  fi
  done_ups=$i
  owned_ms+=($(((UP_OWNED_NS - UP_SIG_NS) / 1000000)))
  windows+=("$UP_SIG_NS:$UP_EXIT_NS")
  bid='?' bid_re='"build_id":"([^"]*)"'
  [[ $UP_STATS =~ $bid_re ]] && bid=${BASH_REMATCH[1]}
  want="build-b"
  ((i % 2 == 0)) && want="build-a"
  [[ $bid == "$want" ]] || soak_fail "upgrade $i: build id $bid, expected $want"
  if ((churn)); then
    t_c=$(kv_now_ns)
    kv_wait_for 120 clients_are $((clients + 2)) || soak_fail "upgrade $i: churn clients not on the new process ($(kv_stat clients))"
    t_c1=$(kv_now_ns)
    churn_stop "upgrade $i"
    kv_log "upgrade $i: churn kvload $churns on the new process $(((t_c1 - t_c) / 1000000)) ms after the old one's exit, stopped clean in $((($(kv_now_ns) - t_c1) / 1000000)) ms"
  fi
  check_load "$KV_DIR/kvload.log" "$load_pid" kvload
  t_chk=$(kv_now_ns)
  await_steady "upgrade $i"
  # printf's %(...)T, not date: under the load an exec of date took 0.6 s.
  printf '[soak %(%H:%M:%S)T] upgrade %d/%d: %s -> %s (%s) owned %d ms, old exit %d ms, steady %d ms later%s (%s%s); %s\n' \
    -1 "$i" "$upgrades" "$UP_OLD" "$UP_NEW" "$bid" \
    $(((UP_OWNED_NS - UP_SIG_NS) / 1000000)) $(((UP_EXIT_NS - UP_SIG_NS) / 1000000)) \
    $((($(kv_now_ns) - t_chk) / 1000000)) "${WAITED_FOR:+ (waited for: $WAITED_FOR)}" "$how" "$note" "$(state_line)"
done

# --- the end: kvload's verdict, the audit, a clean stop --------------------------------
stop_load "$load_pid"
load_pid=""
((LOAD_RC == 0)) || soak_fail "kvload exited $LOAD_RC: $(tail -n 5 "$KV_DIR/kvload.log")"
final_verdict "$KV_DIR" "$acks" --server "$KV_ADDR"
kv_wait_for 30 clients_are 0 || soak_fail "clients did not leave"
[[ ! -e /dev/shm/$KV_SHM.handoff ]] || soak_fail "handoff header leaked"
up_stop_node
[[ ! -e /dev/shm/$KV_SHM ]] || soak_fail "arena segment left after SIGTERM"
exit 0
