"""A nanoGPT-style script written for wandb, with only its import changed
(``import expr_tracker as wandb``), trains a tiny torch model in a real subprocess; the
run's files hold what wandb would have recorded (issue 12, "Done when")."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys

import pytest
from helpers import ROOT, needs

SCRIPT = ROOT / "examples" / "nanogpt_wandb.py"


def test_the_script_is_a_wandb_script_but_for_its_import():
    code = SCRIPT.read_text()
    docstring = ast.get_docstring(ast.parse(code), clean=False)
    body = code.replace(docstring, "")
    ours = [line for line in body.splitlines() if "expr_tracker" in line]
    assert len(ours) == 1 and ours[0].startswith("import expr_tracker as wandb")
    calls = set(re.findall(r"\bwandb\.(\w+(?:\.\w+)?)", code))
    assert {
        "init",
        "config.learning_rate",
        "define_metric",
        "log",
        "run.summary",
        "summary",
    } <= calls
    assert {"run.name", "run.id", "finish"} <= calls


@pytest.mark.slow
@needs("torch")
def test_nanogpt_style_training_is_tracked(tmp_path):
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "max_iters=40", "eval_interval=10"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    run_dir = tmp_path / "runs" / "nanogpt" / "tiny-shakespeare"
    assert "run tiny-shakespeare (id tiny-shakespeare)" in p.stdout

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["iter"] for r in rows] == [0, 10, 20, 30, 40]
    assert [r["_step"] for r in rows] == [0, 1, 2, 3, 4]
    for r in rows:
        assert {"train/loss", "val/loss", "lr", "mfu"} <= set(r)
    assert rows[-1]["train/loss"] < rows[0]["train/loss"]  # it learned

    summary = json.loads((run_dir / "summary.json").read_text())
    val = [r["val/loss"] for r in rows]
    assert summary["val/loss"] == {"min": min(val)}  # define_metric("val/loss", summary="min")
    assert summary["best_val_loss"] == min(val)  # wandb.run.summary[...] = ...
    assert summary["n_params"] > 0  # wandb.summary[...] = ...
    assert summary["train/loss"] == rows[-1]["train/loss"]  # no definition: the last value

    config = json.loads((run_dir / "config.json").read_text())
    assert config["learning_rate"] == 3e-3 and config["max_iters"] == 40
    assert config["wandb_project"] == "nanogpt"

    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "finished" and info["steps"] == 5
    defs = json.loads((run_dir / "metric_defs.json").read_text())
    assert defs["definitions"] == [
        {
            "name": "val/loss",
            "step_metric": None,
            "summary": "min",
            "hidden": None,
            "goal": None,
            "step_sync": None,
        }
    ]


@pytest.mark.slow
@needs("torch")
def test_three_launches_under_one_name_never_merge_another_learning_rate(tmp_path):
    """nanoGPT names every run with a constant: launched twice with one config, the second
    launch continues the first run (a restart); a third with another learning rate is
    tiny-shakespeare-2, with its own config.json, and the first run's config is unchanged
    (issue 21, point 2)."""

    def launch(*overrides: str) -> subprocess.CompletedProcess:
        p = subprocess.run(
            [sys.executable, str(SCRIPT), *overrides],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert p.returncode == 0, p.stdout + p.stderr
        return p

    # the same values in another order, a default given explicitly: the same config
    first = launch("max_iters=20", "eval_interval=10")
    again = launch("eval_interval=10", "max_iters=20", "learning_rate=0.003")
    other = launch("max_iters=20", "eval_interval=10", "learning_rate=0.001")
    project = tmp_path / "runs" / "nanogpt"
    assert sorted(d.name for d in project.iterdir()) == ["tiny-shakespeare", "tiny-shakespeare-2"]
    run, new = project / "tiny-shakespeare", project / "tiny-shakespeare-2"

    assert "expr_tracker:" not in first.stderr
    (resumed,) = [line for line in again.stderr.splitlines() if line.startswith("expr_tracker:")]
    assert "resuming run nanogpt/tiny-shakespeare at step 3" in resumed
    (moved,) = [line for line in other.stderr.splitlines() if line.startswith("expr_tracker:")]
    assert "learning_rate: 0.003 -> 0.001" in moved and "and 1 more" not in moved
    assert "starting run nanogpt/tiny-shakespeare-2" in moved and "resume='must'" in moved
    assert "run tiny-shakespeare-2 (id tiny-shakespeare-2)" in other.stdout

    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["_step"] for r in rows] == list(range(6))  # two launches of 3 rows
    assert [r["iter"] for r in rows] == [0, 10, 20] * 2
    new_rows = [json.loads(line) for line in (new / "metrics.jsonl").read_text().splitlines()]
    assert [r["_step"] for r in new_rows] == [0, 1, 2]
    assert json.loads((run / "config.json").read_text())["learning_rate"] == 3e-3
    assert not {"arg", "key", "value"} & set(json.loads((run / "config.json").read_text()))
    assert json.loads((new / "config.json").read_text())["learning_rate"] == 1e-3
    info = json.loads((run / "run.json").read_text())
    assert [a["status"] for a in info["previous_attempts"]] == ["finished"]
    assert "config_changes" not in info
    new_info = json.loads((new / "run.json").read_text())
    assert new_info["requested_name"] == "tiny-shakespeare"
    assert new_info["init_config"]["learning_rate"] == 1e-3
    assert "previous_attempts" not in new_info


@pytest.mark.slow
@needs("torch")
def test_wandb_log_false_trains_without_a_run(tmp_path):
    """nanoGPT's switch: wandb_log=False (a bool, not bool("False")) trains, records nothing."""
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "max_iters=2", "eval_interval=1", "wandb_log=False"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "step 2:" in p.stdout and not (tmp_path / "runs").exists()
