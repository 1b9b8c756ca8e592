#!/usr/bin/env python3
"""Cost of ``et.log()``: per-call p50/p99 and throughput including ``finish()``.

    python benchmarks/bench_log.py                 # all sections, 3 repeats each
    python benchmarks/bench_log.py --n 20000 --repeat 1 --sections log

Each section runs in a fresh interpreter (so one cannot warm or spoil another) and reports
medians over the repeats. Sections:

- ``log``: ``log()`` of 3 floats, no rules (budget 3 µs p50, 10 µs p99)
- ``log_commit_false``: ``log(..., commit=False)`` then ``log({})`` every 4 calls
- ``log_wide``: ``log()`` of 30 floats
- ``log_nan``: ``log()`` of 3 floats one of which is NaN (the standard-json fallback)
- ``log_numpy``: ``log()`` of 3 NumPy float32 scalars (the conversion path)
- ``log_defined``: ``log()`` of 3 floats after ``define_metric("loss", summary="min,mean")``
  (the summary aggregates one key; the two others cost one dict lookup each)
- ``log_rules``: ``log()`` of 3 floats with the two rules of the shared harness,
  ``zscore(loss[50]) > 3`` and ``isnan(loss)`` (budget 6 µs p50)
- ``span``: one span enter+exit, no plugins, active run, no ``log()`` (budget 2 µs p50)
- ``nested``: two nested spans + ``log({})`` per step (budget 10 µs p50)

Timing uses ``time.perf_counter_ns`` around each call (the timer's own ~50 ns included).

The measured loop runs in chunks of 2,000 calls, each followed by 2,000 calls of the floor
(a dict merge plus one ``orjson.dumps`` of the row with its step and time, what a row costs
at least): ``floor_p50_us`` and ``x_floor`` (the median over chunks of log's chunk median
over the floor's next to it). This machine's speed moves in phases of about 0.1 s (the
floor alone, no library code, goes from 0.66 to 1.1 µs and back within one process), so a
median over one process is a mix of phases: ``x_floor`` is the figure that does not move
with them. The report adds ``p50_us_spread``: max/min of the processes' medians, and
``x_floor_spread``: max/min of the processes' ``x_floor`` (the run-to-run spread with the
machine's phases divided out).
"""

from __future__ import annotations

import tempfile
import time

import harness  # benchmarks/harness.py: the fresh-process driver

SECTIONS = (
    "log",
    "log_commit_false",
    "log_wide",
    "log_nan",
    "log_numpy",
    "log_defined",
    "log_rules",
    "span",
    "nested",
)
RULES = ["zscore(loss[50]) > 3 => error: spike", "isnan(loss) => critical: nan"]
CHUNK = 2000
WARMUP = 1000


def child(section: str, n: int) -> dict:
    import expr_tracker as et

    root = tempfile.mkdtemp(prefix="bench_log_")
    extra = {"alert_rules": list(RULES)} if section == "log_rules" else {}
    et.init(project="bench", name=section, dir=root, **extra)
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
    span = et.span
    for i in range(WARMUP):
        if section in ("span", "nested"):
            with span("forward"):
                with span("attention"):
                    pass
        log(payloads[i & 1023])
    pc = time.perf_counter_ns
    n = max(CHUNK, n - n % CHUNK)
    samples = [0] * n
    floor = [0] * n
    ratios = []
    loop_ns = 0
    for c in range(0, n, CHUNK):
        t_start = pc()
        if section == "log_commit_false":
            for i in range(c, c + CHUNK):
                p = payloads[i & 1023]
                t0 = pc()
                if i & 3 == 3:
                    log({})
                else:
                    log(p, commit=False)
                samples[i] = pc() - t0
        elif section == "span":
            for i in range(c, c + CHUNK):
                t0 = pc()
                with span("forward"):
                    pass
                samples[i] = pc() - t0
        elif section == "nested":
            for i in range(c, c + CHUNK):
                t0 = pc()
                with span("forward"):
                    with span("attention"):
                        pass
                log({})
                samples[i] = pc() - t0
        else:
            for i in range(c, c + CHUNK):
                p = payloads[i & 1023]
                t0 = pc()
                log(p)
                samples[i] = pc() - t0
        loop_ns += pc() - t_start
        _floor(payloads, floor, c)
        ratios.append(_median(samples[c : c + CHUNK]) / max(1, _median(floor[c : c + CHUNK])))
    t0 = pc()
    et.finish()
    finish_ns = pc() - t0
    samples.sort()
    floor.sort()
    return {
        "n": n,
        "p50_us": samples[n // 2] / 1e3,
        "p99_us": samples[int(n * 0.99)] / 1e3,
        "mean_us": sum(samples) / n / 1e3,
        "throughput_per_s_incl_finish": n / ((loop_ns + finish_ns) / 1e9),
        "finish_ms": finish_ns / 1e6,
        "floor_p50_us": floor[n // 2] / 1e3,
        "x_floor": _median(ratios),
    }


def _floor(payloads: list, out: list, c: int) -> None:
    """The floor of one row, timed per call into ``out[c : c + CHUNK]``."""
    import orjson

    dumps = orjson.dumps
    numpy = orjson.OPT_SERIALIZE_NUMPY  # log_numpy's payloads; nothing for plain floats
    wall = time.time
    pc = time.perf_counter_ns
    for i in range(c, c + CHUNK):
        p = payloads[i & 1023]
        t0 = pc()
        row = {}
        row.update(p)
        row["_step"] = i
        row["_time"] = wall()
        dumps(row, option=numpy)
        out[i] = pc() - t0


def _median(xs: list) -> float:
    s = sorted(xs)
    return s[len(s) // 2]


def _line(sec: str, m: dict) -> str:
    return (
        f"{sec:<18} p50 {m['p50_us']:6.2f} µs (spread {m['p50_us_spread']:.2f})  "
        f"p99 {m['p99_us']:7.2f} µs  {m['x_floor']:5.2f}x floor ({m['floor_p50_us']:.2f} µs, "
        f"spread {m['x_floor_spread']:.2f})  "
        f"{m['throughput_per_s_incl_finish']:>10,.0f} rows/s incl finish"
    )


def main() -> None:
    harness.run(__file__, __doc__, SECTIONS, child, _line)


if __name__ == "__main__":
    main()
