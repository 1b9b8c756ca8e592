"""et trace / build_trace / write_trace: format, filters, lanes, streaming and atomicity."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from expr_tracker.cli.main import main as et_main
from expr_tracker.trace import _assign_lanes, _Stats, build_trace, parse_range, write_trace


def rec(name, start, dur_ms, step=0, *, id, parent=None, tid=1, pid=100, depth=None, **kw):
    r = {
        "_step": step,
        "name": name,
        "depth": depth if depth is not None else name.count("/"),
        "start": start,
        "dur_ms": dur_ms,
        "id": id,
        "parent": parent,
        "pid": pid,
        "tid": tid,
        "thread": "MainThread",
    }
    r.update(kw)
    return r


def write(path: Path, records, tail: bytes = b"") -> None:
    with open(path, "wb") as f:
        for r in records:
            f.write(json.dumps(r).encode() + b"\n")
        f.write(tail)


def spans_only(trace):
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def meta(trace, name):
    return [e for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == name]


@pytest.fixture
def run(tmp_path):
    T = 1_700_000_000.0
    write(
        tmp_path / "spans.jsonl",
        [
            rec("step/forward", T + 0.001, 5.0, 0, id=2, parent=1),
            rec("step", T, 10.0, 0, id=1, args={"batch": 32}, metrics={"cpu_percent": 99.5}),
            rec("step/forward", T + 1.001, 5.0, 1, id=4, parent=3, error="ValueError"),
            rec("step", T + 1.0, 10.0, 1, id=3, args={"loss": float("nan")}),
            rec("zero", T + 2.0, 0.0, 2, id=5),
        ],
        tail=b'{"_step": 3, "name": "torn", "st',
    )
    write(
        tmp_path / "spans.data.jsonl",
        [rec("load", T + 0.5, 100.0, 0, id=1, tid=7, pid=200, thread="loader")],
    )
    (tmp_path / "run.json").write_text(json.dumps({"host": "host-a"}))
    (tmp_path / "run.data.json").write_text(json.dumps({"host": "host-b"}))
    return tmp_path


def test_format_processes_threads_args(run):
    t = build_trace(run)
    assert t["displayTimeUnit"] == "ms"
    labels = sorted(e["args"]["name"] for e in meta(t, "process_name"))
    assert labels == ["data (host-b)", "main (host-a)"]
    assert meta(t, "thread_name")
    ev = spans_only(t)
    assert len(ev) == 6  # the torn line is skipped
    first = next(e for e in ev if e["args"]["path"] == "step" and e["args"]["_step"] == 0)
    assert first["ph"] == "X" and first["name"] == "step"
    assert first["ts"] == pytest.approx(1_700_000_000.0 * 1e6)
    assert first["dur"] == pytest.approx(10_000.0)
    assert first["args"]["batch"] == 32 and first["args"]["cpu_percent"] == 99.5
    child = next(e for e in ev if e["args"]["path"] == "step/forward" and e["args"]["_step"] == 1)
    assert child["args"]["error"] == "ValueError"
    nan = next(e for e in ev if e["args"]["path"] == "step" and e["args"]["_step"] == 1)
    assert nan["args"]["loss"] == "NaN"
    # nesting kept: children on their parent's track
    parent = next(e for e in ev if e["args"]["path"] == "step" and e["args"]["_step"] == 0)
    kid = next(e for e in ev if e["args"]["path"] == "step/forward" and e["args"]["_step"] == 0)
    assert (kid["pid"], kid["tid"]) == (parent["pid"], parent["tid"])
    load = next(e for e in ev if e["name"] == "load")
    assert load["pid"] != parent["pid"] and load["cat"] == "data"


def test_ranked_labels(tmp_path):
    write(tmp_path / "spans.data.rank3.jsonl", [rec("a", 1.0, 1.0, id=1)])
    write(tmp_path / "spans.jsonl", [rec("b", 1.0, 1.0, id=1)])
    (tmp_path / "run.data.rank3.json").write_text(json.dumps({"host": "host-a"}))
    labels = sorted(e["args"]["name"] for e in meta(build_trace(tmp_path), "process_name"))
    assert labels == ["rank 0", "rank 3 (host-a) · data"]


def test_stream_filter(run):
    t = build_trace(run, streams="data")
    assert [e["name"] for e in spans_only(t)] == ["load"]
    assert len(spans_only(build_trace(run, streams="main,data"))) == 6
    assert len(spans_only(build_trace(run, streams="*"))) == 6


def test_step_range_end_exclusive(run):
    t = build_trace(run, step_range="1:2")
    assert {e["args"]["_step"] for e in spans_only(t)} == {1}
    t = build_trace(run, step_range=":1")
    assert {e["args"]["_step"] for e in spans_only(t)} == {0}


def test_time_range_half_open_overlap_no_clipping(run):
    T = 1_700_000_000.0
    # step 0 'step' spans [T, T+0.010): a range starting at its end excludes it
    t = build_trace(run, time_range=(T + 0.010, T + 0.6))
    names = sorted(e["args"]["path"] for e in spans_only(t))
    assert names == ["load"]
    # overlapping the start of 'step' (not clipped)
    t = build_trace(run, time_range=(T - 1, T + 0.002))
    ev = {e["args"]["path"]: e for e in spans_only(t)}
    assert ev["step"]["dur"] == pytest.approx(10_000.0)
    # span starting at the upper bound is excluded
    t = build_trace(run, time_range=(T - 1, T))
    assert spans_only(t) == []
    # zero-duration spans only dropped under a time filter
    assert any(e["name"] == "zero" for e in spans_only(build_trace(run)))
    assert not any(
        e["name"] == "zero" for e in spans_only(build_trace(run, time_range=(T + 1.5, None)))
    )
    # empty / reversed ranges select nothing
    assert spans_only(build_trace(run, time_range=(T + 1, T + 1))) == []
    assert spans_only(build_trace(run, time_range="5:3")) == []
    # time and step filters combine with AND
    t = build_trace(run, time_range=(T + 0.9, None), step_range="0:1")
    assert [e["name"] for e in spans_only(t)] == []


def test_parse_range():
    assert parse_range("1:2", int) == (1, 2)
    assert parse_range(":2", int) == (None, 2)
    assert parse_range("1.5:", float) == (1.5, None)
    with pytest.raises(ValueError):
        parse_range("12", int)
    with pytest.raises(ValueError):
        parse_range("a:b", int)


def _lanes(rows):
    from expr_tracker.trace import SpanFile

    files = [SpanFile(Path("x"), None, None)]
    stats = _Stats()
    out = [json.loads(b) for b in _assign_lanes(rows, files, {0: ((0, 1, 1), "T")}, stats)]
    return {e["args"]["id"]: e["tid"] for e in out if e["ph"] == "X"}


def _row(ts, te, sid, parent=None):
    body = json.dumps({"name": str(sid), "ph": "X", "args": {"id": sid}}).encode()
    return (0, ts, te, sid, parent, body)


def test_lanes_overlapping_tasks_split_nested_kept():
    rows = sorted(
        [
            _row(0, 100, 1),  # outer
            _row(10, 60, 2, 1),  # task a under outer
            _row(20, 80, 3, 1),  # task b under outer, overlaps a without nesting
            _row(30, 40, 4, 2),  # child of a
            _row(50, 55, 5, 3),  # child of b
            _row(200, 210, 6),  # later top-level span reuses lane 1
            _row(205, 300, 7),  # overlapping unrelated top-level span
        ],
        key=lambda r: (r[1], -r[2]),
    )
    lane = _lanes(rows)
    assert lane[2] == lane[1] and lane[4] == lane[2]
    assert lane[3] != lane[1] and lane[5] == lane[3]
    assert lane[6] == lane[1]
    assert lane[7] != lane[6]


def test_lanes_unrelated_contained_top_level_separate():
    rows = [_row(0, 100, 1), _row(10, 20, 2)]  # both top-level: 2 inside 1 in time only
    lane = _lanes(rows)
    assert lane[1] != lane[2]


def test_write_trace_gz_default_path_and_cli(run, capsys):
    res = write_trace(run)
    assert Path(res["path"]) == run / "trace.json"
    json.loads((run / "trace.json").read_text())
    out = run / "t.json.gz"
    assert et_main(["trace", str(run), "-o", str(out), "--stream", "main"]) == 0
    data = json.loads(gzip.decompress(out.read_bytes()))
    assert len(spans_only(data)) == 5
    assert "wrote" in capsys.readouterr().out
    assert et_main(["trace", str(run), "--step-range", "x"]) == 2
    assert et_main(["trace", str(run / "missing")]) == 1
    assert et_main(["trace", str(run), "--temp-dir", str(run / "nope")]) == 1


def test_failure_keeps_destination_and_cleans_up(run, tmp_path):
    dest = run / "keep.json"
    dest.write_text("OLD")
    spool = tmp_path / "spool"
    spool.mkdir()

    def boom(n):
        if n == 3:
            raise OSError("disk full")

    with pytest.raises(OSError):
        write_trace(run, dest, temp_dir=spool, _write_hook=boom)
    assert dest.read_text() == "OLD"
    assert os.listdir(spool) == []
    assert not [p for p in os.listdir(run) if p.endswith(".tmp")]
    write_trace(run, dest, temp_dir=spool)
    assert json.loads(dest.read_text())["traceEvents"]
    assert os.listdir(spool) == []


def test_no_span_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        build_trace(tmp_path)


def test_single_file_and_infinity_tokens(tmp_path):
    p = tmp_path / "spans.jsonl"
    p.write_text(
        '{"_step":0,"name":"a","depth":0,"start":1.0,"dur_ms":1.0,"id":1,"parent":null,'
        '"pid":1,"tid":1,"thread":"M","metrics":{"x":Infinity,"y":-Infinity}}\n'
    )
    (e,) = spans_only(build_trace(p))
    assert e["args"]["x"] == "Infinity" and e["args"]["y"] == "-Infinity"


def test_an_int_beyond_64_bits_beside_nan_keeps_its_span(tmp_path):
    """orjson encodes no int wider than 64 bits: with a NaN beside it (the line read by the
    fallback decoder) the span was skipped as unreadable; the standard library encodes it."""
    p = tmp_path / "spans.jsonl"
    p.write_text(
        '{"_step":0,"name":"a","depth":0,"start":1.0,"dur_ms":1.0,"id":1,"parent":null,'
        '"pid":1,"tid":1,"thread":"M","args":{"big":1180591620717411303424,"f":NaN}}\n'
    )
    (e,) = spans_only(build_trace(p))
    assert e["args"]["big"] == 2**70 and e["args"]["f"] == "NaN"


def test_trace_file_is_readable_by_others_like_any_new_file(tmp_path):
    import stat

    import expr_tracker as et
    from expr_tracker.trace import write_trace

    run = et.init(project="p", name="mode", dir=str(tmp_path))
    with et.span("a"):
        pass
    et.log({})
    et.finish()
    out = tmp_path / "t.json"
    old = os.umask(0o022)
    try:
        write_trace(run.dir, out)
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
