"""Plain spans whose names repeat, placed as one summed batch, against one by one.

A batch of plain spans (docs/spans.md "Cost") goes to the store as one dict of metrics; a
name that repeats in it is one key holding the sum of its spans' values, added in the
order the spans ended, from the pending row's value when one waits, so the floats are the
ones placing each span gives. The same random programs (repeated and nested names, loops,
spans in other threads, spans with attributes or plugin measurements, ``log()`` calls of
every kind, queries, flushes) run three times on a fake clock: through the summed batch,
through the store's general path (the producer gives no merged metrics: each span placed
by itself) and with no batch at all (each span handed to ``ingest_span`` as it ends). The
metrics file, the committed and open rows and the span file must be identical.
"""

from __future__ import annotations

import json
import random
import re
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
from expr_tracker.spans import core, recorder
from expr_tracker.spans.recorder import RAW_MAX, SpanRecorder


class NoFlusher:
    """No deadline ever fires: every run folds only where the program says."""

    def start(self) -> None:
        pass

    def schedule(self, key: Any, due: float, callback: Any) -> None:
        pass

    def cancel(self, key: Any) -> None:
        pass


NAMES = st.sampled_from(["layer", "fwd", "a/b"])
LOGS = st.sampled_from(
    [
        ("log",),
        ("log_x",),
        ("log_step",),
        ("log_ahead",),
        ("log_nocommit",),
        ("log_clash",),  # a logged key that is also a span metric
        ("flush",),
        ("query",),
    ]
)
LEAVES = (
    st.tuples(st.just("span"), NAMES, st.just([]))
    | st.tuples(st.just("loop"), NAMES, st.integers(1, 12))
    | st.tuples(st.just("tagged"), NAMES)
    | st.tuples(st.just("plugin"), NAMES, st.sampled_from(["sum", "max", "text", "nan"]))
    | LOGS
)


def _node(children: Any) -> Any:
    return st.tuples(st.just("span"), NAMES, st.lists(children, max_size=3)) | st.tuples(
        st.just("thread"), st.lists(children, min_size=1, max_size=3)
    )


TREE = st.recursive(LEAVES, _node, max_leaves=12)
PROGRAM = st.lists(TREE, min_size=1, max_size=8)

PLUGIN_VALUES = {
    "sum": {"m": 2.5},
    "max": {"gpu_mem_peak_mb": 3.25},
    "text": {"note": "x"},  # restarts the pending metric: the pending row is not plain
    "nan": {"m": float("nan")},  # a non-finite value in the pending row
}

_TID = re.compile(r"\(tid \d+\)")


def _run(
    program: list[Any],
    mode: str,
    *,
    count: bool,
    monkeypatch: Any,
    raw_max: int = RAW_MAX,
    cap: int | None = None,
    aggregation: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``program``; ``mode``: ``"summed"`` (as shipped), ``"general"`` (the raw batch,
    each span placed by itself) or ``"each"`` (no raw batch: ``ingest_span`` per span)."""
    rng = random.Random(27)  # ns between clock reads: durations with many digits
    now = [10**9]

    def clock() -> int:
        now[0] += rng.randrange(1, 10**7)
        return now[0]

    monkeypatch.setattr(core, "perf_counter_ns", clock)
    monkeypatch.setattr(core, "RAW_MAX", raw_max)
    monkeypatch.setattr(recorder, "RAW_MAX", raw_max)
    if cap is not None:
        monkeypatch.setattr(spanfold, "HOLD_RECORDS_BEFORE_STEPS", cap)
        monkeypatch.setattr(spanfold, "HOLD_MAX_RECORDS", 3 * cap)
    tmp = Path(tempfile.mkdtemp(prefix="repeat_sums_"))
    metrics = JsonlWriter(tmp / "metrics.jsonl", flusher=NoFlusher(), lock=False)  # type: ignore[arg-type]
    spans_w = JsonlWriter(tmp / "spans.jsonl", flusher=NoFlusher(), lock=False)  # type: ignore[arg-type]
    store = HistoryStore(
        metrics,
        max_open_seconds=None,
        flusher=NoFlusher(),  # type: ignore[arg-type]
        wall_clock=lambda: 0.0,
        aggregation=core.AGGREGATION if aggregation is None else aggregation,
    )
    rows: list[dict] = []
    store.sinks.append(rows.append)
    rec = SpanRecorder(store, spans_w, count=count, identity={"pid": 7})
    if mode == "general":
        assert rec._sums is (aggregation is None)
        rec._sums = False  # the producer gives no merged metrics: one by one
    elif mode == "each":
        rec.raw_queue = rec._raw = None  # every span through ingest_span as it ends
    rec._wall0, rec._perf0 = 1.7e9, 0
    base = next(_current.sequence)  # span ids and log marks share it: ids compare relative
    step = [0]
    shown: list[str] = []

    def run(node: Any) -> None:
        kind = node[0]
        if kind == "span":
            with core.span(node[1]):
                for child in node[2]:
                    run(child)
        elif kind == "loop":
            for _ in range(node[2]):
                with core.span(node[1]):
                    pass
        elif kind == "tagged":
            with core.span(node[1], tag=1):
                pass
        elif kind == "plugin":
            values = PLUGIN_VALUES[node[2]]
            with core.span(node[1], plugins=[lambda s: dict(values)]):
                pass
        elif kind == "thread":
            t = threading.Thread(target=lambda: [run(c) for c in node[1]], name="worker")
            t.start()
            t.join()
        elif kind == "log":
            store.ingest({})
        elif kind == "log_x":
            store.ingest({"x": 1.5})
        elif kind == "log_step":
            step[0] += 2
            store.ingest({"y": 2.0}, step=step[0])
        elif kind == "log_ahead":  # the next step, explicitly
            store.ingest({"y": 2.0}, step=store.open_step + 1)
        elif kind == "log_nocommit":
            store.ingest({"z": 0.5}, commit=False)
        elif kind == "log_clash":
            store.ingest({"time_ms/layer": 1.0})
        elif kind == "flush":
            rec.flush()
        else:
            shown.append(repr(store.open_row()))

    prev = core.set_active_recorder(rec)
    try:
        for node in program:
            run(node)
        open_row = store.open_row()
        held = rec.stats()["held"]
        rec.close()
        spans_w.close()
        store.close()
    finally:
        core.set_active_recorder(prev)
    metrics_path = tmp / "metrics.jsonl"
    metrics_bytes = metrics_path.read_bytes() if metrics_path.exists() else b""
    span_path = tmp / "spans.jsonl"
    span_lines = span_path.read_bytes().splitlines() if span_path.exists() else []
    shutil.rmtree(tmp)
    tids: dict[int, int] = {}
    records = []
    for line in span_lines:
        r = json.loads(line)
        r["id"] -= base
        if r["parent"] is not None:
            r["parent"] -= base
        # threads get new native ids each run: numbered in the order they first appear
        r["tid"] = tids.setdefault(r["tid"], len(tids))
        r["track"] = _TID.sub(f"(tid {r['tid']})", r["track"])
        records.append(r)
    return {
        "metrics": metrics_bytes,  # _time is 0.0: byte for byte
        "rows": [repr(r) for r in rows],  # repr: the floats bit for bit, NaN included
        "open": repr(open_row),
        "shown": shown,
        "held": held,
        "records": records,
    }


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["metrics"] == b["metrics"]
    assert a["rows"] == b["rows"]
    assert a["open"] == b["open"]
    assert a["shown"] == b["shown"]
    assert a["held"] == b["held"]
    assert a["records"] == b["records"]


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
    summed = _run(program, "summed", **kw)
    _same(summed, _run(program, "general", **kw))
    _same(summed, _run(program, "each", **kw))


def _long_program() -> list[Any]:
    """Past RAW_MAX and the held-record bounds with the real ones: a per-layer loop, long
    loops of one name with no log(), then explicit steps (a pending row that already holds
    sums when the next batch arrives)."""
    per_layer = [("loop", "layer", 8), ("log",)] * 20
    long = [("loop", "forward", 2500), ("loop", "layer", 700), ("log_x",)]
    steps = [("loop", "layer", 1500), ("span", "fwd", [("loop", "layer", 3)]), ("log_ahead",)]
    return per_layer + long + steps * 3 + [("loop", "layer", 1100), ("log",)]


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
    summed = _run(program, "summed", count=count, monkeypatch=monkeypatch)
    assert general_calls == []
    rows = [json.loads(line) for line in summed["metrics"].splitlines()]
    assert all(r["time_ms/layer"] > 0 for r in rows[:20])
    if count:  # every span counted once, in some row
        assert [r["count/layer"] for r in rows[:20]] == [8] * 20
        assert sum(r.get("count/layer", 0) for r in rows) == 20 * 8 + 700 + 3 * 1500 + 1100
        assert sum(r.get("count/forward", 0) for r in rows) == 2500
        assert sum(r.get("count/fwd/layer", 0) for r in rows) == 9
    assert len(summed["records"]) == 20 * 8 + 2500 + 700 + 3 * 1504 + 1100
    _same(summed, _run(program, "general", count=count, monkeypatch=monkeypatch))
    assert general_calls  # the reference really placed them one by one
    _same(summed, _run(program, "each", count=count, monkeypatch=monkeypatch))


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
    summed = _run(program, "summed", count=count, monkeypatch=monkeypatch, aggregation=aggregation)
    each = _run(program, "each", count=count, monkeypatch=monkeypatch, aggregation=aggregation)
    _same(summed, each)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(program=PROGRAM, count=st.booleans(), aggregation=st.sampled_from(NOT_SUMMED))
def test_random_programs_under_tables_that_do_not_sum(program, count, aggregation, monkeypatch):
    kw = {"count": count, "monkeypatch": monkeypatch, "raw_max": 5, "aggregation": aggregation}
    _same(_run(program, "summed", **kw), _run(program, "each", **kw))
