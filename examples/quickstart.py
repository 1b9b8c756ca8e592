"""Quickstart: a tracked toy training loop, offline, in about a second.

    python examples/quickstart.py [--dir runs] [--steps 200]

What it shows: ``et.init`` with a config and one alert rule, ``et.span`` around the parts of a
step (their durations become ``time_ms/<name>`` metrics), ``et.log`` once per step,
``et.history`` while the run is live, ``et.summary`` and ``et.finish``. The run lands in
``<dir>/quickstart/<timestamp>/`` (``metrics.jsonl``, ``spans.jsonl``, ``run.json``, ...).
"""

from __future__ import annotations

import argparse
import math
import random

import expr_tracker as et


def main(argv: list[str] | None = None) -> str:
    """Run the loop; returns the run directory."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="runs", help="parent directory of runs (default: runs)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--name", default=None, help="run name (default: a timestamp)")
    args = parser.parse_args(argv)

    rng = random.Random(0)
    run = et.init(
        project="quickstart",
        name=args.name,
        dir=args.dir,
        config={"lr": 0.05, "steps": args.steps},
        alert_rules=["isnan(loss) => critical: loss is NaN at step {step}"],
    )
    w = 0.0
    for _ in range(args.steps):
        with et.span("data"):
            x = rng.uniform(-1.0, 1.0)
            y = 3.0 * x + rng.gauss(0.0, 0.1)
        with et.span("step"):
            pred = w * x
            grad = 2.0 * (pred - y) * x
            w -= 0.05 * grad
            loss = (pred - y) ** 2
        et.log({"loss": loss, "w": w})
    last = et.history(3, metrics=["loss", "w"], include_meta=False)
    print("newest rows:", [{k: round(v, 4) for k, v in row.items()} for row in last])
    et.summary()["final_w"] = w
    et.finish()
    assert math.isfinite(w)
    print(f"run written to {run.dir}")
    return str(run.dir)


if __name__ == "__main__":
    main()
