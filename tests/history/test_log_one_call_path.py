"""The one-call path of log() (docs/logging.md "What one log() costs"): a row of plain values
is committed without the general merge, held rows reach the writer in order, and the
summary takes rows under the store lock. Each case is checked against the general path."""

from __future__ import annotations

import enum
import math

import pytest

import expr_tracker as et
from expr_tracker.history import store as store_mod
from expr_tracker.history.reader import read_rows
from expr_tracker.history.store import HistoryStore
from expr_tracker.history.writer import JsonlWriter


class Color(enum.IntEnum):
    RED = 1


class Name(str):
    pass


#: calls that look plain and are not, among plain ones: each must land as the general
#: path lands it (dropped keys, NaN, None, conversions, big ints)
CALLS = [
    {"loss": 1.5, "lr": 1e-3, "ok": True, "tag": "a", "n": 3},
    {"loss": math.nan, "acc": 0.5},
    {"loss": math.inf},
    {"loss": None},
    {"": 1.0, "b": 2.0},
    {"_step": 9, "b": 2.0},
    {"_time": 9.0, "b": 2.0},
    {1: 2.0, "b": 3.0},
    {"c": Color.RED},
    {Name("d"): 1.0},
    {"big": 2**70},
    {"big": 2**63 - 1},
    {"s": "null", "t": 1.0},
    {},
    {"loss": 2.5, "lr": 2e-3},
]


def _rows(store: HistoryStore) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "_time"} for r in store.tail(None)]


def _replay(general: bool, monkeypatch) -> HistoryStore:
    if general:  # nothing is plain: every call takes the general path
        monkeypatch.setattr(store_mod, "PLAIN_TYPES", frozenset())
    s = HistoryStore(None, max_open_seconds=None)
    for call in CALLS:
        s.ingest(dict(call))
    monkeypatch.undo()
    return s


def test_plain_and_general_paths_commit_the_same_rows(monkeypatch):
    fast = _replay(False, monkeypatch)
    slow = _replay(True, monkeypatch)
    a, b = _rows(fast), _rows(slow)
    assert len(a) == len(CALLS)
    assert [repr(r) for r in a] == [repr(r) for r in b]  # repr: NaN equals NaN
    assert fast.dropped == slow.dropped
    assert fast.stats()["rows_logged"] == slow.stats()["rows_logged"] == len(CALLS)


def test_plain_path_after_commit_false_and_spans_uses_the_open_row(monkeypatch):
    s = HistoryStore(None, max_open_seconds=None, aggregation={"time_ms": "sum"})
    s.ingest({"a": 1.0}, commit=False)
    assert s.ingest({"b": 2.0}) == 0  # the open row held data: merged, one row
    s.ingest_span({"time_ms/f": 2.0}, 2.0)
    assert s.ingest({"c": 3.0}) == 1  # span time waiting joins this row
    rows = _rows(s)
    assert rows == [{"a": 1.0, "b": 2.0, "_step": 0}, {"time_ms/f": 2.0, "c": 3.0, "_step": 1}]


def test_the_callers_dict_is_copied():
    s = HistoryStore(None, max_open_seconds=None)
    d = {"a": 1.0}
    s.ingest(d)
    d["a"] = 5.0
    assert d == {"a": 5.0}
    assert _rows(s) == [{"a": 1.0, "_step": 0}]


def test_held_rows_reach_the_file_in_order_through_flush_stats_and_close(tmp_path):
    w = JsonlWriter(tmp_path / "m.jsonl", buffer_size=50, interval=30.0, max_seconds=30.0)
    s = HistoryStore(w, max_open_seconds=None)
    for i in range(120):
        s.ingest({"i": float(i)})
    assert s.stats()["rows_on_disk"] + s.stats()["pending_rows"] == 120  # none held back
    for i in range(120, 130):
        s.ingest({"i": float(i)})
    s.flush()
    assert [r["i"] for r in read_rows(tmp_path / "m.jsonl")] == [float(i) for i in range(130)]
    for i in range(130, 140):
        s.ingest({"i": float(i)})
    s.close()
    rows = read_rows(tmp_path / "m.jsonl")
    assert [r["_step"] for r in rows] == list(range(140))
    assert [r["i"] for r in rows] == [float(i) for i in range(140)]


def test_a_scheduled_flush_takes_the_held_rows(tmp_path):
    w = JsonlWriter(tmp_path / "m.jsonl", buffer_size=1000, interval=0.05, max_seconds=0.05)
    s = HistoryStore(w, max_open_seconds=None)
    for i in range(30):
        s.ingest({"i": float(i)})
    w.flush()  # a flush of the writer alone writes what it was handed ...
    import time

    deadline = time.monotonic() + 10
    while w.flushed < 30 and time.monotonic() < deadline:  # ... the scheduled one the rest
        time.sleep(0.01)
    assert [r["i"] for r in read_rows(tmp_path / "m.jsonl")] == [float(i) for i in range(30)]
    s.close()


def test_an_interrupt_while_handing_over_keeps_every_row_once(tmp_path, monkeypatch):
    w = JsonlWriter(tmp_path / "m.jsonl", buffer_size=4, interval=30.0, max_seconds=30.0)
    s = HistoryStore(w, max_open_seconds=None)
    for i in range(3):
        s.ingest({"i": float(i)})
    real = JsonlWriter.extend
    calls = []

    def interrupted(self, records, **kw):
        if not calls:
            calls.append(1)
            raise KeyboardInterrupt
        return real(self, records, **kw)

    monkeypatch.setattr(JsonlWriter, "extend", interrupted)
    for i in range(3, 12):
        try:
            s.ingest({"i": float(i)})
        except KeyboardInterrupt:
            pass
    s.close()
    rows = read_rows(tmp_path / "m.jsonl")
    # the interrupted call (the 6th: handing the 3 held rows over failed before its own
    # commit began) left its values in the open row, as an interrupted merge does; the next
    # call merged over them (last value wins): every other row once, in order
    assert [r["_step"] for r in rows] == list(range(11))
    assert [r["i"] for r in rows] == [0.0, 1.0, 2.0, 3.0, 4.0] + [float(i) for i in range(6, 12)]


def test_writer_extend_counts_what_append_would_refuse(tmp_path):
    w = JsonlWriter(tmp_path / "m.jsonl", max_pending_bytes=10, interval=30.0)
    recs = [(b'{"a":1}', 0), (b'{"a":2222222}', 1)]  # 7 bytes fit, 13 more do not
    assert w.extend(recs) == 1 and recs == []
    w.close()
    assert (tmp_path / "m.jsonl").read_bytes() == b'{"a":1}\n'
    closed = [(b'{"a":4}', 3)]
    assert w.extend(closed) == 1 and closed == [] and w.dropped_closed == 1


def test_the_summary_shares_the_store_lock(run_dir):
    run = et.init(project="proj", name="r1", dir=str(run_dir.parent.parent))
    assert run.summary._lock is run.history.lock
    et.define_metric("loss", summary="min")
    for v in (3.0, 1.0, 2.0):
        et.log({"loss": v, "acc": v})
    assert run.summary["acc"] == 2.0 and run.summary["loss"] == {"min": 1.0}
    run.summary["best"] = 7
    et.finish()
    assert run.summary["best"] == 7


@pytest.mark.parametrize("value", [math.nan, None])
def test_summary_sees_rows_of_the_general_path(run_dir, value):
    run = et.init(project="proj", name="r1", dir=str(run_dir.parent.parent))
    et.log({"x": value})
    et.log({"y": 1.0})
    assert repr(run.summary["x"]) == repr(value) and run.summary["y"] == 1.0
    et.finish()
