#!/usr/bin/env bash
# The README's run command: installs the dependencies, builds, starts kvnode
# on a verbs device (inside deploy/rxe-vm, Soft-RoCE, when this host has
# none), preloads keys, runs `kvload --verify` with a live progress line,
# prints the summary and `kvctl stats`, and stops the node cleanly (SIGTERM,
# exit 0).
#
#   deploy/demo.sh                 everything, build in build/
#   DEMO_DURATION=30 deploy/demo.sh   seconds of kvload (default 15)
#   KVNODE_BUILD_DIR=DIR deploy/demo.sh   build (and run) in DIR instead
#   deploy/demo.sh --no-build      skip install and build (binaries must exist)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source deploy/lib.sh

build=${KVNODE_BUILD_DIR:-$PWD/build}
mode=${1:-}

# --- inside: a device is present (natively or in the VM) -----------------------
if [[ $mode == --inner ]]; then
  dur=${DEMO_DURATION:-15}
  dir=$(mktemp -d /tmp/kvnode-demo.XXXXXX)
  token="$dir/token"
  (umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$token")
  admin="$dir/admin/admin.sock"
  port=${DEMO_PORT:-7000}
  node_pid=""
  cleanup() {
    if [[ -n $node_pid ]] && kill -0 "$node_pid" 2>/dev/null; then kill -KILL "$node_pid"; fi
    rm -f "/dev/shm/kvnode-demo-$$"
  }
  trap cleanup EXIT
  echo "== starting kvnode on $(kv_active_device) (127.0.0.1:$port, data in $dir)"
  "$build/server/kvnode" --listen "127.0.0.1:$port" --db_path "$dir/db" \
    --shm_name "kvnode-demo-$$" --admin_socket "$admin" --auth_token_file "$token" \
    --arena_size $((64 << 20)) --pid_file "$dir/pid" >"$dir/kvnode.log" 2>&1 &
  node_pid=$!
  deadline=$((SECONDS + 120))
  until "$build/client/tools/kvctl" --admin_socket "$admin" ping >/dev/null 2>&1; do
    if ! kill -0 "$node_pid" 2>/dev/null || ((SECONDS > deadline)); then
      echo "kvnode did not come up:"
      tail -20 "$dir/kvnode.log"
      exit 1
    fi
    sleep 0.1 # polling a condition under a deadline
  done
  "$build/client/tools/kvctl" --admin_socket "$admin" ping
  echo "== kvload: preload 10000 keys, then YCSB A with --verify for ${dur}s (4 clients, depth 4)"
  rc=0
  "$build/client/tools/kvload" --server "127.0.0.1:$port" --auth_token_file "$token" \
    --workload A --keys 10000 --value_size 64 --clients 4 --threads 2 --depth 4 --preload \
    --duration "$dur" --verify --ack_log "$dir/acks.log" --report "$dir/report.json" || rc=$?
  echo "== kvctl stats"
  "$build/client/tools/kvctl" --admin_socket "$admin" stats
  echo "== stopping kvnode (SIGTERM)"
  kill -TERM "$node_pid"
  node_rc=0
  wait "$node_pid" || node_rc=$?
  node_pid=""
  grep -E "clean shutdown" "$dir/kvnode.log" | tail -1 || true
  echo "kvnode exited $node_rc; kvload exited $rc; report: $dir/report.json"
  ((rc == 0 && node_rc == 0))
  exit 0
fi

# --- outside: install, build, then run here or in the VM ------------------------
if [[ $mode != --no-build ]]; then
  deploy/install-deps.sh
  echo "== configure and build ($build)"
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$build" -j "$(nproc)" --target kvnode kvload kvctl
fi
if dev=$(kv_active_device); then
  echo "== verbs device $dev found: running natively"
  KVNODE_BUILD_DIR=$build exec deploy/demo.sh --inner
fi
echo "== no verbs device on this host: running in deploy/rxe-vm (Soft-RoCE rxe0 in a QEMU guest)"
exec deploy/rxe-vm --rw "$build" -- env KVNODE_BUILD_DIR="$build" \
  DEMO_DURATION="${DEMO_DURATION:-15}" "$PWD/deploy/demo.sh" --inner
