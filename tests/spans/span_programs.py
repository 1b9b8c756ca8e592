"""Random span programs run against a real store and span recorder, for differential tests.

A program is a list of nodes: nested spans, loops of one name, spans with an attribute or
plugin measurements, spans in another thread, ``log()`` calls of every kind, flushes and
queries of the open row. :func:`run_program` runs one through a real ``HistoryStore``, a
``SpanRecorder`` and a metrics ``JsonlWriter`` on a fake clock, with no deadline ever
firing, in one of the recorder's modes; :func:`assert_same` compares what two runs wrote.
Used by ``test_spans_batch_diff.py`` and ``test_spans_repeat_sums.py``.
"""

from __future__ import annotations

import itertools
import json
import random
import re
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from expr_tracker import _current
from expr_tracker.history import spanfold
from expr_tracker.history.store import HistoryStore
from expr_tracker.history.writer import JsonlWriter
from expr_tracker.spans import core, recorder
from expr_tracker.spans.recorder import SpanRecorder


class NoFlusher:
    """No deadline ever fires: every run folds only where the program says."""

    def start(self) -> None:
        pass

    def schedule(self, key: Any, due: float, callback: Any) -> None:
        pass

    def cancel(self, key: Any) -> None:
        pass


class ListWriter:
    """A span writer with ``append`` only: the recorder encodes every record at once (no
    ``append_deferred``); the lines stay in :attr:`lines`."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []

    def append(self, line: bytes) -> bool:
        self.lines.append(line)
        return True

    def flush(self) -> None:
        pass


#: span names that repeat, nest (``fwd/layer``) and hold a slash
NAMES = ("layer", "fwd", "a/b")

LOGS = st.sampled_from(
    [
        ("log",),
        ("log_x",),
        ("log_step",),
        ("log_ahead",),
        ("log_nocommit",),
        ("flush",),
        ("query",),
    ]
)

PLUGIN_VALUES = {
    "sum": {"m": 2.5},
    "max": {"gpu_mem_peak_mb": 3.25},
    "text": {"note": "x"},  # restarts the pending metric: the pending row is not plain
    "nan": {"m": float("nan")},  # a non-finite value in the pending row
}


def programs(names: Sequence[str] = NAMES, max_leaves: int = 12) -> st.SearchStrategy[list[Any]]:
    """Programs of 1-8 trees of at most ``max_leaves`` leaves, spans named from ``names``."""
    name = st.sampled_from(list(names))
    leaves = (
        st.tuples(st.just("span"), name, st.just([]))
        | st.tuples(st.just("loop"), name, st.integers(1, 12))
        | st.tuples(st.just("tagged"), name)
        | st.tuples(st.just("plugin"), name, st.sampled_from(sorted(PLUGIN_VALUES)))
        | st.tuples(st.just("log_clash"), name)  # a logged key that is also a span metric
        | LOGS
    )

    def node(children: Any) -> Any:
        return st.tuples(st.just("span"), name, st.lists(children, max_size=3)) | st.tuples(
            st.just("thread"), st.lists(children, min_size=1, max_size=3)
        )

    tree = st.recursive(leaves, node, max_leaves=max_leaves)
    return st.lists(tree, min_size=1, max_size=8)


PROGRAM = programs()

MODES = ("summed", "general", "each")

_IDS = re.compile(rb',"id":\d+,"parent":(?:\d+|null)')


def _clock(kind: str) -> Callable[[], int]:
    """``"random"``: 1 ns to 10 ms between reads, durations with many digits (the same
    sequence each run); ``"even"``: 7919 ns between reads, durations that repeat."""
    if kind == "even":
        ticks = itertools.count(1_000, 7_919)
        return lambda: next(ticks)
    if kind != "random":
        raise ValueError(f"clock: {kind!r}")
    rng = random.Random(27)
    now = [10**9]

    def clock() -> int:
        now[0] += rng.randrange(1, 10**7)
        return now[0]

    return clock


def run_program(
    program: list[Any],
    mode: str,
    *,
    count: bool,
    monkeypatch: Any,
    writer: str = "file",
    clock: str = "random",
    raw_max: int | None = None,
    cap: int | None = None,
    aggregation: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``program`` and return what it wrote.

    ``mode``: ``"summed"`` (as shipped: plain spans in a batch, repeated names summed),
    ``"general"`` (the batch, but the producer gives no merged metrics: each span placed
    by itself) or ``"each"`` (no batch: every span handed to ``ingest_span`` as it ends).
    ``writer``: the span file's writer, ``"file"`` (a ``JsonlWriter``: plain records
    encoded when it writes them) or ``"list"`` (:class:`ListWriter`: encoded at once).
    ``clock``: see :func:`_clock`. ``raw_max`` sets ``RAW_MAX``; ``cap`` the held-record
    bounds (``HOLD_RECORDS_BEFORE_STEPS``, and three times it ``HOLD_MAX_RECORDS``); None
    leaves them as they are. ``aggregation``: the store's table (None: the spans' own).

    Returns ``metrics`` (the metrics file's bytes; ``_time`` is 0.0), ``rows`` and ``open``
    (the committed rows and the open row, as ``repr``: floats bit for bit, NaN included),
    ``shown`` (the open row at each query), ``held`` (records held at the end), ``records``
    (the span records, ids relative to the run's first, threads numbered in order of first
    appearance) and ``bytes`` (the span lines without their ids, threads numbered so).
    """
    if mode not in MODES:
        raise ValueError(f"mode: {mode!r}")
    monkeypatch.setattr(core, "perf_counter_ns", _clock(clock))
    if raw_max is not None:
        monkeypatch.setattr(core, "RAW_MAX", raw_max)
        monkeypatch.setattr(recorder, "RAW_MAX", raw_max)
    if cap is not None:
        monkeypatch.setattr(spanfold, "HOLD_RECORDS_BEFORE_STEPS", cap)
        monkeypatch.setattr(spanfold, "HOLD_MAX_RECORDS", 3 * cap)
    with tempfile.TemporaryDirectory(prefix="span_programs_") as tmp:
        metrics_path = Path(tmp) / "metrics.jsonl"
        span_path = Path(tmp) / "spans.jsonl"
        metrics = JsonlWriter(metrics_path, flusher=NoFlusher(), lock=False)  # type: ignore[arg-type]
        if writer == "file":
            spans_w: Any = JsonlWriter(span_path, flusher=NoFlusher(), lock=False)  # type: ignore[arg-type]
        elif writer == "list":
            spans_w = ListWriter()
        else:
            raise ValueError(f"writer: {writer!r}")
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
                store.ingest({"time_ms/" + node[1]: 1.0})
            elif kind == "flush":
                rec.flush()
            elif kind == "query":
                shown.append(repr(store.open_row()))
            else:
                raise ValueError(f"node: {node!r}")

        prev = core.set_active_recorder(rec)
        try:
            for node in program:
                run(node)
            open_row = store.open_row()
            held = rec.stats()["held"]
            rec.close()
            if isinstance(spans_w, JsonlWriter):
                spans_w.close()
            store.close()
        finally:
            core.set_active_recorder(prev)
        metrics_bytes = metrics_path.read_bytes() if metrics_path.exists() else b""
        if isinstance(spans_w, ListWriter):
            lines = spans_w.lines
        else:
            lines = span_path.read_bytes().splitlines() if span_path.exists() else []
    tids: dict[int, int] = {}  # threads get new native ids each run: numbered as they appear
    records = []
    cut = []
    for line in lines:
        r = json.loads(line)
        r["id"] -= base
        if r["parent"] is not None:
            r["parent"] -= base
        native = r["tid"]
        tid = r["tid"] = tids.setdefault(native, len(tids))
        r["track"] = r["track"].replace(f"(tid {native})", f"(tid {tid})")
        records.append(r)
        # the bytes the run wrote, but for the ids (the shared sequence moves on between
        # runs) and the native thread id
        line = _IDS.sub(b"", line, count=1).replace(b'"tid":%d,' % native, b'"tid":%d,' % tid)
        cut.append(line.replace(b"(tid %d)" % native, b"(tid %d)" % tid))
    return {
        "metrics": metrics_bytes,
        "rows": [repr(r) for r in rows],
        "open": repr(open_row),
        "shown": shown,
        "held": held,
        "records": records,
        "bytes": cut,
    }


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    """The two runs of :func:`run_program` wrote the same, part by part."""
    assert a["metrics"] == b["metrics"]
    assert a["rows"] == b["rows"]
    assert a["open"] == b["open"]
    assert a["shown"] == b["shown"]
    assert a["held"] == b["held"]
    assert a["records"] == b["records"]
    assert a["bytes"] == b["bytes"]
