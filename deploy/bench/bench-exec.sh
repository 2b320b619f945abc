#!/usr/bin/env bash
# How long the new process of a live upgrade takes to start: for each kvnode
# binary given, on a verbs device (in deploy/vm/rxe-vm when the host has none).
# Not a test: it prints one line per binary.
#
#   deploy/bench/bench-exec.sh BUILD_DIR KVNODE [KVNODE...]
#     e.g. deploy/vm/rxe-vm -- deploy/bench/bench-exec.sh build build/kvnode-shared build/node/kvnode
#
# Per binary: its shared objects (ldd), `KVNODE --version` run BENCH_RUNS
# (default 20) times (exec to exit: mostly the dynamic loader), and
# BENCH_UPGRADES (default 5) live upgrades of an idle node to it: exec ->
# Hello is the old process's "spawned ... as pid" log line (logged once the
# exec succeeded) to its "Hello from pid" line, Hello -> Ready from there to
# the new process's "Ready sent" line (attaching the arena, opening the
# device, registering the arena), of which device open is its "attached the
# live arena" line to its "device ..." line, request -> Owned from `kvctl
# upgrade` to the ping that answers with the next generation. Medians, with
# min and max.
# BUILD_DIR gives the test helpers (kvnode_admin_request).
# Each binary runs from a copy in a temp dir (tmpfs in the VM), as an
# installed one runs from a local disk: in deploy/vm/rxe-vm the build directory
# is a 9p mount without page cache, where every page the loader touches is a
# round trip to the host and a bigger binary would pay for it (the shared
# objects come from the host root, which is cached).
set -euo pipefail
export KVNODE_BUILD_DIR=${1:?usage: deploy/bench/bench-exec.sh BUILD_DIR KVNODE [KVNODE...]}
shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/../../tests/e2e/lib.sh"
source "$here/../../tests/e2e/upgrade_lib.sh"
kv_require_device
runs=${BENCH_RUNS:-20}
upgrades=${BENCH_UPGRADES:-5}

# stats V... -> "median M (min A, max B)"
stats() { printf '%s\n' "$@" | sort -n | awk '{v[NR]=$1} END {printf "median %d (min %d, max %d)", v[int((NR+1)/2)], v[1], v[NR]}'; }
# glog time of day in ms: "I20261201 18:10:00.123456 ..." -> ms since midnight
glog_ms() { awk '{split($2,t,":"); printf "%d\n", (t[1]*3600+t[2]*60+t[3])*1000}'; }

copies=$(mktemp -d /tmp/bench-exec.XXXXXX)
bins=()
n=0
for b in "$@"; do
  n=$((n + 1))
  mkdir "$copies/$n"
  cp "$b" "$copies/$n/$(basename "$b")"
  bins+=("$copies/$n/$(basename "$b")")
done
# --version of the binaries interleaved, so that a busy host slows them alike.
declare -A ver
for ((i = 0; i < runs; i++)); do
  for bin in "${bins[@]}"; do
    t0=${EPOCHREALTIME//[!0-9]/}
    "$bin" --version >/dev/null
    t1=${EPOCHREALTIME//[!0-9]/}
    ver[$bin]+=" $(((t1 - t0) / 1000))"
  done
done
# One node, upgraded BENCH_UPGRADES times to each binary in turn (kvctl
# upgrade --binary): the binaries are measured alternately, under the same
# load of the host.
declare -A hello ready device owned
# shellcheck disable=SC2034 # KV_NODE_BIN, UP_FIRST_PID: read by the sourced libraries
KV_NODE_BIN=${bins[0]}
kv_start_node
# shellcheck disable=SC2034
UP_FIRST_PID=$KV_PID
for ((u = 0; u < upgrades * ${#bins[@]}; u++)); do
  bin=${bins[$(((u + 1) % ${#bins[@]}))]}
  gen=$(up_ping_field generation)
  old=$(up_ping_field pid)
  t0=$(kv_now_ns)
  "$KV_KVCTL" --admin_socket "$KV_ADMIN" upgrade --binary "$bin" >/dev/null || kv_fail "kvctl upgrade --binary $bin refused"
  kv_wait_for 90 up_generation_is $((gen + 1)) || kv_fail "generation $((gen + 1)) did not answer within 90 s"
  t1=$(kv_now_ns)
  new=$(up_ping_field pid)
  kv_wait_for 30 up_gone "$old" || kv_fail "old process $old still alive 30 s after Owned"
  kv_wait_for 30 up_not_in_progress || kv_fail "upgrade still in progress on $new"
  KV_PID=$new
  s=$(grep "upgrade: spawned .* as pid $new\$" "$KV_LOG" | glog_ms)
  h=$(grep "upgrade: Hello from pid $new," "$KV_LOG" | glog_ms)
  # The new process's own lines: glog's third field is the thread id, its
  # pid for the main thread.
  n_ms() { awk -v pid="$new" -v re="$1" '$3 == pid && $0 ~ re' "$KV_LOG" | glog_ms; }
  a=$(n_ms 'store: attached the live arena')
  d=$(n_ms '] device .* port .* gid ')
  r=$(n_ms 'upgrade: Ready sent')
  [[ -n $s && -n $h && -n $a && -n $d && -n $r ]] ||
    kv_fail "no spawned/Hello/attached/device/Ready lines for pid $new in $KV_LOG"
  hello[$bin]+=" $((h - s))"
  ready[$bin]+=" $((r - h))"
  device[$bin]+=" $((d - a))"
  owned[$bin]+=" $(((t1 - t0) / 1000000))"
done
up_stop_node
for bin in "${bins[@]}"; do
  # shellcheck disable=SC2086
  echo "$bin: $(ldd "$bin" | wc -l) shared objects (ldd lines); --version ms: $(stats ${ver[$bin]}); exec->Hello ms: $(stats ${hello[$bin]}) [${hello[$bin]# }]; Hello->Ready ms: $(stats ${ready[$bin]}) [${ready[$bin]# }], of which device open ms: $(stats ${device[$bin]}) [${device[$bin]# }]; request->Owned ms: $(stats ${owned[$bin]})"
done
rm -rf "$copies"
