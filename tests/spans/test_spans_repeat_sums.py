"""Plain spans whose names repeat, placed as one summed batch, against one by one.

A batch of plain spans (docs/spans.md "Cost") goes to the store as one dict of metrics; a
name that repeats in it is one key holding the sum of its spans' values, added in the
order the spans ended, from the pending row's value when one waits, so the floats are the
ones placing each span gives. The same random programs (repeated and nested names, loops,
spans in other threads, spans with attributes or plugin measurements, ``log()`` calls of
every kind, queries, flushes) run three times on a fake clock: through the summed batch,
through the store's general path (the producer gives no merged metrics: each span placed
by itself) and with no batch at all (each span handed to ``ingest_span`` as it ends). The
metrics file, the committed and open rows and the span file must be identical. The
programs and their interpreter are in ``span_programs.py``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers import needs_python
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from span_programs import PROGRAM, assert_same, run_program

from expr_tracker.history import store as store_mod
from expr_tracker.history.store import HistoryStore
from expr_tracker.spans import core
from expr_tracker.spans.recorder import RAW_MAX


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    program=PROGRAM,
    count=st.booleans(),
    raw_max=st.sampled_from([2, 5, RAW_MAX]),
    cap=st.sampled_from([3, 8, None]),
)
def test_summed_batches_write_what_one_by_one_writes(program, count, raw_max, cap, monkeypatch):
    kw = {"count": count, "monkeypatch": monkeypatch, "raw_max": raw_max, "cap": cap}
    summed = run_program(program, "summed", **kw)
    assert_same(summed, run_program(program, "general", **kw))
    assert_same(summed, run_program(program, "each", **kw))


def _long_program() -> list[Any]:
    """Past RAW_MAX and the held-record bounds with the real ones: a per-layer loop, long
    loops of one name with no log(), then explicit steps (a pending row that already holds
    sums when the next batch arrives)."""
    per_layer = [("loop", "layer", 8), ("log",)] * 20
    long = [("loop", "forward", 2500), ("loop", "layer", 700), ("log_x",)]
    steps = [("loop", "layer", 1500), ("span", "fwd", [("loop", "layer", 3)]), ("log_ahead",)]
    return per_layer + long + steps * 3 + [("loop", "layer", 1100), ("log",)]


@needs_python(store_mod, why="counts calls by replacing a method of")
@pytest.mark.parametrize("count", [False, True])
def test_long_repeated_loops_with_the_real_bounds(count, monkeypatch):
    """A name repeated thousands of times, across RAW_MAX, the held-record bound and
    explicit steps: the same files as one by one; the summed run never placed a span by
    itself (every batch took the summed path)."""
    program = _long_program()
    general_calls: list[int] = []
    orig = HistoryStore._place_raw_locked

    def counted(self: HistoryStore, items: list[Any]) -> None:
        general_calls.append(len(items))
        orig(self, items)

    monkeypatch.setattr(HistoryStore, "_place_raw_locked", counted)
    summed = run_program(program, "summed", count=count, monkeypatch=monkeypatch)
    assert general_calls == []
    rows = [json.loads(line) for line in summed["metrics"].splitlines()]
    assert all(r["time_ms/layer"] > 0 for r in rows[:20])
    if count:  # every span counted once, in some row
        assert [r["count/layer"] for r in rows[:20]] == [8] * 20
        assert sum(r.get("count/layer", 0) for r in rows) == 20 * 8 + 700 + 3 * 1500 + 1100
        assert sum(r.get("count/forward", 0) for r in rows) == 2500
        assert sum(r.get("count/fwd/layer", 0) for r in rows) == 9
    assert len(summed["records"]) == 20 * 8 + 2500 + 700 + 3 * 1504 + 1100
    assert_same(summed, run_program(program, "general", count=count, monkeypatch=monkeypatch))
    assert general_calls  # the reference really placed them one by one
    assert_same(summed, run_program(program, "each", count=count, monkeypatch=monkeypatch))


#: tables under which time_ms or count does not sum: every span is placed by itself
NOT_SUMMED = [
    {"time_ms": "max"},
    {"time_ms": "mean"},
    {**core.AGGREGATION, "count": "max"},
]


@pytest.mark.parametrize("aggregation", NOT_SUMMED)
@pytest.mark.parametrize("count", [False, True])
def test_a_store_that_does_not_sum_span_times_places_each_span(aggregation, count, monkeypatch):
    """The producer asks the store how ``time_ms`` (and ``count``) combine; unless both
    sum, it merges nothing and every span is placed by itself (a mean's state, a
    maximum): the files are what ``ingest_span`` per span writes. Before, a batch of
    unique names took the merged path under any table (a mean lost its state)."""
    program = [
        ("span", "a", []),
        ("span", "a", [("log_nocommit",)]),  # saw a log(): joins the open row
        ("log",),
        ("loop", "layer", 5),
        ("span", "fwd", []),
        ("log",),
        ("loop", "layer", 3),
        ("log_step",),
        ("span", "b", []),
        ("loop", "layer", 4),
        ("log_step",),
    ]
    summed = run_program(
        program, "summed", count=count, monkeypatch=monkeypatch, aggregation=aggregation
    )
    each = run_program(
        program, "each", count=count, monkeypatch=monkeypatch, aggregation=aggregation
    )
    assert_same(summed, each)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(program=PROGRAM, count=st.booleans(), aggregation=st.sampled_from(NOT_SUMMED))
def test_random_programs_under_tables_that_do_not_sum(program, count, aggregation, monkeypatch):
    kw = {"count": count, "monkeypatch": monkeypatch, "raw_max": 5, "aggregation": aggregation}
    assert_same(run_program(program, "summed", **kw), run_program(program, "each", **kw))
