"""Spans through a real run: et.init / et.log / et.history, the span file, et trace."""

from __future__ import annotations

import json

import pytest

import expr_tracker as et
from expr_tracker.plugins import CpuTime
from expr_tracker.spans import get_active_recorder, span
from expr_tracker.trace import build_trace


@pytest.fixture
def run_dir(tmp_path):
    yield tmp_path
    if et.get_run() is not None:
        et.finish()


def _init(tmp_path, **kw):
    return et.init(project="p", name="r", dir=str(tmp_path), **kw)


def _spans(tmp_path, name="spans.jsonl"):
    path = tmp_path / "p" / "r" / name
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_span_metrics_join_the_logged_row(run_dir):
    _init(run_dir, span_count=True)
    for _ in range(2):
        with span("forward"):
            with span("attention"):
                pass
            with span("attention"):
                pass
        et.log({"loss": 0.5})
    rows = et.history(2)
    assert [r["_step"] for r in rows] == [0, 1]
    r = rows[-1]
    assert r["loss"] == 0.5 and r["count/forward/attention"] == 2 and r["count/forward"] == 1
    assert r["time_ms/forward"] >= r["time_ms/forward/attention"] >= 0
    et.get_run().flush()  # TODO(lead): run.history.flush() should flush spans too
    recs = _spans(run_dir)
    assert [x["name"] for x in recs[:3]] == ["forward/attention", "forward/attention", "forward"]
    assert [x["_step"] for x in recs] == [0, 0, 0, 1, 1, 1]


def test_span_never_commits_and_explicit_step(run_dir):
    _init(run_dir)
    et.log({}, step=100)
    with span("work", step=5):
        pass
    assert et.history(-1, include_open=False) == []
    et.log({})
    (row,) = et.history(1)
    assert row["_step"] == 100 and "time_ms/work" in row
    et.get_run().flush()  # TODO(lead): run.history.flush() should flush spans too
    (r,) = _spans(run_dir)
    assert r["_step"] == 100 and r["args"] == {"step": 5}


def test_plugins_run_wide_and_aggregation(run_dir):
    _init(run_dir, span_plugins=[CpuTime()])
    for _ in range(3):
        with span("s"):
            pass
    et.log({})
    (row,) = et.history(1)
    assert row["cpu_time_ms/s"] >= 0 and "cpu_percent/s" in row


def test_trace_only_worker(run_dir):
    _init(run_dir, stream="worker", span_metrics=False)
    for i in range(5):
        with span(f"req-{i}", request=i):
            pass
    et.log({"x": 1})
    (row,) = et.history(1)
    assert not any(k.startswith("time_ms/") for k in row)
    et.finish()
    recs = _spans(run_dir, "spans.worker.jsonl")
    assert [r["name"] for r in recs] == [f"req-{i}" for i in range(5)]
    t = build_trace(run_dir / "p" / "r")
    labels = [e["args"]["name"] for e in t["traceEvents"] if e.get("name") == "process_name"]
    assert labels and labels[0].startswith("worker")


def test_spans_false_writes_no_file(run_dir):
    _init(run_dir, spans=False)
    with span("a"):
        pass
    et.log({})
    assert "time_ms/a" in et.history(1)[0]
    et.finish()
    assert not (run_dir / "p" / "r" / "spans.jsonl").exists()


def test_finish_drains_and_unsets(run_dir):
    _init(run_dir, span_async_write=False)
    with span("only"):
        pass
    et.finish()
    assert get_active_recorder() is None
    assert [r["name"] for r in _spans(run_dir)] == ["only"]
    with span("after"):  # no run: times, writes nothing
        pass
    assert len(_spans(run_dir)) == 1


def test_oversize_record_dropped_but_aggregated(run_dir):
    _init(run_dir, max_record_bytes=300)
    with span("big", blob="x" * 1000):
        pass
    with span("small"):
        pass
    et.log({})
    row = et.history(1)[0]
    assert "time_ms/big" in row and "time_ms/small" in row
    et.get_run().flush()  # TODO(lead): run.history.flush() should flush spans too
    assert [r["name"] for r in _spans(run_dir)] == ["small"]
    assert et.info()["spans"]["dropped_oversize"] == 1


def test_span_left_open_does_not_leak_into_the_next_run(tmp_path):
    import expr_tracker as et

    run_a = et.init(project="sp", name="a", dir=str(tmp_path))
    left = et.start_span("left_open")
    et.log({"x": 1})
    et.finish()
    run_b = et.init(project="sp", name="b", dir=str(tmp_path))
    with et.span("fresh"):
        pass
    left.end()
    et.log({"y": 1})
    et.finish()
    row = et.read_history(run_b.dir)[0]
    assert "time_ms/fresh" in row
    assert not any("left_open" in k for k in row)
    names = [json.loads(x)["name"] for x in (run_b.dir / "spans.jsonl").read_text().splitlines()]
    assert names == ["fresh"]
    assert (
        not (run_a.dir / "spans.jsonl").exists()
        or "left_open" not in (run_a.dir / "spans.jsonl").read_text()
    )
