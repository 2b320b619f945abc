#!/usr/bin/env bash
# kvnode against the wire, in one run on one verbs device (natively where the
# host has one, else on rxe0 inside deploy/vm/rxe-vm): for each value size,
# perftest's ib_read_lat, ib_send_lat and ib_read_bw at kvload's depths, then
# kvload (workload C, and write-only for PUT latency) on the same device,
# alternating rep by rep so host load drifts hit both alike. Prints GET p50 /
# ib_read_lat p50, GET ops/s / ib_read_bw message rate and PUT p50 /
# ib_send_lat p50 against the targets (GET p50 <= 1.3x ib_read_lat inline,
# <= 2.3x heap; GET rate >= 50% of ib_read_bw's).
#
#   deploy/bench/bench.sh [--sizes 16,1024] [--depths 1,8,32] [--reps 3] [--duration 2]
#                   [--keys 5000] [--spin N] [--short_duration 1] [--out DIR]
#                   [--no-build] [--two-host] [--parts lat,put_scale]
#                   [--put_scale 1x1,8x8] [--put_size 64] [--put_duration 3]
#                   [--redis_aof 1] [--perf] [--node_flags "FLAGS"]
#   e.g. one size at depth 1, quickly: deploy/bench/bench.sh --no-build --sizes 16 --depths 1 --reps 1
#   only the PUT scaling and Redis AOF part, one rep:
#     deploy/bench/bench.sh --no-build --parts put_scale --reps 1
#
# --parts: lat = the perftest comparison below (every size and depth);
# put_scale = PUT rate against the number of writers, and against Redis with
# AOF fsync always: for each CLIENTSxDEPTH of --put_scale, kvload write-only
# (--read_ratio 0, uniform over --keys preloaded keys of --put_size B, CLIENTS
# sessions driven by ONE thread, DEPTH PUTs outstanding each, --put_duration
# s) on the same node (--sync_writes=true), then `redis-benchmark -t set -c
# CLIENTS -P DEPTH -d SIZE -r KEYS` against a redis-server with `appendonly
# yes, appendfsync always` whose AOF is on the node's file system (the
# guest's tmpfs), then `ib_send_bw -b -q CLIENTS -t DEPTH` (the device's
# SEND rate each way: a PUT's ceiling), alternating rep by rep.
# --redis_aof 0 leaves Redis out;
# --perf then runs each configuration once more under `perf record -a -g`
# (cpu-clock; whole guest), reports in DIR/perf/. Not with --two-host.
# --node_flags: more kvnode flags (word-split), e.g. "--group_commit=false"
# for an A/B of one binary: alternate runs with and without them.
#
# --two-host: across a link instead of over loopback, always in
# `deploy/vm/rxe-vm --two-host`: kvnode and every perftest server on guest
# "server" (10.77.0.1), kvload and every perftest client on guest "client"
# (10.77.0.2), the same runs in the same order as above, so perftest's
# figures are those of the same link in the same session. Both ends use the
# RC timers of the two-host tests (tests/e2e/twohost_lib.sh). The guests
# agree on each step through files in DIR/rdv.
#
# For heap value sizes (not inline in the bucket) the C runs read every key
# once first (kvload --warm: the location cache then knows every object's
# place), and one more cell, C-nocache, runs depth 1 without the cache.
#
# kvload busy-polls like perftest: --spin N (default 1000000000) idle polls
# before its thread blocks on a completion event, i.e. never within a run;
# kvload's own default (64) adds an interrupt and a wake-up to most depth-1
# GETs. --spin 64 measures that default for comparison.
# --duration is that of the depth-1 GET runs (the latency headline and the
# CDF, which want the most samples); the other kvload runs (depth > 1, PUTs,
# the workload grid) last --short_duration s (default 1: thousands of GETs,
# ~100 synced PUTs, enough for a p50).
#
# Depths are matched honestly: kvload runs ONE client (one QP, one thread)
# with --depth D operations outstanding; a GET has at most one READ in flight
# (bucket, then object for heap values), so at most D READs are outstanding
# on the QP, the same as `ib_read_bw -t D -o D` (D send-queue entries, D
# outstanding READs). ib_read_lat is depth 1 by construction; at depth > 1
# GET p50 is also set against D / (ib_read_bw msg rate at depth D), the mean
# latency Little's law gives perftest at that depth.
#
# Raw output (perftest logs, kvload reports, runs.jsonl) goes to DIR
# (default build-bench/bench/bench-<date>); the table is made by
# deploy/bench/plot-bench.py from those files.
#
# Inside a device session other scripts call `deploy/bench/bench.sh --inner ...`
# (deploy/bench/bench-all.sh does); extra inner options: --mix SIZE:DEPTH (workloads
# A/B/C x uniform/zipfian at that cell), --cdf (GET latency CDFs and
# ib_read_lat samples at depth 1), --deadline EPOCH (skip what would start
# after it, recorded as skipped).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
bench_args="$*"

sizes=16,1024
depths=1,8,32
reps=3
duration=2
keys=5000
spin=1000000000
short_duration=1
out=""
build=${KVNODE_BUILD_DIR:-$repo/build-bench}
do_build=1
inner=0
mix=""
cdf=0
deadline=0
two_host=0
parts=lat,put_scale
put_scale=1x1,8x8
put_size=64
put_duration=3
redis_aof=1
do_perf=0
node_flags=""
while (($#)); do
  case "$1" in
    --sizes) sizes=$2; shift 2 ;;
    --depths) depths=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --keys) keys=$2; shift 2 ;;
    --spin) spin=$2; shift 2 ;;
    --short_duration) short_duration=$2; shift 2 ;;
    --out) out=$(realpath -m "$2"); shift 2 ;;
    --no-build) do_build=0; shift ;;
    --inner) inner=1; shift ;;
    --mix) mix=$2; shift 2 ;;
    --cdf) cdf=1; shift ;;
    --deadline) deadline=$2; shift 2 ;;
    --two-host) two_host=1; shift ;;
    --parts) parts=$2; shift 2 ;;
    --put_scale) put_scale=$2; shift 2 ;;
    --put_size) put_size=$2; shift 2 ;;
    --put_duration) put_duration=$2; shift 2 ;;
    --redis_aof) redis_aof=$2; shift 2 ;;
    --perf) do_perf=1; shift ;;
    --node_flags) node_flags=$2; shift 2 ;;
    -h | --help) sed -n '2,48p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

# ------------------------------------------------------------------------------
# Outside: build, then run here (device present) or in the VM, then the table.
if ((!inner)); then
  cd "$repo"
  source deploy/lib.sh
  out=${out:-$build/bench/bench-$(date +%Y%m%d-%H%M%S)}
  mkdir -p "$out"
  if ((do_build)); then
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$build" -j 2 --target kvnode kvload kvctl kvnode_admin_request
  fi
  echo "load_start=$(cut -d' ' -f1-3 /proc/loadavg)" >"$out/bench-host.txt"
  echo "command=deploy/bench/bench.sh $bench_args" >>"$out/bench-host.txt"
  args=(--inner --sizes "$sizes" --depths "$depths" --reps "$reps" --duration "$duration"
    --keys "$keys" --spin "$spin" --short_duration "$short_duration" --out "$out"
    --parts "$parts" --put_scale "$put_scale" --put_size "$put_size"
    --put_duration "$put_duration" --redis_aof "$redis_aof" --node_flags "$node_flags")
  ((do_perf)) && args+=(--perf)
  rc=0
  if ((two_host)); then
    deploy/vm/rxe-vm --two-host --rw "$build" --rw "$out" -- env KVNODE_BUILD_DIR="$build" \
      "$repo/deploy/bench/bench.sh" "${args[@]}" --two-host || rc=$?
  elif kv_active_device >/dev/null; then
    KVNODE_BUILD_DIR=$build deploy/bench/bench.sh "${args[@]}" || rc=$?
  else
    deploy/vm/rxe-vm --rw "$build" --rw "$out" -- env KVNODE_BUILD_DIR="$build" \
      "$repo/deploy/bench/bench.sh" "${args[@]}" || rc=$?
  fi
  echo "load_end=$(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/bench-host.txt"
  ((rc == 0)) || echo "bench: the measuring run exited $rc; tabulating what it recorded" >&2
  python3 deploy/bench/plot-bench.py summary "$out"
  if [[ ,$parts, == *,put_scale,* ]] && ((!two_host)); then
    python3 deploy/bench/plot-bench.py put-scale-md "$out" >"$out/put-scale.md" &&
      echo "bench: PUT scaling and Redis AOF tables (markdown): $out/put-scale.md"
  fi
  if ((two_host)); then
    [[ -f $out/rdv/counters.txt ]] && sed 's/^/rxe0 counters: /' "$out/rdv/counters.txt"
    python3 deploy/bench/plot-bench.py two-host-md "$out" --command "deploy/bench/bench.sh $bench_args" \
      >"$out/two-host.md" && echo "bench: docs/BENCHMARKS.md's two-host section: $out/two-host.md"
  fi
  exit "$rc"
fi

# ------------------------------------------------------------------------------
# Inside: a verbs device is here.
[[ -n $out ]] || { echo "bench --inner: --out is required" >&2; exit 2; }
export KVNODE_BUILD_DIR=$build
source "$repo/deploy/lib.sh"
source "$repo/tests/e2e/lib.sh" # kv_start_node / kv_stop_node; sets -euo pipefail
KV_TEST=bench
dev=$(kv_active_device) || { echo "bench: no ACTIVE verbs device" >&2; exit 1; }
gid=$(kv_gid_index "$dev")
mkdir -p "$out/perftest" "$out/kvload"
runs=$out/runs.jsonl
touch "$runs"

record() { echo "$1" >>"$runs"; }
# Wall time of each step goes into its record ("wall_s"), so that where a
# session's time went can be read back (plot-bench.py summary prints it).
now_ms() { echo $(($(date +%s%N) / 1000000)); }
since() { local t=$(($(now_ms) - $1)); printf '%d.%03d' $((t / 1000)) $((t % 1000)); }
# True when there is still time to start something that takes about $1 s.
in_budget() { ((deadline == 0 || $(date +%s) + ${1:-0} <= deadline)); }
skip() {
  kv_log "skipped (time budget): $1"
  record "{\"kind\":\"skipped\",\"what\":\"$1\"}"
}

# perftest: all servers of one batch are started first (each blocks in
# accept(), costing nothing), then the clients run one after the other, so a
# server's start-up overlaps the previous measurement instead of adding to it.
pt_port=19000
declare -a pt_specs=()
pt_add() { pt_specs+=("$*"); } # NAME TOOL SIZE DEPTH ARGS...
pt_run_batch() {             # REP
  local rep=$1 name tool size depth i try ok t0
  local -a ports=() spids=() a
  for i in "${!pt_specs[@]}"; do
    read -r -a a <<<"${pt_specs[$i]}"
    pt_port=$((pt_port + 1))
    ports[i]=$pt_port
    "${a[1]}" -d "$dev" -x "$gid" -p "$pt_port" -s "${a[2]}" -F "${a[@]:4}" \
      >"$out/perftest/${a[0]}-r$rep.server.log" 2>&1 &
    spids[i]=$!
  done
  for i in "${!pt_specs[@]}"; do
    read -r -a a <<<"${pt_specs[$i]}"
    name=${a[0]} tool=${a[1]} size=${a[2]} depth=${a[3]}
    ok=false
    t0=$(now_ms)
    for try in 1 2 3; do
      if ((try > 1)); then # the server of a failed run has exited: a fresh one
        pt_port=$((pt_port + 1))
        ports[i]=$pt_port
        "$tool" -d "$dev" -x "$gid" -p "$pt_port" -s "$size" -F "${a[@]:4}" \
          >"$out/perftest/$name-r$rep.server.log" 2>&1 &
        spids[i]=$!
      fi
      kv_wait_for 30 kv_port_listening "${ports[i]}" || { kill "${spids[i]}" 2>/dev/null || true; continue; }
      if "$tool" -d "$dev" -x "$gid" -p "${ports[i]}" -s "$size" -F "${a[@]:4}" 127.0.0.1 \
        >"$out/perftest/$name-r$rep.log" 2>&1; then
        wait "${spids[i]}" 2>/dev/null || true
        # Under TCG the clock calibration sometimes fails: perftest prints inf,
        # nan or a rate of 0. Such a run is repeated.
        # (Only the figure used is judged: the stdev column overflows to nan
        # on huge outliers while t_typical stays good.)
        if awk -v s="$size" -v bw="$([[ $tool == *_bw ]] && echo 1 || echo 0)" '
            $1 == s { v = bw ? $NF : $5 }
            END { exit !(v != "" && v !~ /inf|nan/ && v + 0 > 0) }' \
          "$out/perftest/$name-r$rep.log"; then
          ok=true
          break
        fi
      else
        kill "${spids[i]}" 2>/dev/null || true
        wait "${spids[i]}" 2>/dev/null || true
      fi
      kv_log "$name rep $rep: attempt $try failed (see $out/perftest/$name-r$rep.log)"
    done
    record "{\"kind\":\"perftest\",\"tool\":\"$tool\",\"name\":\"$name\",\"size\":$size,\"depth\":$depth,\"rep\":$rep,\"ok\":$ok,\"args\":\"${a[*]:4}\",\"log\":\"perftest/$name-r$rep.log\",\"wall_s\":$(since "$t0")}"
  done
  pt_specs=()
}

# One kvload run: CELL WORKLOAD DIST SIZE DEPTH REP [extra kvload flags...]
kvload_run() {
  local cell=$1 wl=$2 dist=$3 size=$4 depth=$5 rep=$6
  shift 6
  local base="$cell-s$size-d$depth-r$rep" rc=0 t0
  t0=$(now_ms)
  local -a wlflag=(--workload "$wl")
  [[ $wl == W ]] && wlflag=(--read_ratio 0) # write-only: PUT latency and rate
  local dur=$short_duration
  [[ ($cell == C-uniform || $cell == C-nocache) && $depth == 1 ]] && dur=$duration
  [[ $cell == P-* ]] && dur=$put_duration
  local -a cmd=("$KV_KVLOAD" "${kvload_common[@]}" --value_size "$size" --depth "$depth"
    "${wlflag[@]}" --distribution "$dist" --duration "$dur" --seed "$rep"
    --report "$out/kvload/$base.json" "$@")
  "${cmd[@]}" >"$out/kvload/$base.log" 2>&1 || rc=$?
  local cdf_field="" a
  for a in "$@"; do
    [[ $a == --latency_cdf=* ]] && cdf_field=",\"cdf\":\"kvload/${a##*/}\""
  done
  record "{\"kind\":\"kvload\",\"cell\":\"$cell\",\"workload\":\"$wl\",\"dist\":\"$dist\",\"size\":$size,\"depth\":$depth,\"rep\":$rep,\"rc\":$rc,\"report\":\"kvload/$base.json\",\"log\":\"kvload/$base.log\"$cdf_field,\"command\":\"kvload ${cmd[*]:1}\",\"wall_s\":$(since "$t0")}"
  ((rc == 0)) || kv_log "kvload $base exited $rc: $(tail -n 3 "$out/kvload/$base.log" | tr '\n' ' ')"
}

# Depth 32: the preload's synced PUTs share RocksDB group commits, and the
# preload is set-up, not a figure.
preload() { # SIZE
  local rc try t0
  t0=$(now_ms)
  for try in 1 2 3; do
    rc=0
    "$KV_KVLOAD" "${kvload_common[@]}" --value_size "$1" --depth 32 --workload C \
      --preload --ops 1 >"$out/kvload/preload-s$1.log" 2>&1 || rc=$?
    if ((rc == 0)); then
      record "{\"kind\":\"step\",\"what\":\"preload $keys keys of $1 B\",\"wall_s\":$(since "$t0")}"
      return 0
    fi
    kv_log "preload of $keys keys of $1 B, attempt $try: $(tail -n 2 "$out/kvload/preload-s$1.log" | tr '\n' ' ')"
  done
  kv_fail "preload of $keys keys of $1 B failed 3 times"
}

# --- two hosts: the server guest serves; the client guest runs the loop below.
if ((two_host)); then
  TH_DIR=$out/rdv
  mkdir -p "$TH_DIR"
  source "$repo/tests/e2e/twohost_lib.sh"
  if [[ $TH_ROLE == server ]]; then
    # Every batch of perftest servers the client asks for (rdv/batch-N: one
    # "NAME TOOL SIZE DEPTH PORT ARGS..." line each), until rdv/done.
    # shellcheck disable=SC2086 # --node_flags is a list of flags
    th_start_node --arena_size $((64 << 20)) --sync_writes=true --max_clients 64 $node_flags
    th_counters_begin
    cp "$KV_DIR/kvnode.log" "$out/kvnode-start.log" 2>/dev/null || true
    batch=0
    more_batches() { [[ -e $TH_DIR/batch-$batch || -e $TH_DIR/done ]]; }
    while :; do
      kv_wait_for 3600 more_batches || kv_fail "no request from the client guest within an hour"
      [[ -e $TH_DIR/batch-$batch ]] || break
      spids=()
      while read -r -a a; do
        "${a[1]}" -d "$dev" -x "$gid" -p "${a[4]}" -s "${a[2]}" -F "${a[@]:5}" \
          >"$out/perftest/${a[0]}.server.log" 2>&1 &
        spids+=($!)
        kv_wait_for 30 kv_port_listening "${a[4]}" || kv_log "perftest server ${a[0]} not listening"
      done <"$TH_DIR/batch-$batch"
      th_put "batch-$batch.ready"
      th_wait "batch-$batch.done" 3600
      # A server whose client failed still waits for it.
      for p in "${spids[@]}"; do kill "$p" 2>/dev/null || true; done
      for p in "${spids[@]}"; do wait "$p" 2>/dev/null || true; done
      batch=$((batch + 1))
    done
    kv_admin stats >"$out/kvnode-stats.json" 2>/dev/null || true
    th_counters_report "bench"
    KV_STOP_TIMEOUT=60 kv_stop_node
    exit 0
  fi
  # The client: perftest clients against the server guest's servers.
  th_batch=0
  pt_run_batch() { # REP
    local rep=$1 i name tool size depth ok t0
    local -a a
    : >"$TH_DIR/.batch"
    for i in "${!pt_specs[@]}"; do
      read -r -a a <<<"${pt_specs[$i]}"
      pt_port=$((pt_port + 1))
      echo "${a[0]}-r$rep ${a[1]} ${a[2]} ${a[3]} $pt_port ${a[*]:4}" >>"$TH_DIR/.batch"
    done
    mv "$TH_DIR/.batch" "$TH_DIR/batch-$th_batch"
    th_wait "batch-$th_batch.ready" 300
    while read -r -a a; do
      name=${a[0]%-r*} tool=${a[1]} size=${a[2]} depth=${a[3]}
      ok=false
      t0=$(now_ms)
      # One attempt: the server guest starts one server per run.
      if "$tool" -d "$dev" -x "$gid" -p "${a[4]}" -s "$size" -F "${a[@]:5}" "$RXE_VM_PEER" \
        >"$out/perftest/$name-r$rep.log" 2>&1 &&
        awk -v s="$size" -v bw="$([[ $tool == ib_read_bw ]] && echo 1 || echo 0)" '
            $1 == s { v = bw ? $NF : $5 }
            END { exit !(v != "" && v !~ /inf|nan/ && v + 0 > 0) }' "$out/perftest/$name-r$rep.log"; then
        ok=true
      else
        kv_log "$name rep $rep failed (see $out/perftest/$name-r$rep.log)"
      fi
      record "{\"kind\":\"perftest\",\"tool\":\"$tool\",\"name\":\"$name\",\"size\":$size,\"depth\":$depth,\"rep\":$rep,\"ok\":$ok,\"args\":\"${a[*]:5}\",\"log\":\"perftest/$name-r$rep.log\",\"wall_s\":$(since "$t0")}"
    done <"$TH_DIR/batch-$th_batch"
    th_put "batch-$th_batch.done"
    th_batch=$((th_batch + 1))
    pt_specs=()
  }
  trap 'th_put "done"; kv_cleanup' EXIT
  th_counters_begin
fi

mix_size=${mix%%:*}
mix_depth=${mix##*:}
((two_host)) && dev="$dev (two hosts: eth0 $RXE_VM_ADDR to $RXE_VM_PEER)"
kv_log "device $dev (GID index $gid); sizes $sizes, depths $depths, $reps reps, ${duration}s per kvload run, --spin $spin"
record "{\"kind\":\"config\",\"device\":\"$dev\",\"gid_index\":$gid,\"sizes\":[$sizes],\"depths\":[$depths],\"reps\":$reps,\"duration_s\":$duration,\"short_duration_s\":$short_duration,\"keys\":$keys,\"mix\":\"$mix\",\"spin\":$spin,\"parts\":\"$parts\",\"put_scale\":\"$put_scale\",\"put_size\":$put_size,\"put_duration_s\":$put_duration}"
# The node: defaults but a small arena (every value size fits with $keys
# keys) and RocksDB on the guest's tmpfs; writes are synced (the default).
t0=$(now_ms)
if ((two_host)); then
  th_connect_info
  dev=${dev%% *}
else
  # shellcheck disable=SC2086 # --node_flags is a list of flags
  kv_start_node --arena_size $((64 << 20)) --sync_writes=true --max_clients 64 $node_flags
fi
record "{\"kind\":\"step\",\"what\":\"kvnode start\",\"wall_s\":$(since "$t0")}"
# One client, one thread, busy-polling (--spin). The connect bound is raised:
# under TCG on a loaded host the node's per-client set-up (QP, window) can
# take seconds.
kvload_common=(--server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --progress=false
  --clients 1 --threads 1 --keys "$keys" --connect_timeout_ms 15000 --spin "$spin")
if ((two_host)); then
  kvload_common+=("${TH_QP_FLAGS[@]}")
else
  # The node's CPU time is read from /proc: only where it runs beside kvload.
  kvload_common+=(--node_pid "$KV_PID")
  cp "$KV_DIR/kvnode.log" "$out/kvnode-start.log" 2>/dev/null || true
fi

# Rough cost of one rep of one size, to stop before the deadline.
rep_cost=$((60 + 10 * $(tr ',' '\n' <<<"$depths" | wc -l)))
[[ ,$parts, == *,lat,* ]] || sizes=""
for size in ${sizes//,/ }; do
  if ! in_budget 30; then
    skip "size $size (all reps)"
    continue
  fi
  preload "$size"
  for ((rep = 1; rep <= reps; rep++)); do
    if ! in_budget "$rep_cost"; then
      skip "size $size rep $rep"
      continue
    fi
    hflag=""
    ((cdf && rep == 1)) && hflag=-H # every sample, for the CDF plot
    pt_add "ib_read_lat-$size" ib_read_lat "$size" 1 -n 2000 $hflag
    # -n 1000: under TCG ib_send_lat's outliers (100s of ms) made -n 2000 the
    # costliest perftest run (13-26 s); 1000 samples still pin its median.
    pt_add "ib_send_lat-$size" ib_send_lat "$size" 1 -n 1000
    for d in ${depths//,/ }; do
      pt_add "ib_read_bw-$size-d$d" ib_read_bw "$size" "$d" -n 5000 -t "$d" -o "$d"
    done
    pt_run_batch "$rep"
    for d in ${depths//,/ }; do
      extra=()
      ((cdf && rep == 1 && d == 1)) && extra=("--latency_cdf=$out/kvload/cdf-s$size-d1.txt")
      # Heap values: the client's location cache warmed first (every key
      # read once, unmeasured), so these GETs know each object's place.
      ((32 + 16 + size > 192)) && extra+=(--warm)
      kvload_run C-uniform C uniform "$size" "$d" "$rep" "${extra[@]}"
    done
    # ... and without the cache: bucket, then object.
    ((32 + 16 + size > 192)) && kvload_run C-nocache C uniform "$size" 1 "$rep" --location_cache 0
    kvload_run W-uniform W uniform "$size" 1 "$rep"
    if [[ -n $mix && $size == "$mix_size" ]]; then
      for wl in A B C; do
        for dist in uniform zipfian; do
          [[ $wl == C && $dist == uniform && ,$depths, == *,$mix_depth,* ]] && continue
          kvload_run "$wl-$dist" "$wl" "$dist" "$size" "$mix_depth" "$rep"
        done
      done
    fi
  done
done

# --- PUT rate against the number of writers, and against Redis AOF always.
# Every configuration runs on the node above (--sync_writes=true: a PUT is
# acknowledged once its RocksDB write is synced) and on one redis-server
# with `appendfsync always` (a SET is answered once the AOF is fsynced),
# rep by rep, so host load drifts hit both alike.
redis_aof_start() {
  rdir=$KV_DIR/redis-aof # on the file system of the node's RocksDB
  mkdir -p "$rdir"
  rport=16380
  redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly yes \
    --appendfsync always --dir "$rdir" --daemonize no --logfile "$out/redis-aof/server.log" &
  rpid=$!
  kv_wait_for 30 kv_port_listening "$rport" || { kv_log "redis-server (AOF) did not listen"; return 1; }
  record "{\"kind\":\"redis_aof_server\",\"fs_redis\":\"$(stat -f -c %T "$rdir")\",\"fs_rocksdb\":\"$(stat -f -c %T "$KV_DIR/db")\",\"args\":\"--appendonly yes --appendfsync always --save ''\"}"
}
# redis-benchmark has no --duration: a short calibration run (unrecorded)
# per configuration sets -n to about --put_duration s of SETs.
declare -A redis_n=()
redis_aof_run() { # CLIENTS DEPTH REP
  local c=$1 d=$2 rep=$3 f rc=0 t0 n rps
  local -a rb=(redis-benchmark -h 127.0.0.1 -p "$rport" -t set -d "$put_size" -r "$keys"
    -c "$c" -P "$d" --csv)
  n=${redis_n[$c.$d]:-}
  if [[ -z $n ]]; then
    rps=$("${rb[@]}" -n $((200 * c * d)) 2>/dev/null | awk -F'"' '$2 == "SET" {print int($4)}')
    n=$((${rps:-0} * put_duration))
    ((n >= 100 * c * d)) || n=$((100 * c * d))
    ((n <= 500000)) || n=500000
    redis_n[$c.$d]=$n
  fi
  f=redis-aof/c$c-P$d-s$put_size-r$rep.csv
  t0=$(now_ms)
  "${rb[@]}" -n "$n" >"$out/$f" 2>"$out/$f.err" || rc=$?
  record "{\"kind\":\"redis_aof\",\"size\":$put_size,\"clients\":$c,\"depth\":$d,\"rep\":$rep,\"n\":$n,\"rc\":$rc,\"csv\":\"$f\",\"command\":\"${rb[*]} -n $n\",\"wall_s\":$(since "$t0")}"
}
# Runs a command with kvload_common's --clients set to $1 (still one thread).
with_clients() {
  local -a saved=("${kvload_common[@]}")
  local i
  for i in "${!kvload_common[@]}"; do
    [[ ${kvload_common[i]} == --clients ]] && kvload_common[i + 1]=$1
  done
  shift
  "$@"
  kvload_common=("${saved[@]}")
}
if [[ ,$parts, == *,put_scale,* ]] && ((two_host)); then
  kv_log "put_scale: loopback only (not with --two-host); skipped"
elif [[ ,$parts, == *,put_scale,* ]]; then
  if in_budget 60; then
    mkdir -p "$out/redis-aof" "$out/perf"
    rpid=""
    if ((redis_aof)) && command -v redis-server >/dev/null; then
      redis_aof_start || { kill "$rpid" 2>/dev/null || true; rpid=""; }
    fi
    preload "$put_size"
    for ((rep = 1; rep <= reps; rep++)); do
      for cd in ${put_scale//,/ }; do
        c=${cd%x*} d=${cd#*x}
        if ! in_budget $((put_duration * 2 + 20)); then
          skip "put_scale ${c}x$d rep $rep"
          continue
        fi
        with_clients "$c" kvload_run "P-c$c" W uniform "$put_size" "$d" "$rep"
        [[ -n $rpid ]] && redis_aof_run "$c" "$d" "$rep"
        # The device's own ceiling for this configuration: a PUT is one SEND
        # each way, and `ib_send_bw -b` with C QPs of D SENDs outstanding
        # each way does nothing else (its MsgRate is both directions' sum).
        pt_add "ib_send_bw-b-c$c-d$d" ib_send_bw "$put_size" "$d" -b -q "$c" -t "$d" \
          -D "$put_duration"
        pt_run_batch "$rep"
      done
    done
    # Profiles: each configuration once more under perf, after the measured
    # reps (perf's own cost would skew them), recorded apart (cell P-perf-cN).
    if ((do_perf)) && command -v perf >/dev/null; then
      for cd in ${put_scale//,/ }; do
        c=${cd%x*} d=${cd#*x}
        if ! in_budget $((put_duration + 30)); then
          skip "perf of put_scale ${c}x$d"
          continue
        fi
        # Whole guest (node, kvload, rxe in the kernel): cpu-clock, as TCG
        # has no hardware counters. The data file on the guest's tmpfs: perf
        # cannot mmap one on the host directories the guest mounts.
        perf record -a -g -e cpu-clock -F 499 -o "$KV_DIR/perf.data" \
          >"$out/perf/record-c$c-d$d.log" 2>&1 &
        perf_pid=$!
        with_clients "$c" kvload_run "P-perf-c$c" W uniform "$put_size" "$d" 0
        kill -INT "$perf_pid" 2>/dev/null || true
        wait "$perf_pid" 2>/dev/null || true
        # CPU by thread, then by thread and object (the kernel's share: rxe's
        # transport runs there); then by function (self); then the node's
        # functions with their callees (children): where its time per PUT goes.
        {
          perf report -i "$KV_DIR/perf.data" --stdio --no-children -g none --sort comm
          perf report -i "$KV_DIR/perf.data" --stdio --no-children -g none --sort comm,dso
          perf report -i "$KV_DIR/perf.data" --stdio --no-children -g none \
            --sort comm,dso,sym --percent-limit 0.5
          perf report -i "$KV_DIR/perf.data" --stdio --children -g none --sort sym \
            --pid "$KV_PID" --percent-limit 2
        } >"$out/perf/put-c$c-d$d.txt" 2>&1 || true
        record "{\"kind\":\"perf\",\"what\":\"whole guest during kvload ${c} client(s) x depth $d (an extra, unmeasured run)\",\"report\":\"perf/put-c$c-d$d.txt\"}"
      done
    fi
    if [[ -n $rpid ]]; then
      kill "$rpid" 2>/dev/null || true
      wait "$rpid" 2>/dev/null || true
    fi
  else
    skip "put_scale (all)"
  fi
fi

if ((two_host)); then
  th_counters_report "bench"
  th_put "done"
else
  kv_admin stats >"$out/kvnode-stats.json" 2>/dev/null || true
  KV_STOP_TIMEOUT=60 kv_stop_node
fi
kv_log "done: $(wc -l <"$runs") records in $runs"
