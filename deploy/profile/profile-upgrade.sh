#!/usr/bin/env bash
# Where the guest's CPU goes while a live upgrade runs under a GET-only load.
# A system-wide perf profile (every vCPU, self samples at 999 Hz: call graphs
# slow everything 3x under TCG) of one bench-upgrade live_c run with one
# upgrade, cut to the upgrade's window: from the new process's first sample
# to the old process's last, plus 0.5 s. Prints the window's CPU by process
# (the old and the new kvnode as O and N), then O's and N's by symbol. The
# copy of kvnode that bench-upgrade runs is gone when perf reads the
# samples, so kvnode's own code shows as one "[unknown]" line.
#
#   deploy/vm/rxe-vm --rw build -- deploy/profile/profile-upgrade.sh OUTDIR [BUILD_DIR]
#
# Environment: PROFILE_KEYS (default 1000000) the key count; BENCH_ARENA and
# BENCH_CPUS as bench-upgrade.sh takes them. Writes OUTDIR/perf.data,
# OUTDIR/bench.log (bench-upgrade's output), OUTDIR/kvnode.log and
# OUTDIR/window.txt (also printed).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=$(realpath -m "$1")
build=$(realpath "${2:-$here/../../build}")
mkdir -p "$out"
rm -rf /tmp/bench-upgrade.*/ # this run's directory is the only one left
perf record -a -e cpu-clock -F 999 -o "$out/perf.data" -- \
  env KVNODE_BUILD_DIR="$build" BENCH_RUNS=live_c BENCH_KEYS="${PROFILE_KEYS:-1000000}:1" \
  BENCH_RUN_S=10 BENCH_AT_S=3 "$here/../bench/bench-upgrade.sh" --inner >"$out/bench.log" 2>&1
cp /tmp/bench-upgrade.*/kvnode.log "$out/kvnode.log"
o=$(grep -o 'kvnode: exit 0 (pid [0-9]*, generation 1)' "$out/kvnode.log" | grep -o 'pid [0-9]*' | cut -d' ' -f2)
n=$(grep -o 'spawned .* as pid [0-9]*' "$out/kvnode.log" | head -1 | grep -o '[0-9]*$')
[[ -n $o && -n $n ]] || { echo "profile-upgrade: no upgrade in $out/kvnode.log" >&2 && exit 1; }
perf script -i "$out/perf.data" -F pid,tid,comm,time,ip,sym,dso 2>/dev/null |
  python3 -c '
import collections, re, sys
n, o = int(sys.argv[1]), int(sys.argv[2])
rows = []
for line in sys.stdin:
    m = re.match(r"\s*(\S+)\s+(\d+)/\d+\s+([\d.]+):\s+\S+\s+(.*?)\s+\((.*)\)\s*$", line)
    if m:
        rows.append((float(m.group(3)), int(m.group(2)), m.group(1), m.group(4), m.group(5)))
t0 = min(t for t, pid, *_ in rows if pid == n)
t1 = max(t for t, pid, *_ in rows if pid == o) + 0.5
window = [r for r in rows if t0 <= r[0] <= t1]
ms = 1000 / 999
print(f"upgrade window {t1 - t0:.3f} s: {len(window)} samples of {2 * 999 * (t1 - t0):.0f} on 2 vCPUs")
by = collections.Counter("N" if p == n else "O" if p == o else c for _, p, c, _, _ in window)
for who, k in by.most_common(12):
    print(f"  {k * ms:7.0f} ms  {who}")
for pid, name in ((n, "N"), (o, "O")):
    sym = collections.Counter((d.split("/")[-1], s) for _, p, _, s, d in window if p == pid)
    print(f"{name} (pid {pid}) by symbol, ms:")
    for (dso, s), k in sym.most_common(25):
        print(f"  {k * ms:7.1f}  {dso[:24]:24} {s[:80]}")
' "$n" "$o" | tee "$out/window.txt"
