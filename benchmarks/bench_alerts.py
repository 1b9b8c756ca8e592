"""Alert engine cost per committed step (medians; DESIGN.md budgets).

    python benchmarks/bench_alerts.py [--n 20000]

1. 20 typical rules evaluated on one commit whose row touches every rule's metrics
   (budget: <= 40 us per commit).
2. ``on_step`` with the two rules of the shared harness, ``zscore(loss[50]) > 3`` and
   ``isnan(loss)`` (must cost a few us so ``log()`` with 2 rules stays <= 12 us).
Each section builds its own engine; samples are per-call ``perf_counter_ns`` after warm-up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from expr_tracker.alerts import AlertEngine

TWENTY = [
    "zscore(loss[50]) > 4 => error: spike",
    "isnan(loss) => critical: nan",
    "isinf(loss) => critical: inf",
    "loss > 100 => error: diverged",
    "mean(loss[20]) > 2 * mean(loss[200]) => warn: drifting",
    "stalled(val/acc[30], 0.0001) => warn: stalled",
    "val/acc < 0.1 and step() > 1000 => warn: not learning",
    "diff(grad/norm) > 50 or grad/norm > 1e4 => error: grad blowup",
    "isnan(grad/norm) => critical: nan grads",
    "lr <= 0 => error: lr",
    "max(lr[10]) > 1 => warn: lr high",
    "slope(loss[100]) > 0.01 => warn: loss rising",
    "ema(loss[50], 0.1) > 5 => warn: ema",
    "mem/gpu_gb > 75 => warn: memory",
    "time_ms/step > 2 * median(time_ms/step[50]) => warn: slow step",
    "throughput < 0.5 * mean(throughput[100]) => warn: throughput drop",
    "pct_change(val/acc[10]) < -0.2 => warn: acc drop",
    "std(loss[50]) > 10 => warn: noisy",
    "abs(grad/norm - mean(grad/norm[20])) > 100 => warn: grad jump",
    "increasing(loss[10]) => info: loss increasing",
]
TWO = ["zscore(loss[50]) > 3 => error: spike", "isnan(loss) => critical: nan"]


def bench(rules, make_row, n):
    engine = AlertEngine(rules, notify=lambda e: None)
    pc = time.perf_counter_ns
    samples = []
    warm = min(1000, n // 5)
    for i in range(n + warm):
        row = make_row(i)
        t0 = pc()
        engine.on_step(row)
        t1 = pc()
        if i >= warm:
            samples.append(t1 - t0)
    samples.sort()
    return {
        "median_us": statistics.median(samples) / 1e3,
        "p99_us": samples[int(len(samples) * 0.99)] / 1e3,
        "rules": len(rules),
        "n": n,
    }


def row_twenty(i):
    return {
        "_step": i,
        "_time": 1.7e9 + i * 0.1,
        "loss": 1.0 + (i % 97) * 1e-3,
        "val/acc": 0.5 + (i % 89) * 1e-3,
        "grad/norm": 1.0 + (i % 13) * 0.1,
        "lr": 1e-3,
        "mem/gpu_gb": 40.0,
        "time_ms/step": 100.0 + (i % 7),
        "throughput": 1000.0 + (i % 11),
    }


def row_two(i):
    return {
        "_step": i,
        "_time": 1.7e9 + i * 0.1,
        "loss": 1.0 + (i % 97) * 1e-3,
        "lr": 1e-3,
        "acc": 0.5 + (i % 89) * 1e-3,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    args = ap.parse_args()
    out = {
        "twenty_rules_per_commit": bench(TWENTY, row_twenty, args.n),
        "two_rules_on_step": bench(TWO, row_two, args.n),
    }
    for name, r in out.items():
        print(f"{name:28s} median {r['median_us']:7.2f} us   p99 {r['p99_us']:7.2f} us")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
