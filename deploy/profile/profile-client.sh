#!/usr/bin/env bash
# Where a depth-1 GET's time goes, against the READ `ib_read_lat` times. A
# system-wide perf profile (every vCPU; self samples only: call graphs under
# TCG slowed every READ 3x) of a 3 s window of kvload's depth-1 GETs, then of
# `ib_read_lat`'s READs, in one device session (deploy/vm/rxe-vm). The window
# opens once the run is past its start-up (1000 READs done), and its READs
# are counted on the device (rxe's sent_pkts: a request and a response per
# READ), so samples turn into CPU microseconds per READ, by process, by part
# and by symbol, and the two columns can be subtracted: what kvload spends
# per GET beyond a bare READ. docs/BENCHMARKS.md cites its output.
#
#   deploy/vm/rxe-vm --rw build -- deploy/profile/profile-client.sh build/prof BUILD_DIR...
#
# Writes OUTDIR/<build>-s<size>.{kvload,ib_read_lat}.{data,txt} and
# OUTDIR/<build>-s<size>.per-op.txt (the tables, also printed), and prints the
# guest's clocksource (a non-TSC one makes every clock read a syscall).
# Environment: PROFILE_SIZES (default 16) the value sizes; PROFILE_FREQ
# (default 1000) samples per second on each vCPU; PROFILE_READS (default
# 150000) the READs of the `ib_read_lat` run, which must outlast the window;
# PROFILE_KVLOAD_ARGS more kvload flags (e.g. "--location_cache 0": a heap GET
# then takes two READs, and the figures stay per READ).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=$(realpath -m "$1")
shift
mkdir -p "$out"
cs=/sys/devices/system/clocksource/clocksource0
echo "clocksource: $(cat $cs/current_clocksource) (available: $(cat $cs/available_clocksource)); $(nproc) vCPUs"
echo "perf: $(perf --version 2>&1 | head -1)"
freq=${PROFILE_FREQ:-1000} window=3 pt_n=${PROFILE_READS:-150000}

# perf.data -> "samples comm dso symbol" lines, self samples only.
samples() {
  perf report -i "$1" --stdio --no-children -g none --sort comm,dso,sym -F sample,comm,dso,sym \
    --percent-limit 0 2>/dev/null | grep -v '^#' | grep -v '^$'
}
sent_pkts() { kv_port_counters "$dev" | awk '$1 == "sent_pkts" {print $2}'; }
past_start() { (($(sent_pkts) >= $1 + 2000)); }
# Context switches and tasklet runs so far, all CPUs (/proc/stat, /proc/softirqs).
kernel_events() {
  echo "$(awk '$1 == "ctxt" {print $2}' /proc/stat) $(awk '$1 == "TASKLET:" {s = 0; for (i = 2; i <= NF; i++) s += $i; print s}' /proc/softirqs)"
}
# PID BASE: a 3 s system-wide profile of the running PID's steady state;
# prints the READs (packet pairs) in the window, then the context switches
# and tasklet runs in it.
profile_window() {
  local pid=$1 base=$2 p0 p1 c0 t0 c1 t1
  p0=$(sent_pkts)
  kv_wait_for 60 past_start "$p0" || { echo 0 0 0; return; }
  p0=$(sent_pkts)
  read -r c0 t0 < <(kernel_events)
  perf record -a -e cpu-clock -F "$freq" -o "$base.data" -- sleep "$window" >/dev/null 2>&1
  read -r c1 t1 < <(kernel_events)
  p1=$(sent_pkts)
  kill -0 "$pid" 2>/dev/null || { echo 0 0 0; return; }
  echo $(((p1 - p0) / 2)) $((c1 - c0)) $((t1 - t0))
}

for b in "$@"; do
  tag=$(basename "$b")
  KVNODE_BUILD_DIR=$(realpath "$b")
  export KVNODE_BUILD_DIR
  (
    source "$here/../../tests/e2e/lib.sh"
    set +e +o pipefail # a failed report must not stop the rest
    # shellcheck disable=SC2034 # kv_log's tag
    KV_TEST=prof-$tag
    dev=$(kv_active_device)
    gid=$(kv_gid_index "$dev")
    kv_start_node --arena_size $((64 << 20)) --sync_writes=true --max_clients 64
    common=(--server "$KV_ADDR" --auth_token_file "$KV_TOKEN" --progress=false --clients 1
      --threads 1 --keys 5000)
    for size in ${PROFILE_SIZES:-16}; do
      base=$out/$tag-s$size
      "$KV_KVLOAD" "${common[@]}" --value_size "$size" --depth 32 --workload C --preload --ops 1 \
        >/dev/null 2>&1
      # shellcheck disable=SC2086 # PROFILE_KVLOAD_ARGS is a list of flags
      "$KV_KVLOAD" "${common[@]}" --value_size "$size" --depth 1 --workload C \
        --distribution uniform --duration 12 --spin 1000000000 ${PROFILE_KVLOAD_ARGS:-} \
        >"$base.kvload.txt" 2>&1 &
      client=$!
      read -r kv_ops kv_cs kv_tl < <(profile_window "$client" "$base.kvload")
      wait "$client"
      ib_read_lat -d "$dev" -x "$gid" -p 19900 -s "$size" -n "$pt_n" -F >"$base.server.txt" 2>&1 &
      server=$!
      kv_wait_for 30 kv_port_listening 19900
      ib_read_lat -d "$dev" -x "$gid" -p 19900 -s "$size" -n "$pt_n" -F 127.0.0.1 \
        >"$base.ib_read_lat.txt" 2>&1 &
      client=$!
      read -r pt_ops pt_cs pt_tl < <(profile_window "$client" "$base.ib_read_lat")
      wait "$client" "$server"
      python3 - "$kv_ops $kv_cs $kv_tl" "$pt_ops $pt_cs $pt_tl" "$freq" <(samples "$base.kvload.data") \
        <(samples "$base.ib_read_lat.data") >"$base.per-op.txt" <<'PY'
import collections, re, sys
(kv_ops, kv_cs, kv_tl), (pt_ops, pt_cs, pt_tl) = (map(int, a.split()) for a in sys.argv[1:3])
freq = int(sys.argv[3])
if not kv_ops or not pt_ops:
    sys.exit(f"no operations counted in a window (kvload {kv_ops}, ib_read_lat {pt_ops})")

def kernel(dso):  # the kernel and its modules (rdma_rxe, ib_uverbs, ib_core); not the vDSO
    return dso.startswith("[") and dso not in ("[vdso]", "[unknown]")

def where(comm, dso, sym):
    if comm == "swapper":
        return "idle"
    if dso == "[unknown]":
        return "unknown"
    if kernel(dso):
        return "kernel: " + ("rxe" if re.search(r"rxe|crc32|icrc", dso + sym) else "other")
    return "user: " + dso

def load(path):
    by_where, by_sym = collections.Counter(), collections.Counter()
    for line in open(path):
        f = line.split(None, 3)
        if len(f) < 4 or not f[0].isdigit():
            continue
        n, comm, dso, sym = int(f[0]), f[1], f[2], f[3].strip()
        role = "client" if comm.startswith(("kvload", "ib_read_lat")) else comm
        by_where[(role, where(comm, dso, sym))] += n
        if role == "client":
            by_sym[(dso, sym)] += n
    return by_where, by_sym

kv, kv_sym = load(sys.argv[4])
pt, pt_sym = load(sys.argv[5])
kv_us, pt_us = 1e6 / freq / kv_ops, 1e6 / freq / pt_ops  # CPU µs per op of one sample
print(f"CPU µs per operation (a READ), {freq} Hz samples on every vCPU; READs in the window: "
      f"kvload {kv_ops}, ib_read_lat {pt_ops}")
print(f"per operation, all CPUs: context switches {kv_cs / kv_ops:.2f} (kvload) "
      f"{pt_cs / pt_ops:.2f} (ib_read_lat), tasklet runs {kv_tl / kv_ops:.2f} {pt_tl / pt_ops:.2f}")
print(f"{'process':<16} {'where':<34} {'kvload GET':>10} {'ib_read_lat':>11} {'difference':>10}")
for key in sorted(set(kv) | set(pt), key=lambda k: -(kv[k] + pt[k])):
    if kv[key] + pt[key] < 3:
        continue
    a, b = kv[key] * kv_us, pt[key] * pt_us
    print(f"{key[0][:16]:<16} {key[1][:34]:<34} {a:10.2f} {b:11.2f} {a - b:+10.2f}")
# kvload's user space by part (the regular expressions match demangled names).
PARTS = [
    ("kvload between GETs (key choice, histogram, Complete)",
     r"kvnode::load::|Worker::(Complete|Issue)|pow|Duration::operator|ToInt64Nanoseconds|"
     r"IsNotFound|raw_code|umodti3"),
    ("kvload's poll loop", r"Worker::Loop"),
    ("libkvclient (client, rdma/, storage read path, XXH3)",
     r"kvnode::(client|storage|rdma)::|XXH3|xxhash|functional_internal"),
    ("verbs user space (librxe, the post's write(), its lock)",
     r"librxe|libibverbs|spin_lock|spin_unlock|libc_write"),
    ("clock reads", r"GetCurrentTimeNanos|Now|clock_gettime|vdso"),
    ("control socket recv()", r"recv"),
]
parts = collections.Counter()
for (dso, sym), n in kv_sym.items():
    if kernel(dso):
        continue
    name = next((p for p, rx in PARTS if re.search(rx, dso + " " + sym)), "other: " + dso)
    parts[name] += n
print("\nkvload's user space by part (µs per operation)")
for name, n in parts.most_common():
    print(f"{n * kv_us:10.2f}  {name}")
print("\nthe client process by symbol, largest differences first (µs per operation)")
print(f"{'kvload GET':>10} {'ib_read_lat':>11} {'difference':>10}  symbol")
diff = {k: kv_sym[k] * kv_us - pt_sym[k] * pt_us for k in set(kv_sym) | set(pt_sym)}
for k in sorted(diff, key=lambda k: -abs(diff[k]))[:40]:
    print(f"{kv_sym[k] * kv_us:10.2f} {pt_sym[k] * pt_us:11.2f} {diff[k]:+10.2f}  {k[0][:24]} {k[1][:60]}")
PY
      grep -a -E 'p50|latency' "$base.kvload.txt" | head -n 4
      grep -a -A3 't_typical' "$base.ib_read_lat.txt" | tail -n 2
      cat "$base.per-op.txt"
    done
    kv_stop_node
  )
done
