#!/usr/bin/env python3
"""First and repeated ``et query`` over many real runs: wall time and peak RSS.

    python benchmarks/bench_query.py                        # 100 runs x 100,000 steps x 5 metrics
    python benchmarks/bench_query.py --runs 4 --steps 20000 --repeat 3

Data: ``--runs`` run directories of ``--steps`` steps of 5 metrics each (loss, acc, lr,
grad_norm, tokens_per_s; one run in ten has a NaN loss from 70 % of its steps on), written
by ``et.log`` in a subprocess per run, ``--jobs`` at a time, into ``--data``/runs (default
``/tmp/et-bench-query``). Generated once: a later call reuses it when its
``bench-query.json`` says the same runs and steps and every run ended with the steps it
should have (else it is written anew; a folder this script did not write is never deleted).

Each measurement is a fresh process (its wall time and peak RSS, from ``wait4``, are what is
reported), through ``et.query(..., output_type="arrow")`` in Python and through the ``et
query`` command line (``--format csv -o FILE``), for two queries:

- ``agg``: per run and metric: min, max, avg and last value (5 x runs rows);
- ``nan``: per run, the first step where the loss is NaN (the NaN runs' rows).

``first``: the first query after the runs were written, their caches as the runs left them
(each run extends its file's cache while it writes past 16 MiB, and at finish:
``history.query_cache``, docs/query.md "Kept by the run"); measured only by the call that
generated the data (``--regenerate`` forces that), once per query, before any other.
``cold``: every ``.et-cache`` folder deleted first (the first query over runs that left no
cache: an older version's, ``history.query_cache: false``, runs under 16 MiB, another
user's; every line of the JSONL decoded); ``warm``: the same query again (median of ``--repeat``; the cache covers every
line, no JSONL is read); ``+1000``: the query right after 1,000 more steps were appended to
one run (``et.log`` resuming it; the cache reads only the appended bytes). ``query s``: the
``et.query`` call alone, inside the Python process. Each result's row count is checked.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MANIFEST = "bench-query.json"
#: 2: the runs leave their query caches (a data set of version 1 has none: written anew)
VERSION = 2
PROJECT = "bench"
METRICS = ("loss", "acc", "lr", "grad_norm", "tokens_per_s")
APPEND_STEPS = 1000

QUERIES = {
    "agg": (
        "SELECT run, metric, min(value) AS min, max(value) AS max, avg(value) AS avg, "
        "arg_max(value, step) AS last FROM metrics GROUP BY run, metric ORDER BY run, metric"
    ),
    "nan": (
        "SELECT run, min(step) AS first_nan_step FROM metrics "
        "WHERE metric = 'loss' AND isnan(value) GROUP BY run ORDER BY run"
    ),
}


def run_name(i: int) -> str:
    return f"r{i:03d}"


def nan_from(i: int, steps: int) -> int | None:
    """The first NaN step of run ``i`` (one run in ten), else None."""
    return int(steps * 0.7) if i % 10 == 3 else None


# ---------------------------------------------------------------------------- children


def child_generate(data: Path, i: int, first: int, count: int, total: int) -> None:
    """Write (or, resuming, extend) run ``i``: steps ``first``..``first+count-1``."""
    import random

    import expr_tracker as et

    rng = random.Random(i * 7919 + first)
    et.init(
        project=PROJECT,
        name=run_name(i),
        dir=str(data / "runs"),
        config={"lr": 10 ** -(1 + i % 4), "seed": i, "model": {"depth": 2 + i % 3}},
        resume="allow",
        system=False,  # the 5 metrics only: no sampler lines in a run slower than 10 s
    )
    lr = 10 ** -(1 + i % 4)
    nan_step = nan_from(i, total)
    log = et.log
    for s in range(first, first + count):
        loss = 2.0 / (1 + s * lr) + rng.random() * 0.01
        if nan_step is not None and s >= nan_step:
            loss = math.nan
        log(
            {
                "loss": loss,
                "acc": 1.0 - loss / 3 if loss == loss else 0.0,
                "lr": lr,
                "grad_norm": rng.random() * 5,
                "tokens_per_s": 1000.0 + rng.random() * 100,
            }
        )
    et.finish()


def child_query(data: Path, query: str) -> dict[str, Any]:
    """Run ``query`` through et.query in this process: its time and row count."""
    t0 = time.perf_counter()
    import expr_tracker as et

    t1 = time.perf_counter()
    table = et.query(QUERIES[query], dir=str(data / "runs"), output_type="arrow")
    t2 = time.perf_counter()
    return {"rows": table.num_rows, "import_s": t1 - t0, "query_s": t2 - t1}


# ---------------------------------------------------------------------------- the driver


def spawn_measured(cmd: list[str]) -> tuple[float, float, str, float]:
    """Run ``cmd`` and reap it with ``os.wait4``: (wall s, its own peak RSS MB, stdout,
    its CPU s: user + system, every thread; on a shared machine the steadier figure)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd[:5])} ... exited {proc.returncode}: {err.read()[-2000:]}"
            )
        rss_mb = usage.ru_maxrss / 1024  # KiB on Linux
        return wall, rss_mb, out.read(), usage.ru_utime + usage.ru_stime


def gen_command(data: Path, i: int, first: int, count: int, steps: int) -> list[str]:
    """The child command writing steps ``first``.. (``count`` of them) of run ``i`` of a
    data set of ``steps`` steps."""
    return [
        *(sys.executable, __file__, "--data", str(data), "--child-generate", str(i)),
        *("--first", str(first), "--count", str(count), "--steps", str(steps)),
    ]


def run_ok(run_dir: Path, steps: int) -> bool:
    try:
        info = json.loads((run_dir / "run.json").read_text("utf-8"))
    except (OSError, ValueError):
        return False
    return info.get("status") == "finished" and info.get("last_step") == steps - 1


def ensure_data(
    data: Path, runs: int, steps: int, jobs: int, regenerate: bool = False
) -> dict[str, Any]:
    """The data set, generated unless a matching one is there (or ``regenerate``); returns
    its manifest (with ``generated_s`` when it was written now)."""
    mpath = data / MANIFEST
    try:
        manifest = json.loads(mpath.read_text("utf-8"))
    except (OSError, ValueError):
        manifest = None
    if (
        not regenerate
        and manifest
        and manifest.get("version") == VERSION
        and (manifest.get("runs"), manifest.get("steps")) == (runs, steps)
        and all(
            run_ok(
                data / "runs" / PROJECT / run_name(i),
                steps + manifest["appended"].get(run_name(i), 0),
            )
            for i in range(runs)
        )
    ):
        return manifest
    if data.exists() and any(data.iterdir()) and manifest is None:
        raise SystemExit(
            f"{data} exists, is not empty and holds no {MANIFEST}: not written by this "
            "script, so it is left alone; give another --data"
        )
    if (data / "runs").exists():
        shutil.rmtree(data / "runs")
    mpath.unlink(missing_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    print(
        f"generating {runs} runs x {steps:,} steps x {len(METRICS)} metrics in {data} ...",
        flush=True,
    )
    t0 = time.perf_counter()
    pending = list(range(runs))
    active: list[tuple[int, subprocess.Popen[str]]] = []
    while pending or active:
        while pending and len(active) < jobs:
            i = pending.pop(0)
            cmd = gen_command(data, i, 0, steps, steps)
            active.append((i, subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)))
        i, proc = active.pop(0)
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"generating run {i} failed: {err[-2000:]}")
    gen_s = time.perf_counter() - t0
    manifest = {
        "version": VERSION,
        "runs": runs,
        "steps": steps,
        "metrics": list(METRICS),
        "appended": {},
    }
    mpath.write_text(json.dumps(manifest))
    return {**manifest, "generated_s": gen_s}


def append_steps(data: Path, manifest: dict[str, Any], i: int = 0) -> None:
    """Append ``APPEND_STEPS`` steps to run ``i`` (et.log resuming it); the manifest
    records it so the data set stays valid for the next call."""
    name = run_name(i)
    first = manifest["steps"] + manifest["appended"].get(name, 0)
    cmd = gen_command(data, i, first, APPEND_STEPS, manifest["steps"])
    spawn_measured(cmd)
    manifest["appended"][name] = manifest["appended"].get(name, 0) + APPEND_STEPS
    on_disk = {k: v for k, v in manifest.items() if k != "generated_s"}
    (data / MANIFEST).write_text(json.dumps(on_disk))


def drop_caches(data: Path) -> int:
    """Delete every ``.et-cache`` folder under the runs; returns how many."""
    n = 0
    for d in (data / "runs").rglob(".et-cache"):
        shutil.rmtree(d)
        n += 1
    return n


def et_command() -> list[str]:
    exe = shutil.which("et", path=str(Path(sys.executable).parent))
    return [exe] if exe else [sys.executable, "-m", "expr_tracker.cli.main"]


def measure(data: Path, path: str, query: str, expect: int) -> dict[str, Any]:
    """One fresh process running ``query`` by ``path`` (``py`` or ``cli``)."""
    if path == "py":
        cmd = [sys.executable, __file__, "--data", str(data), "--child-query", query]
        wall, rss, out, cpu = spawn_measured(cmd)
        res = json.loads(out.strip().splitlines()[-1])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            csv = Path(tmp) / "out.csv"
            cmd = [
                *et_command(),
                "query",
                QUERIES[query],
                str(data / "runs"),
                "--format",
                "csv",
                "-o",
                str(csv),
            ]
            wall, rss, _, cpu = spawn_measured(cmd)
            with open(csv, encoding="utf-8") as f:
                res = {"rows": sum(1 for _ in f) - 1, "query_s": None}
    if res["rows"] != expect:
        raise SystemExit(f"{path} {query}: {res['rows']} rows, expected {expect}")
    return {"wall_s": wall, "cpu_s": cpu, "rss_mb": rss, "query_s": res.get("query_s")}


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import duckdb
    import pyarrow

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "duckdb": duckdb.__version__,
        "pyarrow": pyarrow.__version__,
    }


def du(path: Path, pattern: str) -> int:
    return sum(p.stat().st_size for p in path.rglob(pattern) if p.is_file())


def fmt_s(v: float | None) -> str:
    return "" if v is None else f"{v:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "et-bench-query")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--jobs", type=int, default=2, help="runs written at once (default 2)")
    ap.add_argument("--repeat", type=int, default=3, help="warm queries per path (median)")
    ap.add_argument("--queries", default=",".join(QUERIES))
    ap.add_argument("--paths", default="py,cli", help="py (et.query), cli (et query)")
    ap.add_argument(
        "--regenerate",
        action="store_true",
        help="write the data set anew (and measure the first query after the runs)",
    )
    ap.add_argument("--child-generate", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--child-query", help=argparse.SUPPRESS)
    args = ap.parse_args()
    data = args.data.resolve()
    if args.child_generate is not None:
        child_generate(data, args.child_generate, args.first, args.count, args.steps)
        return
    if args.child_query:
        print(json.dumps(child_query(data, args.child_query)))
        return

    report: dict[str, Any] = {"machine": machine()}
    manifest = ensure_data(data, args.runs, args.steps, args.jobs, args.regenerate)
    m = report["machine"]
    report["data"] = {
        "dir": str(data),
        "runs": args.runs,
        "steps": args.steps,
        "metrics": len(METRICS),
        "jsonl_bytes": du(data / "runs", "metrics*.jsonl"),
        "generated_s": manifest.get("generated_s"),
    }
    print(
        f"machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, duckdb {m['duckdb']}, "
        f"pyarrow {m['pyarrow']}"
    )
    gen = manifest.get("generated_s")
    print(
        f"data: {args.runs} runs x {args.steps:,} steps x {len(METRICS)} metrics, "
        f"{report['data']['jsonl_bytes'] / 1e6:,.0f} MB of metrics JSONL in {data} "
        + (f"(generated in {gen:.0f} s)" if gen else "(reused)"),
        flush=True,
    )
    expect = {
        "agg": args.runs * len(METRICS),
        "nan": sum(1 for i in range(args.runs) if nan_from(i, 1) is not None),
    }
    paths = args.paths.split(",")
    results: dict[str, dict[str, Any]] = {}
    if gen:  # the caches as the runs left them: each query once, first of all
        report["data"]["cache_bytes_after_runs"] = du(data / "runs", "*.parquet")
        first = {}
        for q in args.queries.split(","):
            first[q] = measure(data, paths[0], q, expect[q])
            print(
                f"first {q} by {paths[0]} after the runs, their caches as they left them: "
                f"{first[q]['wall_s']:.2f} s wall, {first[q]['cpu_s']:.2f} s CPU, "
                f"{first[q]['rss_mb']:.0f} MB",
                flush=True,
            )
        report["first"] = first
    header = (
        f"{'query':6} {'path':9} {'cold s':>8} {'warm s':>8} {'+1000 s':>8} "
        f"{'warm query s':>12} {'CPU s cold/warm':>16} {'RSS MB cold/warm/+1000':>24}"
    )
    print(header)
    print("-" * len(header))
    for q in args.queries.split(","):
        for path in paths:
            drop_caches(data)
            cold = measure(data, path, q, expect[q])
            warm_runs = [measure(data, path, q, expect[q]) for _ in range(args.repeat)]
            append_steps(data, manifest)
            inc = measure(data, path, q, expect[q])
            warm = {
                k: statistics.median(r[k] for r in warm_runs)
                if warm_runs[0][k] is not None
                else None
                for k in warm_runs[0]
            }
            results[f"{q}/{path}"] = {"cold": cold, "warm": warm, "append": inc}
            label = "et.query" if path == "py" else "et query"
            print(
                f"{q:6} {label:9} {cold['wall_s']:8.2f} {warm['wall_s']:8.2f} {inc['wall_s']:8.2f} "
                f"{fmt_s(warm['query_s']):>12} "
                f"{cold['cpu_s']:>10.2f}/{warm['cpu_s']:.2f} "
                f"{cold['rss_mb']:>8.0f}/{warm['rss_mb']:.0f}/{inc['rss_mb']:.0f}",
                flush=True,
            )
    report["results"] = results
    report["cache_bytes"] = du(data / "runs", "*.parquet")
    print(
        f"cache: {report['cache_bytes'] / 1e6:,.0f} MB of Parquet parts; times are whole "
        f"fresh processes (interpreter start, import, query); warm = median of {args.repeat}"
    )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
