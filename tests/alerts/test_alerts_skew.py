"""skew(m): the straggler rank, judged on rank 0 from the other ranks' files written here
directly (docs/streams.md "Straggler ranks"). The real torchrun run is in
tests/spans/test_straggler_torchrun.py."""

from __future__ import annotations

import json
import logging
import os

import pytest

import expr_tracker as et
from expr_tracker.alerts import AlertEngine, RuleError
from expr_tracker.alerts.testing import EventCapture
from expr_tracker.history.peers import PeerFiles, RankSkew, rank_skew

KEY = "time_ms/forward"


def write_rows(path, rows, *, end=b"\n"):
    with open(path, "ab") as fh:
        for r in rows:
            fh.write(json.dumps(r).encode() + b"\n")
        if end != b"\n":
            fh.write(end)


def row(step, ms, **kw):
    return {"_step": step, "_time": 1.7e9 + step, KEY: ms, **kw}


@pytest.mark.parametrize(
    ("values", "want"),
    [
        ([10.0, 10.0], (1.0, 0)),
        ([10.0, 30.0], (1.5, 1)),  # median of two is their mean: 30 / 20
        ([10.0, 10.0, 40.0, 10.0], (4.0, 2)),
        ([5.0, 10.0, 20.0], (2.0, 2)),
        ([10.0, 10.0, 10.0], (1.0, 0)),  # a tie names the lowest rank
        ([10.0], None),
        ([10.0, float("nan")], None),
        ([0.0, 0.0], None),
        ([-1.0, 0.5], None),
        ([1.0, float("inf")], None),
    ],
)
def test_rank_skew_golden_values(values, want):
    got = rank_skew(values)
    assert got == (pytest.approx(want[0]), want[1]) if want else got is None


def tracker(tmp_path, world=2):
    return RankSkew(PeerFiles(tmp_path, None, world, interval=0.0))


def test_each_step_is_judged_once_when_every_rank_wrote_it(tmp_path):
    sk = tracker(tmp_path)
    # rank 1 has not started: missing, UNKNOWN
    assert sk.skew(KEY, 0, 0, 10.0) is None
    write_rows(tmp_path / "metrics.rank1.jsonl", [row(0, 30.0), row(1, 30.0)])
    # rank 0 at step 1: step 0 is complete (judged), step 1 waits for rank 0's own value...
    assert sk.skew(KEY, 1, 1, 10.0) == (pytest.approx(1.5), 1)
    # ...which came with that call: step 1 is judged at the next rank-0 step
    assert sk.skew(KEY, 2, 2, 10.0) == (pytest.approx(1.5), 1)
    assert sk.last(KEY) == (1, pytest.approx(1.5), 1)
    assert sk.skew(KEY, 3, 3, 10.0) is None  # rank 1 has not reached step 2 yet
    assert sk.skew(KEY, 3, 3, 10.0) is None  # the same rank-0 step: the same answer
    write_rows(tmp_path / "metrics.rank1.jsonl", [row(2, 10.0), row(3, 10.0)])
    assert sk.skew(KEY, 4, 4, 10.0) == (1.0, 0)
    assert sk.last("time_ms.forward")[0] == 2  # `.` reads as `/`, as metric names do
    assert sk.stats()["judgements"] == 3
    sk.close()


def test_torn_lines_patch_lines_and_foreign_lines(tmp_path):
    sk = tracker(tmp_path)
    path = tmp_path / "metrics.rank1.jsonl"
    write_rows(path, [row(0, 30.0)], end=b'{"_step": 1, "time_ms/for')  # a torn tail
    assert sk.skew(KEY, 0, 0, 10.0) == (pytest.approx(1.5), 1)
    assert sk.skew(KEY, 1, 1, 10.0) is None  # step 1 of rank 1 is not complete on disk
    with open(path, "ab") as fh:  # the line completes; a patch line of step 1 follows
        fh.write(b'ward": 10.0}\nnot json\n[1, 2]\n{"_step": "x", "time_ms/forward": 1}\n')
        fh.write(b'{"_step": 1, "time_ms/forward": 50.0}\n')
    assert sk.skew(KEY, 2, 2, 10.0) == (pytest.approx(50.0 / 30.0), 1)  # the later line wins
    sk.close()


@pytest.mark.parametrize("bad", [-3, 2**63, 2**64])
@pytest.mark.parametrize("flat", [True, False], ids=["scanned", "decoded"])
def test_a_peer_line_whose_step_is_no_step_is_not_read(tmp_path, bad, flat):
    """A line of a peer's file with ``_step`` -3 or past 2**63-1 is no row (as to every
    reader, docs/logging.md "The commit table"), on the chunk scan as on the decoding."""
    rows = [row(0, 30.0), {"_step": bad, KEY: 99.0}, row(1, 40.0)]
    if not flat:  # a nested value sends the chunk to the decoder
        rows.append({"_step": 2, KEY: 50.0, "nested": {"a": 1}})
    write_rows(tmp_path / "metrics.rank1.jsonl", rows)
    files = PeerFiles(tmp_path, None, 2, interval=0.0)
    polled = files.poll({('"' + KEY + '"').encode(): KEY})
    files.close()
    steps = [s for _r, _n, ss, _v in polled for s in ss]
    values = [v for _r, _n, _s, vs in polled for v in vs]
    assert steps == ([0, 1] if flat else [0, 1, 2])
    assert 99.0 not in values


def test_four_ranks_name_the_slowest_and_a_dead_rank_is_missing(tmp_path):
    sk = tracker(tmp_path, world=4)
    for r, ms in ((1, 10.0), (2, 40.0)):
        write_rows(tmp_path / f"metrics.rank{r}.jsonl", [row(s, ms) for s in range(3)])
    # rank 3 never writes: no step is complete, never a guess
    for s in range(3):
        assert sk.skew(KEY, s, s, 10.0) is None
    write_rows(tmp_path / "metrics.rank3.jsonl", [row(s, 10.0) for s in range(3)])
    assert sk.skew(KEY, 3, 3, 10.0) == (4.0, 2)
    assert sk.skew(KEY, 4, 4, 10.0) == (4.0, 2)
    sk.close()


def test_a_step_a_rank_skipped_is_passed_over_and_memory_stays_bounded(tmp_path, monkeypatch):
    from expr_tracker.history import peers

    monkeypatch.setattr(peers, "MAX_PENDING", 8)
    sk = tracker(tmp_path)
    write_rows(tmp_path / "metrics.rank1.jsonl", [row(s, 30.0) for s in (0, 1, 2, 4)])
    answers = [sk.skew(KEY, s, s, 10.0) for s in range(6)]
    assert sum(a is not None for a in answers) == 4  # steps 0, 1, 2, 4; never 3 or 5
    assert sk.last(KEY)[0] == 4
    for s in range(6, 400):  # rank 1 stopped: rank 0's own values wait, bounded
        assert sk.skew(KEY, s, s, 10.0) is None
    m = sk._metrics[KEY]
    assert len(m.own) <= 8 and len(m.peers[0]) <= 4  # rank 1's steps 0-4 judged or passed
    write_rows(tmp_path / "metrics.rank1.jsonl", [row(s, 30.0) for s in range(390, 400)])
    assert sk.skew(KEY, 400, 400, 10.0) == (pytest.approx(1.5), 1)  # judging resumes
    sk.close()


def test_an_unreadable_peer_is_given_up_with_one_warning(tmp_path, caplog):
    os.mkfifo(tmp_path / "metrics.rank1.jsonl")  # a FIFO: reading it must never block
    sk = tracker(tmp_path)
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        for s in range(3):
            assert sk.skew(KEY, s, s, 10.0) is None
    assert sum("rank 1's metrics file" in r.getMessage() for r in caplog.records) == 1
    sk.close()


def test_reads_only_new_bytes(tmp_path):
    sk = tracker(tmp_path)
    path = tmp_path / "metrics.rank1.jsonl"
    write_rows(path, [row(s, 10.0, loss=1.0) for s in range(100)])
    sk.skew(KEY, 0, 0, 10.0)
    first = sk.peers.bytes_read
    assert first == path.stat().st_size
    for s in range(1, 50):
        sk.skew(KEY, s, s, 10.0)
    assert sk.peers.bytes_read == first  # nothing appended, nothing read again
    write_rows(path, [row(100, 10.0)])
    sk.skew(KEY, 50, 50, 10.0)
    assert sk.peers.bytes_read == path.stat().st_size
    sk.close()


RULE = {
    "name": "straggler",
    "condition": "skew(time_ms/forward) > 1.5",
    "for_steps": 3,
    "level": "warning",
    "message": "straggler rank {rank} ({expr})",
}


def test_the_rule_names_the_slow_rank(tmp_path):
    cap = EventCapture()
    sk = RankSkew(PeerFiles(tmp_path, None, 3, interval=0.0))
    engine = AlertEngine([RULE], notify=cap, peers=sk)
    for s in range(12):
        slow = 40.0 if s >= 4 else 10.0
        write_rows(tmp_path / "metrics.rank1.jsonl", [row(s, 10.0)])
        write_rows(tmp_path / "metrics.rank2.jsonl", [row(s, slow)])
        engine.on_step(row(s, 10.0))
    fired = [e for e in cap.events if e.kind == "firing"]
    assert len(fired) == 1
    # the peers wrote each step before rank 0 committed it: judged at once, true at steps
    # 4, 5 and 6, fires at 6
    assert fired[0].step == 6
    assert fired[0].message.startswith("straggler rank 2 (skew(time_ms/forward)=4")
    engine.close()


def test_without_peers_skew_is_unknown_and_checked_like_has():
    cap = EventCapture()
    engine = AlertEngine(["skew(time_ms/forward) > 0 => warning: x"], notify=cap)
    for s in range(5):
        engine.on_step(row(s, 10.0))
    assert cap.events == []
    with pytest.raises(RuleError, match="bare metric name"):
        AlertEngine(["skew(time_ms/forward[5]) > 1 => warning: x"])
    with pytest.raises(RuleError, match=r"skew\(\) takes"):
        AlertEngine(["skew(a, b) > 1 => warning: x"])


def test_a_rank0_run_reads_its_peers(tmp_path, monkeypatch):
    """et.init on rank 0 with WORLD_SIZE=2: the rule reads rank 1's shard."""
    run_dir = tmp_path / "runs" / "p" / "r"
    run_dir.mkdir(parents=True)
    write_rows(run_dir / "metrics.rank1.jsonl", [row(s, 50.0) for s in range(8)])
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    cap = EventCapture()
    run = et.init(
        run_dir=str(run_dir),
        alert_rules=[{**RULE, "for_steps": 2, "message": "straggler rank {rank}"}],
    )
    run.alerts.notify = cap
    for _ in range(8):
        et.log({KEY: 10.0})
    et.finish()
    fired = [e for e in cap.events if e.kind == "firing"]
    assert [e.message for e in fired] == ["straggler rank 1"]


def reference_poll(data: bytes, name: str):
    """What a reader decoding each line as JSON finds: (steps, values) of ``name``."""
    steps, values = [], []
    for line in data.split(b"\n"):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict) and type(r.get("_step")) is int:
            v = r.get(name)
            if type(v) in (int, float):
                steps.append(r["_step"])
                values.append(float(v))
    return steps, values


def _same(got, want):
    gs, gv = got
    ws, wv = want
    return (
        gs == ws
        and len(gv) == len(wv)
        and all(a == b or (a != a and b != b) for a, b in zip(gv, wv, strict=True))
    )


LINES = [  # each a layout a peer file may hold; the fast scan must agree with decoding them
    lambda s: {"_step": s, "_time": 1.7e9, KEY: 0.25 * s, "loss": 1.0},
    lambda s: {"_step": s, KEY: s},  # an int
    lambda s: {"_step": s, KEY: float("nan")},  # the standard module's NaN (with spaces)
    lambda s: {"_step": s, KEY: -float("inf"), "x": 1e-300},
    lambda s: {"_step": s, "loss": 2.0},  # no such key: a step this rank did not time
    lambda s: {"_step": s, "cfg": {KEY: 99.0}, KEY: 1.5},  # nested under another key
    lambda s: {"_step": s, "note": f'"{KEY}": 7, {{'},  # the key inside a string
    lambda s: {"_step": s, KEY: "fast"},  # not a number
    lambda s: {"_step": s, KEY: True},  # bool is not a number here
    lambda s: {"_step": s, KEY + "/x": 3.0},  # a longer name
    lambda s: {"_time": 1.0, "_step": s, KEY: 2.5},  # another key order
]


@pytest.mark.parametrize(
    "layouts", [[0], [1], [0, 2], [0, 3], [0, 4], [5], [0, 6], [7], [8], [9], [10], list(range(11))]
)
def test_the_chunk_scan_reads_what_decoding_each_line_reads(tmp_path, layouts):
    import orjson

    rows = [LINES[layouts[s % len(layouts)]](s) for s in range(40)]
    data = b"".join(
        (
            orjson.dumps(r)
            if all(
                v == v and v not in (float("inf"), -float("inf"))
                for v in r.values()
                if isinstance(v, float)
            )
            else json.dumps(r).encode()
        )
        + b"\n"
        for r in rows
    )
    (tmp_path / "metrics.rank1.jsonl").write_bytes(data)
    files = PeerFiles(tmp_path, None, 2, interval=0.0)
    polled = files.poll({('"' + KEY + '"').encode(): KEY})
    files.close()
    got = ([], [])
    for _rank, _name, steps, values in polled:
        got[0].extend(steps)
        got[1].extend(values)
    assert _same(got, reference_poll(data, KEY))


def test_rows_as_the_writer_writes_them_are_scanned_without_decoding(tmp_path, monkeypatch):
    run_dir = tmp_path / "r"
    with et.init(run_dir=str(run_dir), name="r") as run:
        for s in range(30):
            et.log({"loss": 1.0 / (s + 1), KEY: 0.5 + s, "nan": float("nan") if s == 3 else 1.0})
    path = run.dir / "metrics.jsonl"
    (tmp_path / "metrics.rank1.jsonl").write_bytes(path.read_bytes())

    def no_decoding(*args):
        raise AssertionError("decoded line by line")

    monkeypatch.setattr(PeerFiles, "_decode", staticmethod(no_decoding))
    files = PeerFiles(tmp_path, None, 2, interval=0.0)
    ((rank, name, steps, values),) = files.poll({('"' + KEY + '"').encode(): KEY})
    files.close()
    assert (rank, name, steps, values) == (1, KEY, list(range(30)), [0.5 + s for s in range(30)])
