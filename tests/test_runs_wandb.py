"""The wandb-style Run (expr_tracker/runs.py): attributes, ``with`` blocks, ``et.Run``
independent runs, the disabled run, ``finish(exit_code, quiet)``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest
from helpers import wait_or_dump

import expr_tracker as et
from expr_tracker.spans import core as span_core


def _info(run):
    return json.loads((run.dir / "run.json").read_text())


def test_attributes():
    run = et.init(
        project="p",
        name="r",
        tags=["a", "b"],
        notes="first try",
        group="sweep1",
        entity="team",
        job_type="train",
    )
    assert (run.id, run.name, run.project) == ("r", "r", "p")
    assert (run.entity, run.job_type, run.group) == ("team", "train", "sweep1")
    assert run.tags == ["a", "b"] and run.notes == "first try"
    assert run.url is None and run.resumed is False and run.offline and not run.disabled
    assert run.start_time == _info(run)["started_at"] > 0
    assert run.step == 0
    et.log({"x": 1})
    et.log({"x": 2}, commit=False)
    assert run.step == 1  # the open step: the next plain log() writes it
    et.log({"x": 3}, step=10)
    assert run.step == 10
    run.tags = ["c"]
    run.notes = "changed"
    info = _info(run)
    assert info["tags"] == ["c"] and info["notes"] == "changed"
    assert info["entity"] == "team" and info["job_type"] == "train"
    with pytest.raises(TypeError):
        run.tags = "not-a-list"


def test_resumed_by_id():
    et.init(project="p", id="abc")
    et.log({"x": 1})
    et.finish()
    run = et.init(project="p", id="abc", resume="must")
    assert run.resumed and run.id == "abc" and run.step == 1


def test_assigning_run_name_keeps_the_identity_and_records_a_display_name(caplog):
    # wandb scripts rename the run for its UI: `wandb.run.name = f"lr{lr}-{wandb.run.id}"`;
    # the id saved for resuming must stay the one et.init(id=...) continues
    run = et.init(project="p", name="r")
    with caplog.at_level("WARNING", logger="expr_tracker"):
        et.run.name = f"lr0.1-{et.run.id}"
    assert (run.name, run.id, run.dir.name) == ("r", "r", "r")
    assert _info(run)["display_name"] == "lr0.1-r" and "display_name" in caplog.text
    with pytest.raises(TypeError, match="string"):
        run.name = 5
    run_id = run.id
    et.finish()
    assert _info(run)["display_name"] == "lr0.1-r"
    again = et.init(project="p", id=run_id, resume="must")
    assert again.dir == run.dir and again.resumed
    et.finish()


def test_with_block_finishes_the_run():
    with et.init(project="p", name="r") as run:
        assert et.run is run
        et.log({"x": 1})
    assert run.finished and et.run is None
    assert _info(run)["status"] == "finished"


def test_with_block_that_raises_marks_the_run_failed():
    with pytest.raises(ZeroDivisionError):
        with et.init(project="p", name="r") as run:
            et.log({"x": 1})
            1 / 0  # noqa: B018
    assert run.finished and et.run is None
    info = _info(run)
    assert info["status"] == "failed"
    assert info["exception"]["type"] == "ZeroDivisionError"
    assert "1 / 0" in info["exception"]["traceback"]


def test_finish_exit_code_and_quiet():
    run = et.init(project="p", name="r")
    et.finish(exit_code=3, quiet=True)
    assert run.quiet and _info(run)["status"] == "failed" and _info(run)["exit_code"] == 3


def test_independent_run_is_not_the_current_one():
    current = et.init(project="p", name="main")
    other = et.Run(project="p", name="eval", config={"split": "val"}, tags=["eval"])
    assert isinstance(other, et.Run) and other is not current and et.run is current
    assert other.independent and not current.independent
    with et.span("step"):
        et.log({"loss": 1.0})
    other.log({"acc": 0.5})
    other.summary["best"] = 0.5
    other.config.update({"extra": 1})
    assert span_core.get_active_recorder() is current.spans  # spans go to the current run
    other.finish()
    assert et.run is current and not current.finished
    et.finish()
    main_rows = [json.loads(x) for x in (current.dir / "metrics.jsonl").read_text().splitlines()]
    eval_rows = [json.loads(x) for x in (other.dir / "metrics.jsonl").read_text().splitlines()]
    assert any("time_ms/step" in r for r in main_rows)  # the span's time: current run
    assert [r["loss"] for r in main_rows if "loss" in r] == [1.0]
    assert [set(r) - {"_step", "_time"} for r in eval_rows] == [{"acc"}]
    assert not (other.dir / "spans.jsonl").exists() or not (other.dir / "spans.jsonl").read_text()
    assert json.loads((other.dir / "summary.json").read_text())["best"] == 0.5
    assert "best" not in json.loads((current.dir / "summary.json").read_text())
    assert json.loads((other.dir / "config.json").read_text()) == {"split": "val", "extra": 1}
    assert json.loads((other.dir / "run.json").read_text())["tags"] == ["eval"]


def test_two_independent_runs_without_a_current_one():
    a = et.Run(project="p", name="a")
    b = et.Run(project="p", name="b")
    assert et.run is None
    threads = [
        threading.Thread(target=lambda r=r: [r.log({"i": i}) for i in range(200)]) for r in (a, b)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    a.finish()
    b.finish()
    for r in (a, b):
        rows = [json.loads(x) for x in (r.dir / "metrics.jsonl").read_text().splitlines()]
        assert [x["i"] for x in rows] == list(range(200))


def test_independent_run_of_the_same_name_is_refused_by_the_lock():
    et.init(project="p", name="r")
    # the message says the holder is this process (it said "another live process")
    with pytest.raises(et.RunLockedError, match=r"a run open in this process.*run\.finish\(\)"):
        et.Run(project="p", name="r")
    et.finish()
    et.Run(project="p", name="r").finish()  # once finished, the same name is free


def test_independent_run_in_a_with_block_and_at_exit(tmp_path):
    with et.Run(project="p", name="w") as run:
        run.log({"x": 1})
    assert run.finished and _info(run)["status"] == "finished"
    from helpers import run_py

    run_py(
        """
        import sys, expr_tracker as et
        r = et.Run(project="p", name="left-open", dir=sys.argv[1])
        r.log({"x": 1})
        """,
        str(tmp_path / "out"),
    )
    info = json.loads((tmp_path / "out" / "p" / "left-open" / "run.json").read_text())
    assert info["status"] == "finished"  # finished by the exit hook


def test_reinit_modes():
    first = et.init(project="p", name="a")
    with pytest.raises(et.RunAlreadyActiveError, match="reinit"):
        et.init(project="p", name="b")
    assert et.init(project="p", name="zzz", reinit="return_previous") is first
    new = et.init(project="p", name="c", reinit="create_new")
    assert et.run is first and new.independent
    new.finish()
    second = et.init(project="p", name="d", reinit=True)
    assert first.finished and et.run is second and _info(first)["status"] == "finished"
    third = et.init(project="p", name="e", reinit="finish_previous")
    assert second.finished and et.run is third


def test_disabled_run_writes_nothing(tmp_path):
    run = et.init(project="p", name="r", mode="disabled", config={"lr": 0.1})
    assert isinstance(run, et.Run) and run.disabled and et.run is run
    assert et.log({"x": 1}) == 0 and et.log({"x": 2}) == 1 and run.step == 2
    assert et.log({"y": 1}, commit=False) == 2 and run.step == 2
    et.config.update({"bs": 8})
    assert et.config.lr == 0.1 and et.config.bs == 8
    et.summary["best"] = 1.0
    et.define_metric("x", summary="max")
    assert et.summary["best"] == 1.0
    assert et.history() == []
    with et.span("s"):
        pass
    assert et.alert("t") is False
    data = tmp_path.parent / f"{tmp_path.name}-data.txt"
    data.write_text("x")
    assert et.log_artifact(str(data), name="data") is None  # training code runs unchanged
    assert et.list_alert_rules() == [] and et.add_alert_rule("x > 1 => warn: x") is None
    with pytest.raises(et.NoActiveRunError, match=r"no artifact store \(mode='disabled'"):
        et.use_artifact("data")
    et.finish()
    data.unlink()
    assert run.finished and et.run is None
    assert os.listdir(tmp_path) == []  # no runs/ directory at all


def test_disabled_with_block_and_independent(tmp_path):
    with et.init(project="p", mode="disabled") as run:
        run.log({"x": 1})
    other = et.Run(project="p", mode="disabled")
    other.log({"x": 1})
    other.finish()
    assert run.finished and other.finished and os.listdir(tmp_path) == []


def test_a_run_cannot_be_copied_or_pickled(tmp_path):
    import copy
    import pickle

    run = et.init(project="p", name="r")
    for attempt in (lambda: copy.copy(run), lambda: copy.deepcopy(run), lambda: pickle.dumps(run)):
        with pytest.raises(TypeError, match="cannot be copied"):
            attempt()
    assert sorted(os.listdir(tmp_path / "runs" / "p")) == ["r"]  # no second run was built


SIGTERM_AFTER_RUN_FINISH = """
import sys, time, expr_tracker as et
mode = sys.argv[2]
if mode == "finished":  # wandb style: run.finish(), then post-processing
    run = et.init(project="p", name="r", dir=sys.argv[1])
    run.log({"a": 1})
    run.finish()
elif mode == "finishing":  # SIGTERM while run.finish() (not et.finish()) drains
    run = et.init(project="p", name="r", dir=sys.argv[1])
    run.log({"a": 1})
    # "ready" from inside finish(): the signal surely arrives while it runs
    run.add_closer("slow", lambda: (print("ready", flush=True), time.sleep(2)))
    run.finish()
else:  # only an independent run (the earlier expr_tracker's et.Run)
    run = et.Run(project="p", name="r", dir=sys.argv[1])
    run.define_metric("a", summary="min")
    run.log({"a": 1})
    run.summary["best"] = 1
print("ready", flush=True)
# short sleeps: a signal landing between the interpreter's last check and the start
# of one long sleep would be handled only when that sleep ends (CPython)
for _ in range(600):
    time.sleep(0.05)
print("SIGTERM was ignored", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["finished", "finishing", "independent"])
def test_sigterm_with_a_finished_or_an_independent_run(tmp_path, mode):
    # SIGTERM after run.finish() was swallowed (the process went on), and so was one that
    # arrived while run.finish() ran; with only an independent run open, the process died
    # without finishing it (run.json "running")
    p = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-c", SIGTERM_AFTER_RUN_FINISH]
        + [str(tmp_path / "runs"), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with p:  # killed and its pipes closed whatever fails: nothing left for the next test
        try:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()
            p.send_signal(signal.SIGTERM)
            status = wait_or_dump(p, 30)
            # read, not communicate(): readline() left the rest in the buffer
            out, err = p.stdout.read(), p.stderr.read()
        finally:
            p.kill()
    assert status == 128 + signal.SIGTERM, err
    assert "ignored" not in out
    run_dir = tmp_path / "runs" / "p" / "r"
    info = json.loads((run_dir / "run.json").read_text())
    if mode in ("finished", "finishing"):
        assert info["status"] == "finished"
    else:
        assert info["status"] == "failed" and info["signal"] == "SIGTERM"
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["a"] == {"min": 1} and summary["best"] == 1


@pytest.mark.parametrize("bad", ["1", 2.5, True, [1]])
def test_finish_exit_code_must_be_an_int(bad):
    # a string or a float was recorded as run.json's exit_code as given (and reached the
    # mirrors' finish); the error names the keyword and the value, the run stays open
    run = et.init(project="p", name="r")
    with pytest.raises(TypeError, match=r"exit_code=.*must be an int"):
        et.finish(exit_code=bad)
    assert et.run is run and not run.finished
    et.finish(exit_code=3)
    assert _info(run)["status"] == "failed" and _info(run)["exit_code"] == 3
