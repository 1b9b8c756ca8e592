#!/usr/bin/env python3
"""``log()`` of 3 floats beside the peers' own ``log()``, in the same minutes (issue 27:
"≤ 1/3 of trackio's in the same run").

    python benchmarks/bench_peers.py                       # et, trackio, wandb; 3 rounds
    python benchmarks/bench_peers.py --libs et,trackio --repeat 5 --n 40000

Each library runs in a fresh interpreter per round, the rounds interleaved (et, trackio,
wandb, et, trackio, ...), so every library sees the same machine phases and load. Each
child logs ``{"loss", "lr", "acc"}`` (3 floats) ``--n`` times after 1,000 calls of
warm-up, into a store of its own in a temporary folder: expr_tracker with
``backends=[]``; trackio with ``TRACKIO_DIR`` there (its local SQLite store, no server);
wandb with ``WANDB_MODE=offline`` and ``WANDB_DIR`` there. Nothing leaves the machine.

Per child: ``p50_us``, ``p99_us``, ``mean_us`` (``time.perf_counter_ns`` around each
call), ``rows_written`` (expr_tracker's: the lines of its ``metrics.jsonl``, warm-up
included; None for the peers), ``finish_s`` (the library's own finish: ``et.finish``, ``trackio.finish``,
``wandb.finish``) and ``rows_per_s_incl_finish``. The loop runs in chunks of 2,000 calls,
each followed by 2,000 calls of two floors in the same process: a dict merge plus one
``orjson.dumps`` (``x_orjson``: the median over chunks of the library's chunk median over
the floor's) and the same with the standard library's ``json.dumps`` (``x_json``). This
machine's speed moves in phases of about 0.1 s; the ratios to the floors do not move with
them, the µs do.

The report: per library the medians over rounds; ``et_vs_<lib>``: the median over rounds
of expr_tracker's p50 over that library's p50 in the same round; ``et_vs_<lib>_floored``:
the same with each one's ``x_orjson`` (the phases the two processes met divided out). The last line is
the whole report as JSON. A library that is not installed is reported as skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

LIBS = ("et", "trackio", "wandb")
CHUNK = 2000
WARMUP = 1000


def _payloads() -> list[dict[str, float]]:
    return [
        {"loss": 1.0 + (i % 97) * 1e-3, "lr": 1e-3, "acc": 0.5 + (i % 89) * 1e-3}
        for i in range(1024)
    ]


def _start(lib: str, root: str) -> tuple[Any, Any]:
    """``(log, finish)`` of ``lib``, its run started in ``root``."""
    if lib == "et":
        import expr_tracker as et

        et.init(project="bench", name="peers", dir=root, backends=[])
        return et.log, et.finish
    if lib == "trackio":
        os.environ["TRACKIO_DIR"] = root  # read when trackio is imported
        import trackio

        trackio.init(project="bench", name="peers")
        return trackio.log, trackio.finish
    if lib == "wandb":
        os.environ["WANDB_MODE"] = "offline"
        os.environ["WANDB_DIR"] = root
        os.environ["WANDB_SILENT"] = "true"
        import wandb

        run = wandb.init(project="bench", name="peers")
        return run.log, run.finish
    raise ValueError(f"library {lib!r} is not one of {', '.join(LIBS)}")


def child(lib: str, n: int) -> dict[str, Any]:
    """One library's figures, measured in this process."""
    import orjson

    root = tempfile.mkdtemp(prefix=f"bench_peers_{lib}_")
    log, finish = _start(lib, root)
    payloads = _payloads()
    for i in range(WARMUP):
        log(payloads[i & 1023])
    pc = time.perf_counter_ns
    n = max(CHUNK, n - n % CHUNK)
    samples = [0] * n
    x_orjson: list[float] = []
    x_json: list[float] = []
    loop_ns = 0
    dumps_fast, dumps_std = orjson.dumps, json.dumps
    floor_fast = [0] * CHUNK
    floor_std = [0] * CHUNK
    for c in range(0, n, CHUNK):
        t_start = pc()
        for i in range(c, c + CHUNK):
            p = payloads[i & 1023]
            t0 = pc()
            log(p)
            samples[i] = pc() - t0
        loop_ns += pc() - t_start
        for j in range(CHUNK):
            p = payloads[(c + j) & 1023]
            t0 = pc()
            dumps_fast({**p, "_step": c + j, "_time": 1.7e9})
            floor_fast[j] = pc() - t0
        for j in range(CHUNK):
            p = payloads[(c + j) & 1023]
            t0 = pc()
            dumps_std({**p, "_step": c + j, "_time": 1.7e9})
            floor_std[j] = pc() - t0
        mine = statistics.median(samples[c : c + CHUNK])
        x_orjson.append(mine / max(1.0, statistics.median(floor_fast)))
        x_json.append(mine / max(1.0, statistics.median(floor_std)))
    t0 = pc()
    finish()
    finish_ns = pc() - t0
    samples.sort()
    written = None
    if lib == "et":  # what was measured reached the file (the warm-up's rows too)
        written = sum(
            sum(1 for _ in open(os.path.join(d, f), "rb"))
            for d, _, files in os.walk(root)
            for f in files
            if f == "metrics.jsonl"
        )
    shutil.rmtree(root, ignore_errors=True)
    return {
        "n": n,
        "rows_written": written,
        "p50_us": samples[n // 2] / 1e3,
        "p99_us": samples[int(n * 0.99)] / 1e3,
        "mean_us": sum(samples) / n / 1e3,
        "finish_s": finish_ns / 1e9,
        "rows_per_s_incl_finish": n / ((loop_ns + finish_ns) / 1e9),
        "x_orjson": statistics.median(x_orjson),
        "x_json": statistics.median(x_json),
    }


def _installed(lib: str) -> bool:
    if lib == "et":
        return True
    probe = subprocess.run(
        [sys.executable, "-c", f"import importlib.util as u; exit(u.find_spec({lib!r}) is None)"],
        capture_output=True,
    )
    return probe.returncode == 0


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--libs", default=",".join(LIBS), help="et, trackio, wandb")
    ap.add_argument("--n", type=int, default=40_000, help="calls measured per child")
    ap.add_argument("--repeat", type=int, default=3, help="rounds (fresh processes each)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.n)))
        return
    libs = [x.strip() for x in args.libs.split(",") if x.strip()]
    for lib in libs:
        if lib not in LIBS:
            ap.error(f"--libs: {lib!r} is not one of {', '.join(LIBS)}")
    skipped = {lib: "not installed" for lib in libs if not _installed(lib)}
    libs = [lib for lib in libs if lib not in skipped]
    runs: dict[str, list[dict[str, Any]]] = {lib: [] for lib in libs}
    load = os.getloadavg()
    for r in range(args.repeat):
        for lib in libs:
            p = subprocess.run(
                [sys.executable, __file__, "--child", lib, "--n", str(args.n)],
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONHASHSEED": "0"},
            )
            if p.returncode != 0:
                tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
                raise SystemExit(f"{lib}, round {r + 1}: exit {p.returncode}: {' | '.join(tail)}")
            runs[lib].append(json.loads(p.stdout.strip().splitlines()[-1]))
    report: dict[str, Any] = {
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "load": [round(x, 2) for x in load],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "n": args.n,
        "repeat": args.repeat,
        "libs": {},
        "skipped": skipped,
    }
    for lib in libs:
        keys = [k for k in runs[lib][0] if k != "rows_written"]
        med: dict[str, Any] = {k: statistics.median(run[k] for run in runs[lib]) for k in keys}
        med["rows_written"] = [run["rows_written"] for run in runs[lib]]
        med["p50_us_runs"] = [round(run["p50_us"], 3) for run in runs[lib]]
        report["libs"][lib] = med
        print(
            f"{lib:<8} p50 {med['p50_us']:7.2f} µs  p99 {med['p99_us']:7.2f} µs  "
            f"mean {med['mean_us']:7.2f} µs  {med['x_orjson']:5.2f}x orjson floor  "
            f"{med['x_json']:5.2f}x json floor  finish {med['finish_s']:.3f} s  "
            f"{med['rows_per_s_incl_finish']:,.0f} rows/s incl finish"
        )
    if "et" in libs:
        for lib in libs:
            if lib == "et":
                continue
            ratios = [a["p50_us"] / b["p50_us"] for a, b in zip(runs["et"], runs[lib], strict=True)]
            # the same over each one's floor: the machine's phases divided out
            floored = [
                a["x_orjson"] / b["x_orjson"] for a, b in zip(runs["et"], runs[lib], strict=True)
            ]
            report[f"et_vs_{lib}"] = statistics.median(ratios)
            report[f"et_vs_{lib}_floored"] = statistics.median(floored)
            print(
                f"et p50 / {lib} p50, same round: {statistics.median(ratios):.3f} "
                f"({statistics.median(floored):.3f} over each one's floor)"
            )
    for lib, why in skipped.items():
        print(f"{lib:<8} skipped: {why}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
