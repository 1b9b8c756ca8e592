"""Alert rules catching a diverging, NaN or stalled run while it trains (offline, seconds).

    python examples/alert_rules.py --fault spike   # loss_spike fires at the spike
    python examples/alert_rules.py --fault nan     # nan_guard fires at the first NaN
    python examples/alert_rules.py --fault stall   # the loss freezes: stalled fires
    python examples/alert_rules.py --fault hang    # the loop stops logging: hung_run fires
    python examples/alert_rules.py --fault none    # a healthy run: nothing fires

The rules live in ``examples/alerts.yaml`` (``et rules check examples/alerts.yaml``); fired
alerts go to the console and to the run's ``alerts.jsonl``. Prints one line per firing
rule at the end and exits 0.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import expr_tracker as et

RULES = Path(__file__).resolve().parent / "alerts.yaml"
FAULTS = ("spike", "nan", "stall", "hang", "none")


def loss_at(step: int, fault: str, at: int, rng: random.Random) -> float:
    base = 2.0 * math.exp(-step / 60.0) + 0.05 + rng.gauss(0.0, 0.01)
    if step >= at:
        if fault == "nan":
            return float("nan")
        if fault == "stall":
            return 0.25
        if fault == "spike" and step == at:
            return base * 40.0
    return base


def main(argv: list[str] | None = None) -> list[str]:
    """Run the loop; returns the names of the rules that fired."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fault", choices=FAULTS, default="spike")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--at", type=int, default=120, help="step the fault starts at")
    parser.add_argument("--dir", default="runs")
    args = parser.parse_args(argv)

    run = et.init(
        project="alert_rules",
        name=f"{args.fault}-{time.strftime('%Y%m%d-%H%M%S')}",
        dir=args.dir,
        spec={"alerts": et_alerts_section()},
    )
    rng = random.Random(0)
    for step in range(args.steps):
        if args.fault == "hang" and step == args.at:
            time.sleep(3.0)  # the loop hangs: no_data(2s) fires from the watchdog
            break
        et.log({"train/loss": loss_at(step, args.fault, args.at, rng), "lr": 1e-3})
    et.finish()
    fired = []
    alerts = run.dir / "alerts.jsonl"
    if alerts.exists():
        for line in alerts.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("event") == "firing":
                fired.append(rec["rule"])
                print(f"fired: {rec['rule']} at step {rec['step']}: {rec['message']}")
    if not fired:
        print("no alert fired")
    return fired


def et_alerts_section() -> dict:
    """The alerts section from examples/alerts.yaml (the same file CI checks)."""
    import yaml

    return yaml.safe_load(RULES.read_text())


if __name__ == "__main__":
    main()
