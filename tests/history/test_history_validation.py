"""et.history argument checking at the entry (n, step_range, metrics), warnings for unknown
metric names, and the store's query counters existing from construction."""

from __future__ import annotations

import logging

import pytest

import expr_tracker as et
from expr_tracker.history import HistoryStore
from expr_tracker.history.query import check_n, parse_step_range, query_history


def steps(rows):
    return [r["_step"] for r in rows]


@pytest.fixture
def offline(tmp_path):
    run = et.init(project="proj", name="off", dir=str(tmp_path / "runs"))
    for i in range(6):
        et.log({"train/loss": 1.0 / (i + 1), "acc": i / 6})
    et.finish()
    return run.dir


@pytest.fixture
def live(tmp_path, offline):  # after ``offline``: one active run at a time
    et.init(project="proj", name="v", dir=str(tmp_path / "runs"))
    for i in range(6):
        et.log({"train/loss": 1.0 / (i + 1), "acc": i / 6})
    yield
    et.finish()


@pytest.mark.parametrize(
    ("n", "exc", "shown"),
    [
        (2.5, TypeError, "n=2.5"),
        ("3", TypeError, "n='3'"),
        (True, TypeError, "n=True"),
        ([3], TypeError, "n=[3]"),
    ],
)
def test_bad_n_is_rejected_at_the_entry_naming_the_value(live, offline, n, exc, shown):
    for kw in ({}, {"run": offline}):
        with pytest.raises(exc) as info:
            et.history(n, **kw)
        msg = str(info.value)
        assert shown in msg and ">= 0" in msg and "negative/None" in msg


def test_valid_n(live, offline):
    np = pytest.importorskip("numpy")
    assert steps(et.history(-1)) == steps(et.history(None)) == list(range(6))
    # any negative n is everything (as the spec's API reads it), live and offline
    assert steps(et.history(-2)) == steps(et.history(-5)) == list(range(6))
    assert steps(et.history(-7, run=offline)) == list(range(6))
    assert steps(et.history(0)) == []
    assert steps(et.history(np.int64(2))) == [4, 5]
    assert steps(et.history(2, run=offline)) == [4, 5]
    assert check_n(-1) is None and check_n(-100) is None and check_n(7) == 7


@pytest.mark.parametrize(
    ("step_range", "exc"),
    [
        ((1.5, 3), TypeError),
        (("1", 3), TypeError),
        ((True, 3), TypeError),
        (5, TypeError),
        ({1: 2}, TypeError),
        ((1, 2, 3), ValueError),
        ("1:x", ValueError),
        ("1:2:3", ValueError),
        ("12", ValueError),
    ],
)
def test_bad_step_range_is_rejected(live, offline, step_range, exc):
    for kw in ({}, {"run": offline}):
        with pytest.raises(exc, match=r"step_range=.*start:end"):
            et.history(step_range=step_range, **kw)


def test_valid_and_reversed_step_ranges(live, offline):
    assert parse_step_range(" 2 : 4 ") == (2, 4)
    assert parse_step_range([None, 3]) == (None, 3)
    assert parse_step_range(":") == (None, None)
    for kw in ({}, {"run": offline}):
        assert steps(et.history(step_range=(2, 4), **kw)) == [2, 3]
        assert steps(et.history(step_range="4:", **kw)) == [4, 5]
        assert et.history(step_range=(4, 2), **kw) == []  # reversed: empty, documented
        assert et.history(step_range="3:3", **kw) == []


@pytest.mark.parametrize(
    ("metrics", "exc"),
    [
        (5, TypeError),
        ([1], TypeError),
        ({"acc": 1}, TypeError),
        (b"acc", TypeError),
        ([""], ValueError),
    ],
)
def test_bad_metrics_are_rejected(live, metrics, exc):
    with pytest.raises(exc, match=r"metrics=.*comma-separated"):
        et.history(metrics=metrics)


def test_arguments_are_checked_before_reading(tmp_path):
    with pytest.raises(TypeError, match="n=2.5"):
        query_history(tmp_path / "no-such-run", n=2.5)


def _unknown_warnings(caplog):
    return [r.getMessage() for r in caplog.records if "in none of the" in r.getMessage()]


def test_unknown_metric_warns_once_with_suggestions_and_still_returns_rows(live, caplog):
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        rows = et.history(3, metrics=["train/los", "nope", "acc"])
        et.history(3, metrics="nope,train/los")  # same names: no second warning
    assert steps(rows) == [3, 4, 5] and all("acc" in r for r in rows)
    got = _unknown_warnings(caplog)
    assert len(got) == 2, got
    assert "'train/los'" in got[0] and "did you mean 'train/loss'" in got[0]
    assert "'nope'" in got[1] and "did you mean" not in got[1]


def test_known_metric_and_empty_read_do_not_warn(tmp_path, caplog):
    et.init(project="proj", name="e", dir=str(tmp_path / "runs"))
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        assert et.history(5, metrics=["loss"]) == []  # nothing read yet: nothing judged
        et.log({"loss": 1.0})
        assert et.history(5, metrics=["loss"], include_meta=False) == [{"loss": 1.0}]
    et.finish()
    assert _unknown_warnings(caplog) == []


def test_unknown_metric_offline_warns(offline, caplog):
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        rows = et.history(2, run=offline, metrics=["accc"])
    assert steps(rows) == [4, 5]
    (msg,) = _unknown_warnings(caplog)
    assert "'accc'" in msg and "did you mean 'acc'" in msg


def test_store_counters_exist_from_construction(tmp_path):
    s = HistoryStore(max_open_seconds=None)
    assert s._reader.disk_bytes_read == 0 and s._reader._memo is None
    assert s.stats()["disk_bytes_read"] == 0
    for i in range(3):
        s.ingest({"v": i})
    assert steps(s.tail(2)) == [1, 2] and s._reader._memo is not None
