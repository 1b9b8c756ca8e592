"""`et trace` over span files from anyone (issue 20, points 7 and 8): a line nested 20,000
deep, a lone surrogate, args deeper than the encoder takes, a FIFO named `run.json` beside a
span file, a span file that cannot be read: each is skipped (and counted, or named in a
warning), never a crash or a hang; the other spans are converted as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import CANNOT_READ_SKIP, cannot_read_prefix

from expr_tracker.trace import build_trace, write_trace

T = 1_700_000_000.0


def rec(name, start, dur_ms, step=0, **kw):
    r = {"_step": step, "name": name, "depth": 0, "start": start, "dur_ms": dur_ms}
    r.update({"id": kw.pop("id", 1), "parent": None, "pid": 1, "tid": 1, "thread": "Main"})
    r.update(kw)
    return r


def write(path: Path, *lines: bytes) -> None:
    path.write_bytes(b"".join(line + b"\n" for line in lines))


def good_lines():
    return [
        json.dumps(rec("a", T, 5.0, 0, id=1)).encode(),
        json.dumps(rec("b", T + 1, 5.0, 1, id=2)).encode(),
    ]


def spans(trace):
    return sorted(e["name"] for e in trace["traceEvents"] if e["ph"] == "X")


def test_hostile_lines_are_skipped_and_counted(tmp_path):
    deep = b'{"_step": 1, "name": "deep", "start": 1.0, "dur_ms": 1.0, "args": '
    deep += b"[" * 20000 + b"]" * 20000 + b"}"
    surrogate = json.dumps(rec("s", T, 1.0, args={"x": float("nan")})).encode()
    surrogate = surrogate.replace(b'"s"', b'"\\ud800"', 1)
    # orjson decodes it but encodes at most 254 levels: the standard library encodes it
    args300 = b"[" * 300 + b"]" * 300
    too_deep_args = (
        json.dumps(rec("d", T, 1.0)).encode()[:-1] + b', "args": {"x": ' + args300 + b"}}"
    )
    write(tmp_path / "spans.jsonl", *good_lines(), deep, surrogate, too_deep_args)
    out = tmp_path / "trace.json"
    res = write_trace(tmp_path, out)
    assert res["skipped"] == 2 and res["unreadable"] == {}
    assert sorted(spans(json.loads(out.read_text()))) == ["a", "b", "d"]
    assert sorted(spans(build_trace(tmp_path))) == ["a", "b", "d"]


@pytest.mark.slow
def test_a_fifo_named_run_json_beside_the_spans_hangs_nothing(tmp_path):
    write(tmp_path / "spans.jsonl", *good_lines())
    os.mkfifo(tmp_path / "run.json")  # where et trace reads the host from
    os.mkfifo(tmp_path / "spans.data.jsonl")  # a FIFO named like a span file: not one
    p = subprocess.run(
        [sys.executable, "-m", "expr_tracker.cli.main", "trace", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 0, p.stderr
    assert "wrote" in p.stdout and "2 spans" in p.stdout
    assert spans(json.loads((tmp_path / "trace.json").read_text())) == ["a", "b"]


@pytest.mark.slow
def test_a_span_file_that_cannot_be_read_is_left_out_with_a_warning(tmp_path):
    """A colleague's 0600 span file (another uid's, read by one who cannot): the others are
    converted, the file is named in one warning, exit 0."""
    write(tmp_path / "spans.jsonl", *good_lines())
    theirs = tmp_path / "spans.data.jsonl"
    write(theirs, json.dumps(rec("c", T, 1.0, id=3)).encode())
    os.chown(theirs, 65534, 65534)
    theirs.chmod(0o600)
    prefix = cannot_read_prefix(theirs)
    if prefix is None:
        pytest.skip(CANNOT_READ_SKIP)
    out = tmp_path / "t.json"
    p = subprocess.run(
        [*prefix, sys.executable, "-m", "expr_tracker.cli.main", "trace", str(tmp_path)]
        + ["-o", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert f"{theirs} cannot be read (permission denied)" in p.stderr
    assert spans(json.loads(out.read_text())) == ["a", "b"]


def test_a_step_no_writer_writes_is_in_no_step_range(tmp_path):
    """A span line whose ``_step`` is negative or past 2**63-1 has no step (``is_step``, as
    the ``spans`` view of ``et query`` reads it): drawn, but in no ``step_range`` (-4 was
    in ``:2``, 2**63 and 2**64 in ``1:``)."""
    planted = [
        json.dumps(rec(name, T + 2, 1.0, step, id=i)).encode()
        for i, (name, step) in enumerate([("neg", -4), ("min", -(2**63)), ("big", 2**63)], 3)
    ]
    planted.append(json.dumps(rec("huge", T + 2, 1.0, 2**64, id=9)).encode())
    write(tmp_path / "spans.jsonl", *good_lines(), *planted)
    assert spans(build_trace(tmp_path)) == ["a", "b", "big", "huge", "min", "neg"]
    assert spans(build_trace(tmp_path, step_range=":2")) == ["a", "b"]
    assert spans(build_trace(tmp_path, step_range="1:")) == ["b"]
