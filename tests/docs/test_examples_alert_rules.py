"""examples/alert_rules.py: each injected fault fires its rule, a healthy run fires nothing."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from helpers import ROOT


def load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("spike", ["loss_spike"]),
        ("nan", ["nan_guard"]),
        ("stall", ["stalled"]),
        ("none", []),
    ],
)
def test_fault_fires_its_rule(tmp_path, fault, expected):
    fired = load("alert_rules").main(["--fault", fault, "--dir", str(tmp_path)])
    assert fired == expected


@pytest.mark.slow
def test_hang_is_caught_by_the_watchdog(tmp_path):
    fired = load("alert_rules").main(["--fault", "hang", "--dir", str(tmp_path)])
    assert fired == ["hung_run"]


def test_rule_file_passes_et_rules_check():
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "expr_tracker.cli.main",
            "rules",
            "check",
            str(ROOT / "examples" / "alerts.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.slow
def test_profile_step_writes_spans_plugins_and_trace(tmp_path, capsys):
    pytest.importorskip("torch")
    run = load("profile_step").main(["--steps", "4", "--dir", str(tmp_path), "--device", "cpu"])
    out = capsys.readouterr().out
    assert "-> step" in out and "<- step" in out and "  -> forward" in out
    rows = [json.loads(x) for x in (run.dir / "metrics.jsonl").read_text().splitlines()]
    first = rows[0]
    for key in ("time_ms/step/forward", "cpu_time_ms/step", "count/step", "time_ms/load"):
        assert key in first
    trace = json.loads((run.dir / "trace.json").read_text())
    threads = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert len(threads) >= 2  # the loader thread has its own track
