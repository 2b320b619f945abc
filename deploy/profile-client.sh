#!/usr/bin/env bash
# perf profile of kvload's depth-1 GETs, one per build given, inside a device
# session (deploy/rxe-vm): where the client process's time goes (user code
# against rxe's kernel path). docs/BENCHMARKS.md cites its output.
#
#   deploy/rxe-vm --rw build -- deploy/profile-client.sh build/prof BUILD_DIR... 
#
# Writes OUTDIR/<build>-s<size>.kvload.{data,txt,report.txt}; prints the
# guest's clocksource (a non-TSC one makes every clock read a syscall).
# PROFILE_SIZES (default 16) lists the value sizes.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=$(realpath -m "$1")
shift
mkdir -p "$out"
cs=/sys/devices/system/clocksource/clocksource0
echo "clocksource: $(cat $cs/current_clocksource) (available: $(cat $cs/available_clocksource))"
echo "perf: $(perf --version 2>&1 | head -1)"
for b in "$@"; do
  tag=$(basename "$b")
  KVNODE_BUILD_DIR=$(realpath "$b")
  export KVNODE_BUILD_DIR
  (
    source "$here/../tests/e2e/lib.sh"
    set +e +o pipefail # a failed report must not stop the rest
    # shellcheck disable=SC2034 # kv_log's tag
    KV_TEST=prof-$tag
    kv_start_node --arena_size $((64 << 20)) --sync_writes=true --max_clients 64
    common=(--server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --progress=false --clients 1
      --threads 1 --keys 5000)
    for size in ${PROFILE_SIZES:-16}; do
      "$KV_KVLOAD" "${common[@]}" --value_size "$size" --depth 32 --workload C --preload --ops 1 \
        >/dev/null 2>&1
      perf record -e cpu-clock -F 2000 -g -o "$out/$tag-s$size.kvload.data" -- "$KV_KVLOAD" \
        "${common[@]}" --value_size "$size" --depth 1 --workload C --duration 3 \
        --spin 1000000000 --node_pid "$KV_PID" >"$out/$tag-s$size.kvload.txt" 2>&1
      perf report -i "$out/$tag-s$size.kvload.data" --stdio --no-children --sort dso,symbol \
        -g none 2>/dev/null | grep '%' | head -60 >"$out/$tag-s$size.kvload.report.txt"
    done
    kv_stop_node
  )
done
