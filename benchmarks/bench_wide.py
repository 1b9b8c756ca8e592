#!/usr/bin/env python3
"""Decoding wide rows (50,000 metrics per line) into the query cache: MB/s of JSONL.

Writes one run's ``metrics.jsonl`` of ``--lines`` lines (default 40) of ``--metrics`` random
float metrics each (default 50,000; names ``layer<i>/w<j>/grad_norm``, as a per-parameter
gradient log has them; ~1.9 MB a line), plus ``_step``/``_time``, in a temporary directory,
then reports medians over ``--repeat`` fresh processes (default 3) of:

- ``build_mb_s``: the first query cache build (:func:`expr_tracker.query.cache.refresh` into
  an empty ``cache_dir``: reading, decoding, writing Parquet) — what the first ``et query``,
  ``et export`` or ``et ui``'s first ``/api/runs`` pays for such a run;
- ``decode_mb_s``: the decoding alone (:func:`expr_tracker.query.scan.decode_metrics_block`
  over the cache's 4 MiB blocks), in the same process after the build.

Each child checks the row count (lines x metrics) and imports the expr_tracker this script
imports (the installed one, or ``PYTHONPATH=<checkout>``). The machine (cores, load average,
Python, pyarrow) is printed with the figures. Run it against another checkout with
``PYTHONPATH=<checkout> python benchmarks/bench_wide.py`` to compare (the code before
issue 20 decoded such lines at 0.8 MB/s here: `--lines 4`, it is that slow).

Usage: ``python benchmarks/bench_wide.py [--metrics 50000] [--lines 40] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, os, sys, tempfile, time
from pathlib import Path

src = Path(sys.argv[1])
expect = int(sys.argv[2])
from expr_tracker.query import cache, scan
import pyarrow.parquet  # imported before timing, as a warm process has it

with tempfile.TemporaryDirectory() as cdir:
    t = time.perf_counter()
    c = cache.refresh(src, "metrics", cache_dir=cdir)
    build = time.perf_counter() - t
    assert c.rows == expect, (c.rows, expect)
size = src.stat().st_size
fd = os.open(src, os.O_RDONLY)
try:
    t = time.perf_counter()
    rows = 0
    for _end, chunk in cache._blocks(fd, 0, size):
        table, _steps = scan.decode_metrics_block(chunk, 0)
        rows += table.num_rows
    decode = time.perf_counter() - t
finally:
    os.close(fd)
assert rows == expect, (rows, expect)
print(json.dumps({"build_s": build, "decode_s": decode}))
"""


def write_run(path: Path, metrics: int, lines: int) -> None:
    rng = random.Random(20)
    names = [f"layer{i // 100}/w{i % 100}/grad_norm" for i in range(metrics)]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for step in range(lines):
            row = {n: rng.random() for n in names}
            row["_step"] = step
            row["_time"] = 1_700_000_000.0 + step
            f.write(json.dumps(row) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--metrics", type=int, default=50_000)
    ap.add_argument("--lines", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    import pyarrow

    import expr_tracker

    # the children import the expr_tracker this process imported (PYTHONPATH=<checkout>
    # picks another), never one found in the current directory
    code = str(Path(expr_tracker.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [code, *filter(None, [os.environ.get("PYTHONPATH")])]
    )}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "runs" / "bench" / "wide" / "metrics.jsonl"
        write_run(src, args.metrics, args.lines)
        size = src.stat().st_size
        runs = []
        for _ in range(args.repeat):
            out = subprocess.run(
                [sys.executable, "-c", CHILD, str(src), str(args.metrics * args.lines)],
                capture_output=True,
                text=True,
                check=True,
                cwd=tmp,
                env=env,
            )
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        build = statistics.median(r["build_s"] for r in runs)
        decode = statistics.median(r["decode_s"] for r in runs)
    report = {
        "machine": {
            "cores": os.cpu_count(),
            "load_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            "python": platform.python_version(),
            "pyarrow": pyarrow.__version__,
            "platform": platform.platform(),
        },
        "metrics_per_line": args.metrics,
        "lines": args.lines,
        "file_mb": size / 1e6,
        "repeat": args.repeat,
        "build_s": build,
        "build_mb_s": size / 1e6 / build,
        "decode_s": decode,
        "decode_mb_s": size / 1e6 / decode,
        "measured_at": time.strftime("%Y-%m-%d %H:%M"),
        "code": code,
    }
    print(
        f"{args.metrics:,} metrics x {args.lines} lines ({size / 1e6:.1f} MB): cache build "
        f"{report['build_mb_s']:.1f} MB/s, decode {report['decode_mb_s']:.1f} MB/s "
        f"(median of {args.repeat} fresh processes; {os.cpu_count()} cores, load "
        f"{report['machine']['load_1min']:.2f})",
        flush=True,
    )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
