"""Plain spans placed in a batch (the store's raw-span queue) against one by one.

A plain span (no plugin, attribute, ``step=`` or error) costs one list append when it ends
and is placed before the store next reads or changes its rows (docs/spans.md "Cost"). The
same random programs (``span_programs.py``: nested spans whose paths clash, loops, spans
with attributes, plugin measurements or in other threads, ``log()`` calls, flushes,
queries) run once through that path and once with it switched off (every span through
``ingest_span`` as it ends and encoded at once): the metrics file, the committed rows, the
open row and the span file must be identical, the span file byte for byte apart from the
ids, on a fake clock with even ticks.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from span_programs import ListWriter, NoFlusher, assert_same, programs, run_program

from expr_tracker.history import spanfold
from expr_tracker.history.store import HistoryStore
from expr_tracker.spans import core
from expr_tracker.spans.recorder import RAW_MAX, SpanRecorder

#: a nested ``b`` in ``a`` has the path of a span named ``a/b``
PROGRAM = programs(names=["a", "b", "a/b", "fwd"], max_leaves=10)


def _one_by_one_and_batched(
    program: list[Any], *, count: bool, monkeypatch: Any, writer: str, one_writer: str = "list"
) -> None:
    """Each span placed as it ends, written through ``one_writer`` (the list writer: each
    record encoded at once), against the batch (as shipped) written through ``writer``:
    the same metrics file, rows, open row, queries, held records, span records, and span
    bytes apart from the ids (the shared sequence moved on between the runs)."""
    kw = {"count": count, "monkeypatch": monkeypatch, "clock": "even"}
    one = run_program(program, "each", writer=one_writer, **kw)
    many = run_program(program, "summed", writer=writer, **kw)
    assert_same(many, one)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(program=PROGRAM, count=st.booleans())
def test_batched_spans_write_what_one_by_one_does(program, count, monkeypatch):
    _one_by_one_and_batched(program, count=count, monkeypatch=monkeypatch, writer="list")


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(program=PROGRAM, count=st.booleans())
def test_records_encoded_by_the_writer_are_the_bytes_one_by_one_writes(program, count, monkeypatch):
    """The span file's writer encodes a step's plain records when it writes them
    (``JsonlWriter.append_deferred``): the file holds what placing each span as it ended
    and encoding it then wrote, byte for byte, and the rows are the same."""
    _one_by_one_and_batched(program, count=count, monkeypatch=monkeypatch, writer="file")


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
    writer = "file" if deferred else "list"
    _one_by_one_and_batched(
        program, count=True, monkeypatch=monkeypatch, writer=writer, one_writer=writer
    )


@contextmanager
def _recording(writer: Any = None) -> Iterator[tuple[HistoryStore, SpanRecorder]]:
    """A store with no metrics file and a recorder writing to ``writer`` (None: a
    :class:`ListWriter`), active while the block runs, closed after it."""
    store = HistoryStore(None, max_open_seconds=None, flusher=NoFlusher())  # type: ignore[arg-type]
    rec = SpanRecorder(store, ListWriter() if writer is None else writer)
    prev = core.set_active_recorder(rec)
    try:
        yield store, rec
    finally:
        core.set_active_recorder(prev)
        rec.close()
        store.close()


def test_raw_queue_is_bounded_and_spans_from_threads_all_land(monkeypatch):
    """Past RAW_MAX waiting spans the producer places them itself; spans ended in other
    threads join the same queue and none is lost or counted twice."""
    writer = ListWriter()
    with _recording(writer) as (store, rec):

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
    assert len(writer.lines) == 4 * RAW_MAX
    assert len({line for line in writer.lines}) == 4 * RAW_MAX
    assert row["time_ms/t"] > 0


def test_a_span_ending_before_a_query_shows_in_the_open_row():
    with _recording() as (store, rec):
        with core.span("q"):
            pass
        assert len(store._raw) == 1  # waiting, not placed yet
        assert "time_ms/q" in store.open_row()
        assert store.tail(1, include_open=True)[-1]["time_ms/q"] >= 0
        assert rec.stats()["held"] == 1


@pytest.mark.parametrize("fail", [ValueError, KeyError])
def test_a_failing_conversion_never_breaks_log(fail):
    def boom(batch):
        raise fail("no")

    with _recording() as (store, rec):
        store._raw_convert = boom
        with core.span("q"):
            pass
        assert store.ingest({"x": 1.0}) == 0
        assert store._raw == []
        assert any(k.startswith("raw_spans") for k in store.warner.counts), store.warner.counts
