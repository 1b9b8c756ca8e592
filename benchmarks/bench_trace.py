#!/usr/bin/env python3
"""`et trace` on N spans (default 1,000,000): wall time and peak RSS of the CLI process.

python benchmarks/bench_trace.py [--n 1000000] [--keep DIR]

The span file mimics a training loop (step > forward > attention/mlp, backward) on the main
thread plus a data stream whose asyncio tasks overlap (so lanes are exercised). The CLI runs
in a child process; peak RSS is that child's ru_maxrss. Budget (DESIGN.md): <= 20 s and
<= 300 MB for 1M spans.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import orjson


def generate(run_dir: str, n: int) -> int:
    t = 1_700_000_000.0
    sid = 0
    written = 0
    with (
        open(os.path.join(run_dir, "spans.jsonl"), "wb") as main,
        open(os.path.join(run_dir, "spans.data.jsonl"), "wb") as data,
    ):
        step = 0
        while written < n:
            base = t + step * 0.05
            sid += 5
            recs = [
                ("step/forward/attention", 2, base + 0.001, 8.0, sid + 3, sid + 2),
                ("step/forward/mlp", 2, base + 0.010, 6.0, sid + 4, sid + 2),
                ("step/forward", 1, base + 0.0005, 17.0, sid + 2, sid + 1),
                ("step/backward", 1, base + 0.020, 20.0, sid + 5, sid + 1),
                ("step", 0, base, 45.0, sid + 1, None),
            ]
            for name, depth, start, dur, i, parent in recs:
                main.write(
                    orjson.dumps(
                        {
                            "_step": step,
                            "name": name,
                            "depth": depth,
                            "start": start,
                            "dur_ms": dur,
                            "id": i,
                            "parent": parent,
                            "pid": 1,
                            "tid": 1,
                            "thread": "MainThread",
                            "args": {"batch": step},
                        }
                    )
                    + b"\n"
                )
            written += 5
            for k in range(2):  # two overlapping loader tasks per step
                data.write(
                    orjson.dumps(
                        {
                            "_step": step,
                            "name": "load",
                            "depth": 0,
                            "start": base + k * 0.01,
                            "dur_ms": 30.0,
                            "id": step * 2 + k,
                            "parent": None,
                            "pid": 2,
                            "tid": 2,
                            "thread": "MainThread",
                            "task": f"Task-{k}",
                            "metrics": {"cpu_percent": 50.0},
                        }
                    )
                    + b"\n"
                )
            written += 2
            step += 1
    return written


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--keep", default=None, help="generate into this directory and keep it")
    args = ap.parse_args()
    d = args.keep or tempfile.mkdtemp(prefix="bench-trace-")
    os.makedirs(d, exist_ok=True)
    t0 = time.perf_counter()
    n = generate(d, args.n)
    gen_s = time.perf_counter() - t0
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    out = os.path.join(d, "trace.json")
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "expr_tracker.cli.main", "trace", d, "-o", out], check=True
    )
    wall = time.perf_counter() - t0
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    res = {
        "spans": n,
        "input_mb": round(size / 1e6, 1),
        "output_mb": round(os.path.getsize(out) / 1e6, 1),
        "generate_s": round(gen_s, 2),
        "trace_wall_s": round(wall, 2),
        "trace_peak_rss_mb": round(peak_kb / 1024, 1),
        "budget": {"wall_s": 20, "peak_rss_mb": 300},
    }
    print(json.dumps(res))
    if not args.keep:
        import shutil

        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
