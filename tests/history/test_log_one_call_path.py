"""The one-call path of log() (docs/logging.md "What one log() costs"): a row of plain values
is committed without the general merge, held rows reach the writer in order, and the
summary takes rows under the store lock. Each case is checked against the general path."""

from __future__ import annotations

import enum
import math

import pytest
from helpers import needs_python

import expr_tracker as et
from expr_tracker.history import cache as cache_mod
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


def test_plain_rows_reach_the_file_in_order_through_flush_and_close(tmp_path):
    w = JsonlWriter(tmp_path / "m.jsonl", buffer_size=50, interval=30.0, max_seconds=30.0)
    s = HistoryStore(w, max_open_seconds=None)
    for i in range(130):
        s.ingest({"i": float(i)})
    s.flush()  # (before it, a batch the flusher thread is writing is in neither count)
    assert (s.stats()["rows_on_disk"], s.stats()["pending_rows"]) == (130, 0)
    assert [r["i"] for r in read_rows(tmp_path / "m.jsonl")] == [float(i) for i in range(130)]
    for i in range(130, 140):
        s.ingest({"i": float(i)})
    s.close()
    rows = read_rows(tmp_path / "m.jsonl")
    assert [r["_step"] for r in rows] == list(range(140))
    assert [r["i"] for r in rows] == [float(i) for i in range(140)]


@pytest.mark.parametrize(
    "where",
    [
        pytest.param("cache", marks=needs_python(cache_mod, why="replaces RowCache.append of")),
        "writer",
    ],
)
def test_an_interrupt_in_a_plain_commit_writes_each_row_once(tmp_path, monkeypatch, where):
    # async_write=False: no flusher thread, the writer is told of every row (poke_at -1)
    w = JsonlWriter(tmp_path / "m.jsonl", interval=30.0, max_seconds=30.0, async_write=False)
    s = HistoryStore(w, max_open_seconds=None)
    s.ingest({"i": 0.0})
    # "writer": the row reached the cache (the writer's queue) and telling the writer
    # (JsonlWriter.added, a flush to schedule) is interrupted
    target = s.cache if where == "cache" else w
    name = "append" if where == "cache" else "added"
    real = getattr(type(target), name)
    calls = []

    def interrupted(self, *args):
        if not calls:
            calls.append(1)
            raise KeyboardInterrupt
        return real(self, *args)

    monkeypatch.setattr(type(target), name, interrupted)
    assert w.poke_at == -1
    with pytest.raises(KeyboardInterrupt):
        s.ingest({"i": 1.0})
    s.ingest({"j": 2.0})
    s.close()
    rows = [{k: v for k, v in r.items() if k != "_time"} for r in read_rows(w.path)]
    if where == "cache":  # nothing was written: the values waited in the open row
        assert rows == [{"i": 0.0, "_step": 0}, {"i": 1.0, "j": 2.0, "_step": 1}]
    else:  # the row was in the cache: its commit completed, the writer writes it too
        assert rows == [{"i": 0.0, "_step": 0}, {"i": 1.0, "_step": 1}, {"j": 2.0, "_step": 2}]


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
