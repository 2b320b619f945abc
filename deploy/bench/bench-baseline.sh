#!/usr/bin/env bash
# The hardware baseline every kvnode benchmark is compared against in the same
# run: perftest's ib_read_lat, ib_read_bw and ib_send_lat on the verbs device
# (natively where the host has one, else on rxe0 inside deploy/vm/rxe-vm).
#
#   deploy/bench/bench-baseline.sh [--sizes 2,64,1024,4096] [--iters N] [--json FILE]
#
# Prints one table; --json also writes the figures for other scripts.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source deploy/lib.sh

sizes=2,64,1024,4096
iters=2000
json=""
while (($#)); do
  case "$1" in
    --sizes) sizes=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --json) json=$(realpath -m "$2"); shift 2 ;;
    -h | --help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench-baseline: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

if ! dev=$(kv_active_device); then
  if [[ -n ${RXE_VM:-} ]]; then
    echo "bench-baseline: no ACTIVE verbs device even inside the VM" >&2
    exit 1
  fi
  args=(--sizes "$sizes" --iters "$iters")
  rw=()
  if [[ -n $json ]]; then
    mkdir -p "$(dirname "$json")"
    args+=(--json "$json")
    rw=(--rw "$(dirname "$json")")
  fi
  exec deploy/vm/rxe-vm "${rw[@]}" -- deploy/bench/bench-baseline.sh "${args[@]}"
fi
gid=$(kv_gid_index "$dev")
port=18515
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# run_pair TOOL SIZE EXTRA...: server and client of one perftest run on the
# loopback; prints the client's result line for SIZE. Under TCG perftest's
# clock calibration sometimes fails and prints inf: such a run is repeated.
run_pair() {
  local line try
  for try in 1 2 3; do
    line=$(run_pair_once "$@") || return 1
    [[ $line == *inf* || $line == *nan* ]] || break
    echo "bench-baseline: $1 -s $2 reported '$line' (clock calibration), run $try of 3" >&2
  done
  echo "$line"
}

run_pair_once() {
  local tool=$1 size=$2
  shift 2
  port=$((port + 1))
  "$tool" -d "$dev" -x "$gid" -p "$port" -s "$size" -n "$iters" "$@" >"$out/server.log" 2>&1 &
  local spid=$!
  if ! kv_wait_listen "$port" 20; then
    echo "bench-baseline: $tool server did not listen on $port" >&2
    kill "$spid" 2>/dev/null
    return 1
  fi
  "$tool" -d "$dev" -x "$gid" -p "$port" -s "$size" -n "$iters" "$@" 127.0.0.1 >"$out/client.log" 2>&1 ||
    { cat "$out/client.log" >&2; kill "$spid" 2>/dev/null; return 1; }
  wait "$spid" || true
  awk -v s="$size" '$1 == s' "$out/client.log" | tail -1
}

echo "perftest baseline on $dev (GID index $gid), $iters iterations per figure"
printf '%-8s %14s %14s %14s %14s %14s %12s %14s\n' bytes read_lat_p50 read_lat_p99 send_lat_p50 send_lat_p99 read_bw_MBps read_Mpps read_bw_d32
rows=()
for s in ${sizes//,/ }; do
  # ib_*_lat: t_min t_max t_typical t_avg t_stdev p99 p99.9 (usec)
  read -r _ _ _ _ rl_typ _ _ rl_p99 _ < <(run_pair ib_read_lat "$s")
  read -r _ _ _ _ sl_typ _ _ sl_p99 _ < <(run_pair ib_send_lat "$s")
  # ib_read_bw: bytes iters peak avg(MB/s) msgrate(Mpps); default depth, then depth 32
  read -r _ _ _ rb_avg rb_mpps < <(run_pair ib_read_bw "$s")
  read -r _ _ _ rb32_avg _ < <(run_pair ib_read_bw "$s" -o 32)
  printf '%-8s %14s %14s %14s %14s %14s %12s %14s\n' "$s" "$rl_typ" "$rl_p99" "$sl_typ" "$sl_p99" "$rb_avg" "$rb_mpps" "$rb32_avg"
  rows+=("{\"bytes\":$s,\"read_lat_p50_us\":$rl_typ,\"read_lat_p99_us\":$rl_p99,\"send_lat_p50_us\":$sl_typ,\"send_lat_p99_us\":$sl_p99,\"read_bw_MBps\":$rb_avg,\"read_mpps\":$rb_mpps,\"read_bw_d32_MBps\":$rb32_avg}")
done
echo "(p50 is perftest's t_typical; MB/s is 10^6 bytes/s)"
if [[ -n $json ]]; then
  (IFS=,; echo "{\"device\":\"$dev\",\"iters\":$iters,\"sizes\":[${rows[*]}]}") >"$json"
  echo "wrote $json"
fi
