"""et trace: every rank and host on one timeline, host clocks aligned at the first shared
step (docs/streams.md "Straggler ranks")."""

from __future__ import annotations

import json

import pytest

from expr_tracker.trace import build_trace, write_trace


def spans(path, host, base, steps, *, late=0.0, pid=100):
    with open(path, "w") as fh:
        for s in steps:
            start = base + s * 1.0 + late
            rec = {"name": "forward", "start": start, "dur_ms": 10.0, "_step": s, "host": host}
            rec.update(pid=pid, tid=1, thread="MainThread", id=s, depth=0)
            fh.write(json.dumps(rec) + "\n")


@pytest.fixture
def run(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    spans(d / "spans.jsonl", "a", 1000.0, range(0, 4))
    spans(d / "spans.rank1.jsonl", "a", 1000.0, range(0, 4), late=0.25, pid=101)  # a straggler
    spans(d / "spans.rank2.jsonl", "b", 1005.0, range(1, 4), pid=102)  # a clock 5 s ahead
    return d


def starts(trace):
    out: dict[int, list[float]] = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X":
            out.setdefault(e["pid"], []).append(e["ts"] / 1e6)
    return out


def test_hosts_aligned_at_the_first_shared_step_ranks_of_one_host_untouched(run):
    tr = build_trace(run)
    got = starts(tr)
    assert got[1] == [1000.0, 1001.0, 1002.0, 1003.0]
    assert got[2] == [1000.25, 1001.25, 1002.25, 1003.25]  # same host: its lateness stays
    # host b's step 1 began at 1006.0, host a's at 1001.0: shifted by -5 s
    assert got[3] == pytest.approx([1001.0, 1002.0, 1003.0])
    labels = {
        e["pid"]: e["args"]["labels"]
        for e in tr["traceEvents"]
        if e.get("name") == "process_labels"
    }
    assert labels[3] == "clock -5000.000 ms (hosts aligned at step 1)"
    assert labels[1] == "clock +0.000 ms (hosts aligned at step 1)"
    names = [e["args"]["name"] for e in tr["traceEvents"] if e.get("name") == "process_name"]
    assert names == ["rank 0 (a)", "rank 1 (a)", "rank 2 (b)"]


def test_no_alignment_on_request_or_with_one_host(run, tmp_path):
    got = starts(build_trace(run, align_clocks=False))
    assert got[3] == [1006.0, 1007.0, 1008.0]
    res = write_trace(run, tmp_path / "t.json")
    assert res["aligned_at"] == 1 and res["clock_offsets"] == {"a": 0.0, "b": -5.0}
    res = write_trace(run, tmp_path / "t.json", ranks="0,1")
    assert res["aligned_at"] is None and res["clock_offsets"] == {}
    doc = json.loads((tmp_path / "t.json").read_text())
    assert not [e for e in doc["traceEvents"] if e.get("name") == "process_labels"]
