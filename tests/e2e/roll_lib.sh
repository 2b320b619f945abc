# Fleet-roll helpers for the cluster_roll*.sh tests (source after lib.sh and
# upgrade_lib.sh, once kv_cluster_start has run):
#   roll_run NAME BUILD [kvctl flags...]   kvctl cluster roll to KV_TEST_DIR/kvnode-BUILD
#                                          (build id build-BUILD; BUILD "-": none given,
#                                          for --resume) in the foreground; ROLL_RC,
#                                          output in ROLL_OUT
#   roll_start NAME BUILD [kvctl flags...] the same in the background: ROLL_PID
#   roll_wait                              reaps the background roll: ROLL_RC
#   roll_fleet_start                       three nodes a, b, c started as build a (up_make_builds)
#   roll_verified_load                     kvload --cluster --verify --history ROLL_HISTORY
#   roll_nodes                             "id:generation:build:state ..." from cluster status
#   roll_plan_is STATE [ID:STATE...]       condition on the plan in etcd
#   roll_some_node_upgrading               condition: a member key says "upgrading"

ROLL_FLAGS=(--gate_s 1)

# etcd and three nodes a, b, c started as build a of two wrapper builds
# (upgrade_lib.sh up_make_builds: KV_TEST_DIR/kvnode-a, -b).
roll_fleet_start() {
  umask 077 # the nodes' --pid_file directories must be their own
  kv_test_dir
  up_make_builds "$KV_TEST_DIR"
  KV_NODE_BIN="$KV_TEST_DIR/kvnode-a"
  kv_cluster_start 3
}

# The roll tests' load: verified reads, writes and deletes over every node,
# its history in ROLL_HISTORY for kv_history_check.
roll_verified_load() {
  ROLL_HISTORY="$KV_TEST_DIR/history.tsv"
  kv_cluster_load load --keys 300 --distribution uniform --read_ratio 0.5 --delete_ratio 0.1 \
    --clients 4 --depth 4 --verify --history "$ROLL_HISTORY" --timeout_ms 30000
}

roll_kvctl() { "$KV_KVCTL" cluster roll --etcd_endpoints "$KV_ETCD_ENDPOINTS" --cluster "$KV_CLUSTER" "$@"; }

roll_start() { # NAME BUILD|- [flags...]   (-: no --binary, for --resume)
  local name=$1 build=$2 bin=()
  shift 2
  if [[ $build != - ]]; then
    bin=(--binary "$KV_TEST_DIR/kvnode-$build")
    # ROLL_PROBE=1: kvctl learns the build id by running the binary.
    [[ ${ROLL_PROBE:-0} == 1 ]] || bin+=(--build_id "build-$build")
  fi
  ROLL_OUT="$KV_TEST_DIR/roll-$name.out"
  # kvctl itself in the background (not a function's subshell), so that
  # ROLL_PID is kvctl's pid: a test kills it.
  "$KV_KVCTL" cluster roll --etcd_endpoints "$KV_ETCD_ENDPOINTS" --cluster "$KV_CLUSTER" \
    "${bin[@]}" "${ROLL_FLAGS[@]}" "$@" >"$ROLL_OUT" 2>&1 &
  ROLL_PID=$!
  kv_log "kvctl cluster roll $name${bin[*]:+ to build-$build} (pid $ROLL_PID)"
}
roll_wait() {
  ROLL_RC=0
  wait "$ROLL_PID" || ROLL_RC=$?
  ROLL_PID=""
}
roll_run() { # NAME BUILD [flags...]
  roll_start "$@"
  roll_wait
}
roll_expect() { # RC WHAT
  [[ $ROLL_RC == "$1" ]] || { cat "$ROLL_OUT" >&2; kv_fail "$2: kvctl cluster roll exited $ROLL_RC, not $1"; }
}

roll_nodes() {
  kv_cluster_status --json | python3 -c '
import json, sys
s = json.load(sys.stdin)
row = lambda n: ":".join(str(n.get(k, d)) for k, d in
                         (("node_id", "?"), ("generation", 0), ("build_id", "-"), ("state", "down")))
print(" ".join(row(n) for n in s["nodes"]))'
}

roll_plan_is() { # STATE [ID:STATE...]
  local v
  v=$(kv_etcdctl get "/kvnode/$KV_CLUSTER/roll" --print-value-only) || return 1
  python3 - "$v" "$@" <<'PY'
import json, sys
p = json.loads(sys.argv[1])
want = sys.argv[2]
nodes = {n["node_id"]: n["state"] for n in p["nodes"]}
ok = p["state"] == want and all(nodes.get(x.split(":")[0]) == x.split(":")[1] for x in sys.argv[3:])
sys.exit(0 if ok else 1)
PY
}

roll_some_node_upgrading() {
  kv_etcdctl get --prefix "/kvnode/$KV_CLUSTER/nodes/" --print-value-only | grep -q '"state":"upgrading"'
}

# Every kvnode verbs object belongs to a live node process: none of an old
# process is left (rdma names the creating thread: map each to its process).
roll_no_old_verbs_objects() {
  local t pid live=" " bad=""
  for i in "${!KV_C_IDS[@]}"; do live+="$(kv_node_pid "$i") "; done
  for t in $({ rdma resource show qp; rdma resource show mr; } 2>/dev/null | grep ' comm kvnode' |
    grep -o ' pid [0-9]*' | awk '{print $2}' | sort -u); do
    pid=$(awk '/^Tgid:/ {print $2}' "/proc/$t/status" 2>/dev/null || echo "gone:$t")
    [[ $live == *" $pid "* ]] || bad+=" $pid"
  done
  [[ -z $bad ]] || { kv_log "verbs objects of processes that are not the nodes:$bad (nodes:$live)"; return 1; }
}
