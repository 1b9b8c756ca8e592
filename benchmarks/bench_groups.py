"""A group band of many seeds: ``query.stats.group_band`` over ``--seeds`` runs of
``--steps`` steps each (numpy arrays, as ``et plot --group-by`` and the dashboard hand them
in), per band and centre, warm (one call first, not counted), median of ``--repeat`` calls.

Usage: ``python benchmarks/bench_groups.py [--seeds 100] [--steps 1000] [--repeat 5]``.
Prints one JSON object: seconds per (agg, band).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np

from expr_tracker.query.stats import group_band


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    runs = []
    for k in range(a.seeds):  # every other seed logs every other step: different grids
        steps = np.arange(0, a.steps, 2 if k % 2 else 1)
        runs.append((steps, 1.0 / (1 + steps / 100) + rng.normal(0, 0.05, len(steps))))
    machine = {"arch": platform.machine(), "cores": os.cpu_count(), "load": os.getloadavg()[0]}
    out = {"seeds": a.seeds, "steps": a.steps, "machine": machine, "median_s": {}}
    for agg, band in (
        ("mean", "std"),
        ("mean", "minmax"),
        ("mean", "sem"),
        ("mean", "ci"),
        ("median", "minmax"),
        ("median", "ci"),
    ):
        group_band(runs, agg=agg, band=band)  # warm
        times = []
        for _ in range(a.repeat):
            t = time.perf_counter()
            group_band(runs, agg=agg, band=band)
            times.append(time.perf_counter() - t)
        out["median_s"][f"{agg}/{band}"] = round(statistics.median(times), 4)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
