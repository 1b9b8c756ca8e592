#!/usr/bin/env python3
"""`et export` of one run of N steps (default 10,000,000) x M metrics: wall time and peak RSS.

python benchmarks/bench_export.py [--rows 10000000] [--metrics 4] [--repeat 3] [--data DIR]
                                  [--formats parquet,csv,jsonl] [--layouts wide,long]

The run is written once by the real writer (`et.log`, one process) into DIR (default
/tmp/et-bench-export/rows-N-m-M, reused while it is complete). Every timing is the `et export`
CLI in a fresh process; peak RSS is that child's ru_maxrss (os.wait4). Sections:

- `cold`: parquet, wide, after deleting the run's columnar cache (the cache is built from
  the JSONL first: what a first export of a run costs);
- `<format>/<layout>`: with the cache in place (what every later export costs).

Each section runs --repeat times; the median of each figure is reported (one line per
section, then the report as JSON with the machine). Budget (issue 14): <= 60 s and
<= 500 MB peak RSS for a 10M-row run.

Disk at 10M rows x 4 metrics: the run ~1.7 GB (JSONL) plus its cache ~0.4 GB, and the
largest output, the long JSONL export, ~6.7 GB (one output file at a time, removed at the
end; the run is kept for the next invocation).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def generate(run_dir: Path, rows: int, metrics: int) -> float:
    """Write the run with the real writer in a child process; returns its seconds."""
    code = f"""
import math, sys
import expr_tracker as et
run = et.init(run_dir={str(run_dir)!r}, project="bench", name="export", resume="never")
names = ["train/loss", "train/acc", "lr", "grad_norm", "eval/loss", "eval/acc", "tokens", "x"]
names = names[:{metrics}] + [f"m{{i}}" for i in range(max(0, {metrics} - len(names)))]
log = et.log
for i in range({rows}):
    v = 1.0 / (i + 1)
    log({{n: v * (k + 1) for k, n in enumerate(names)}})
et.finish()
"""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - t0


def timed(cmd: list[str]) -> dict[str, float]:
    """Run ``cmd``; its wall seconds and peak RSS (MB, ru_maxrss of this child alone)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {proc.returncode}")
    return {"wall_s": wall, "peak_rss_mb": usage.ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000, help="steps (lines) in the run")
    ap.add_argument("--metrics", type=int, default=4, help="metrics per step")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--data", default=None, help="run directory (generated when incomplete)")
    ap.add_argument("--formats", default="parquet,csv,jsonl")
    ap.add_argument("--layouts", default="wide,long")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold-cache section")
    args = ap.parse_args()

    data = Path(args.data or f"/tmp/et-bench-export/rows-{args.rows}-m-{args.metrics}")
    marker = data / ".bench-complete"
    gen_s = None
    if not marker.exists():
        shutil.rmtree(data, ignore_errors=True)
        data.parent.mkdir(parents=True, exist_ok=True)
        gen_s = generate(data, args.rows, args.metrics)
        marker.write_text(json.dumps({"rows": args.rows, "metrics": args.metrics}))
    out_dir = data.parent / f"{data.name}-out"
    out_dir.mkdir(exist_ok=True)
    base = [sys.executable, "-m", "expr_tracker.cli.main", "export", str(data)]

    sections: list[tuple[str, str, str, bool]] = []
    if not args.no_cold:
        sections.append(("cold parquet/wide", "parquet", "wide", True))
    for fmt in args.formats.split(","):
        for layout in args.layouts.split(","):
            sections.append((f"{fmt}/{layout}", fmt, layout, False))

    report: dict = {
        "machine": {
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
        },
        "rows": args.rows,
        "metrics": args.metrics,
        "input_mb": round((data / "metrics.jsonl").stat().st_size / 1e6, 1),
        "generate_s": None if gen_s is None else round(gen_s, 2),
        "sections": {},
        "budget": {"wall_s": 60, "peak_rss_mb": 500, "rows": 10_000_000},
    }
    for name, fmt, layout, cold in sections:
        runs = []
        for _ in range(args.repeat):
            if cold:
                shutil.rmtree(data / ".et-cache", ignore_errors=True)
            out = out_dir / f"export.{fmt}"
            cmd = [*base, "-o", str(out), "--format", fmt, "--layout", layout, "--overwrite"]
            r = timed(cmd)
            r["output_mb"] = out.stat().st_size / 1e6
            runs.append(r)
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        med["rows_per_s"] = args.rows / med["wall_s"]
        report["sections"][name] = {k: round(v, 2) for k, v in med.items()}
        print(
            f"{name:20s} {med['wall_s']:7.2f} s  {med['rows_per_s']:>12,.0f} steps/s  "
            f"peak RSS {med['peak_rss_mb']:6.1f} MB  output {med['output_mb']:8.1f} MB",
            flush=True,
        )
    shutil.rmtree(out_dir, ignore_errors=True)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
