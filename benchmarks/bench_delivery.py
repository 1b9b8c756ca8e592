"""et.log() latency with a dead alert channel attached, against the same run without one.

A rule fires on every step (level mode, no cooldown, no dedup, no rate limit), so every
log() hands a message to the dispatcher. The channel is a loopback webhook that either
hangs (never answers) or answers 500 for ever. Reports p50/p99/max of et.log() in µs.

    python benchmarks/bench_delivery.py [--steps 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time


def measure(mode: str, steps: int) -> dict:
    import expr_tracker as et
    from expr_tracker.alerts import AlertEngine
    from expr_tracker.assemble.delivery import attach_delivery
    from expr_tracker.testing import WebhookServer

    script = {"hang": ["hang"], "500": [(500, "down")], "none": [(200, "ok")]}[mode]
    with WebhookServer(script) as server, tempfile.TemporaryDirectory() as tmp:
        run = et.init(project="bench", name=f"delivery-{mode}", dir=tmp)
        channels = [] if mode == "none" else [{"type": "webhook", "url": server.url}]
        spec = {
            "channels": channels or [{"type": "callable", "options": {"fn": lambda m: None}}],
            "policy": {
                "rate_limit_per_minute": None,
                "dedup_window": 0,
                "timeout": 2.0,
                "backoff_initial": 0.05,
                "max_retries": 3,
            },
        }
        d = attach_delivery(run, spec, None, drain_timeout=1.0)
        engine = AlertEngine(
            [{"name": "always", "condition": "x > -1", "mode": "level", "cooldown": 0}],
            notify=d.notify,
        )
        run.history.sinks.append(engine.on_step)
        times = []
        for i in range(steps):
            t0 = time.perf_counter_ns()
            et.log({"x": float(i), "y": 1.0, "z": 2.0})
            times.append(time.perf_counter_ns() - t0)
        stats = d.stats()
        et.finish()
    times.sort()
    lane = next(iter(stats.values()))
    return {
        "mode": mode,
        "steps": steps,
        "p50_us": round(times[len(times) // 2] / 1000, 2),
        "p99_us": round(times[int(len(times) * 0.99)] / 1000, 2),
        "max_us": round(times[-1] / 1000, 1),
        "mean_us": round(statistics.fmean(times) / 1000, 2),
        "dropped": lane["dropped"],
        "sent": lane["sent"],
        "failed": lane["failed"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--mode", choices=["none", "hang", "500"], default=None)
    args = parser.parse_args()
    if args.mode:  # one section in this process
        print(json.dumps(measure(args.mode, args.steps)))
        return
    import subprocess

    for mode in ("none", "hang", "500"):  # a fresh process per section
        out = subprocess.run(
            [sys.executable, __file__, "--mode", mode, "--steps", str(args.steps)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-500:]
        print(line)


if __name__ == "__main__":
    main()
