"""et trace --stream: an unknown stream is an error naming the streams there are."""

from __future__ import annotations

import json

import pytest

from expr_tracker.cli.main import main as et_main
from expr_tracker.trace import build_trace, find_span_files, write_trace


def _span(name, tid=1):
    return {
        "_step": 0,
        "name": name,
        "depth": 0,
        "start": 1_700_000_000.0,
        "dur_ms": 1.0,
        "id": 1,
        "parent": None,
        "pid": 100,
        "tid": tid,
        "thread": "MainThread",
    }


@pytest.fixture
def run(tmp_path):
    (tmp_path / "spans.jsonl").write_text(json.dumps(_span("step")) + "\n")
    (tmp_path / "spans.data.jsonl").write_text(json.dumps(_span("load")) + "\n")
    (tmp_path / "spans.data.rank1.jsonl").write_text(json.dumps(_span("load1")) + "\n")
    return tmp_path


def test_unknown_stream_is_an_error_naming_the_streams(run, capsys):
    assert et_main(["trace", str(run), "--stream", "nope"]) == 1
    cap = capsys.readouterr()
    assert "no stream 'nope'" in cap.err and "data, main" in cap.err
    assert "wrote" not in cap.out
    assert not (run / "trace.json").exists()  # nothing written


def test_one_unknown_name_among_known_ones(run):
    with pytest.raises(ValueError, match="'nope'.*data, main"):
        build_trace(run, streams="main,nope")
    with pytest.raises(ValueError, match="'x', 'y'"):
        write_trace(run, streams=["y", "x", "data"])


def test_known_streams_and_star_keep_working(run, capsys):
    assert et_main(["trace", str(run), "--stream", "*"]) == 0
    assert "3 spans" in capsys.readouterr().out
    assert et_main(["trace", str(run), "--stream", "data"]) == 0
    assert "2 spans" in capsys.readouterr().out  # every rank of the stream
    assert et_main(["trace", str(run), "--stream", "main,data"]) == 0
    assert "3 spans" in capsys.readouterr().out
    assert [f.path.name for f in find_span_files(run, "")] == ["spans.jsonl"]  # "" = main


def test_single_file_with_another_stream(run):
    with pytest.raises(ValueError, match="streams with span files: data"):
        find_span_files(run / "spans.data.jsonl", "main")
    assert len(find_span_files(run / "spans.data.jsonl", "data")) == 1
