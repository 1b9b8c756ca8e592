"""Issue 10, what the user sees in history: et.history(stream=) on a live run, lines
without ``_step``, the same value logged twice in one step."""

from __future__ import annotations

import json
import logging
import math

import pytest
from helpers import run_py

import expr_tracker as et
from expr_tracker.history import read_history
from expr_tracker.history.reader import JsonlReader


def start(tmp_path, **kw):
    return et.init(project="p", name="r", dir=str(tmp_path), **kw)


# ---------------------------------------------------------------- history(stream=)


def test_history_stream_on_a_live_run_reads_that_stream(tmp_path):
    run = start(tmp_path)
    for i in range(3):
        et.log({"main": i})
    # another process writes the "data" stream of the same run
    run_py(
        """
        import sys, expr_tracker as et
        et.init(project="p", name="r", dir=sys.argv[1], stream="data")
        for i in range(2):
            et.log({"queue": 10 + i})
        et.finish()
        """,
        str(tmp_path),
    )
    rows = et.history(stream="data")
    assert [(r["_step"], r["queue"]) for r in rows] == [(0, 10), (1, 11)]
    assert not any("main" in r for r in rows)
    assert [r["main"] for r in et.history()] == [0, 1, 2]  # the run's own stream
    assert [r["main"] for r in et.history(stream=None)] == [0, 1, 2]
    assert len(et.history(run=run, stream="data")) == 2
    assert [r["queue"] for r in et.history(1, stream="data", metrics=["queue"])] == [11]
    with pytest.raises(FileNotFoundError, match=r"metrics\.nope\.jsonl"):
        et.history(stream="nope")
    with pytest.raises(ValueError, match="stream"):
        et.history(stream="../x")


@pytest.mark.parametrize("stream", ["x" * 250, "a/b", "rank3"])
def test_a_stream_name_et_init_refuses_is_the_same_spec_error(tmp_path, stream):
    """et.history(run=..., stream=...) with a name no run can have (base code: OSError
    "File name too long" for 250 characters): the SpecError et.init gives for it."""
    from expr_tracker.spec import SpecError

    run = start(tmp_path)
    et.log({"a": 1})
    with pytest.raises(SpecError) as by_history:
        et.history(stream=stream)  # the live run's other stream
    et.finish()
    with pytest.raises(SpecError) as by_init:
        et.init(project="p", name="other", dir=str(tmp_path), stream=stream)
    with pytest.raises(SpecError) as offline:
        et.history(run=run.dir, stream=stream)
    with pytest.raises(SpecError) as read:
        read_history(run.dir, stream=stream)
    want = str(by_init.value).replace("et.init()", "et.history()")
    assert str(by_history.value) == str(offline.value) == str(read.value) == want
    assert [i.path for i in offline.value.issues] == ["stream"]


def test_history_of_its_own_stream_by_name_is_the_live_one(tmp_path):
    start(tmp_path, stream="worker")
    et.log({"a": 1})
    et.log({"a": 2}, commit=False)  # open, not on disk: only the live store has it
    assert [r["a"] for r in et.history(stream="worker")] == [1, 2]


# ---------------------------------------------------------------- lines without _step

LINES = [
    {"_step": 0, "loss": 1.0},
    {"loss": 99.0},  # no _step: not a row
    {"_step": "1", "loss": 98.0},  # a string step: not a row
    {"_step": 1.0, "loss": 97.0},  # a float step: not a row
    [1, 2],  # not an object
    {"_step": 1, "loss": 0.5},
    {"_step": 2, "loss": 0.25},
]


def _write(path, items):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(x) + "\n" for x in items) + "not json\n" + "\n")
    return path


def test_lines_without_step_are_never_rows(tmp_path, caplog):
    path = _write(tmp_path / "other" / "metrics.jsonl", LINES)
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        for rows in (
            read_history(path),
            et.history(run=path),
            et.history(2, run=path),
            read_history(path, step_range=(0, 3)),
            JsonlReader(path).tail(10),
            JsonlReader(path).tail_rows(10),
        ):
            assert rows and all(type(r.get("_step")) is int for r in rows)
            assert not any(r.get("loss") in (99.0, 98.0, 97.0) for r in rows)
    assert [r["_step"] for r in read_history(path)] == [0, 1, 2]
    warned = [r for r in caplog.records if "without an integer _step" in r.getMessage()]
    assert len(warned) == 1  # once per file
    reader = JsonlReader(path)
    reader.read_all()
    assert reader.stats()["no_step"] == 3  # of 6 skipped: + [1, 2], "not json", a blank line
    assert reader.stats()["skipped"] == 6


def test_lines_without_step_in_a_live_run_are_counted_in_info(tmp_path):
    path = tmp_path / "p" / "r" / "metrics.jsonl"
    _write(path, LINES)
    start(tmp_path)  # resumes after step 2; the file is the disk prefix
    et.log({"loss": 0.1})
    rows = et.history(-1)
    assert [r["_step"] for r in rows] == [0, 1, 2, 3]
    info = et.info()
    assert info["history"]["disk_lines_no_step"] >= 3
    assert info["history"]["disk_lines_skipped"] >= 5
    assert any("no_step" in k for k in info["warnings"])


# ---------------------------------------------------------------- the same key twice


def test_same_value_twice_in_one_step_is_not_warned(tmp_path, caplog):
    start(tmp_path)
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        et.log({"a": 1, "b": "x", "c": [1, 2], "d": math.nan}, commit=False)
        et.log({"a": 1, "b": "x", "c": [1, 2], "d": math.nan})
        et.log({"e": 0.5}, step=5)
        et.log({"e": 0.5}, step=5)
    assert not [r for r in caplog.records if "logged twice" in r.getMessage()]
    assert not any("last_wins" in str(k) for k in et.info()["warnings"])
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        et.log({"e": 0.75}, step=5)  # a different value: warned (the last wins)
    assert len([r for r in caplog.records if "logged twice" in r.getMessage()]) == 1
    et.finish()


def test_an_int_and_a_float_of_equal_value_are_different_values(tmp_path, caplog):
    start(tmp_path)
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        et.log({"a": 1}, commit=False)
        et.log({"a": 1.0})  # written differently (1 vs 1.0): the user is told
    assert len([r for r in caplog.records if "logged twice" in r.getMessage()]) == 1
