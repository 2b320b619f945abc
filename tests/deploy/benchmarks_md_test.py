#!/usr/bin/env python3
"""docs/BENCHMARKS.md is exactly what the generator makes of the run it names.

The report's first paragraph names the JSON of the bench-all run it was
generated from (results/bench-*.json). This test runs
`deploy/bench/plot-bench.py report` on that JSON and the committed targets
(deploy/bench/targets.json) and compares the output with the committed
report byte for byte, so a hand edit of the report, a JSON or targets file
changed without regenerating, or a generator change that alters the output
fails here. Regenerate with:

  deploy/bench/plot-bench.py report results/bench-....json

usage: benchmarks_md_test.py REPO_ROOT
"""
import difflib
import os
import re
import subprocess
import sys


def main():
    root = sys.argv[1]
    md_path = os.path.join(root, "docs", "BENCHMARKS.md")
    with open(md_path, encoding="utf-8") as f:
        committed = f.read()
    m = re.search(r"^Generated from `(results/bench-[^`]+\.json)`", committed, re.M)
    if not m:
        print(f"{md_path}: no 'Generated from `results/bench-....json`' line")
        return 1
    json_path = os.path.join(root, m.group(1))
    if not os.path.exists(json_path):
        print(f"{md_path} names {m.group(1)}, which is not in the tree")
        return 1
    gen = subprocess.run([sys.executable, os.path.join(root, "deploy", "bench", "plot-bench.py"),
                          "report", json_path, "--md", "-"],
                         capture_output=True, text=True, encoding="utf-8")
    if gen.returncode != 0:
        print(f"plot-bench.py report {m.group(1)} exited {gen.returncode}:\n{gen.stderr}")
        return 1
    if gen.stdout == committed:
        print(f"docs/BENCHMARKS.md is plot-bench.py's output on {m.group(1)}, byte for byte")
        return 0
    diff = difflib.unified_diff(committed.splitlines(), gen.stdout.splitlines(),
                                "docs/BENCHMARKS.md (committed)",
                                f"plot-bench.py report {m.group(1)}", lineterm="", n=1)
    print("\n".join(list(diff)[:60]))
    print("docs/BENCHMARKS.md differs from the generator's output (above); regenerate it:\n"
          f"  deploy/bench/plot-bench.py report {m.group(1)}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
