"""An overlay of many runs answered from multi-resolution summaries (docs/ui.md "Overlays of
many runs: exact at any zoom").

Builds ``--runs`` series of ``--steps`` rows each (a noisy decay with one spike, one NaN and
one +inf per run), saves each run's pyramid (``expr_tracker.history.pyramid``) in a temporary
folder, loads them back memory-mapped, and reports medians over ``--repeat`` warm queries of
every run at ``--pixels`` pixels:

- ``full_s``: the whole x range; ``zoom_s``: a window of 1 % of it, off bucket boundaries;
- ``build_s``: building one run's pyramid from its rows; ``extend_s``: appending 1,000 rows;
- checks that every spike, NaN and inf is in the answer.

With ``--cache`` the same overlay goes through the dashboard's path instead
(``expr_tracker.ui.overlay.overlay``, what ``/api/overlay`` answers, minus HTTP): each run
a ``metrics.jsonl`` under a runs folder, its query cache and its pyramids built in
``<run>/.et-cache/``; then per request every run's cache is refreshed (nothing new), its
pyramid found (``query/pyramids.py``) and all are queried and turned into JSON-ready points
and per-pixel summaries. Writing and decoding 100 × 1M JSONL lines would take the better
part of an hour here, so ``--distinct`` runs (default 2) are written and cached for real and
the others are copies by hard link (the JSONL, its parts and pyramid files; each copy's
manifest names its own path): the work per run is the same, the page cache is shared.
Reported: ``cache_s`` (building one run's query cache), ``pyramid_s`` (the first overlay
of one run: its pyramid built from the cache), ``open_s`` (the first overlay of all runs
in this process: every pyramid opened and checked), ``full_s``/``zoom_s`` (warm), and
``extend_s`` (an overlay of one run after 1,000 lines were appended to it; the median of
``--grow`` such appends, each in ``extend_all_s``).

Budget (issue 24): 100 runs × 1,000,000 steps, 1,000 pixels, ≤ 300 ms warm.
Usage: ``python benchmarks/bench_overlay.py [--runs 100] [--steps 1000000] [--cache]
[--grow 5]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

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


def _jsonl(xs: np.ndarray, ys: np.ndarray) -> bytes:
    def num(y: float) -> str:
        if y != y:
            return "NaN"
        if y in (np.inf, -np.inf):
            return "Infinity" if y > 0 else "-Infinity"
        return repr(y)

    return "".join(
        f'{{"loss":{num(y)},"_step":{int(x)},"_time":{1.7e9 + x}}}\n'
        for x, y in zip(xs.tolist(), ys.tolist(), strict=True)
    ).encode()


def _clone(src: Path, dst: Path) -> None:
    """``dst``: a copy of the run ``src`` by hard links, its cache manifest naming ``dst``."""
    for d, _dirs, files in os.walk(src):
        out = dst / Path(d).relative_to(src)
        out.mkdir(parents=True, exist_ok=True)
        os.chmod(out, 0o755)
        for f in files:
            if f == "manifest.json":
                m = json.loads((Path(d) / f).read_text())
                m["source"] = str(dst / "metrics.jsonl")
                (out / f).write_text(json.dumps(m))
            elif f != "lock":
                os.link(Path(d) / f, out / f)


def through_cache(args: argparse.Namespace) -> dict:
    from expr_tracker.query import pyramids
    from expr_tracker.ui.catalog import Catalog
    from expr_tracker.ui.overlay import overlay

    n = args.steps
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        ids = [f"p/r{i:03d}" for i in range(args.runs)]
        for i in range(min(args.distinct, args.runs)):
            d = root / ids[i]
            d.mkdir(parents=True)
            (d / "metrics.jsonl").write_bytes(_jsonl(*run_series(i, n)))
        cat = Catalog(root, None)
        cache_s, pyramid_s = [], []
        for i in range(min(args.distinct, args.runs)):
            t = time.perf_counter()
            from expr_tracker.ui.parts import producer_cache

            (prod,) = cat.get(ids[i])
            producer_cache(cat, prod, "metrics")
            cache_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            overlay(cat, [ids[i]], "loss", width=args.pixels)
            pyramid_s.append(time.perf_counter() - t)
        for i in range(args.distinct, args.runs):
            _clone(root / ids[i % args.distinct], root / ids[i])
        cat = Catalog(root, None)
        pyramids.forget()
        t = time.perf_counter()
        overlay(cat, ids, "loss", width=args.pixels)
        open_s = time.perf_counter() - t
        zlo, zhi = 0.4137 * n, 0.4237 * n
        res = _timed(
            args.repeat,
            lambda: overlay(cat, ids, "loss", width=args.pixels),
            lambda: overlay(cat, ids, "loss", width=args.pixels, lo=zlo, hi=zhi),
        )
        full = overlay(cat, ids, "loss", width=args.pixels, pixels=True)
        for k, r in enumerate(full["runs"]):
            (tr,) = r["traces"]
            i = k % args.distinct
            assert max(v for v in tr["pixels"]["max"] if v is not None) == 50.0 + i
            assert sum(tr["pixels"]["nan"]) == 1 and sum(tr["pixels"]["pinf"]) == 1
            assert sum(tr["pixels"]["count"]) == n - 2
        grow = []
        for g in range(args.grow):
            at = n + 1000 * g
            with open(root / ids[0] / "metrics.jsonl", "ab") as f:
                f.write(_jsonl(np.arange(at, at + 1000, dtype=np.float64), np.zeros(1000)))
            t = time.perf_counter()
            d = overlay(cat, ids[:1], "loss", width=args.pixels)
            grow.append(time.perf_counter() - t)
            assert d["hi"] == at + 999
    return {
        "runs": args.runs,
        "distinct": args.distinct,
        "steps": n,
        "pixels": args.pixels,
        "cache_s": statistics.median(cache_s),
        "pyramid_s": statistics.median(pyramid_s),
        "open_s": open_s,
        **{k: statistics.median(v[1:]) for k, v in res.items()},
        "extend_s": statistics.median(grow),
        "extend_all_s": grow,
        "load": os.getloadavg()[0],
    }


def _timed(repeat: int, full: Any, zoom: Any) -> dict[str, list[float]]:
    """Wall and CPU seconds of ``repeat + 1`` calls of each (the first warms the page
    cache): on a shared machine the CPU time is what the call costs, the wall time what a
    user waits."""
    res: dict[str, list[float]] = {k: [] for k in ("full_s", "zoom_s", "full_cpu_s", "zoom_cpu_s")}
    for _ in range(repeat + 1):
        for name, fn in (("full", full), ("zoom", zoom)):
            t, c = time.perf_counter(), time.process_time()
            fn()
            res[f"{name}_s"].append(time.perf_counter() - t)
            res[f"{name}_cpu_s"].append(time.process_time() - c)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--pixels", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cache", action="store_true", help="through the dashboard's cache path")
    ap.add_argument("--distinct", type=int, default=2, help="--cache: runs written for real")
    ap.add_argument(
        "--grow",
        type=int,
        default=1,
        help="--cache: times 1,000 lines are appended to a run (extend_s: the median overlay)",
    )
    args = ap.parse_args()
    if args.cache:
        r = through_cache(args)
        print(
            f"overlay via cache {args.runs} runs x {args.steps:,} steps, {args.pixels} px: "
            f"full {r['full_s'] * 1e3:.0f} ms (CPU {r['full_cpu_s'] * 1e3:.0f}), zoom "
            f"{r['zoom_s'] * 1e3:.0f} ms (CPU {r['zoom_cpu_s'] * 1e3:.0f}), first in "
            f"process {r['open_s'] * 1e3:.0f} ms (cache {r['cache_s']:.1f} s/run, pyramid "
            f"{r['pyramid_s']:.2f} s/run, extend 1k lines {r['extend_s'] * 1e3:.0f} ms)"
        )
        print(json.dumps(r))
        return
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
        res = _timed(
            args.repeat,
            lambda: overlay(pyrs, 0.0, float(n - 1), args.pixels),
            lambda: overlay(pyrs, zlo, zhi, args.pixels),
        )
        full = overlay(pyrs, 0.0, float(n - 1), args.pixels)
        for i, q in enumerate(full):
            assert q["max"].max() == 50.0 + i and q["nan"].sum() == 1 and q["pinf"].sum() == 1
            assert int(q["count"].sum()) == n - 2
        report = {
            "runs": args.runs,
            "steps": n,
            "pixels": args.pixels,
            **{k: statistics.median(v[1:]) for k, v in res.items()},
            "build_s": statistics.median(builds),
            "extend_s": extend_s,
            "load": os.getloadavg()[0],
        }
    print(
        f"overlay {args.runs} runs x {n:,} steps, {args.pixels} px: "
        f"full {report['full_s'] * 1e3:.0f} ms (CPU {report['full_cpu_s'] * 1e3:.0f}), zoom "
        f"{report['zoom_s'] * 1e3:.0f} ms (CPU {report['zoom_cpu_s'] * 1e3:.0f}) "
        f"(build {report['build_s']:.2f} s/run, extend 1k rows {extend_s * 1e3:.1f} ms)"
    )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
