"""``et plot`` of one metric of a long run: the whole command in a fresh process, and its parts.

Writes a metrics file of ``--n`` steps (default 1,000,000; one float metric ``loss`` with a
spike, a NaN and an inf, plus ``_step``/``_time``, as the writer lays them out) in a
temporary directory, then reports medians over ``--repeat`` runs of:

- ``command_s``: ``et plot RUN loss --width 120 --height 30`` in a fresh interpreter
  (imports, reading, downsampling, drawing), output to a pipe; and its peak RSS;
- ``read_s``: ``history.columns.read_columns`` of the one metric (every line decoded);
- ``m4_s``: ``history.downsample.m4`` to 112 buckets (numpy when installed, and pure Python);
- ``draw_s``: the chart drawn by plotext from the downsampled points.

Usage: ``python benchmarks/bench_plot.py [--n 1000000] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write_run(run: Path, n: int) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    path = run / "metrics.jsonl"
    t0 = 1_700_000_000.0
    with path.open("w") as f:
        for i in range(n):
            v = 1.0 / (1.0 + i / 1000.0) + 0.01 * math.sin(i)
            if i == n // 3:
                v = 50.0
            text = repr(v)
            if i == n // 2:
                text = "NaN"
            elif i == 2 * n // 3:
                text = "Infinity"
            f.write(f'{{"loss": {text}, "_step": {i}, "_time": {t0 + i * 0.01!r}}}\n')
    return path


def command(run: Path) -> tuple[float, int]:
    code = (
        "import resource, sys, time\n"
        "t = time.perf_counter()\n"
        "from expr_tracker.cli.main import main\n"
        "import io, contextlib\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        f"    rc = main(['plot', {str(run)!r}, 'loss', '--width', '120', '--height', '30'])\n"
        "assert rc == 0 and '1 NaN' in buf.getvalue(), buf.getvalue()\n"
        "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    _inner, rss_kb = out.stdout.split()
    return wall, int(rss_kb)


def parts(path: Path) -> dict[str, float]:
    import plotext

    from expr_tracker.cli.plotrender import render_chart
    from expr_tracker.history.chartprep import series_view
    from expr_tracker.history.columns import read_columns
    from expr_tracker.history.downsample import m4

    try:
        import numpy  # noqa: F401  (imported before timing: m4 uses it when installed)
    except ImportError:
        pass
    t = time.perf_counter()
    col = read_columns(path, lambda name: name == "loss").columns["loss"]
    read_s = time.perf_counter() - t
    hi = float(col.steps[-1])
    t = time.perf_counter()
    m4(col.steps, col.values, 112, 0.0, hi)
    m4_s = time.perf_counter() - t
    t = time.perf_counter()
    m4(col.steps, col.values, 112, 0.0, hi, use_numpy=False)
    m4_py_s = time.perf_counter() - t
    view = series_view(
        "run/loss", col, x_mode="step", t0=None, buckets=112, lo=0.0, hi=hi, smooth=None,
        log_y=False,
    )  # fmt: skip
    t = time.perf_counter()
    render_chart(
        plotext, "loss", [view], width=120, height=30, lo=0.0, hi=hi, x_label="step",
        integer_x=True, log_y=False, color=False,
    )  # fmt: skip
    draw_s = time.perf_counter() - t
    return {"read_s": read_s, "m4_s": m4_s, "m4_python_s": m4_py_s, "draw_s": draw_s,
            "points_drawn": len(view.xs)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "runs" / "bench" / "long"
        path = write_run(run, args.n)
        cmd = [command(run) for _ in range(args.repeat)]
        prt = [parts(path) for _ in range(args.repeat)]
        report = {
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
            "steps": args.n,
            "file_bytes": path.stat().st_size,
            "command_s": statistics.median(c[0] for c in cmd),
            "command_peak_rss_mb": statistics.median(c[1] for c in cmd) / 1024,
        }
        for key in prt[0]:
            report[key] = statistics.median(p[key] for p in prt)
        report["bench_process_peak_rss_mb"] = (
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
