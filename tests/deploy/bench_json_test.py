#!/usr/bin/env python3
"""plot-bench.py turns a bench-all run's raw output into the expected JSON.

tests/deploy/data/raw-run/ is a small run directory as bench-all leaves it
(runs.jsonl, perftest logs, kvload reports, redis-benchmark CSV, rdma_bench
and bench-upgrade.sh output, the cluster part's JSONs); tests/deploy/data/raw-run.json is what
`plot-bench.py json` must make of it, byte for byte. The report is then
generated from that JSON, so a parser or an extraction change that breaks
bench-all's last step fails here rather than after a 20-minute run.
After an intended change: deploy/bench/plot-bench.py json
tests/deploy/data/raw-run --out tests/deploy/data/raw-run.json

usage: bench_json_test.py REPO_ROOT
"""
import os
import subprocess
import sys
import tempfile

# A row the report must hold: the 16 B GET p50 ratio of the two reps.
EXPECTED_ROW = "| inline GET p50 <= 1.15x ib_read_lat p50 | 16 B, depth 1 | 1.32x [1.31–1.32] |"


def run(args):
    return subprocess.run([sys.executable] + args, capture_output=True, text=True, encoding="utf-8")


def main():
    root = sys.argv[1]
    gen = os.path.join(root, "deploy", "bench", "plot-bench.py")
    data = os.path.join(root, "tests", "deploy", "data")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run.json")
        r = run([gen, "json", os.path.join(data, "raw-run"), "--out", out])
        if r.returncode != 0:
            print(f"plot-bench.py json exited {r.returncode}:\n{r.stdout}{r.stderr}")
            return 1
        with open(out, encoding="utf-8") as f:
            got = f.read()
        with open(os.path.join(data, "raw-run.json"), encoding="utf-8") as f:
            want = f.read()
        if got != want:
            print("plot-bench.py json on tests/deploy/data/raw-run differs from raw-run.json")
            return 1
        r = run([gen, "report", out, "--md", "-"])
        if r.returncode != 0:
            print(f"plot-bench.py report exited {r.returncode}:\n{r.stderr}")
            return 1
        if EXPECTED_ROW not in r.stdout:
            print(f"the report lacks the row {EXPECTED_ROW!r}")
            return 1
    print("raw output -> JSON as expected; the report renders from it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
