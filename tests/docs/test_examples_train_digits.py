"""The main job runs for real (torch on the CPU, sklearn digits) and is tracked end to end."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from helpers import ROOT

pytestmark = pytest.mark.slow  # each test trains the main job in a subprocess
pytest.importorskip("torch")
pytest.importorskip("sklearn")
pytest.importorskip("hydra")

SCRIPT = ROOT / "examples" / "train_digits.py"


def run_job(tmp_path, *overrides):
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "train.epochs=2", *overrides],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    runs = sorted((tmp_path / "runs" / "digits").iterdir())
    assert len(runs) == 1
    return runs[0], p


def rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_main_job_tracks_a_real_training_run(tmp_path):
    run_dir, p = run_job(tmp_path)
    assert f"run directory: {run_dir}" in p.stdout
    history = rows(run_dir / "metrics.jsonl")
    steps = [r["_step"] for r in history]
    assert steps == list(range(len(steps))) and len(steps) == 46  # 23 batches x 2 epochs
    first, last = history[0], history[-1]
    for key in ("train/loss", "train/acc", "lr", "time_ms/step", "time_ms/step/forward"):
        assert key in first
    assert "cpu_percent/step" in first  # CpuTime on the step span
    assert last["train/loss"] < first["train/loss"]  # it learned
    evals = [r for r in history if "eval/acc" in r]
    assert len(evals) == 2 and evals[-1]["eval/acc"] > 0.5
    assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"
    config = json.loads((run_dir / "config.json").read_text())
    assert config["train"]["epochs"] == 2
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["train/loss"] == last["train/loss"]
    spans = rows(run_dir / "spans.jsonl")
    assert {s["name"] for s in spans} >= {"step", "step/forward", "step/backward", "eval"}
    trace = json.loads((run_dir / "trace.json").read_text())
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])
    # no fault injected: no rule fired
    alerts = run_dir / "alerts.jsonl"
    assert not alerts.exists() or not [r for r in rows(alerts) if r.get("event") == "firing"]


def test_main_job_spike_fires_the_spike_rule(tmp_path):
    # the window needs 50 points before zscore is known: spike after that
    run_dir, _ = run_job(
        tmp_path, "train.epochs=4", "train.fault=spike", "train.fault_step=70", "trace=false"
    )
    fired = [r for r in rows(run_dir / "alerts.jsonl") if r.get("event") == "firing"]
    assert [r["rule"] for r in fired] == ["loss_spike"]
    assert fired[0]["step"] == 70


def test_main_job_nan_fires_the_nan_guard(tmp_path):
    run_dir, _ = run_job(tmp_path, "train.fault=nan", "train.fault_step=30", "trace=false")
    fired = [r for r in rows(run_dir / "alerts.jsonl") if r.get("event") == "firing"]
    assert "nan_loss" in [r["rule"] for r in fired]
    nan_row = rows(run_dir / "metrics.jsonl")[30]
    assert math.isnan(nan_row["train/loss"])
