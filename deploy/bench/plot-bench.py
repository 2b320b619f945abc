#!/usr/bin/env python3
"""docs/BENCHMARKS.md from one bench-all run, in two steps.

  plot-bench.py json DIR --out results/bench-DATE-COMMIT.json [--plots docs/bench]
      DIR's raw output -> the run's figures as one JSON file (and the plots)
  plot-bench.py report results/bench-DATE-COMMIT.json [--md docs/BENCHMARKS.md]
      that JSON and the targets (deploy/bench/targets.json) -> the report
  plot-bench.py summary DIR          the main tables and the targets on stdout
  plot-bench.py put-scale-md DIR     the PUT scaling section alone (bench.sh)
  plot-bench.py two-host-md DIR      the GET/PUT tables of bench.sh --two-host

DIR holds runs.jsonl (one record per run, written by the bench scripts) and
the raw files the records point at: perftest client logs, kvload --report
JSON, kvload --latency_cdf files, redis-benchmark CSV, rdma_bench output,
the live-upgrade benchmark's output. In the JSON every figure is a list
[median, min, max, runs] over the run's reps; a ratio is the median of the
per-rep ratios (rep i of kvnode over rep i of its baseline, measured minutes
apart in the same session). The report is a function of the JSON and the
targets file only, so the same two files give the same report byte for byte.
Standard library only; plots by gnuplot (pngcairo).
"""
import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SCHEMA = 1  # the JSON's layout; the report refuses another
BUCKET_INLINE_LIMIT = 192  # default bucket 256 B - 64 B header (docs/format.md)
OBJECT_HEADER = 32
KEY_SIZE = 16  # kvload's default --key_size


# ----------------------------------------------------------------------------
# loading


def load_runs(d):
    runs = []
    path = os.path.join(d, "runs.jsonl")
    if not os.path.exists(path):
        return runs
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    runs.append(json.loads(line))
                except json.JSONDecodeError:
                    print(f"plot-bench: bad record in {path}: {line[:80]}", file=sys.stderr)
    return runs


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def parse_perftest(d, rec):
    """The figures of one perftest client log, or None. The log is judged by
    its own figures (a p50 or a rate that is finite and positive), not by the
    recorder's verdict: perftest's stdev overflows to nan on huge outliers
    while its t_typical stays good."""
    try:
        text = open(os.path.join(d, rec["log"])).read()
    except OSError:
        return None
    size = str(rec["size"])
    summary = None
    samples = []
    for line in text.splitlines():
        f = line.split()
        if not f:
            continue
        if f[0] == size and len(f) >= 5:
            summary = f
        m = re.match(r"^\s*(\d+),\s*([\d.]+)\s*$", line)
        if m:
            samples.append(float(m.group(2)))
    if summary is None:
        return None
    try:
        if rec["tool"] in ("ib_read_bw", "ib_send_bw"):
            # bytes iters bw_peak bw_avg(MB/s) msgrate(Mpps)
            rate = float(summary[4]) * 1e6
            if not 0 < rate < float("inf"):
                return None
            return {"bw_MBps": float(summary[3]), "rate": rate}
        if not 0 < float(summary[4]) < float("inf"):
            return None
        # bytes iters t_min t_max t_typical t_avg t_stdev p99 p99.9 (usec)
        return {"p50": float(summary[4]), "min": float(summary[2]), "avg": float(summary[5]),
                "p99": float(summary[7]), "p999": float(summary[8]), "samples": samples}
    except (ValueError, IndexError):
        return None


def kv_fig(d, rec):
    r = read_json(os.path.join(d, rec["report"]))
    if r is None:
        return None
    lat = r.get("latency_us", {})
    # Steady-state rate: from the end of the first 10 ms slot holding a
    # completion to the end of the run. The first operations on a fresh QP can
    # wait hundreds of ms (rxe under TCG); perftest's own figures exclude its
    # set-up too. raw_ops_per_s keeps kvload's whole-run figure.
    steady = r.get("ops_per_s", 0)
    tl = r.get("timeline", [])
    first = next((i for i, e in enumerate(tl) if e["ops"]), None)
    if first is not None:
        slot = r.get("timeline_slot_ms", 10)
        t0 = (first + 1) * slot / 1000
        rest = sum(e["ops"] for e in tl[first + 1:])
        if r.get("duration_s", 0) > t0 and rest:
            steady = rest / (r["duration_s"] - t0)
    return {"ops_per_s": steady, "raw_ops_per_s": r.get("ops_per_s", 0), "get": lat.get("read", {}),
            "put": lat.get("write", {}), "failed": r.get("failed_ops", 0),
            "client": r.get("client", {}), "ops": r.get("ops", 0), "rc": rec.get("rc", 0),
            "cpu_client": r.get("cpu", {}).get("client_us_per_op"),
            "cpu_node": r.get("cpu", {}).get("node_us_per_op"), "command": rec.get("command")}


class Data:
    def __init__(self, d):
        d = os.path.abspath(d)
        self.dir = d
        self.runs = load_runs(d)
        self.config = next((r for r in self.runs if r["kind"] == "config"), {})
        self.pt = {}  # (tool, size, depth) -> {rep: figures}
        self.kv = {}  # (cell, size, depth) -> {rep: figures}
        self.cdf = {}  # size -> kvload cdf path
        self.pt_samples = {}  # size -> ib_read_lat samples
        self.skipped = [r["what"] for r in self.runs if r["kind"] == "skipped"]
        self.failed = []
        self.starved = []  # kvload runs that completed too few operations to mean much
        for r in self.runs:
            if r["kind"] == "perftest":
                f = parse_perftest(d, r)
                if f is None:
                    self.failed.append(f"perftest {r['name']} rep {r['rep']}")
                    continue
                self.pt.setdefault((r["tool"], r["size"], r["depth"]), {})[r["rep"]] = f
                if r["tool"] == "ib_read_lat" and f["samples"]:
                    self.pt_samples.setdefault(r["size"], f["samples"])
            elif r["kind"] == "cluster_run" and r.get("rc", 0) != 0:
                # Part 5's scripts: a nonzero exit means figures missing or partial.
                self.failed.append(f"cluster part {r['name']}: exit {r['rc']} (see {r['log']})")
            elif r["kind"] == "kvload":
                f = kv_fig(d, r)
                if f is None:
                    self.failed.append(f"kvload {r['cell']} {r['size']} B depth {r['depth']} "
                                       f"rep {r['rep']} (no report)")
                    continue
                if f["ops"] < 100:
                    self.starved.append(f"{r['cell']} {r['size']} B depth {r['depth']} rep "
                                        f"{r['rep']} ({f['ops']} ops)")
                if f["rc"] != 0 or f["failed"]:
                    self.failed.append(f"kvload {r['cell']} {r['size']} B depth {r['depth']} "
                                       f"rep {r['rep']}: exit {f['rc']}, {f['failed']} failed ops")
                self.kv.setdefault((r["cell"], r["size"], r["depth"]), {})[r["rep"]] = f
                if r.get("cdf"):
                    self.cdf[r["size"]] = os.path.join(d, r["cdf"])
        # P-cN cells (PUT scaling, N clients) and their ib_send_bw ceilings
        # have tables of their own.
        self.sizes = sorted({k[1] for k in self.kv if not k[0].startswith("P-")} |
                            {k[1] for k in self.pt if k[0] != "ib_send_bw"})
        self.depths = sorted({k[2] for k in self.kv if k[0] == "C-uniform"} |
                             {k[2] for k in self.pt if k[0] == "ib_read_bw"})


# ----------------------------------------------------------------------------
# statistics: a figure is [median, min, max, runs]; min and max may be None
# (a figure known only by its median)


def stat(vals):
    vals = [v for v in vals if v is not None]
    if not vals:
        return None
    return [round(statistics.median(vals), 4), round(min(vals), 4), round(max(vals), 4), len(vals)]


def ratio_stat(num, den):
    """num, den: {rep: value}. Median/min/max of per-rep ratios."""
    return stat([num[k] / den[k] for k in num if k in den and den[k]])


def pick(dct, field, sub=None):
    out = {}
    for rep, f in dct.items():
        v = f.get(field) if sub is None else f.get(field, {}).get(sub)
        if v is not None and not (field in ("get", "put") and not v):
            out[rep] = v
    return out


def pstat(dct, field, sub=None):
    return stat(pick(dct, field, sub).values())


def inline(size):
    return OBJECT_HEADER + KEY_SIZE + size <= BUCKET_INLINE_LIMIT


def value_class(size):
    return "inline" if inline(size) else "heap"


def sanitize(command):
    """A command line without this machine's paths, ports and pids: an
    absolute path becomes its last component."""
    if not command:
        return command
    words = [w.rsplit("/", 1)[-1] if w.startswith("/") else w for w in command.split()]
    text = " ".join(words)
    text = re.sub(r"(--server \S+?):\d+\b", r"\1:PORT", text)
    return re.sub(r"--node_pid \d+", "--node_pid PID", text)


# ----------------------------------------------------------------------------
# the other parts of bench-all


def redis_data(D, kind="redis"):
    """(size, clients) -> {"SET"/"GET": {rep: (rps, p50_us)}}; kind "redis_aof":
    (size, clients, depth) -> the same."""
    out = {}
    for r in D.runs:
        if r["kind"] != kind:
            continue
        try:
            lines = open(os.path.join(D.dir, r["csv"])).read().splitlines()
        except OSError:
            D.failed.append(f"redis {r['size']} B -c {r['clients']} rep {r['rep']}")
            continue
        for line in lines:
            f = [x.strip('"') for x in line.split(",")]
            if len(f) >= 5 and f[0] in ("SET", "GET"):
                key = (r["size"], r["clients"]) if kind == "redis" else (
                    r["size"], r["clients"], r["depth"])
                try:
                    out.setdefault(key, {}).setdefault(f[0], {})[r["rep"]] = (
                        float(f[1]), float(f[4]) * 1000)
                except ValueError:
                    pass
    return out


def send_ceiling(D):
    """The device's SEND rate each way, {(size, qps, depth): {rep: msgs/s}},
    from `ib_send_bw -b -q QPS -t DEPTH`, whose MsgRate is the sum of both
    directions. A PUT is one SEND each way: no client and node can PUT faster."""
    out = {}
    for r in D.runs:
        if r["kind"] != "perftest" or r["tool"] != "ib_send_bw":
            continue
        q = re.search(r"-q (\d+)", r.get("args", ""))
        f = parse_perftest(D.dir, r)
        if q and f:
            each_way = f["rate"] / 2 if re.search(r"(^| )-b( |$)", r["args"]) else f["rate"]
            out.setdefault((r["size"], int(q.group(1)), r["depth"]), {})[r["rep"]] = each_way
    return out


def put_scale_data(D):
    """PUT scaling cells {(size, clients, depth): {rep: figures}}, the base
    (fewest operations outstanding) configuration of each size, Redis
    AOF-always SETs {(size, clients, depth): {rep: (rps, p50_us)}} and the
    device's SEND rate each way in the same configurations."""
    cells = {}
    for (cell, size, depth), reps in D.kv.items():
        if cell.startswith("P-c"):
            cells[(size, int(cell[3:]), depth)] = reps
    base = {}
    for (size, c, d) in sorted(cells, key=lambda k: (k[0], k[1] * k[2])):
        base.setdefault(size, (size, c, d))
    red = {k: v.get("SET", {}) for k, v in redis_data(D, "redis_aof").items()}
    return cells, base, red, send_ceiling(D)


RB_ROW = re.compile(r"^(.*?)\s+(yes|no)\s+([\d.]+|-)\s+([\d.]+)?")
RB_BATCH = re.compile(r"^(\d+) \((.*?)\)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x")


def rdma_data(D):
    reg = {}  # (memory, prefault) -> {"reg": {rep: v}, "dereg": {rep: v}}
    batch = {}  # (api, threads) -> {rep: us_per_mr}
    order = []
    for r in D.runs:
        if r["kind"] != "rdma_bench":
            continue
        try:
            text = open(os.path.join(D.dir, r["log"])).read()
        except OSError:
            continue
        section = 0
        for line in text.splitlines():
            m = re.match(r"^== (\d)\.", line)
            if m:
                section = int(m.group(1))
                continue
            if section == 1:
                m = RB_ROW.match(line)
                if m and m.group(1) not in ("memory",):
                    key = (m.group(1).strip(), m.group(2))
                    if key not in order:
                        order.append(key)
                    e = reg.setdefault(key, {"reg": {}, "dereg": {}, "note": ""})
                    if m.group(3) == "-":
                        e["note"] = line.split("(skipped:", 1)[-1].strip(" )") if "skipped" in line else "skipped"
                    else:
                        e["reg"][r["rep"]] = float(m.group(3))
                        e["dereg"][r["rep"]] = float(m.group(4))
            elif section == 3:
                m = RB_BATCH.match(line)
                if m:
                    batch.setdefault((m.group(2), int(m.group(1))), {})[r["rep"]] = float(m.group(4))
    return reg, order, batch


UP_ROW = re.compile(r"^\s*(\d+) (\w+)\s+blackout\s+([\d.]+) ms\s+p99\s+([\d.]+) ms\s+max\s+([\d.]+) ms"
                    r"\s+failed (\d+)\s+ops (\d+)\s+event ([\d/]+) ms")
# bench-upgrade.sh's set-up line per key count: the kvfill preload and the
# node's cold start (its arena built from RocksDB: what a naive restart pays).
UP_SETUP = re.compile(r"^== (\d+) keys .*: kvfill (\d+) ms, cold start (\d+) ms")


# Where a bench-upgrade.sh run's kvload ran: "guest", beside the node in the
# one device session; "two_host", on the other guest of deploy/vm/rxe-vm
# --two-host, as a storage node's clients run.
UP_WHERE = ("guest", "two_host")


def upgrade_logs(D, where="guest"):
    """(run record, text of its log) of each bench-upgrade.sh run with its
    kvload `where` (runs without a log skipped)."""
    for r in D.runs:
        if r["kind"] != "upgrade_run" or r.get("where", "guest") != where:
            continue
        try:
            text = open(os.path.join(D.dir, r["log"])).read()
        except OSError:
            continue
        # deploy/vm/rxe-vm --two-host prefixes each guest's lines with its name.
        yield r, re.sub(r"^\[server\] ", "", text, flags=re.M)


def upgrade_setup(D, where="guest"):
    """[(keys, kvfill ms, cold start ms)] from bench-upgrade.sh's logs."""
    out = []
    for _, text in upgrade_logs(D, where):
        for line in text.splitlines():
            m = UP_SETUP.match(line)
            if m:
                out.append(tuple(int(g) for g in m.groups()))
    return out


# bench-upgrade.sh's per-event phases line (N's upgrade_last_phase_seconds).
UP_STALL = re.compile(r"\bstall ([\d.]+) ms")
UP_PHASES = re.compile(r"^\s*phases (\w+): writer_switch (\d+) ms\s+signal->N_writes (\d+) ms"
                       r"\s+signal->O_exit (\d+) ms")


def read_kv(path):
    out = {}
    try:
        for line in open(path):
            if "=" in line:
                k, v = line.rstrip("\n").split("=", 1)
                out[k] = v
    except OSError:
        pass
    return out


# ----------------------------------------------------------------------------
# extraction: DIR -> the run's figures (the JSON bench-all commits)


def ex_get(D):
    lat, base, rate, tail, nocache = [], [], [], [], []
    for s in D.sizes:
        kv = D.kv.get(("C-uniform", s, 1), {})
        pt = D.pt.get(("ib_read_lat", s, 1), {})
        kv50, pt50 = pick(kv, "get", "p50"), pick(pt, "p50")
        lat.append({"size": s, "class": value_class(s), "get_p50": stat(kv50.values()),
                    "read_lat_p50": stat(pt50.values()), "ratio": ratio_stat(kv50, pt50)})
        st = D.pt.get(("ib_send_lat", s, 1), {})
        base.append({"size": s, "read_lat_p50": pstat(pt, "p50"), "read_lat_p99": pstat(pt, "p99"),
                     "read_lat_p999": pstat(pt, "p999"), "send_lat_p50": pstat(st, "p50"),
                     "send_lat_p99": pstat(st, "p99")})
        # C-uniform of a heap size ran with the location cache warmed only
        # when the run also had the C-nocache cell (bench.sh).
        nc = D.kv.get(("C-nocache", s, 1), {})
        for cache, cells in (("warm", kv), ("none", nc)):
            if not nc or not cells:
                continue
            c50 = pick(cells, "get", "p50")
            # location_hits counts the measured run only; divide by its operations.
            share = stat([f["client"].get("location_hits", 0) / f["ops"]
                          for f in cells.values() if f["ops"]])
            nocache.append({"size": s, "class": value_class(s), "cache": cache,
                            "get_p50": stat(c50.values()), "read_lat_p50": stat(pt50.values()),
                            "ratio": ratio_stat(c50, pt50), "cache_share": share})
        for d in D.depths:
            kv = D.kv.get(("C-uniform", s, d), {})
            bw = D.pt.get(("ib_read_bw", s, d), {})
            if kv:
                tail.append({"size": s, "depth": d, "p50": pstat(kv, "get", "p50"),
                             "p99": pstat(kv, "get", "p99"), "p999": pstat(kv, "get", "p999"),
                             "max": pstat(kv, "get", "max"),
                             "gets_by_rpc": stat([f["client"].get("gets_by_rpc", 0)
                                                  for f in kv.values()])})
            if not kv and not bw:
                continue
            ops, r = pick(kv, "ops_per_s"), pick(bw, "rate")
            kv50 = pick(kv, "get", "p50")
            # Little's law: perftest's mean latency at depth d.
            little = {k: d / r[k] * 1e6 for k in r if r[k]}
            rate.append({"size": s, "class": value_class(s), "depth": d,
                         "get_ops": stat(ops.values()), "read_bw_rate": stat(r.values()),
                         "ratio": ratio_stat(ops, r), "get_p50": stat(kv50.values()),
                         "little_us": stat(little.values()),
                         "p50_over_little": ratio_stat(kv50, little)})
    return {"get_latency": lat, "perftest_latency": base, "get_rate": rate, "get_tail": tail,
            "get_nocache": nocache}


def ex_put(D):
    rows = []
    for s in D.sizes:
        kv = D.kv.get(("W-uniform", s, 1), {})
        pt50 = pick(D.pt.get(("ib_send_lat", s, 1), {}), "p50")
        kv50 = pick(kv, "put", "p50")
        rtt = {k: 2 * v for k, v in pt50.items()}
        if kv or pt50:
            rows.append({"size": s, "put_p50": stat(kv50.values()), "send_lat_p50": stat(pt50.values()),
                         "ratio": ratio_stat(kv50, pt50), "ratio_rtt": ratio_stat(kv50, rtt),
                         "put_ops": pstat(kv, "ops_per_s")})
    return rows


def ex_workloads(D):
    rows = []
    for (cell, s, d) in sorted(D.kv, key=lambda k: (k[1], k[2], k[0])):
        if cell in ("C-uniform", "W-uniform", "C-nocache") or cell.startswith("P-"):
            continue
        kv = D.kv[(cell, s, d)]
        wl, dist = cell.split("-", 1)
        rows.append({"workload": wl, "dist": dist, "size": s, "depth": d,
                     "ops": pstat(kv, "ops_per_s"), "get_p50": pstat(kv, "get", "p50"),
                     "get_p99": pstat(kv, "get", "p99"), "put_p50": pstat(kv, "put", "p50"),
                     "put_p99": pstat(kv, "put", "p99")})
    # A grid cell's workloads A, B, C, each uniform then zipfian.
    rows.sort(key=lambda r: (r["size"], r["depth"], r["workload"], r["dist"]))
    return rows


def ex_redis(D):
    rd = redis_data(D)
    rows = []
    for (size, clients) in sorted(rd):
        for op, cell, field in (("GET", "C-uniform", "get"), ("SET", "W-uniform", "put")):
            red = rd[(size, clients)].get(op, {})
            rp50 = {k: v[1] for k, v in red.items()}
            rrps = {k: v[0] for k, v in red.items()}
            kv = D.kv.get((cell, size, clients), {})
            k50, kops = pick(kv, field, "p50"), pick(kv, "ops_per_s")
            rows.append({"size": size, "clients": clients, "op": op, "kv_p50": stat(k50.values()),
                         "redis_p50": stat(rp50.values()), "p50_ratio": ratio_stat(k50, rp50),
                         "kv_ops": stat(kops.values()), "redis_ops": stat(rrps.values()),
                         "ops_ratio": ratio_stat(kops, rrps)})
    return rows


def ex_put_scale(D):
    cells, base, red, send = put_scale_data(D)
    if not cells and not red:
        return None
    rows = []
    for key in sorted(set(cells) | set(red), key=lambda k: (k[0], k[1] * k[2])):
        size, c, d = key
        kv = cells.get(key, {})
        ops = pick(kv, "ops_per_s")
        b = base.get(size)
        rrps = {k: v[0] for k, v in red.get(key, {}).items()}
        rows.append({"size": size, "clients": c, "depth": d, "base": key == b,
                     "base_clients": b[1] if b else None, "base_depth": b[2] if b else None,
                     "ops": stat(ops.values()), "p50": pstat(kv, "put", "p50"),
                     "cpu_node": pstat(kv, "cpu_node"),
                     "scale": ratio_stat(ops, pick(cells[b], "ops_per_s")) if b and key != b else None,
                     "base_ops": pstat(cells[b], "ops_per_s") if b else None,
                     "redis_ops": stat(rrps.values()), "vs_redis": ratio_stat(ops, rrps),
                     "device": stat(send.get(key, {}).values()),
                     "vs_device": ratio_stat(ops, send.get(key, {}))})
    big = max(cells, key=lambda k: k[1] * k[2], default=None)
    kcmd = next((f["command"] for f in cells.get(big, {}).values() if f.get("command")), None)
    srv = next((r for r in D.runs if r["kind"] == "redis_aof_server"), {})
    return {"fs_rocksdb": srv.get("fs_rocksdb"), "fs_redis": srv.get("fs_redis"),
            "reps": max((len(v) for v in cells.values()), default=0), "rows": rows,
            "kvload_command": sanitize(kcmd),
            "redis_commands": sorted({sanitize(r.get("command", "")) for r in D.runs
                                      if r["kind"] == "redis_aof"} - {""}),
            "profiles": [{"what": r["what"], "report": r["report"]}
                         for r in D.runs if r["kind"] == "perf"]}


def ex_upgrade(D, where):
    """One place's bench-upgrade.sh runs: the settings, a row per run of the
    summary, the events' phases and the set-up per key count, or None."""
    ur = next((r for r in D.runs if r["kind"] == "upgrade_run" and r.get("where", "guest") == where),
              None)
    if ur is None:
        return None
    rows, events = [], []
    for r, text in upgrade_logs(D, where):
        seen = set()
        summary = text.split("== summary", 1)[-1]
        for line in summary.splitlines():
            m = UP_ROW.match(line)
            if m and m.groups() not in seen:
                seen.add(m.groups())
                keys, mode, bo, p99, mx, failed, ops, ev = m.groups()
                st = UP_STALL.search(line)
                rows.append({"keys": int(keys), "mode": mode, "events": len(ev.split("/")),
                             "blackout_ms": float(bo), "p99_ms": float(p99), "max_ms": float(mx),
                             "failed": int(failed), "ops": int(ops),
                             "event_ms": [int(x) for x in ev.split("/")]
                             if mode in ("live", "naive") else None,
                             "stall_ms": float(st.group(1)) if st else None})
            m = UP_PHASES.match(line)
            if m:
                events.append((int(m.group(3)), int(m.group(4))))
    return {"command": sanitize(ur.get("command")), "keys": ur.get("keys"),
            "run_s": ur.get("run_s"), "at_s": ur.get("at_s"), "rc": ur.get("rc", 0),
            "log": ur.get("log"), "dead_link_attempts": ur.get("dead_link_attempts", 0),
            "rows": rows,
            "events": {"n": len(events), "signal_to_n_writes_ms": stat([e[0] for e in events]),
                       "signal_to_o_exit_ms": stat([e[1] for e in events])},
            "setup": [{"keys": k, "kvfill_ms": f, "cold_start_ms": c}
                      for k, f, c in upgrade_setup(D, where)]}


def ex_rdma(D, host):
    reg, order, batch = rdma_data(D)
    if not reg:
        return None
    rows = []
    for k in order:
        e = reg[k]
        rows.append({"memory": k[0], "prefault": k[1], "reg_ms_per_gib": stat(e["reg"].values()),
                     "dereg_ms_per_gib": stat(e["dereg"].values()), "note": e["note"][:60]})
    brows = []
    for (api, th) in sorted(batch):
        brows.append({"api": api, "threads": th, "us_per_mr": stat(batch[(api, th)].values()),
                      "speedup": ratio_stat(batch.get((api, 1), {}), batch[(api, th)])})
    return {"size_mib": host.get("rdma_size_mib"),
            "runs": max((len(e["reg"]) for e in reg.values()), default=0),
            "registration": rows, "dereg_batch": brows}


def med(vals):
    """The median of stat(), or None."""
    s = stat(vals)
    return s[0] if s else None


def ex_cluster(D):
    """Part 5's figures as rows {bench, figure, value, measured, ...}: the
    restart after a crash (bench-restart.json), the cluster's costs
    (bench-cluster.json), the fleet roll (bench-roll.json's own rows)."""
    rows = []
    d = os.path.join(D.dir, "cluster")
    rs = read_json(os.path.join(d, "bench-restart.json"))
    if rs and rs.get("trials"):
        by = {m: med([t["kill_to_ping_ms"] for t in rs["trials"] if t["mode"] == m])
              for m in ("upgrade", "recovered", "cold")}
        base = {"bench": "restart", "keys": rs.get("keys"), "trials": len(rs["trials"]) // 3}
        for m, v in by.items():
            if v is not None:
                rows.append(dict(base, figure=f"{m}_ms", value=v, measured=f"{v:.0f} ms",
                                 what=f"kill -9 (SIGUSR2 for upgrade) to ping answered, {m}"))
        for name, a, b in (("recovered_over_upgrade", "recovered", "upgrade"),
                           ("cold_over_recovered", "cold", "recovered")):
            if by.get(a) and by.get(b):
                v = by[a] / by[b]
                rows.append(dict(base, figure=name, value=v,
                                 measured=f"{v:.2f}x ({by[a]:.0f} / {by[b]:.0f} ms)",
                                 what=f"{a} / {b}, kill to ping"))
        failed = sum(t.get("failed_ops", 0) for t in rs["trials"])
        rows.append(dict(base, figure="failed_ops", value=failed, measured=str(failed),
                         what="operations failed in every trial"))
    cl = read_json(os.path.join(d, "bench-cluster", "bench-cluster.json"))
    if cl:
        base = {"bench": "cluster"}
        g = cl.get("get") or {}
        if g.get("ratio"):
            rows.append(dict(base, figure="get_ratio", value=g["ratio"],
                             measured=f"{g['ratio']:.2f}x ({med(g['cluster_p50_us']):.1f} / "
                                      f"{med(g['direct_p50_us']):.1f} µs)",
                             what="GET p50 through ClusterClient / through a plain Client"))
        m = (cl.get("map") or {}).get("every_client_ms") or {}
        if m.get("p99") is not None:
            rows.append(dict(base, figure="map_change_p99_ms", value=m["p99"],
                             measured=f"{m['p99']:.1f} ms",
                             what="a map change until every client has it, p99"))
        lo = cl.get("loss") or {}
        if lo.get("to_shard_unavailable_ms") is not None:
            v = lo["to_shard_unavailable_ms"] / 1000
            rows.append(dict(base, figure="loss_to_unavailable_s", value=v,
                             measured=f"{v:.2f} s",
                             what="SIGKILL of a node to its slots' first SHARD_UNAVAILABLE"))
    ro = read_json(os.path.join(d, "bench-roll", "bench-roll.json"))
    if ro:
        for r in ro.get("roll") or []:
            rows.append(dict(r, bench="roll", what={
                "roll_blackout_ratio": "each node's blackout in a roll / a single live upgrade's",
                "roll_time_ratio": "roll time / (n x signal to old exit + n x gate)",
                "failed_ops": "operations failed during the rolls and single upgrades",
            }.get(r.get("figure"), r.get("figure"))))
        if ro.get("linearizable") is not None:
            rows.append(dict(bench="roll", figure="linearizable", value=ro["linearizable"],
                             measured="yes" if ro["linearizable"] else "NO",
                             what="kvhistory on the run's history"))
    return rows


def extract(d, plots=None):
    """The run in DIR d as the report's JSON (a dict); the plots into `plots`."""
    D = Data(d)
    host = read_kv(os.path.join(d, "host.txt"))
    guest = read_kv(os.path.join(d, "guest.txt"))
    try:
        loads = [float(x.split()[0]) for x in open(os.path.join(d, "load.txt")) if x.strip()]
    except (OSError, ValueError, IndexError):
        loads = []
    c = D.config
    fig = {"schema": SCHEMA,
           "run": {k: host.get(k) for k in ("command", "date", "commit", "dirty", "wall_s", "cpu",
                                              "cores", "mem", "kernel", "load_start", "load_end",
                                              "perftest", "redis", "build_type", "budget_s")},
           "load_samples": stat(loads), "guest": guest,
           "config": {k: c.get(k) for k in ("device", "gid_index", "reps", "keys", "duration_s",
                                             "short_duration_s", "spin")},
           "plots": []}
    fig["run"]["dirty"] = host.get("dirty") == "1"
    fig.update(ex_get(D))
    fig["put_latency"] = ex_put(D)
    fig["workloads"] = ex_workloads(D)
    fig["redis"] = ex_redis(D)
    fig["put_scale"] = ex_put_scale(D)
    fig["upgrade"] = {w: ex_upgrade(D, w) for w in UP_WHERE}
    fig["rdma"] = ex_rdma(D, host)
    fig["cluster"] = ex_cluster(D)
    fig["cut"] = {"skipped": D.skipped, "failed": D.failed, "starved": D.starved}
    if plots:
        plots = os.path.abspath(plots)
        os.makedirs(plots, exist_ok=True)
        for old in glob.glob(os.path.join(plots, "*.png")):
            os.remove(old)
        with tempfile.TemporaryDirectory() as tmp:
            reg, order, _ = rdma_data(D)
            made = [plot_cdf(D, plots, tmp), plot_registration(reg, order, plots, tmp),
                    plot_upgrade(D, plots, tmp)]
        fig["plots"] = [os.path.basename(p) for p in made if p]
    return fig


# ----------------------------------------------------------------------------
# plots


def gnuplot(script, cwd):
    try:
        subprocess.run(["gnuplot"], input=script.encode(), cwd=cwd, check=True,
                       capture_output=True)
        return True
    except (OSError, subprocess.CalledProcessError) as e:
        err = getattr(e, "stderr", b"") or str(e).encode()
        print(f"plot-bench: gnuplot failed: {err.decode(errors='replace').strip()[:500]}",
              file=sys.stderr)
        return False


TERM = "set terminal pngcairo size 900,560 font 'DejaVu Sans,10'\n"


def plot_cdf(D, plots, tmp):
    curves = []
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    for i, s in enumerate(sorted(set(D.cdf) | set(D.pt_samples))):
        lc = f"lc rgb '{colors[i % len(colors)]}'"
        if s in D.pt_samples:
            v = sorted(D.pt_samples[s])
            f = os.path.join(tmp, f"pt-{s}.dat")
            with open(f, "w") as o:
                for i, x in enumerate(v):
                    o.write(f"{x} {(i + 1) / len(v)}\n")
            curves.append(f"'{f}' using 1:2 with lines lw 2 dt 2 {lc} title 'ib\\_read\\_lat {s} B'")
        if s in D.cdf and os.path.exists(D.cdf[s]):
            curves.append(f"'{D.cdf[s]}' using 1:2 with lines lw 2 {lc} title 'kvnode GET {s} B (kvload, depth 1)'")
    if not curves:
        return None
    out = os.path.join(plots, "get-latency-cdf.png")
    ok = gnuplot(TERM + f"set output '{out}'\n"
                 "set title 'GET latency CDF at depth 1 vs ib\\_read\\_lat (same device, same run)'\n"
                 "set logscale x\nset xlabel 'latency (µs, log scale)'\n"
                 "set ylabel 'fraction of operations at or below'\nset yrange [0:1]\n"
                 "set grid\nset key bottom right\n"
                 "plot " + ", ".join(curves) + "\n", tmp)
    return out if ok else None


def plot_registration(reg, order, plots, tmp):
    rows = [(k, e) for k, e in ((k, reg[k]) for k in order) if e["reg"]]
    if not rows:
        return None
    f = os.path.join(tmp, "reg.dat")
    with open(f, "w") as o:
        for i, ((mem, pre), e) in enumerate(rows):
            s = stat(e["reg"].values())
            label = f"{mem}{' (prefaulted)' if pre == 'yes' else ''}".replace("_", "\\\\_")
            o.write(f"{i} {s[0]} {s[1]} {s[2]} \"{label}\"\n")
    out = os.path.join(plots, "registration-per-gib.png")
    ok = gnuplot(TERM.replace("900,560", "1000,600") + f"set output '{out}'\n"
                 "set title 'ibv\\_reg\\_mr time per GiB: 4 KiB pages vs huge pages (rdma\\_bench)'\n"
                 "set style fill solid 0.6\nset boxwidth 0.7\nset logscale y\n"
                 "set ylabel 'ms per GiB (log scale), median with min/max'\n"
                 "set xtics rotate by -30 left\nset grid ytics\nset key off\n"
                 "set bmargin 9\nset rmargin 20\n"
                 f"plot '{f}' using 1:2:xtic(5) with boxes, '' using 1:2:3:4 with yerrorbars "
                 "lc rgb 'black' pt 0\n", tmp)
    return out if ok else None


def plot_upgrade(D, plots, tmp):
    """ops/s and max latency over time from the live-upgrade benchmark's kvload
    timelines (records upgrade_timeline {mode, report}); the dotted line marks
    the start of the longest gap (the blackout)."""
    blocks = []
    for r in D.runs:
        if r["kind"] != "upgrade_timeline" or r["mode"] == "steady":
            continue
        rep = read_json(os.path.join(D.dir, r["report"]))
        if rep is None or not rep.get("timeline"):
            continue
        keys = rep.get("config", {}).get("keys", 0)
        f = os.path.join(tmp, f"up-{r['mode']}-{keys}.dat")
        bins = {}
        for e in rep["timeline"]:
            b = int(e["t_ms"] // 100)
            o, m = bins.get(b, (0, 0))
            bins[b] = (o + e["ops"], max(m, e["max_latency_us"]))
        with open(f, "w") as o:
            for b in range(0, max(bins) + 1 if bins else 0):
                ops, mx = bins.get(b, (0, 0))
                o.write(f"{b / 10:.1f} {ops * 10} {max(mx, 1) / 1000:.3f}\n")
        blocks.append((keys, r["mode"], f, rep.get("blackout_start_ms", 0) / 1000,
                       rep.get("blackout_ms", 0), r.get("events", 1)))
    if not blocks:
        return None
    blocks.sort(key=lambda b: (b[0], b[1] != "live"))
    n = len(blocks)
    cols = 2
    rows = (n + 1) // 2
    out = os.path.join(plots, "upgrade-timeline.png")
    script = TERM.replace("900,560", f"1200,{320 * rows}") + f"set output '{out}'\n"
    script += f"set multiplot layout {rows},{cols}\nset grid\nset ytics nomirror\nset y2tics\n"
    script += ("set ylabel 'ops/s (100 ms bins)'\nset y2label 'max latency ms (log)'\n"
               "set logscale y2\nset y2range [0.1:*]\nset key top left font ',8'\n")
    for keys, mode, f, t_gap, gap_ms, nev in blocks:
        name = "live upgrade (SIGUSR2)" if mode == "live" else "naive restart (SIGTERM, start)"
        if nev > 1:
            name = (f"{nev} live upgrades (SIGUSR2)" if mode == "live"
                    else f"{nev} naive restarts (SIGTERM, start)")
        script += "unset arrow\n"
        script += f"set arrow from {t_gap}, graph 0 to {t_gap}, graph 1 nohead dt 3 lc rgb 'red'\n"
        script += (f"set title \"{name}, {keys:,} keys: {'longest ' if nev > 1 else ''}blackout "
                   f"{gap_ms:.0f} ms\"\n"
                   "set xlabel 'time since kvload start (s)'\n"
                   # latency first (light), so the ops/s line stays visible on top
                   f"plot '{f}' using 1:3 axes x1y2 with impulses lc rgb '#e8b0b0' "
                   "title 'max latency', '' using 1:2 with steps lw 1.5 lc rgb '#1f4fbf' "
                   "title 'ops/s'\n")
    script += "unset multiplot\n"
    return out if gnuplot(script, tmp) else None


# ----------------------------------------------------------------------------
# formatting


def fnum(v, digits=None):
    if v is None:
        return "-"
    if digits is not None:
        return f"{v:.{digits}f}"
    a = abs(v)
    if a >= 10000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def fstat(s, digits=None, suffix=""):
    if s is None:
        return "-"
    med, lo, hi, n = s
    if n == 1:
        return f"{fnum(med, digits)}{suffix} (1 run)"
    if lo is None or hi is None:
        return f"{fnum(med, digits)}{suffix}"
    return f"{fnum(med, digits)}{suffix} [{fnum(lo, digits)}–{fnum(hi, digits)}]"


def fratio(s):
    return fstat(s, 2, "x")


def md_table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def kind_of(row):
    return "inline, 1 READ" if row["class"] == "inline" else "heap, 1 READ when cached, else 2"


# ----------------------------------------------------------------------------
# targets: deploy/bench/targets.json names each target by what it measures,
# the table of the run's figures it reads, a row filter, a field and a goal;
# a missed goal links the results file that explains it.

PLACES = {"guest": "one guest", "two_host": "clients on another machine"}
# How an upgrade ratio's operands print: (figure, numerator digits,
# denominator digits).
UP_RATIOS = {
    "c_blackout": ("live_c", "blackout_ms", 1, "steady_c", "blackout_ms", 1),
    "c_p99": ("live_c", "p99_ms", 2, "steady_c", "p99_ms", 2),
    "a_blackout_over_p99": ("live", "blackout_ms", 1, "steady", "p99_ms", 2),
    "naive_over_live": ("naive", "blackout_ms", 1, "live", "blackout_ms", 1),
}


def upgrade_rows(fig):
    """The upgrade targets' table, derived from fig["upgrade"]: a row per
    place, figure and key count, each with its value and how it prints."""
    out = []
    for where, up in (fig.get("upgrade") or {}).items():
        if not up or not up.get("rows"):
            continue
        runs = {(r["keys"], r["mode"]): r for r in up["rows"]}
        keys = sorted({r["keys"] for r in up["rows"]})
        base = {"where": where, "place": PLACES.get(where, where)}
        for k in keys:
            for name, (nm, nf, nd, dm, df, dd) in UP_RATIOS.items():
                a, b = runs.get((k, nm)), runs.get((k, dm))
                if a and b and b[df]:
                    v = a[nf] / b[df]
                    out.append(dict(base, figure=name, keys=k, value=v,
                                    measured=f"{v:.2f}x ({a[nf]:.{nd}f} / {b[df]:.{dd}f} ms)"))
        if len(keys) > 1:
            a, b = runs.get((keys[-1], "live")), runs.get((keys[0], "live"))
            if a and b and b["blackout_ms"]:
                v = a["blackout_ms"] / b["blackout_ms"]
                out.append(dict(base, figure="live_growth", keys=f"{keys[-1]:,} / {keys[0]:,}",
                                value=v, measured=f"{v:.2f}x ({a['blackout_ms']:.1f} / "
                                                  f"{b['blackout_ms']:.1f} ms)"))
        ev = up.get("events") or {}
        for name in ("signal_to_n_writes", "signal_to_o_exit"):
            s = ev.get(name + "_ms")
            if s:
                out.append(dict(base, figure=name, keys="-", events=ev.get("n"), value=s[0] / 1000,
                                measured=f"{s[0] / 1000:.2f} s"))
        failed = sum(r["failed"] for r in up["rows"])
        out.append(dict(base, figure="failed_ops", keys="-", value=failed, measured=str(failed)))
    return out


def target_table(fig, name):
    if name == "upgrade":
        return upgrade_rows(fig)
    if name == "put_scale":
        return (fig.get("put_scale") or {}).get("rows", [])
    return fig.get(name) or []


def load_targets(path):
    with open(path) as f:
        return json.load(f)["targets"]


def selected(row, where):
    """Whether each field named in `where` equals its value, or is in its list."""
    return all(row.get(k) in v if isinstance(v, list) else row.get(k) == v
               for k, v in where.items())


def evaluate(fig, targets):
    """[(target, row, value, measured text, verdict)] for every row a target
    selects; a target that selects none gives one row with row None."""
    out = []
    for t in targets:
        rows = [r for r in target_table(fig, t["table"]) if selected(r, t.get("where", {}))]
        hit = False
        for r in rows:
            v = r.get(t["field"])
            if v is None:
                continue
            hit = True
            med = v[0] if isinstance(v, list) else v
            if "measured" in r:
                text = r["measured"]
            elif t.get("unit", "x") == "x":
                text = fratio(v)
            else:
                text = fstat(v, suffix=t["unit"])
            ok = {"<=": med <= t["goal"], ">=": med >= t["goal"], "==": med == t["goal"]}[t["op"]]
            out.append((t, r, med, text, "**met**" if ok else "**not met**"))
        if not hit:
            out.append((t, None, None, "not measured in this run", "-"))
    return out


def goal_text(t):
    op = {"<=": "≤ ", ">=": "≥ ", "==": ""}[t["op"]]
    unit = t.get("unit", "x")
    return f"{op}{t['goal']:g}{unit}"


def cell_text(t, row):
    if row is None:
        return "-"
    fields = {k: v for k, v in row.items() if not isinstance(v, (list, dict))}
    return t.get("cell", "").format(**fields)


def targets_md(fig, targets, link):
    rows = []
    for t, r, _, text, v in evaluate(fig, targets):
        miss = t.get("explained_in")
        why = f"[{miss}]({link(miss)})" if v == "**not met**" and miss else ""
        rows.append([t["name"], cell_text(t, r), text, goal_text(t), v, why])
    return md_table(["target", "cell", "measured", "goal", "verdict", "a miss explained in"], rows)


# ----------------------------------------------------------------------------
# BENCHMARKS.md from the JSON


def render_head(fig, w, json_name):
    run, guest, cfg = fig["run"], fig.get("guest") or {}, fig.get("config") or {}
    w("# kvnode benchmarks\n")
    w(f"Generated from `{json_name}` by `deploy/bench/plot-bench.py report`; "
      "`deploy/bench/bench-all.sh` runs the benchmarks, writes that file and this one. "
      "Do not edit by hand. "
      f"Command: `{run.get('command') or 'deploy/bench/bench-all.sh'}`, {run.get('date', '?')}, "
      f"commit `{run.get('commit', '?')}`"
      f"{' (work tree had uncommitted changes)' if run.get('dirty') else ''}, "
      f"wall time {run.get('wall_s', '?')} s.\n")
    w("## Where it ran\n")
    ls = fig.get("load_samples")
    lt = (f"1-min load average sampled every 15 s during the run: min {ls[1]:.1f}, "
          f"median {ls[0]:.1f}, max {ls[2]:.1f}" if ls else "")
    w(md_table(["", ""], [
        ["host", f"{run.get('cpu', '?')}, {run.get('cores', '?')} cores, "
                 f"{run.get('mem', '?')}, kernel {run.get('kernel', '?')}"],
        ["host load", f"{run.get('load_start', '?')} at start, {run.get('load_end', '?')} at end"
                      + (f"; {lt}" if lt else "") +
                      (" (the guest's 2 TCG vCPUs alone load the host by about 2: above that,"
                       " other work shared the machine)" if ls and ls[2] > 3 else
                       " (the guest's 2 TCG vCPUs alone load the host by about 2: nothing"
                       " else ran)")],
        ["device", f"{guest.get('device', '?')}: {guest.get('where', '?')}; "
                   f"MTU {guest.get('mtu', '?')}; GID index {cfg.get('gid_index', '?')}"],
        ["guest", f"{guest.get('kernel', '?')}, {guest.get('cpus', '?')} vCPUs, {guest.get('mem', '?')}"],
        ["software", f"perftest {run.get('perftest', '?')}, redis {run.get('redis', '?')}, "
                     f"build type {run.get('build_type') or 'Release'}"],
    ]))
    w("\nAbsolute numbers under TCG emulation on a loaded host mean little; the ratios "
      "are the point: kvnode and its baseline ran minutes apart in one session, rep by rep "
      "(rep i of perftest, then rep i of kvload, for each value size). Every figure is the "
      "median of its runs, with [min–max]; a ratio is the median of the per-rep ratios "
      "with their range.\n")


def render_targets(fig, targets, w, link):
    w("## Targets\n")
    w("Each target, its goal and the results file that explains a miss come from "
      "`deploy/bench/targets.json`; the verdict compares this run's median with the goal. "
      "Upgrade figures are one run per cell.\n")
    w(targets_md(fig, targets, link) + "\n")
    w("What each target measures:\n")
    for t in targets:
        w(f"- {t['name']}: {t['measures']}")
    w("")


def render_method(fig, w):
    c = fig.get("config") or {}
    w("## Method\n")
    spin = c.get("spin") or 64
    w(f"- One kvnode (`--arena_size 64 MiB --sync_writes=true`, RocksDB on the guest's "
      f"tmpfs so a synced write costs no disk), {c.get('keys', '?')} keys of 16 B "
      "preloaded per value size. kvload: ONE client (one QP, one thread), "
      f"`--depth D` operations outstanding, `--duration {c.get('duration_s', '?')}` for the "
      "depth-1 GET runs (latency, CDF) and "
      f"{c.get('short_duration_s') or c.get('duration_s', '?')} s for the others. "
      + (f"kvload busy-polls its completion queue like perftest (`--spin {spin}` idle "
         "polls before it would block on a completion event, i.e. never within a run).\n"
         if spin >= 1000000 else
         f"kvload polls its completion queue `--spin {spin}` times, then blocks "
         "on a completion event (perftest busy-polls): a wake-up is added to most depth-1 GETs.\n"))
    w("- Depth matching: a GET has at most one READ in flight (bucket, then the object "
      "for heap values), so kvload at depth D has at most D READs outstanding on its "
      "QP; perftest runs `ib_read_bw -t D -o D` (D send-queue entries, D outstanding "
      "READs, one QP). `ib_read_lat` and `ib_send_lat` are ping-pong (depth 1) and "
      "are compared with kvload at depth 1.\n"
      "- Values of ≤ 144 B (32 B header + 16 B key + value ≤ 192 B) are inline: one "
      "256 B bucket READ; larger ones are heap values: bucket READ + object READ, or "
      "the object READ alone when the client's location cache knows its place (the C "
      "runs of heap sizes read every key once first; C-nocache runs without the cache). "
      "perftest runs at the value's size, so an inline GET's READ "
      "is really 256 B and a heap GET reads (256 B +) 48 B + value.\n"
      "- `ib_send_lat` reports half a round trip; a PUT's latency is a whole one "
      "(SEND request, server writes RocksDB and the arena, SEND response). Both "
      "ratios are shown.\n"
      "- perftest's p50 is its `t_typical`; its message rate is `ib_read_bw`'s "
      "MsgRate. `perftest D/rate` is the mean latency Little's law gives perftest at "
      "depth D, the fair yardstick for GET p50 at depth > 1.\n")


def render_get(fig, w, plot):
    w("## GET latency at depth 1 against `ib_read_lat`\n")
    w(md_table(["value", "GET p50 µs", "ib_read_lat p50 µs", "ratio"],
               [[f"{r['size']} B ({kind_of(r)})", fstat(r["get_p50"]), fstat(r["read_lat_p50"]),
                 fratio(r["ratio"])] for r in fig["get_latency"]]))
    if plot("get-latency-cdf.png"):
        w(f"\n![GET latency CDF]({plot('get-latency-cdf.png')})\n")
    w("\n### perftest latency baselines (µs)\n")
    w(md_table(["size", "read_lat p50", "read_lat p99", "read_lat p99.9", "send_lat p50",
                "send_lat p99"],
               [[f"{r['size']} B"] + [fstat(r[k]) for k in ("read_lat_p50", "read_lat_p99",
                                                            "read_lat_p999", "send_lat_p50",
                                                            "send_lat_p99")]
                for r in fig["perftest_latency"]]))
    if fig.get("get_nocache"):
        w("\n### Heap GETs with and without the location cache (depth 1)\n")
        w(md_table(["value", "location cache", "GET p50 µs", "ib_read_lat p50 µs", "ratio",
                    "share of GETs by cached place"],
                   [[f"{r['size']} B", "warmed" if r["cache"] == "warm" else "none",
                     fstat(r["get_p50"]), fstat(r["read_lat_p50"]), fratio(r["ratio"]),
                     fstat(r["cache_share"], 2)] for r in fig["get_nocache"]]))
    w("\n## GET throughput against `ib_read_bw` at the same depth\n")
    w(md_table(["value", "depth", "GET ops/s", "ib_read_bw msg/s", "ratio", "GET p50 µs",
                "perftest D/rate µs", "p50 / (D/rate)"],
               [[f"{r['size']} B", r["depth"], fstat(r["get_ops"]), fstat(r["read_bw_rate"]),
                 fratio(r["ratio"]), fstat(r["get_p50"]), fstat(r["little_us"]),
                 fratio(r["p50_over_little"])] for r in fig["get_rate"]]))
    w("\n### kvnode GET latency distribution, workload C uniform (µs)\n")
    w(md_table(["value", "depth", "p50", "p99", "p99.9", "max", "GETs by RPC (fallbacks)"],
               [[f"{r['size']} B", r["depth"]] + [fstat(r[k]) for k in ("p50", "p99", "p999", "max")]
                + [fstat(r["gets_by_rpc"])] for r in fig["get_tail"]]))


def render_put(fig, w):
    w("\n## PUT latency against `ib_send_lat` (write-only, depth 1)\n")
    w(md_table(["value", "PUT p50 µs", "ib_send_lat p50 µs", "PUT / send_lat",
                "PUT / (2 x send_lat)", "PUT ops/s"],
               [[f"{r['size']} B", fstat(r["put_p50"]), fstat(r["send_lat_p50"]),
                 fratio(r["ratio"]), fratio(r["ratio_rtt"]), fstat(r["put_ops"])]
                for r in fig["put_latency"]]))
    if fig.get("workloads"):
        w("\n## Workloads A, B, C, uniform and zipfian (θ 0.99)\n")
        w(md_table(["workload", "keys", "value", "depth", "ops/s", "GET p50 µs", "GET p99 µs",
                    "PUT p50 µs", "PUT p99 µs"],
                   [[r["workload"], r["dist"], f"{r['size']} B", r["depth"]]
                    + [fstat(r[k]) for k in ("ops", "get_p50", "get_p99", "put_p50", "put_p99")]
                    for r in fig["workloads"]]))
    if fig.get("redis"):
        w("\n## kvnode against Redis on loopback TCP, same VM\n")
        w("`redis-server` (no persistence) and `redis-benchmark -t set,get -d SIZE -c N` "
          "(N connections, one request each in flight; one key, so every GET hits). kvnode: "
          "one client at depth N (GET: workload C; SET: write-only, synced RocksDB writes). "
          "Ratios below 1 in latency and above 1 in ops/s favour kvnode.\n")
        w(md_table(["value", "N", "op", "kvnode p50 µs", "Redis p50 µs", "kvnode / Redis",
                    "kvnode ops/s", "Redis ops/s", "kvnode / Redis"],
                   [[f"{r['size']} B", r["clients"], r["op"], fstat(r["kv_p50"]),
                     fstat(r["redis_p50"]), fratio(r["p50_ratio"]), fstat(r["kv_ops"]),
                     fstat(r["redis_ops"]), fratio(r["ops_ratio"])] for r in fig["redis"]]))


PUT_SCALE_TITLE = "PUT scaling with writers, and against Redis with AOF fsync always"


def render_put_scale(fig, targets, w, level="##"):
    ps = fig.get("put_scale")
    if not ps or not ps.get("rows"):
        return
    w(f"\n{level} {PUT_SCALE_TITLE}\n")
    w("One kvnode (`--sync_writes=true`: a PUT is answered once its RocksDB write is in the "
      "synced WAL) and one `redis-server --appendonly yes --appendfsync always --save ''` "
      "(a SET is answered once the AOF is fsynced), writing to the same file system "
      f"(RocksDB: {ps.get('fs_rocksdb') or '?'}, AOF: {ps.get('fs_redis') or '?'}) in the same "
      "guest, alternating configuration by configuration. kvnode: kvload write-only "
      "(`--read_ratio 0`), uniform keys, CLIENTS sessions (one QP each) driven by ONE thread, "
      "DEPTH PUTs outstanding per session. Redis: `redis-benchmark -t set -c CLIENTS -P DEPTH` "
      "(one thread, CLIENTS connections, DEPTH pipelined SETs on each), the same key count "
      "and value size (its keys, `key:` and 12 digits, are 16 B like kvload's). "
      "Node CPU per PUT: the node's /proc/PID/stat time over the run (all its threads) "
      "divided by the PUTs. Device: `ib_send_bw -b -q CLIENTS -t DEPTH -s SIZE` after "
      "each pair, its MsgRate halved (perftest sums both directions): the SENDs per second "
      "the device moves each way with nothing else to do. A PUT is one SEND each way, so "
      "that rate bounds any PUT rate on this device; a goal's rate above it (a share "
      "above 1 below) is out of reach here whatever the node does. "
      f"{ps.get('reps', '?')} rep(s) per figure: median [min–max]; ratios are medians of "
      "per-rep ratios.\n")
    w(md_table(["value", "clients", "depth", "outstanding", "PUT ops/s", "PUT p50 µs",
                "node CPU µs/PUT", "PUT ops/s / base", "Redis AOF-always SET ops/s",
                "kvnode / Redis", "device SENDs/s each way", "PUT ops/s / device"],
               [[f"{r['size']} B", r["clients"], r["depth"], r["clients"] * r["depth"],
                 fstat(r["ops"]), fstat(r["p50"]), fstat(r["cpu_node"]),
                 "1 (base)" if r["base"] else fratio(r["scale"]), fstat(r["redis_ops"]),
                 fratio(r["vs_redis"]), fstat(r["device"]), fratio(r["vs_device"])]
                for r in ps["rows"]]) + "\n")
    rows = []
    for t, r, _, _, _ in evaluate(fig, [t for t in targets if t.get("device_share")]):
        if r is None or not r.get("device") or not r.get(t["device_share"]):
            continue
        goal_rate = t["goal"] * r[t["device_share"]][0]
        rows.append([t["name"], cell_text(t, r), fnum(goal_rate), fnum(r["device"][0]),
                     f"{goal_rate / r['device'][0]:.2f}"])
    if rows:
        w("A goal's PUT rate against the device's SENDs each way in the same configuration:\n")
        w(md_table(["target", "cell", "goal's PUT ops/s", "device SENDs/s each way", "share"],
                   rows) + "\n")
    if ps.get("kvload_command"):
        w(f"kvload (largest configuration): `{ps['kvload_command']}`\n")
    for rc in ps.get("redis_commands", []):
        w(f"Redis: `{rc}`\n")
    for p in ps.get("profiles", []):
        w(f"Profile: `{p['report']}` in the run's directory ({p['what']}).\n")


def upgrade_table(up):
    event = {"live": "signal → old process exit", "naive": "SIGTERM → new process answering"}
    rows = []
    for r in up["rows"]:
        n, mode = r["events"], r["mode"]
        rows.append([f"{r['keys']:,}", mode if mode == "steady" else f"{mode} ({n} event{'s' * (n > 1)})",
                     f"{r['blackout_ms']:.1f}", f"{r['p99_ms']:.2f}", f"{r['max_ms']:.1f}",
                     fnum(r["stall_ms"], 0), r["failed"], r["ops"],
                     f"{' / '.join(map(str, r['event_ms']))} ({event[mode]})" if r.get("event_ms")
                     else "-"])
    if up.get("rc"):
        rows.append(["", f"bench-upgrade.sh exited {up['rc']}", "", "", "", "", "", "", ""])
    return md_table(["keys", "run", "blackout ms", "p99 ms", "max ms", "guest stall ms",
                     "failed ops", "ops", "event ms"], rows)


def render_upgrade(fig, w, plot):
    up = (fig.get("upgrade") or {}).get("guest")
    w("\n## Live upgrade against a naive restart\n")
    if not up or not up.get("rows"):
        w("Not measured in this run (no bench-upgrade.sh summary).\n")
    else:
        specs = (up.get("keys") or "").split()
        desc = ", ".join(f"{int(k.split(':')[0]):,} keys with {k.split(':')[1] if ':' in k else 1} "
                         "event(s) per run" for k in specs if k.split(":")[0].isdigit())
        at = up.get("at_s") or 4
        w("`deploy/bench/bench-upgrade.sh` in this session, shortened to fit: "
          f"{desc}. Each run is a kvload (workload A, 64 B, 4 clients, depth 4, RocksDB not "
          f"synced; `_c` runs: workload C, GETs only) with its first event {at} s in, each next "
          f"one {at} s after the previous finished, and {at} s of load after the last (at least "
          f"{up.get('run_s') or 12} s in all); `steady` is the same load undisturbed. Blackout = "
          "longest gap between completed operations in the run (the worst of its events); guest "
          "stall = the longest time the guest stood still under kvload (its stall meter). One "
          "run per cell: no median here. Set-up, not a figure: the keys are written straight "
          "into the node's RocksDB directory by `kvfill` before the node starts; the node's "
          "cold start then builds its arena from RocksDB, as every naive restart does.\n")
        w(upgrade_table(up) + "\n")
        if up.get("setup"):
            w("Set-up per key count: " + "; ".join(
                f"{s['keys']:,} keys: kvfill {s['kvfill_ms'] / 1000:.1f} s, node cold start "
                f"{s['cold_start_ms'] / 1000:.1f} s" for s in up["setup"])
              + " (cold start: process start to answering, the arena built from RocksDB).\n")
    if plot("upgrade-timeline.png"):
        w(f"![ops/s and max latency across upgrades]({plot('upgrade-timeline.png')})\n")
    far = (fig.get("upgrade") or {}).get("two_host")
    if not far:
        return
    w("\n### The same with the clients on another machine\n")
    w(f"`{far.get('command') or 'BENCH_TWO_HOST=1 deploy/bench/bench-upgrade.sh'}`, run by "
      "bench-all after the session above: the same keys, events and load, with kvload on the "
      "\"client\" guest of `deploy/vm/rxe-vm --two-host` and the node on the \"server\" guest "
      "(1 TCG vCPU each, one virtio-net link, both ends with `--qp_timeout 16 --qp_retry_cnt "
      "3`). A storage node's clients run on other machines. In the one guest above, kvload's "
      "busy-polling threads share the node's two vCPUs, so the upgrade's CPU work (the new "
      "process's start, the arena's registration, RocksDB's close and open) is taken from the "
      "clients; here it is not. The node's one vCPU is shared by the old and the new process, "
      "and every operation crosses the link, so the steady figures are higher than in one "
      "guest.\n")
    dead = far.get("dead_link_attempts") or 0
    if dead:
        w(f"The virtual link between the guests died for good in the first {dead} attempt(s) "
          "(kvload: \"No route to host\"; docs/twohost.md, \"Dead link\"), so the part ran "
          f"again: these are attempt {dead + 1}'s figures.\n")
    if not far.get("rows"):
        w(f"No result: bench-upgrade.sh exited {far.get('rc', '?')} before its summary "
          f"(log: {far.get('log', '?')}).\n")
        return
    w(upgrade_table(far) + "\n")


def render_rdma(fig, w, plot):
    rd = fig.get("rdma")
    if not rd:
        return
    w("\n## rdma/ micro-benchmarks (`rdma_bench`)\n")
    w(f"Registration of {rd.get('size_mib') or '?'} MiB regions, scaled to ms per GiB; "
      f"{rd.get('runs', '?')} separate runs of `rdma_bench --reps 1`.\n")
    w(md_table(["memory", "prefault", "reg ms/GiB", "dereg ms/GiB"],
               [[r["memory"], r["prefault"], fstat(r["reg_ms_per_gib"]),
                 fstat(r["dereg_ms_per_gib"])] if r["reg_ms_per_gib"] else
                [r["memory"], r["prefault"], "skipped", r.get("note", "")]
                for r in rd["registration"]]))
    if plot("registration-per-gib.png"):
        w(f"\n![registration time per GiB]({plot('registration-per-gib.png')})\n")
    if rd.get("dereg_batch"):
        w("\nBatch deregistration (µs per MR):\n")
        w(md_table(["API", "threads", "µs per MR", "speed vs 1 thread"],
                   [[r["api"], r["threads"], fstat(r["us_per_mr"]), fratio(r["speedup"])]
                    for r in rd["dereg_batch"]]))


def render_cluster(fig, w):
    rows = fig.get("cluster") or []
    if not rows:
        return
    w("\n## Restart after a crash, the cluster, the fleet roll\n")
    w("Each by its own script in the session: `deploy/bench/bench-restart.sh` (one node, "
      "kvfill-preloaded keys, YCSB A under load; kill -9 and a restart that takes the arena "
      "back, the same with the arena removed, and a live upgrade), `deploy/bench/bench-cluster.sh` "
      "(etcd and three nodes: GETs through ClusterClient, map changes, a node's loss) and "
      "`deploy/bench/bench-roll.sh` (three nodes under `kvload --cluster`: `kvctl cluster roll` "
      "against live upgrades of one node alone). The scripts' headers say what each figure "
      "measures; the targets above judge them.\n")
    w(md_table(["bench", "figure", "measured", "what"],
               [[r["bench"], r["figure"], r.get("measured", fnum(r.get("value"))), r.get("what", "")]
                for r in rows]))


def render_cut(fig, w):
    cut = fig.get("cut") or {}
    mix = sorted({(r["size"], r["depth"]) for r in fig.get("workloads") or []})
    w("\n## What was cut, and what failed\n")
    w("- The full matrix is 4 sizes x 3 depths x 3 workloads x 2 distributions. "
      "bench-all plans workload C uniform (and write-only PUTs) at every size and depth, "
      "and the A/B/C x uniform/zipfian grid at one cell (64 B, depth 8): "
      + (f"measured here at {', '.join(f'{s} B, depth {d}' for s, d in mix)}. " if mix
         else "not reached in this run. ")
      + "On rxe the NIC is the kernel: a skewed key distribution changes nothing for one-sided "
      "READs, and writes only contend per key, so the grid is the cheapest cut.\n"
      "- kvload runs are short (seconds), so p99.9 and max rest on few samples.\n")
    if cut.get("skipped"):
        w("- Skipped when the time budget ran out: " + "; ".join(cut["skipped"]) + ".\n")
    if cut.get("failed"):
        w("- Failed runs (left out of the figures): " + "; ".join(cut["failed"]) + ".\n")
    if cut.get("starved"):
        w("- kvload runs that completed fewer than 100 operations in their seconds (the guest "
          "was starved of CPU by the host; kept in the medians, which absorb one such run): "
          + "; ".join(cut["starved"]) + ".\n")
    if not cut.get("skipped") and not cut.get("failed"):
        w("- Nothing was skipped and no run failed.\n")


def render(fig, targets, json_name):
    """The report (a string) from the run's figures and the targets."""
    if fig.get("schema") != SCHEMA:
        raise ValueError(f"{json_name}: schema {fig.get('schema')}, this generator reads {SCHEMA}")
    L = []
    w = L.append
    # The report lives in docs/ and its plots in docs/bench/ (bench-all's
    # defaults): links do not depend on where this copy is written.
    link = lambda p: f"../{p}"
    plot = lambda name: f"bench/{name}" if name in fig.get("plots", []) else None
    render_head(fig, w, json_name)
    render_targets(fig, targets, w, link)
    render_method(fig, w)
    render_get(fig, w, plot)
    render_put(fig, w)
    render_put_scale(fig, targets, w)
    render_upgrade(fig, w, plot)
    render_rdma(fig, w, plot)
    render_cluster(fig, w)
    render_cut(fig, w)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(L)).rstrip() + "\n"


def print_time(D):
    """Where the session's time went, from the records' wall_s."""
    tot = {}
    for r in D.runs:
        if "wall_s" not in r:
            continue
        if r["kind"] == "step":
            key = r["what"]
        elif r["kind"] == "kvload":
            key = f"kvload {r['cell']} (depth {r['depth']})"
        elif r["kind"] == "perftest":
            key = f"perftest {r['tool']}"
        else:
            key = r["kind"]
        n, t = tot.get(key, (0, 0.0))
        tot[key] = (n + 1, t + float(r["wall_s"]))
    if not tot:
        return
    print("\nwall time by step (s): total, runs, per run")
    for k, (n, t) in sorted(tot.items(), key=lambda kv: -kv[1][1]):
        print(f"  {k:<48} {t:8.1f} {n:4d} {t / n:7.1f}")


def print_table(title, header, rows):
    print(title)
    table = [header] + [[str(c).replace("**", "") for c in r] for r in rows]
    w = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        print("  " + "  ".join(c.rjust(w[i]) if i else c.ljust(w[i]) for i, c in enumerate(r)))
    print()


# ----------------------------------------------------------------------------
# the commands


def dumps(fig):
    """The JSON text: indented, with each list of numbers (a figure) on one line."""
    text = json.dumps(fig, indent=1, ensure_ascii=False)
    return re.sub(r"\[\s*((?:-?[\d.eE+-]+|null)(?:,\s*(?:-?[\d.eE+-]+|null))*)\s*\]",
                  lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]",
                  text) + "\n"


def write_json(d, out, plots):
    fig = extract(d, plots)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        f.write(dumps(fig))
    print(f"plot-bench: wrote {out}" + (f"; plots: {', '.join(fig['plots'])}" if fig["plots"] else ""))
    return 0


def report(json_path, md_path, targets_path):
    with open(json_path) as f:
        fig = json.load(f)
    name = os.path.relpath(os.path.abspath(json_path), REPO)
    text = render(fig, load_targets(targets_path), name)
    if md_path == "-":
        sys.stdout.write(text)
        return 0
    with open(md_path, "w") as f:
        f.write(text)
    print(f"plot-bench: wrote {md_path} from {name}")
    return 0


def summary(d, targets_path):
    D = Data(d)
    if not D.runs:
        print(f"plot-bench: no runs.jsonl in {d}")
        return 1
    fig = extract(d)
    c = D.config
    print(f"\nkvnode vs perftest on {c.get('device', '?')} ({d})")
    print(f"{c.get('reps', '?')} reps per figure: median [min–max]; ratios are medians of "
          "per-rep ratios\n")
    print_table("GET p50 at depth 1 vs ib_read_lat p50 (µs)",
                ["value", "GET p50", "ib_read_lat p50", "ratio"],
                [[f"{r['size']} B ({kind_of(r)})", fstat(r["get_p50"]), fstat(r["read_lat_p50"]),
                  fratio(r["ratio"])] for r in fig["get_latency"]])
    print_table("GET ops/s vs ib_read_bw message rate at the same depth (one QP)",
                ["value", "depth", "GET ops/s", "read_bw msg/s", "ratio"],
                [[f"{r['size']} B", r["depth"], fstat(r["get_ops"]), fstat(r["read_bw_rate"]),
                  fratio(r["ratio"])] for r in fig["get_rate"]])
    print_table("PUT p50 (write-only, depth 1) vs ib_send_lat p50 (µs)",
                ["value", "PUT p50", "ib_send_lat p50", "ratio", "vs 2x send_lat", "PUT ops/s"],
                [[f"{r['size']} B", fstat(r["put_p50"]), fstat(r["send_lat_p50"]),
                  fratio(r["ratio"]), fratio(r["ratio_rtt"]), fstat(r["put_ops"])]
                 for r in fig["put_latency"]])
    res = evaluate(fig, load_targets(targets_path))
    print_table("Targets (deploy/bench/targets.json)", ["target", "cell", "measured", "goal", ""],
                [[t["name"], cell_text(t, r), text, goal_text(t), v] for t, r, _, text, v in res])
    print(f"targets met: {sum(1 for x in res if x[4] == '**met**')} of "
          f"{sum(1 for x in res if x[1] is not None)} measured")
    for what, items in fig["cut"].items():
        if items:
            print(f"{what}: " + "; ".join(items))
    print_time(D)
    return 0


def two_host_md(d, command):
    """The GET and PUT tables of a deploy/bench/bench.sh --two-host run."""
    D = Data(d)
    if not D.runs:
        print(f"plot-bench: no runs.jsonl in {d}")
        return 1
    fig = extract(d)
    c = D.config
    L = ["## Two hosts: across a link\n",
         f"Command: `{command}`. Device: {c.get('device', '?')}; kvnode and the perftest "
         "servers on guest \"server\", kvload and the perftest clients on guest \"client\" of "
         "`deploy/vm/rxe-vm --two-host` (1 TCG vCPU each, one virtio-net link on a QEMU "
         "unix-datagram socket pair, MTU 65535, RoCE MTU 4096), both ends with "
         "`--qp_timeout 16 --qp_retry_cnt 3`. perftest and kvload alternate rep by rep in the "
         f"same session. {c.get('reps', '?')} rep(s) per figure: median [min–max].\n"]
    render_get(fig, L.append, lambda name: None)
    render_put(fig, L.append)
    try:
        counters = open(os.path.join(d, "rdv", "counters.txt")).read().split("\n")
        L.append("\nrxe0 counters over the run (retransmissions: `completer_retry_err` at the "
                 "requester, `duplicate_request` at the responder):\n")
        L += [f"- {x.split(':', 1)[0].split()[1]}:{x.split(':', 1)[1]}" for x in counters if x]
    except (OSError, IndexError):
        pass
    if D.skipped or D.failed:
        L.append("\nSkipped or failed: " + "; ".join(D.skipped + D.failed) + "\n")
    print("\n".join(L).rstrip())
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["json", "report", "summary", "two-host-md", "put-scale-md"])
    ap.add_argument("src", help="a run's DIR, or for report its JSON")
    ap.add_argument("--out", help="json: the file to write")
    ap.add_argument("--plots", help="json: where the plots go (e.g. docs/bench)")
    ap.add_argument("--md", default=os.path.join(REPO, "docs", "BENCHMARKS.md"),
                    help="report: the file to write, - for stdout")
    ap.add_argument("--targets", default=os.path.join(HERE, "targets.json"))
    ap.add_argument("--command", default="deploy/bench/bench.sh --two-host")
    a = ap.parse_args()
    if a.mode == "json":
        if not a.out:
            ap.error("json needs --out FILE")
        return write_json(a.src, a.out, a.plots)
    if a.mode == "report":
        return report(a.src, a.md, a.targets)
    if a.mode == "summary":
        return summary(a.src, a.targets)
    if a.mode == "two-host-md":
        return two_host_md(a.src, a.command)
    # put-scale-md: bench.sh's put-scale.md, the same section one level down.
    L = []
    render_put_scale(extract(a.src), load_targets(a.targets), L.append, "###")
    print("\n".join(L).strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
