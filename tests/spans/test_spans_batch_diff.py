"""Plain spans placed in a batch (the store's raw-span queue) against one by one.

A plain span (no plugin, attribute, ``step=`` or error) costs one list append when it ends
and is placed before the store next reads or changes its rows (docs/spans.md "Cost"). The
same random programs of nested spans and ``log()`` calls run once through that path and
once with it switched off (every span through ``ingest_span`` as it ends): the committed
rows, the open row and the span file must be identical, byte for byte, on a fake clock.
"""

from __future__ import annotations

import itertools
import json
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from expr_tracker import _current
from expr_tracker.history import spanfold
from expr_tracker.history.store import HistoryStore
from expr_tracker.history.writer import JsonlWriter
from expr_tracker.spans import core
from expr_tracker.spans.recorder import RAW_MAX, SpanRecorder


class NoFlusher:
    """No deadline ever fires: both runs fold only where the program says."""

    def start(self) -> None:
        pass

    def schedule(self, key: Any, due: float, callback: Any) -> None:
        pass

    def cancel(self, key: Any) -> None:
        pass


class ListWriter:
    def __init__(self) -> None:
        self.lines: list[bytes] = []

    def append(self, line: bytes) -> bool:
        self.lines.append(line)
        return True

    def flush(self) -> None:
        pass


NAMES = st.sampled_from(["a", "b", "a/b", "fwd"])
LOGS = st.sampled_from([("log",), ("log_x",), ("log_step",), ("log_nocommit",), ("flush",)])


def _node(children: Any) -> Any:
    return st.tuples(st.just("span"), NAMES, st.lists(children, max_size=3))


TREE = st.recursive(st.tuples(st.just("span"), NAMES, st.just([])) | LOGS, _node, max_leaves=10)
PROGRAM = st.lists(TREE, min_size=1, max_size=8)


def _run(
    program: list[Any], *, batched: bool, count: bool, monkeypatch: Any, deferred: bool = False
) -> dict:
    ticks = itertools.count(1_000, 7_919)  # ns: durations vary, and repeat the same
    monkeypatch.setattr(core, "perf_counter_ns", lambda: next(ticks))
    store = HistoryStore(
        None,
        max_open_seconds=None,
        flusher=NoFlusher(),  # type: ignore[arg-type]
        wall_clock=lambda: 0.0,
        aggregation=core.AGGREGATION,
    )
    rows: list[dict] = []
    store.sinks.append(rows.append)
    if deferred:  # the span file's writer: plain records encoded when it writes them
        path = Path(tempfile.mkdtemp(prefix="spans_diff_")) / "spans.jsonl"
        writer: Any = JsonlWriter(path, flusher=NoFlusher(), lock=False)  # type: ignore[arg-type]
    else:
        writer = ListWriter()
    rec = SpanRecorder(store, writer, count=count, identity={"pid": 7})
    if not batched:
        rec.raw_queue = rec._raw = None  # every span through ingest_span as it ends
    rec._wall0, rec._perf0 = 1.7e9, 0
    base = next(_current.sequence)  # span ids and log marks share it: ids compare relative
    step = [0]

    def run(node: Any) -> None:
        kind = node[0]
        if kind == "span":
            with core.span(node[1]):
                for child in node[2]:
                    run(child)
        elif kind == "log":
            store.ingest({})
        elif kind == "log_x":
            store.ingest({"x": 1.5})
        elif kind == "log_step":
            step[0] += 2
            store.ingest({"y": 2.0}, step=step[0])
        elif kind == "log_nocommit":
            store.ingest({"z": 0.5}, commit=False)
        else:
            rec.flush()

    prev = core.set_active_recorder(rec)
    try:
        for node in program:
            run(node)
        open_row = store.open_row()
        held = rec.stats()["held"]
        rec.close()
        store.close()
    finally:
        core.set_active_recorder(prev)
    lines = writer.lines
    if deferred:
        writer.close()
        lines = path.read_bytes().splitlines() if path.exists() else []
        shutil.rmtree(path.parent)
    out = []
    for line in lines:
        r = json.loads(line)
        r["id"] -= base
        if r["parent"] is not None:
            r["parent"] -= base
        out.append(r)
    # the lines without their ids: the bytes the two paths wrote, compared as bytes
    cut = [line.split(b',"id":')[0] + line.split(b',"pid":')[1] for line in lines]
    return {"rows": rows, "open": open_row, "held": held, "records": out, "bytes": cut}


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(program=PROGRAM, count=st.booleans())
def test_batched_spans_write_what_one_by_one_does(program, count, monkeypatch):
    one = _run(program, batched=False, count=count, monkeypatch=monkeypatch)
    many = _run(program, batched=True, count=count, monkeypatch=monkeypatch)
    assert many["rows"] == one["rows"]
    assert many["open"] == one["open"]
    assert many["held"] == one["held"]
    assert many["records"] == one["records"]
    # byte for byte apart from the ids (the shared sequence moved on between the runs)
    assert many["bytes"] == one["bytes"]


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(program=PROGRAM, count=st.booleans())
def test_records_encoded_by_the_writer_are_the_bytes_one_by_one_writes(program, count, monkeypatch):
    """The span file's writer encodes a step's plain records when it writes them
    (``JsonlWriter.append_deferred``): the file holds what placing each span as it ended
    and encoding it then wrote, byte for byte, and the rows are the same."""
    one = _run(program, batched=False, count=count, monkeypatch=monkeypatch)
    many = _run(program, batched=True, count=count, monkeypatch=monkeypatch, deferred=True)
    assert many["rows"] == one["rows"]
    assert many["open"] == one["open"]
    assert many["held"] == one["held"]
    assert many["records"] == one["records"]
    assert many["bytes"] == one["bytes"]


@pytest.mark.parametrize("deferred", [False, True])
def test_a_span_that_saw_a_log_at_the_held_bound_folds_as_one_by_one(deferred, monkeypatch):
    """A span that saw a ``log()`` while it ran, ending behind held records, is held with
    its step fixed; when that reaches the bound on held records the pending data joins
    the open row at once, in a batch as one by one (``ingest_span``'s ``FULL``). Before,
    the batch did not fold there, so the next span's metrics joined the folded data
    (here ``c``'s landed in a row instead of being dropped with the ``log(step=2)``)."""
    monkeypatch.setattr(core, "RAW_MAX", 2)
    monkeypatch.setattr(spanfold, "HOLD_RECORDS_BEFORE_STEPS", 3)
    program = [("log_x",)] * 3  # the open step is 3: log(step=2) is dropped below
    # b, b held; a saw the log(): held with its step, the third record (the bound); then c
    program += [("span", "a", [("log",), ("span", "b", []), ("span", "b", [])]), ("span", "c", [])]
    program += [("log_step",), ("log",)]
    one = _run(program, batched=False, count=True, monkeypatch=monkeypatch, deferred=deferred)
    many = _run(program, batched=True, count=True, monkeypatch=monkeypatch, deferred=deferred)
    assert many["rows"] == one["rows"]
    assert many["open"] == one["open"]
    assert many["held"] == one["held"]
    assert many["records"] == one["records"]
    assert many["bytes"] == one["bytes"]


def test_raw_queue_is_bounded_and_spans_from_threads_all_land(monkeypatch):
    """Past RAW_MAX waiting spans the producer places them itself; spans ended in other
    threads join the same queue and none is lost or counted twice."""
    store = HistoryStore(None, max_open_seconds=None, flusher=NoFlusher())  # type: ignore[arg-type]
    writer = ListWriter()
    rec = SpanRecorder(store, writer)
    prev = core.set_active_recorder(rec)
    try:

        def work() -> None:
            for _ in range(RAW_MAX):
                with core.span("t"):
                    pass

        threads = [threading.Thread(target=work) for _ in range(3)]
        for t in threads:
            t.start()
        work()
        for t in threads:
            t.join()
        assert len(store._raw) < RAW_MAX
        store.ingest({})
        rec.close()
        row = store.tail(1)[0]
        store.close()
    finally:
        core.set_active_recorder(prev)
    assert len(writer.lines) == 4 * RAW_MAX
    assert len({line for line in writer.lines}) == 4 * RAW_MAX
    assert row["time_ms/t"] > 0


def test_a_span_ending_before_a_query_shows_in_the_open_row():
    store = HistoryStore(None, max_open_seconds=None, flusher=NoFlusher())  # type: ignore[arg-type]
    rec = SpanRecorder(store, ListWriter())
    prev = core.set_active_recorder(rec)
    try:
        with core.span("q"):
            pass
        assert len(store._raw) == 1  # waiting, not placed yet
        assert "time_ms/q" in store.open_row()
        assert store.tail(1, include_open=True)[-1]["time_ms/q"] >= 0
        assert rec.stats()["held"] == 1
    finally:
        core.set_active_recorder(prev)
        rec.close()
        store.close()


@pytest.mark.parametrize("fail", [ValueError, KeyError])
def test_a_failing_conversion_never_breaks_log(fail):
    store = HistoryStore(None, max_open_seconds=None, flusher=NoFlusher())  # type: ignore[arg-type]
    rec = SpanRecorder(store, ListWriter())

    def boom(batch):
        raise fail("no")

    store._raw_convert = boom
    prev = core.set_active_recorder(rec)
    try:
        with core.span("q"):
            pass
        assert store.ingest({"x": 1.0}) == 0
        assert store._raw == []
        assert any(k.startswith("raw_spans") for k in store.warner.counts), store.warner.counts
    finally:
        core.set_active_recorder(prev)
        rec.close()
        store.close()
