"""Run-level calls as users of the spec's API and wandb write them (docs/api.md): ``et.info()``
names, ``Run.backends``/``Run.tags``, ``et.summary`` keys, ``et.log(data=...)``."""

from __future__ import annotations

import json

import pytest

import expr_tracker as et


class Recorder:
    """A backend object (init/log/finish) that keeps what it is handed."""

    name = "rec"

    def __init__(self):
        self.rows = []

    def init(self, **info):
        self.info = info

    def log(self, metrics, step):
        self.rows.append((step, metrics))

    def finish(self):
        pass


def test_info_carries_the_spec_names(tmp_path):
    run = et.init(
        project="p",
        name="info",
        dir=tmp_path / "runs",
        alert_rules=["lossx > 1 => warn: never logged", "loss > 3 => error: high"],
    )
    info = et.info()
    assert info["history"]["last_step"] is None  # nothing committed yet
    et.log({"loss": 1.0, "eval.acc": 0.5})
    et.log({"loss": 0.5})
    info = et.info()
    h = info["history"]
    assert h["log_dir"] == str(run.dir)
    assert h["metrics_file"] == str(run.dir / "metrics.jsonl")
    assert h["last_step"] == 1
    assert info["summary"] == {"loss": 0.5, "eval.acc": 0.5}
    assert info["artifacts"]["root"] == str(tmp_path / "runs" / "p" / "artifacts")
    rules = info["alerts"]["rules"]
    by_condition = {name.split(" [")[0]: stats for name, stats in rules.items()}
    assert by_condition["lossx > 1"]["unresolved_metrics"] == ["lossx"]
    assert by_condition["loss > 3"]["unresolved_metrics"] == []
    et.finish()


def test_info_last_step_after_a_resume_is_the_files(tmp_path):
    for _ in range(2):
        et.init(project="p", name="again", dir=tmp_path / "runs")
        if et.info()["history"]["last_step"] is None:
            et.log({"x": 1})
            et.log({"x": 2})
        else:
            assert et.info()["history"]["last_step"] == 1
        et.finish()


def test_run_backends_by_name_and_tags_as_a_list(tmp_path):
    rec = Recorder()
    run = et.init(project="p", name="mirrors", dir=tmp_path / "runs", backends=[rec], tags=["a"])
    assert run.backends == {"rec": rec}
    assert run.tags == ["a"] and isinstance(run.tags, list)
    run.tags.append("lost")  # a copy: assign to change the tags
    assert run.tags == ["a"]
    run.tags = [*run.tags, "b"]
    assert run.tags == ["a", "b"]
    assert json.loads((run.dir / "run.json").read_text())["tags"] == ["a", "b"]
    et.log({"x": 1})
    et.finish()
    assert rec.rows == [(0, {"x": 1})]


def test_run_backends_empty_without_mirrors_and_on_a_rank_left_out(tmp_path, monkeypatch):
    assert et.init(project="p", name="none", dir=tmp_path / "runs").backends == {}
    et.finish()
    monkeypatch.setenv("RANK", "2")
    run = et.init(project="p", name="ranked", dir=tmp_path / "runs", backends=[Recorder()])
    assert run.backends == {}  # backend_on_rank: 0 by default
    et.finish()


def test_backend_on_rank_null_mirrors_on_every_rank(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "2")
    rec = Recorder()
    run = et.init(
        project="p",
        name="null",
        dir=tmp_path / "runs",
        backends=[rec],
        spec={"backend_on_rank": None},
    )
    assert run.spec.backend_on_rank == "all" and run.backends == {"rec": rec}
    et.log({"x": 1})
    et.finish()
    assert rec.rows == [(0, {"x": 1})]


def test_summary_holds_only_logged_keys_as_given(tmp_path):
    run = et.init(project="p", name="summary", dir=tmp_path / "runs")
    et.log({"loss": 1.0, "eval.acc": 0.25, " spaced ": 3, "x/y": 2})
    et.log({})  # a row holding only _step/_time adds nothing
    et.summary["best"] = 0.9
    expected = {"loss": 1.0, "eval.acc": 0.25, " spaced ": 3, "x/y": 2, "best": 0.9}
    assert dict(et.summary()) == expected
    assert et.summary().to_dict() == expected and len(et.summary) == 5
    assert "_step" not in et.summary and "_time" not in et.summary
    with pytest.raises(KeyError):
        et.summary()["_step"]
    assert run.info()["summary"] == expected
    et.finish()
    saved = json.loads((run.dir / "summary.json").read_text())
    assert saved["_step"] == 1  # the file keeps the step it had seen, for a resume
    assert {k: v for k, v in saved.items() if not k.startswith("_")} == expected
    # resumed: caught up from the file, still without _step/_time
    et.init(project="p", name="summary", dir=tmp_path / "runs")
    assert dict(et.summary()) == expected
    et.finish()


def test_log_takes_wandbs_data_keyword(tmp_path):
    run = et.init(project="p", name="data", dir=tmp_path / "runs")
    assert et.log(data={"a": 1}) == 0
    assert et.log(data={"b": 2}, step=5) == 5
    et.log(data={"c": 3}, step=5, commit=True)
    assert run.log(data={"d": 4}) == 6
    with pytest.raises(TypeError, match="both metrics and data"):
        et.log({"a": 1}, data={"b": 2})
    with pytest.raises(TypeError, match="both metrics and data"):
        run.log({"a": 1}, data={"b": 2})
    with pytest.raises(TypeError, match="mapping"):
        et.log()  # neither: the usual error
    assert [{k: v for k, v in r.items() if k != "_time"} for r in et.history()] == [
        {"a": 1, "_step": 0},
        {"b": 2, "c": 3, "_step": 5},
        {"d": 4, "_step": 6},
    ]
    et.finish()


def test_disabled_run_log_takes_data_too():
    run = et.init(project="p", name="off", mode="disabled")
    assert et.log(data={"a": 1}) == 0 and run.log(data={"a": 2}) == 1
    et.finish()
