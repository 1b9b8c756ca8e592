"""examples/hf_trainer_tiny.py runs offline: a tiny BERT trained by a real Trainer, tracked by
ExprTrackerCallback, then evaluated again after training."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT, read_lines

import expr_tracker as et


@pytest.mark.slow
def test_hf_trainer_tiny(tmp_path):
    for module in ("torch", "transformers", "accelerate"):
        pytest.importorskip(module)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "hf_trainer_tiny.py"), "--steps", "10"]
        + ["--name", "ex"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "runs" / "hf-tiny" / "ex"
    assert f"run: {run.resolve()}" in proc.stdout  # run.dir is absolute
    rows = {r["_step"]: r for r in et.read_history(run)}
    assert sorted(rows) == list(range(1, 11))  # the collate span gives every step a row
    assert all(r["time_ms/collate"] > 0 for r in rows.values())
    assert {"loss", "eval_loss", "train_loss"} <= set(rows[10]) and "eval_loss" in rows[5]
    # the evaluate() after training: a second line at the last step, merged by readers
    assert [r["_step"] for r in read_lines(run / "metrics.jsonl")][-2:] == [10, 10]
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "finished" and info["tags"] == ["example"]
    config = json.loads((run / "config.json").read_text())
    assert config["args"]["max_steps"] == 10 and config["model"]["hidden_size"] == 16
