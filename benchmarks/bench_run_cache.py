#!/usr/bin/env python3
"""What keeping its query cache costs a run: ``log()`` of 5 floats with the cache kept by the
run (``history.query_cache``, the default; docs/query.md "Kept by the run") against off.

    python benchmarks/bench_run_cache.py                     # 300,000 steps, 3 repeats
    python benchmarks/bench_run_cache.py --n 100000 --repeat 5

Sections (each a fresh process per repeat; medians): ``on`` and ``off``, the same loop of
``--n`` calls ``et.log({5 floats})`` (~170 bytes a line: 300,000 steps write ~51 MB, so the
run extends its cache 3 times on its own thread and once at finish). Reported: ``log()``
p50/p99/mean in µs (``perf_counter_ns`` around each call), the loop's wall seconds, the
``finish()`` seconds (the last extension included), the process's CPU seconds (every
thread: ``resource.getrusage``; and, apart, its children's: the helper process that extends
the cache), and the run's ``query_cache`` extensions.
Then, for ``on``, the first ``et.query`` over that run in the same process, which finds
nothing left to decode (``query_s``).
"""

from __future__ import annotations

import gc
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402


def cpu_s(who: int = resource.RUSAGE_SELF) -> float:
    u = resource.getrusage(who)
    return u.ru_utime + u.ru_stime


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def helper_usage(pid: int | None) -> tuple[float, float]:
    """(CPU s, peak RSS MB) of the helper process ``pid`` (alive: read from /proc)."""
    if pid is None:
        return 0.0, 0.0
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        hwm = 0.0
        for ln in open(f"/proc/{pid}/status"):
            if ln.startswith("VmHWM:"):
                hwm = int(ln.split()[1]) / 1024
        return cpu, hwm
    except (OSError, ValueError, IndexError):
        return float("nan"), float("nan")


def child(section: str, n: int) -> dict[str, Any]:
    import expr_tracker as et

    root = tempfile.mkdtemp(prefix="et-bench-run-cache-")
    rng = random.Random(1)
    rows = [
        {
            "loss": rng.random(),
            "acc": rng.random(),
            "lr": rng.random() * 1e-3,
            "grad_norm": rng.random() * 5,
            "tokens_per_s": 1000.0 + rng.random() * 100,
        }
        for _ in range(1024)
    ]
    run = et.init(
        project="b",
        name=section,
        dir=root,
        system=False,
        history={"query_cache": section == "on"},
    )
    log = et.log
    pc = time.perf_counter_ns
    samples = [0] * n
    gc.collect()
    rss0 = peak_rss_mb()
    c0 = cpu_s()
    t0 = time.perf_counter()
    for i in range(n):
        row = rows[i & 1023]
        a = pc()
        log(row)
        samples[i] = pc() - a
    t1 = time.perf_counter()
    et.finish()
    t2 = time.perf_counter()
    c1 = cpu_s()
    samples.sort()
    stats = run.info().get("query_cache", {}).get("metrics", {})
    helper_cpu, helper_rss = helper_usage(stats.get("helper_pid"))
    out = {
        "p50_us": samples[n // 2] / 1e3,
        "p99_us": samples[int(n * 0.99)] / 1e3,
        "mean_us": statistics.fmean(samples) / 1e3,
        "loop_s": t1 - t0,
        "finish_s": t2 - t1,
        "cpu_s": c1 - c0,
        "rss_growth_mb": peak_rss_mb() - rss0,
        "helper_cpu_s": helper_cpu,
        "helper_rss_mb": helper_rss,
        "warms": stats.get("warms", 0),
        "mb": os.path.getsize(run.dir / "metrics.jsonl") / 1e6,
    }
    if section == "on":
        q0 = time.perf_counter()
        et.query("select count(*) from metrics", dir=root, output_type="arrow")
        out["query_s"] = time.perf_counter() - q0
    return out


def line(section: str, m: dict[str, Any]) -> str:
    q = f", first query {m['query_s']:.3f} s" if "query_s" in m else ""
    return (
        f"{section:4} log() p50 {m['p50_us']:.2f} µs, p99 {m['p99_us']:.2f}, mean "
        f"{m['mean_us']:.2f}; loop {m['loop_s']:.2f} s, finish {m['finish_s']:.3f} s, CPU "
        f"{m['cpu_s']:.2f} s, peak RSS +{m['rss_growth_mb']:.0f} MB; {m['mb']:.0f} MB written, "
        f"{m['warms']} extensions; helper CPU {m['helper_cpu_s']:.2f} s, peak RSS "
        f"{m['helper_rss_mb']:.0f} MB{q}"
    )


if __name__ == "__main__":
    sys.argv[1:1] = [] if "--n" in sys.argv else ["--n", "300000"]
    harness.run(__file__, __doc__, ["on", "off"], child, line)
