"""Accelerate's tracker API onto a run: a real ``Accelerator`` on the CPU training a tiny model.

``ExprTrackerTracker`` (expr_tracker/integrations/accelerate.py) as an instance and by name,
its rows and steps, the config, the final status, joining a user's run, a failing loop, and
two processes of one launch where only the main one writes.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
from helpers import ROOT, read_lines, run_py

# a real Accelerator and torch (seconds to import): not collected under -m "not slow"
pytestmark = pytest.mark.slow
pytest.importorskip("accelerate")
torch = pytest.importorskip("torch")

import expr_tracker as et  # noqa: E402
from expr_tracker.integrations.accelerate import ExprTrackerTracker  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """Each test builds its own ``Accelerator``; Accelerate keeps its state per process."""
    yield
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)


def _train(accelerator, steps=3, *, with_step=True, span=True):
    """A tiny Linear model on random data; returns the losses logged."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    losses = []
    for i in range(steps):
        x, y = torch.randn(8, 4), torch.randn(8, 1)
        if span:
            with et.span("forward"):
                loss = torch.nn.functional.mse_loss(model(x), y)
        else:
            loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        accelerator.log({"loss": losses[-1]}, step=i if with_step else None)
    return losses


def _status(run_dir):
    return json.loads((run_dir / "run.json").read_text())["status"]


def test_instance_logs_rows_at_accelerate_steps_config_and_finishes():
    from accelerate import Accelerator

    tracker = ExprTrackerTracker(
        project="acc", name="r1", spec={"tags": ["accel"]}, config={"model": "linear"}
    )
    accelerator = Accelerator(cpu=True, log_with=tracker)
    accelerator.init_trackers("unused-by-instances", config={"lr": 0.1, "batch_size": 8})
    run = accelerator.get_tracker("expr_tracker", unwrap=True)
    assert run is tracker.tracker and run is et.run and run.tags == ["accel"]
    losses = _train(accelerator)
    accelerator.end_training()

    assert run.finished and et.run is None
    rows = read_lines(run.dir / "metrics.jsonl")
    assert [r["_step"] for r in rows] == [0, 1, 2]
    assert [r["loss"] for r in rows] == pytest.approx(losses)
    assert all(r["time_ms/forward"] > 0 for r in rows)  # the user's spans on those steps
    assert json.loads((run.dir / "config.json").read_text()) == {
        "model": "linear",
        "lr": 0.1,
        "batch_size": 8,
    }
    assert _status(run.dir) == "finished"
    assert run.dir.parent.name == "acc"
    tracker.finish()  # a second finish (end_training twice) does nothing


@pytest.mark.parametrize("form", ["path", "dict", "DictConfig"])
def test_spec_in_every_form_and_init_keywords_reach_the_run(form, tmp_path):
    from accelerate import Accelerator

    spec = {"tags": ["accel"], "alerts": {"rules": ["loss > 100 => error: exploded"]}}
    if form == "path":
        (tmp_path / "tracker.yaml").write_text(
            "tags: [accel]\nalerts:\n  rules: ['loss > 100 => error: exploded']\n"
        )
        spec = str(tmp_path / "tracker.yaml")
    elif form == "DictConfig":
        spec = pytest.importorskip("omegaconf").OmegaConf.create(spec)
    tracker = ExprTrackerTracker(project="acc", name=form, spec=spec, notes="n", dir="out")
    accelerator = Accelerator(cpu=True, log_with=tracker)
    accelerator.init_trackers("acc")
    run = tracker.tracker
    assert run.tags == ["accel"] and run.notes == "n"
    assert [r.source for r in et.list_alert_rules()] == ["loss > 100"]
    accelerator.log({"loss": 1000.0}, step=3)
    accelerator.end_training()
    fired = [a for a in read_lines(run.dir / "alerts.jsonl") if a.get("state") == "firing"]
    assert [a["step"] for a in fired] == [3]  # the rule saw accelerate's step
    assert run.dir.resolve() == (tmp_path / "out" / "acc" / form).resolve()
    assert _status(run.dir) == "finished"


@pytest.mark.parametrize("with_step", [True, False])
def test_a_span_around_the_whole_step_holding_accelerator_log(with_step):
    """``accelerator.log`` inside a span over the whole step: with ``step=i`` the span joins
    step ``i``, open when it ends (base code: one row late); without a step, log() commits
    the step inside the span, so the span lands in the next step (docs/spans.md "Which row a
    span joins")."""
    from accelerate import Accelerator

    tracker = ExprTrackerTracker(project="acc", name=f"inside-{with_step}")
    accelerator = Accelerator(cpu=True, log_with=tracker)
    accelerator.init_trackers("acc")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    for i in range(3):
        with et.span("step", i=i):
            loss = torch.nn.functional.mse_loss(model(torch.randn(8, 4)), torch.randn(8, 1))
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            accelerator.log({"loss": loss.item()}, step=i if with_step else None)
    accelerator.end_training()
    run_dir = tracker.tracker.dir
    rows = {r["_step"]: r for r in read_lines(run_dir / "metrics.jsonl")}
    spans = read_lines(run_dir / "spans.jsonl")
    shift = 0 if with_step else 1
    assert [(s["_step"], s["args"]["i"]) for s in spans] == [(i + shift, i) for i in range(3)]
    assert [s for s, r in rows.items() if "time_ms/step" in r] == [i + shift for i in range(3)]
    assert [s for s, r in rows.items() if "loss" in r] == [0, 1, 2]


def test_log_without_step_takes_the_runs_next_step_and_log_kwargs():
    from accelerate import Accelerator

    tracker = ExprTrackerTracker(project="acc", name="nostep")
    accelerator = Accelerator(cpu=True, log_with=tracker)
    accelerator.init_trackers("acc")
    _train(accelerator, steps=2, with_step=False, span=False)
    accelerator.log({"eval/acc": 0.5}, step=10)
    accelerator.log({"eval/f1": 0.4}, log_kwargs={"expr_tracker": {"commit": True}})
    accelerator.log({"late": 1})
    accelerator.log({"x": torch.tensor(2.0)}, step=torch.tensor(20))  # a tensor step
    accelerator.end_training()

    rows = read_lines(tracker.tracker.dir / "metrics.jsonl")
    assert [r["_step"] for r in rows] == [0, 1, 10, 11, 20]
    assert rows[2] == {**rows[2], "eval/acc": 0.5, "eval/f1": 0.4}
    assert rows[3]["late"] == 1 and rows[4]["x"] == 2.0


def test_by_name_takes_project_name_and_init_kwargs(tmp_path):
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True, log_with="expr_tracker")
    accelerator.init_trackers(
        "byname",
        config={"lr": 0.01},
        init_kwargs={"expr_tracker": {"name": "r2", "dir": str(tmp_path / "elsewhere")}},
    )
    tracker = accelerator.get_tracker("expr_tracker")
    assert isinstance(tracker, ExprTrackerTracker)
    _train(accelerator, steps=2)
    accelerator.end_training()

    run_dir = tmp_path / "elsewhere" / "byname" / "r2"
    assert tracker.tracker.dir.resolve() == run_dir.resolve()
    assert [r["_step"] for r in read_lines(run_dir / "metrics.jsonl")] == [0, 1]
    assert json.loads((run_dir / "config.json").read_text()) == {"lr": 0.01}
    assert _status(run_dir) == "finished"


def test_joins_the_users_run_and_never_finishes_it(caplog):
    from accelerate import Accelerator

    run = et.init(project="mine", name="outer", config={"seed": 1})
    et.log({"setup": 1})  # step 0, the user's own
    tracker = ExprTrackerTracker(project="other", spec={"tags": ["x"]}, config={"opt": "sgd"})
    accelerator = Accelerator(cpu=True, log_with=tracker)
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        accelerator.init_trackers("other", config={"lr": 0.1})
    assert tracker.tracker is run
    joined = [r.getMessage() for r in caplog.records if "joins the current run" in r.getMessage()]
    assert len(joined) == 1 and "project='other'" in joined[0] and "spec" in joined[0]
    _train(accelerator, steps=2, with_step=False)  # steps 1 and 2: the run's steps go on
    accelerator.end_training()

    assert not run.finished and et.run is run  # still the user's
    et.log({"after": 1}, step=5)
    et.finish()
    rows = read_lines(run.dir / "metrics.jsonl")
    assert [r["_step"] for r in rows] == [0, 1, 2, 5]
    config = json.loads((run.dir / "config.json").read_text())
    assert config == {"seed": 1, "opt": "sgd", "lr": 0.1}
    assert _status(run.dir) == "finished"


def test_the_docs_example_runs_twice():
    # a user runs the example script again: its assertions hold for the second launch too
    from accelerate.state import AcceleratorState

    text = (ROOT / "docs" / "integrations.md").read_text()
    section = text.split("## Accelerate", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    for _ in range(2):
        exec(compile(code, "docs/integrations.md", "exec"), {"__name__": "__main__"})
        AcceleratorState._reset_state(True)


def test_a_bad_log_call_warns_once_and_training_goes_on(caplog):
    from accelerate import Accelerator

    tracker = ExprTrackerTracker(project="acc", name="bad")
    accelerator = Accelerator(cpu=True, log_with=tracker)
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        tracker.log({"early": 1})  # before init_trackers: dropped, warned
        accelerator.init_trackers("acc")
        for _ in range(2):
            accelerator.log(["not", "a", "mapping"])
            accelerator.log({"ok": 1}, log_kwargs={"expr_tracker": {"tags": "x"}})
    accelerator.end_training()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("before init_trackers" in m for m in messages) == 1
    assert sum("log() failed" in m and "TypeError" in m for m in messages) == 1
    assert sum("ignores tags" in m for m in messages) == 1
    rows = read_lines(tracker.tracker.dir / "metrics.jsonl")
    assert [r["ok"] for r in rows] == [1, 1]


def test_init_trackers_again_after_end_training_starts_the_next_run():
    from accelerate import Accelerator

    tracker = ExprTrackerTracker(project="acc")
    accelerator = Accelerator(cpu=True, log_with=tracker)
    accelerator.init_trackers("acc")
    first = tracker.tracker
    tracker.start()  # started already: the same run
    assert tracker.tracker is first
    accelerator.log({"a": 1})
    accelerator.end_training()
    tracker.start()
    second = tracker.tracker
    assert first.finished and second is not first and not second.finished
    tracker.finish()
    assert second.finished


def test_a_tracker_with_its_own_name_gets_its_own_run_beside_the_current_one():
    """A second Accelerator's tracker named "B" while run A is current (a nested training
    loop): B gets its own run, A stays current and untouched (issue 21, point 5)."""
    from accelerate import Accelerator

    outer = et.init(project="acc", name="A", config={"lr": 0.1})
    et.log({"outer": 1})
    tracker = ExprTrackerTracker(project="acc", name="B", config={"lr": 0.5})
    accelerator = Accelerator(cpu=True, log_with=tracker)
    accelerator.init_trackers("acc", config={"batch_size": 4})
    inner = tracker.tracker
    assert inner is not outer and inner.name == "B" and et.run is outer
    _train(accelerator, steps=2, span=False)
    accelerator.end_training()
    assert inner.finished and not outer.finished and et.run is outer
    et.log({"outer": 2})
    et.finish()
    assert [r["_step"] for r in read_lines(inner.dir / "metrics.jsonl")] == [0, 1]
    assert [r["outer"] for r in read_lines(outer.dir / "metrics.jsonl")] == [1, 2]
    assert json.loads((outer.dir / "config.json").read_text()) == {"lr": 0.1}
    assert json.loads((inner.dir / "config.json").read_text()) == {"lr": 0.5, "batch_size": 4}
    assert _status(inner.dir) == "finished" and _status(outer.dir) == "finished"


def test_a_joined_runs_config_is_never_replaced(caplog):
    from accelerate import Accelerator

    run = et.init(project="acc", name="users", config={"lr": 0.1})
    tracker = ExprTrackerTracker(project="acc")  # no run of its own: joins
    accelerator = Accelerator(cpu=True, log_with=tracker)
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        accelerator.init_trackers("acc", config={"lr": 0.2, "batch_size": 8})
    assert tracker.tracker is run
    accelerator.end_training()
    et.finish()
    assert json.loads((run.dir / "config.json").read_text()) == {"lr": 0.1, "batch_size": 8}
    kept = [r.getMessage() for r in caplog.records if "never replaced" in r.getMessage()]
    assert len(kept) == 1 and "lr" in kept[0]


@pytest.mark.parametrize("where", ["except", "finally"])
def test_end_training_while_an_exception_is_handled_marks_the_run_failed(where):
    from accelerate import Accelerator

    tracker = ExprTrackerTracker(project="acc", name=f"caught-{where}")
    accelerator = Accelerator(cpu=True, log_with=tracker)
    accelerator.init_trackers("acc", config={"lr": 0.1})
    try:
        try:
            accelerator.log({"loss": 1.0}, step=0)
            raise RuntimeError("diverged")
        except RuntimeError:
            if where == "except":
                accelerator.end_training()  # the caller handles it and ends training
            else:
                raise
        finally:
            if where == "finally":
                accelerator.end_training()
    except RuntimeError:
        pass
    run = tracker.tracker
    assert run.finished and et.run is None
    info = json.loads((run.dir / "run.json").read_text())
    assert info["status"] == "failed"
    assert info["exception"] == {**info["exception"], "type": "RuntimeError", "message": "diverged"}


def test_a_rerun_with_another_init_trackers_config_is_a_new_run(capsys):
    """init_trackers' config is the config given at init: the same name with another
    config starts <name>-2; with the same config, the run is continued (issue 21, point 2)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    dirs = []
    for lr in (0.1, 0.1, 0.3):
        tracker = ExprTrackerTracker(project="acc", name="again")
        accelerator = Accelerator(cpu=True, log_with=tracker)
        accelerator.init_trackers("acc", config={"lr": lr})
        accelerator.log({"loss": lr})
        accelerator.end_training()
        dirs.append(tracker.tracker.dir.name)
        AcceleratorState._reset_state(True)
    assert dirs == ["again", "again", "again-2"]
    err = capsys.readouterr().err
    assert "resuming run acc/again at step 1" in err
    assert "another config (lr: 0.1 -> 0.3); starting run acc/again-2" in err


FAILING = """
import sys, torch
from accelerate import Accelerator
import expr_tracker as et
from expr_tracker.integrations.accelerate import ExprTrackerTracker

accelerator = Accelerator(cpu=True, log_with=ExprTrackerTracker(project="acc", name="boom"))
accelerator.init_trackers("acc", config={"lr": 0.1})
model = accelerator.prepare(torch.nn.Linear(2, 1))
for i in range(5):
    loss = model(torch.randn(3, 2)).pow(2).mean()
    accelerator.log({"loss": loss.item()}, step=i)
    if i == 2:
        raise RuntimeError("diverged")
accelerator.end_training()
"""


def test_an_exception_in_the_loop_marks_the_run_failed(tmp_path):
    p = run_py(FAILING, check=False, env={"PYTHONPATH": str(ROOT)})
    assert p.returncode == 1 and "diverged" in p.stderr
    run_dir = tmp_path / "runs" / "acc" / "boom"
    assert [r["_step"] for r in read_lines(run_dir / "metrics.jsonl")] == [0, 1, 2]
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "failed"
    assert (
        info["exception"]["type"] == "RuntimeError" and info["exception"]["message"] == "diverged"
    )


def test_importing_expr_tracker_imports_no_framework_and_a_missing_one_names_the_extra():
    run_py(
        "import expr_tracker, expr_tracker.integrations, sys\n"
        "assert 'accelerate' not in sys.modules and 'torch' not in sys.modules"
    )
    p = run_py(
        "import sys\n"
        "sys.modules['accelerate'] = None\n"  # as if not installed
        "import expr_tracker.integrations.accelerate\n",
        check=False,
    )
    assert p.returncode == 1
    assert "pip install 'expr-tracker[accelerate]'" in p.stderr


TWO_PROCESSES = """
import os, sys, torch
from accelerate import Accelerator
import expr_tracker as et
from expr_tracker.integrations.accelerate import ExprTrackerTracker

tracker = ExprTrackerTracker(project="ddp", dir=sys.argv[1])
accelerator = Accelerator(cpu=True, log_with=tracker)
accelerator.init_trackers("ddp", config={"world": accelerator.num_processes})
torch.manual_seed(accelerator.process_index)
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = accelerator.prepare(model, opt)
for i in range(3):
    with et.span("forward"):
        loss = model(torch.randn(4, 3)).pow(2).mean()
    accelerator.backward(loss)
    opt.step()
    opt.zero_grad()
    accelerator.log({"loss": loss.item(), "rank": accelerator.process_index}, step=i)
run = tracker.tracker
os.write(1, f"RANK {accelerator.process_index} {run is not None} {et.get_run() is not None}\\n".encode())
accelerator.end_training()
"""


def test_two_processes_only_the_main_one_logs(tmp_path):
    pytest.importorskip("torch.distributed")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TWO_PROCESSES))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone"]
    p = subprocess.run(
        [*cmd, str(script), str(tmp_path / "runs")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert sorted(line for line in p.stdout.splitlines() if line.startswith("RANK")) == [
        "RANK 0 True True",
        "RANK 1 False False",
    ]
    (run_dir,) = (tmp_path / "runs" / "ddp").iterdir()
    rows = read_lines(run_dir / "metrics.jsonl")
    assert [r["_step"] for r in rows] == [0, 1, 2]
    assert {r["rank"] for r in rows} == {0} and all("time_ms/forward" in r for r in rows)
    assert not list(run_dir.glob("*rank1*"))  # rank 1 wrote nothing
    assert json.loads((run_dir / "config.json").read_text()) == {"world": 2}
    assert _status(run_dir) == "finished"
