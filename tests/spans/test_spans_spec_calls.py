"""Spans as users of the spec's API call them (docs/spans.md): ``span.end()`` returns the
duration, names are normalised paths, records carry the ``track`` ``et trace`` names, plugin
metrics are printed on the ``<-`` line; the public readers ``read_spans``/``span_files``."""

from __future__ import annotations

import asyncio
import json
import os
import threading

import pytest

import expr_tracker as et
from expr_tracker.trace import build_trace, read_spans, span_files


def _thread_names(trace):
    return {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in trace["traceEvents"]
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }


def test_end_returns_the_duration_in_ms():
    s = et.start_span("manual")
    ms = s.end()
    assert isinstance(ms, float) and ms == s.duration_ms > 0
    assert s.end() == ms  # a second end() ends nothing
    with et.start_span("block") as b:
        pass
    assert b.end() == b.duration_ms


@pytest.mark.parametrize(
    ("given", "name"),
    [("/forward/", "forward"), ("a//b", "a/b"), ("/x//y/", "x/y"), ("plain", "plain")],
)
def test_names_are_normalised_paths(tmp_path, given, name):
    et.init(project="p", name="norm", dir=tmp_path / "runs")
    with et.span("step"):
        with et.span(given) as s:
            pass
    assert s.name == name and s.path == f"step/{name}"
    et.log({})
    row = et.history(1)[0]
    assert f"time_ms/step/{name}" in row
    assert not any("//" in k or k.endswith("/") for k in row)
    et.finish()


@pytest.mark.parametrize("bad", ["/", "//", ""])
def test_a_name_of_nothing_is_refused(bad):
    with pytest.raises(ValueError, match="span name"):
        et.span(bad)


def test_records_carry_the_track_the_trace_names(tmp_path):
    run = et.init(project="p", name="tracks", dir=tmp_path / "runs")
    with et.span("main"):
        pass

    def worker():
        with et.span("in_thread"):
            pass

    t = threading.Thread(target=worker, name="loader")
    t.start()
    t.join()

    async def work(name):
        async with et.span(name):
            await asyncio.sleep(0.01)

    async def main():
        await asyncio.gather(work("a"), work("b"))

    asyncio.run(main())
    et.log({})
    et.finish()
    records = {r["name"]: r for r in read_spans(run.dir)}
    main_tid = records["main"]["tid"]
    assert records["main"]["track"] == f"MainThread (tid {main_tid})"
    assert records["in_thread"]["track"] == f"loader (tid {records['in_thread']['tid']})"
    for name in ("a", "b"):
        r = records[name]
        assert r["track"] == f"MainThread (tid {main_tid}) · {r['task']}"
    # the same names in the file as read_spans returns them
    on_disk = [json.loads(x) for x in (run.dir / "spans.jsonl").read_text().splitlines()]
    assert {r["name"]: r["track"] for r in on_disk} == {k: r["track"] for k, r in records.items()}
    # ... and as et trace names the tracks: each task a track of its own
    trace = build_trace(run.dir)
    names = _thread_names(trace)
    for e in trace["traceEvents"]:
        if e.get("ph") == "X":
            assert names[(e["pid"], e["tid"])] == records[e["args"]["path"]]["track"]
    assert len(set(names.values())) == 4


def test_trace_of_records_without_track_names_them_the_same(tmp_path):
    """Files written before records carried ``track``: read_spans and et trace derive it."""
    d = tmp_path / "old"
    d.mkdir()
    base = {"_step": 0, "depth": 0, "dur_ms": 1.0, "pid": 9, "tid": 77, "thread": "T"}
    lines = [
        {**base, "name": "x", "start": 100.0, "id": 1, "parent": None},
        {**base, "name": "y", "start": 101.0, "id": 2, "parent": None, "task": "Task-9"},
    ]
    (d / "spans.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"torn')
    got = read_spans(d)
    assert [r["track"] for r in got] == ["T (tid 77)", "T (tid 77) · Task-9"]
    assert sorted(_thread_names(build_trace(d)).values()) == ["T (tid 77)", "T (tid 77) · Task-9"]


def test_plugin_metrics_on_the_exit_line():
    lines = []

    def plugin(span):
        return {"rows": 3, "mb": 1.23456, "ratio": 0.5}

    with et.span("load", print_fn=lines.append, plugins=[plugin]):
        pass
    assert lines[0].startswith("-> load")
    assert lines[1].startswith("<- load") and lines[1].endswith("ms  rows=3 mb=1.235 ratio=0.5")
    with et.span("bare", print_fn=lines.append):
        pass
    assert lines[-1].endswith("ms")  # no plugin: the line as before


def test_plugin_metrics_on_the_exit_line_with_a_run(tmp_path):
    et.init(project="p", name="printed", dir=tmp_path / "runs")
    lines = []
    with et.span("load", print_fn=lines.append, plugins=[lambda s: {"rows": 3}]):
        pass
    assert lines[-1].endswith("  rows=3")
    et.finish()


def test_read_spans_by_stream_and_rank_and_span_files(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    et.init(project="p", name="multi", dir=runs)
    with et.span("main_span"):
        pass
    et.finish()
    run = et.init(project="p", name="multi", dir=runs, stream="data")
    with et.span("data_span"):
        pass
    et.finish()
    monkeypatch.setenv("RANK", "1")
    et.init(project="p", name="multi", dir=runs, stream="data")
    with et.span("rank1_span"):
        pass
    et.finish()
    d = run.dir
    assert [r["name"] for r in read_spans(d)] == ["main_span"]
    assert [r["name"] for r in read_spans(d, "data")] == ["data_span"]
    assert [r["name"] for r in read_spans(d, "data", rank=1)] == ["rank1_span"]
    assert [r["name"] for r in read_spans(d / "spans.data.rank1.jsonl")] == ["rank1_span"]
    assert span_files(d) == [
        d / "spans.jsonl",
        d / "spans.data.jsonl",
        d / "spans.data.rank1.jsonl",
    ]
    assert span_files(d, streams="main") == [d / "spans.jsonl"]
    assert span_files(d, streams="data", ranks=1) == [d / "spans.data.rank1.jsonl"]
    with pytest.raises(FileNotFoundError, match="spans.data.jsonl"):
        read_spans(d, "nope")
    with pytest.raises(ValueError, match="stream"):
        read_spans(d, "../x")
    with pytest.raises(ValueError, match="rank"):
        read_spans(d, rank=-1)
    with pytest.raises(FileNotFoundError):
        read_spans(tmp_path / "missing")


def test_readers_refuse_what_lies_outside_the_folder(tmp_path):
    outside = tmp_path / "secret.jsonl"
    outside.write_text(json.dumps({"name": "stolen", "start": 1.0, "dur_ms": 1.0}) + "\n")
    d = tmp_path / "run"
    d.mkdir()
    (d / "spans.jsonl").write_text(json.dumps({"name": "ok", "start": 1.0, "dur_ms": 1.0}) + "\n")
    os.symlink(outside, d / "spans.evil.jsonl")
    os.mkfifo(d / "spans.fifo.jsonl")
    with pytest.raises(OSError, match="outside"):
        read_spans(d, "evil")
    with pytest.raises(OSError):
        read_spans(d / "spans.fifo.jsonl")  # never blocks on a FIFO
    assert span_files(d) == [d / "spans.jsonl"]
    deep = d / "spans.deep.jsonl"
    deep.write_text("[" * 20_000 + "\n" + json.dumps({"name": "kept"}) + "\n")
    assert [r["name"] for r in read_spans(d, "deep")] == ["kept"]
