#!/usr/bin/env python3
"""Span costs with a real run (python benchmarks/bench_spans.py [--n N]).

Sections:
  span          one span enter+exit, no plugins, active run (budget p50 <= 2 µs)
  span_norun    the same without a run (timing only)
  span2_log     two nested spans + log({}) per step (budget p50 <= 10 µs); bench_log.py's
                span and nested sections measure the same against the floor
  trace_only    10,000 unique trace-only spans (span_metrics=False): latency percentiles,
                throughput including the final flush (finish), worker threads started,
                retained memory (tracemalloc, after finish)
Prints one JSON object per section; the last line holds them all.
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import threading
import time
import tracemalloc

import expr_tracker as et
from expr_tracker.spans import span

pc = time.perf_counter_ns


def pct(s, q):
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s)) - 1))] / 1e3


def summary(samples):
    s = sorted(samples)
    return {f"p{q}_us".replace(".", "_"): pct(s, q) for q in (50, 90, 99, 99.9)} | {
        "max_us": s[-1] / 1e3
    }


def init(d, **kw):
    et.init(project="bench", name=f"r{time.time_ns()}", dir=d, backends=[], **kw)


def sec_span(n, d, run=True):
    if run:
        init(d)
    for _ in range(1000):
        with span("forward"):
            pass
    gc.collect()
    out = [0] * n
    for i in range(n):
        t0 = pc()
        with span("forward"):
            pass
        out[i] = pc() - t0
    if run:
        et.finish()
    return summary(out)


def sec_span2_log(n, d):
    init(d)
    log = et.log
    for _ in range(1000):
        with span("forward"):
            with span("attention"):
                pass
        log({})
    gc.collect()
    out = [0] * n
    for i in range(n):
        t0 = pc()
        with span("forward"):
            with span("attention"):
                pass
        log({})
        out[i] = pc() - t0
    et.finish()
    return summary(out)


def sec_trace_only(n, d):
    """Latency/throughput pass without tracemalloc, then a memory pass with it."""
    before = {t.ident for t in threading.enumerate()}
    init(d, stream="worker", span_metrics=False)
    out = [0] * n
    start = pc()
    for i in range(n):
        t0 = pc()
        with span(f"request-{i}"):
            pass
        out[i] = pc() - t0
    loop = pc() - start
    et.finish()
    total = pc() - start
    started = [t.name for t in threading.enumerate() if t.ident not in before]
    gc.collect()
    tracemalloc.start()
    init(d, stream="worker2", span_metrics=False)
    base = tracemalloc.get_traced_memory()[0]
    for i in range(n):
        with span(f"request-{i}"):
            pass
    open_row_bytes = tracemalloc.get_traced_memory()[0] - base
    et.finish()
    gc.collect()
    retained = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    res = summary(out)
    res.update(
        spans=n,
        loop_s=loop / 1e9,
        finish_s=(total - loop) / 1e9,
        throughput_per_s=n / (total / 1e9),
        new_threads_alive=started,
        traced_bytes_before_finish=open_row_bytes,
        retained_bytes_after_finish=retained,
    )
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    args = ap.parse_args()
    res = {}
    with tempfile.TemporaryDirectory() as d:
        res["span"] = sec_span(args.n, d)
        res["span_norun"] = sec_span(args.n, d, run=False)
        res["span2_log"] = sec_span2_log(args.n // 2, d)
        res["trace_only"] = sec_trace_only(10_000, d)
    for k, v in res.items():
        print(k, json.dumps(v))
    print(json.dumps(res))


if __name__ == "__main__":
    main()
