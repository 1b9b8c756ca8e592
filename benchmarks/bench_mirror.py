#!/usr/bin/env python3
"""Cost of a mirror on ``et.log()``: per-call p50/p99 of ``log()`` of 3 floats.

    python benchmarks/bench_mirror.py                 # all sections, 3 repeats each
    python benchmarks/bench_mirror.py --n 20000 --repeat 1 --sections none,slow

Each section runs in a fresh interpreter and reports medians over the repeats. Sections:

- ``none``: no backend (the ``log`` section of bench_log.py)
- ``fast``: one backend object whose ``log`` does nothing (the queue never fills)
- ``slow``: one backend object whose ``log`` sleeps 1 ms: the queue (10 000 rows) fills
  and later rows are dropped and counted; ``finish()`` waits at most
  ``backend_finish_timeout`` (1 s here)

The budget is the one of ``log()`` itself (5 µs p50): a mirror only appends to its queue on
the committing thread. Timing uses ``time.perf_counter_ns`` around each call.
"""

from __future__ import annotations

import tempfile
import time

import harness  # benchmarks/harness.py: the fresh-process driver

SECTIONS = ("none", "fast", "slow")
WARMUP = 1000


class Fast:
    def init(self, **info):
        pass

    def log(self, metrics, step):
        pass

    def finish(self):
        pass


class Slow(Fast):
    def log(self, metrics, step):
        time.sleep(0.001)


def child(section: str, n: int) -> dict:
    import expr_tracker as et

    root = tempfile.mkdtemp(prefix="bench_mirror_")
    backends = {"none": [], "fast": [Fast()], "slow": [Slow()]}[section]
    run = et.init(
        project="bench", name=section, dir=root, backends=backends, backend_finish_timeout=1.0
    )
    log = et.log

    def make(i):
        return {"loss": 1.0 + (i % 97) * 1e-3, "lr": 1e-3, "acc": 0.5 + (i % 89) * 1e-3}

    payloads = [make(i) for i in range(1024)]
    for i in range(WARMUP):
        log(payloads[i & 1023])
    pc = time.perf_counter_ns
    samples = [0] * n
    for i in range(n):
        p = payloads[i & 1023]
        t0 = pc()
        log(p)
        samples[i] = pc() - t0
    t0 = pc()
    et.finish()
    finish_ns = pc() - t0
    samples.sort()
    mirror = next(iter(run.info().get("backends", {}).values()), {})
    return {
        "n": n,
        "p50_us": samples[n // 2] / 1e3,
        "p99_us": samples[int(n * 0.99)] / 1e3,
        "mean_us": sum(samples) / n / 1e3,
        "finish_ms": finish_ns / 1e6,
        "sent": mirror.get("sent", 0),
        "dropped": sum((mirror.get("dropped") or {}).values()),
    }


def _line(sec: str, m: dict) -> str:
    return (
        f"{sec:<6} p50 {m['p50_us']:6.2f} µs  p99 {m['p99_us']:7.2f} µs  "
        f"finish {m['finish_ms']:8.1f} ms  mirrored {m['sent']:>8,.0f}  "
        f"dropped {m['dropped']:>8,.0f}"
    )


def main() -> None:
    harness.run(__file__, __doc__, SECTIONS, child, _line)


if __name__ == "__main__":
    main()
