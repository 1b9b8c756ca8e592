"""An overlay of many runs answered from multi-resolution summaries (docs/ui.md "Overlays of
many runs: exact at any zoom").

Builds ``--runs`` series of ``--steps`` rows each (a noisy decay with one spike, one NaN and
one +inf per run), saves each run's pyramid (``expr_tracker.history.pyramid``) in a temporary
folder, loads them back memory-mapped, and reports medians over ``--repeat`` warm queries of
every run at ``--pixels`` pixels:

- ``full_s``: the whole x range; ``zoom_s``: a window of 1 % of it, off bucket boundaries;
- ``build_s``: building one run's pyramid from its rows; ``extend_s``: appending 1,000 rows;
- checks that every spike, NaN and inf is in the answer.

Budget (issue 24): 100 runs × 1,000,000 steps, 1,000 pixels, ≤ 300 ms warm.
Usage: ``python benchmarks/bench_overlay.py [--runs 100] [--steps 1000000]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from expr_tracker.history import pyramid as pm


def run_series(i: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(i)
    xs = np.arange(n, dtype=np.float64)
    ys = 1.0 / (1.0 + xs / 1000.0) + 0.01 * rng.standard_normal(n)
    ys[(n // 3 + i) % n] = 50.0 + i
    ys[(n // 2 + i) % n] = np.nan
    ys[(2 * n // 3 + i) % n] = np.inf
    return xs, ys


def overlay(pyrs: list[pm.Pyramid], lo: float, hi: float, pixels: int) -> list[dict]:
    return pm.query_many(pyrs, lo, hi, pixels)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--pixels", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    n = args.steps
    with tempfile.TemporaryDirectory() as tmp:
        builds = []
        for i in range(args.runs):
            xs, ys = run_series(i, n)
            t = time.perf_counter()
            p = pm.Pyramid(xs, ys)
            builds.append(time.perf_counter() - t)
            p.save(Path(tmp) / f"run{i}")
        t = time.perf_counter()
        p.extend(np.arange(n, n + 1000, dtype=np.float64), np.zeros(1000))
        extend_s = time.perf_counter() - t
        pyrs = [pm.load(Path(tmp) / f"run{i}") for i in range(args.runs)]
        zlo, zhi = 0.4137 * n, 0.4237 * n
        res: dict[str, list[float]] = {"full_s": [], "zoom_s": []}
        for _ in range(args.repeat + 1):  # the first one warms the page cache
            t = time.perf_counter()
            full = overlay(pyrs, 0.0, float(n - 1), args.pixels)
            res["full_s"].append(time.perf_counter() - t)
            t = time.perf_counter()
            overlay(pyrs, zlo, zhi, args.pixels)
            res["zoom_s"].append(time.perf_counter() - t)
        for i, q in enumerate(full):
            assert q["max"].max() == 50.0 + i and q["nan"].sum() == 1 and q["pinf"].sum() == 1
            assert int(q["count"].sum()) == n - 2
        report = {
            "runs": args.runs,
            "steps": n,
            "pixels": args.pixels,
            "full_s": statistics.median(res["full_s"][1:]),
            "zoom_s": statistics.median(res["zoom_s"][1:]),
            "build_s": statistics.median(builds),
            "extend_s": extend_s,
        }
    print(
        f"overlay {args.runs} runs x {n:,} steps, {args.pixels} px: "
        f"full {report['full_s'] * 1e3:.0f} ms, zoom {report['zoom_s'] * 1e3:.0f} ms "
        f"(build {report['build_s']:.2f} s/run, extend 1k rows {extend_s * 1e3:.1f} ms)"
    )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
