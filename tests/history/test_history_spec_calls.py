"""``history()`` as users of the spec's API call it (docs/history.md "Arguments"): any negative
``n``, ``output_type`` matched exactly, a live ``stream=None`` meaning the run's own stream;
``list_streams`` (docs/streams.md "Reading streams")."""

from __future__ import annotations

import os

import pytest

import expr_tracker as et
from expr_tracker.history import list_streams


def _steps(rows):
    return [r["_step"] for r in rows]


def test_any_negative_n_is_everything(tmp_path):
    run = et.init(project="p", name="neg", dir=tmp_path / "runs")
    for i in range(60):
        et.log({"x": i})
    for n in (-1, -2, -60, -1000):
        assert _steps(et.history(n)) == list(range(60))
    run.flush()
    assert _steps(et.read_history(run.dir, -3)) == list(range(60))
    assert _steps(et.history(-9, run=run.dir)) == list(range(60))
    et.finish()


def test_output_type_is_matched_exactly(tmp_path):
    et.init(project="p", name="exact", dir=tmp_path / "runs")
    et.log({"x": 1})
    assert et.history(output_type="") == et.history(output_type="dict") == et.history()
    for bad in ("DICT ", "Dict", " dict", "PANDAS", "Polars"):
        with pytest.raises(ValueError) as info:
            et.history(output_type=bad)
        text = str(info.value)
        assert repr(bad) in text
        for name in ("dict", "dicts", "records", "list", "pandas", "pd", "polars", "pl"):
            assert repr(name) in text
    et.finish()


def test_live_stream_none_is_the_runs_own_stream(tmp_path):
    runs = tmp_path / "runs"
    et.init(project="p", name="own", dir=runs)
    et.log({"main": 1})
    et.finish()
    run = et.init(project="p", name="own", dir=runs, stream="data")
    et.log({"data": 1})
    et.log({"data": 2}, commit=False)  # the open row: only the live store has it
    for rows in (et.history(), et.history(stream=None), et.history(run=run, stream=None)):
        assert [r["data"] for r in rows] == [1, 2]
    assert [r["main"] for r in et.history(stream=None, run=run.dir)] == [1]  # a path: main
    et.finish()


def test_list_streams(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    run = et.init(project="p", name="streams", dir=runs, stream="loader")
    et.log({"x": 1})
    et.finish()
    assert list_streams(run.dir) == ["loader"]  # no main stream yet
    et.init(project="p", name="streams", dir=runs)
    et.log({"x": 1})
    et.finish()
    monkeypatch.setenv("RANK", "1")
    et.init(project="p", name="streams", dir=runs, stream="eval")  # a rank shard only
    with et.span("s"):
        pass
    et.finish()
    streams = list_streams(run.dir)
    assert streams == [None, "eval", "loader"]
    for stream in streams:  # each goes back as stream=
        rank = 1 if stream == "eval" else None
        assert et.read_history(et.resolve_run_path(run.dir, stream=stream, rank=rank))


def test_list_streams_reads_an_untrusted_folder(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "metrics.jsonl").write_text('{"_step": 0}\n')
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text('{"_step": 0}\n')
    os.symlink(outside, d / "metrics.evil.jsonl")  # points out of the folder
    os.mkfifo(d / "metrics.fifo.jsonl")  # not a regular file
    (d / "metrics.dir.jsonl").mkdir()
    (d / "spans.timeline.jsonl").write_text("")
    (d / "notes.jsonl").write_text("")
    assert list_streams(d) == [None, "timeline"]
    with pytest.raises(FileNotFoundError):
        list_streams(tmp_path / "missing")
