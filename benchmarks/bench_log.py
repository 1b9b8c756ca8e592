#!/usr/bin/env python3
"""Cost of ``et.log()``: per-call p50/p99 and throughput including ``finish()``.

    python benchmarks/bench_log.py                 # all sections, 3 repeats each
    python benchmarks/bench_log.py --n 20000 --repeat 1 --sections log

Each section runs in a fresh interpreter (so one cannot warm or spoil another) and reports
medians over the repeats. Sections:

- ``log``: ``log()`` of 3 floats, no rules (budget 5 µs p50)
- ``log_commit_false``: ``log(..., commit=False)`` then ``log({})`` every 4 calls
- ``log_wide``: ``log()`` of 30 floats
- ``log_nan``: ``log()`` of 3 floats one of which is NaN (the standard-json fallback)
- ``log_numpy``: ``log()`` of 3 NumPy float32 scalars (the conversion path)
- ``log_defined``: ``log()`` of 3 floats after ``define_metric("loss", summary="min,mean")``
  (the summary aggregates one key; the two others cost one dict lookup each)

Timing uses ``time.perf_counter_ns`` around each call (the timer's own ~50 ns included).
"""

from __future__ import annotations

import tempfile
import time

import harness  # benchmarks/harness.py: the fresh-process driver

SECTIONS = ("log", "log_commit_false", "log_wide", "log_nan", "log_numpy", "log_defined")
WARMUP = 1000


def child(section: str, n: int) -> dict:
    import expr_tracker as et

    root = tempfile.mkdtemp(prefix="bench_log_")
    et.init(project="bench", name=section, dir=root)
    if section == "log_defined":
        et.define_metric("loss", summary="min,mean")
    log = et.log
    if section == "log_numpy":
        import numpy as np

        f32 = np.float32

        def make(i):
            return {"loss": f32(1.0 + (i % 97) * 1e-3), "lr": f32(1e-3), "acc": f32(0.5)}
    elif section == "log_wide":
        keys = [f"layer{k}/grad_norm" for k in range(30)]

        def make(i):
            return {k: 1.0 + (i % 13) * 1e-3 for k in keys}
    elif section == "log_nan":

        def make(i):
            return {"loss": float("nan"), "lr": 1e-3, "acc": 0.5 + (i % 89) * 1e-3}
    else:

        def make(i):
            return {"loss": 1.0 + (i % 97) * 1e-3, "lr": 1e-3, "acc": 0.5 + (i % 89) * 1e-3}

    payloads = [make(i) for i in range(1024)]
    for i in range(WARMUP):
        log(payloads[i & 1023])
    pc = time.perf_counter_ns
    samples = [0] * n
    t_start = pc()
    if section == "log_commit_false":
        for i in range(n):
            p = payloads[i & 1023]
            t0 = pc()
            if i & 3 == 3:
                log({})
            else:
                log(p, commit=False)
            samples[i] = pc() - t0
    else:
        for i in range(n):
            p = payloads[i & 1023]
            t0 = pc()
            log(p)
            samples[i] = pc() - t0
    loop_ns = pc() - t_start
    t0 = pc()
    et.finish()
    finish_ns = pc() - t0
    samples.sort()
    return {
        "n": n,
        "p50_us": samples[n // 2] / 1e3,
        "p99_us": samples[int(n * 0.99)] / 1e3,
        "mean_us": sum(samples) / n / 1e3,
        "throughput_per_s_incl_finish": n / ((loop_ns + finish_ns) / 1e9),
        "finish_ms": finish_ns / 1e6,
    }


def _line(sec: str, m: dict) -> str:
    return (
        f"{sec:<18} p50 {m['p50_us']:6.2f} µs  p99 {m['p99_us']:7.2f} µs  "
        f"{m['throughput_per_s_incl_finish']:>10,.0f} rows/s incl finish"
    )


def main() -> None:
    harness.run(__file__, __doc__, SECTIONS, child, _line)


if __name__ == "__main__":
    main()
