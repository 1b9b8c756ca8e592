"""Span forms, nesting, printing, errors and the recorder (against small fakes)."""

from __future__ import annotations

import asyncio
import os
import threading

import orjson
import pytest

from expr_tracker.errors import ForkedRunError
from expr_tracker.spans import (
    SpanRecorder,
    current_span,
    get_active_recorder,
    set_active_recorder,
    span,
    start_span,
)


class FakeStore:
    def __init__(self) -> None:
        self.calls: list[tuple[dict, float]] = []
        self.open_step = 7

    def ingest_span(self, metrics, dur_ms):
        self.calls.append((dict(metrics), dur_ms))
        return self.open_step

    def merged(self) -> dict:
        out: dict = {}
        for m, _ in self.calls:
            for k, v in m.items():
                out[k] = out.get(k, 0) + v
        return out


class FakeWriter:
    def __init__(self, accept: bool = True) -> None:
        self.lines: list[bytes] = []
        self.accept = accept

    def append(self, line: bytes):
        if not self.accept:
            return False
        self.lines.append(line)
        return True

    def flush(self) -> None:
        pass

    def records(self) -> list[dict]:
        return [orjson.loads(x) for x in self.lines]


@pytest.fixture
def rec():
    store, writer = FakeStore(), FakeWriter()
    r = SpanRecorder(store, writer)
    prev = set_active_recorder(r)
    yield r, store, writer
    set_active_recorder(prev)


def test_import_is_light():
    import subprocess
    import sys

    code = "import sys, expr_tracker.spans, expr_tracker.plugins; print('torch' in sys.modules, 'pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


def test_nested_paths_metrics_and_records(rec):
    _, store, writer = rec
    with span("forward"):
        with span("attention"):
            pass
        with span("mlp"):
            pass
    with span("backward"):
        pass
    keys = [next(iter(m)) for m, _ in store.calls]
    assert keys == [
        "time_ms/forward/attention",
        "time_ms/forward/mlp",
        "time_ms/forward",
        "time_ms/backward",
    ]
    recs = writer.records()
    assert [r["name"] for r in recs] == ["forward/attention", "forward/mlp", "forward", "backward"]
    assert [r["depth"] for r in recs] == [1, 1, 0, 0]
    assert recs[0]["parent"] == recs[2]["id"] and recs[2]["parent"] is None
    for r in recs:
        assert r["_step"] == 7 and r["pid"] == os.getpid()
        assert {"start", "dur_ms", "tid", "thread", "id"} <= set(r)
        assert r["dur_ms"] >= 0


def test_repeated_paths_sum_and_count():
    store, writer = FakeStore(), FakeWriter()
    prev = set_active_recorder(SpanRecorder(store, writer, count=True))
    try:
        for _ in range(32):
            with span("layer"):
                pass
    finally:
        set_active_recorder(prev)
    merged = store.merged()
    assert merged["count/layer"] == 32
    assert merged["time_ms/layer"] == pytest.approx(sum(d for _, d in store.calls))
    assert len(writer.lines) == 32


def test_span_metrics_false_keeps_store_out(rec):
    store, writer = FakeStore(), FakeWriter()
    set_active_recorder(SpanRecorder(store, writer, metrics=False))
    with span("req-123", user="u"):
        pass
    assert store.calls == []
    (r,) = writer.records()
    assert r["_step"] == 7 and r["args"] == {"user": "u"}


def test_no_span_file(rec):
    store = FakeStore()
    set_active_recorder(SpanRecorder(store, None))
    with span("a"):
        pass
    assert len(store.calls) == 1


def test_no_active_run_still_times_and_prints():
    prev = set_active_recorder(None)
    try:
        lines: list[str] = []
        with span("alone", print_fn=lines.append) as s:
            pass
        assert s.duration_ms >= 0 and s.metrics["time_ms"] == s.duration_ms
        assert len(lines) == 2
    finally:
        set_active_recorder(prev)


def test_errors_recorded_and_reraised(rec):
    _, _, writer = rec
    with pytest.raises(ValueError):
        with span("risky"):
            raise ValueError("boom")
    (r,) = writer.records()
    assert r["error"] == "ValueError"


def test_recording_failure_is_ignored(caplog):
    class Broken:
        open_step = 0

        def ingest_span(self, m, d):
            raise RuntimeError("store is broken")

    prev = set_active_recorder(SpanRecorder(Broken(), None))
    try:
        for _ in range(3):
            with span("x"):
                pass
    finally:
        set_active_recorder(prev)
    assert sum("recording span" in r.getMessage() for r in caplog.records) == 1


def test_attrs_encoded_copy_and_set(rec):
    import datetime
    from pathlib import Path

    import numpy as np

    _, _, writer = rec
    p = Path("/tmp/x")
    with span("load", batch_size=np.int64(32), path=p, step=5) as s:
        s.set(rows=3, when=datetime.date(2024, 1, 2), bad=float("nan"))
    assert s.attrs["path"] is p  # original values kept on the object
    line = writer.lines[-1]
    assert b"NaN" in line  # non-finite stays readable, not null
    import json

    r = json.loads(line)
    assert r["args"]["batch_size"] == 32 and r["args"]["path"] == "/tmp/x"
    assert r["args"]["step"] == 5 and r["args"]["when"] == "2024-01-02"
    assert r["_step"] == 7  # step= only adds args.step


def test_start_span_out_of_order_end(rec):
    _, _, writer = rec
    outer = start_span("outer")
    inner = start_span("inner")
    assert inner.path == "outer/inner"
    outer.end()  # ends first: filtered out, inner stays open
    assert current_span() is inner
    with span("child") as c:
        pass
    assert c.path == "outer/inner/child"
    inner.end()
    inner.end()  # second end ignored
    assert current_span() is None
    with span("after") as a:
        pass
    assert a.path == "after" and a.depth == 0
    assert [r["name"] for r in writer.records()] == [
        "outer",
        "outer/inner/child",
        "outer/inner",
        "after",
    ]


def test_span_ended_in_another_thread_does_not_stay_parent(rec):
    s = start_span("cross")
    t = threading.Thread(target=s.end)
    t.start()
    t.join()
    with span("next") as n:
        pass
    assert n.path == "next"


def test_threads_start_their_own_stack(rec):
    paths = []

    def worker():
        with span("w") as s:
            paths.append(s.path)

    with span("main"):
        t = threading.Thread(target=worker)
        t.start()
        t.join()
    assert paths == ["w"]


def test_async_tasks_do_not_nest(rec):
    _, _, writer = rec

    async def work(name):
        async with span(name) as s:
            await asyncio.sleep(0.01)
            return s.path

    async def main():
        return await asyncio.gather(work("a"), work("b"))

    assert asyncio.run(main()) == ["a", "b"]
    recs = writer.records()
    assert {r["task"] for r in recs} and all(r["task"] for r in recs)


def test_decorators_sync_and_async(rec):
    _, store, _ = rec

    @span("pre", kind="sync")
    def pre(x):
        return x + 1

    @span("fetch")
    async def fetch(x):
        await asyncio.sleep(0)
        return x * 2

    assert pre(1) == 2 and pre(2) == 3
    assert asyncio.run(fetch(4)) == 8
    assert [next(iter(m)) for m, _ in store.calls] == [
        "time_ms/pre",
        "time_ms/pre",
        "time_ms/fetch",
    ]


def test_printing_tree_and_inheritance():
    lines: list[str] = []
    with span("step", print_fn=lines.append):
        with span("forward"):
            with span("attention"):
                pass
        with span("quiet", print_fn=False):
            with span("hidden"):
                pass
    assert [ln.split()[1] for ln in lines] == [
        "step",
        "forward",
        "attention",
        "attention",
        "forward",
        "step",
    ]
    assert lines[1].startswith("  -> forward  ") and lines[2].startswith("    -> attention  ")
    assert lines[3].startswith("    <- attention  ") and lines[3].endswith("ms")
    assert lines[0].startswith("-> step  ")
    import re

    assert re.fullmatch(r"<- step  \d\d:\d\d:\d\d  \d+\.\d{3}ms", lines[-1])


def test_printing_relative_to_the_span_that_started_it():
    lines: list[str] = []
    with span("deep0"):
        with span("deep1"):
            with span("here", print_fn=lines.append):
                with span("child"):
                    pass
    assert lines[0].startswith("-> here") and lines[1].startswith("  -> child")


def test_print_failure_marker_and_swallowed_print_errors():
    lines: list[str] = []
    with pytest.raises(KeyError):
        with span("bad", print_fn=lines.append):
            raise KeyError("k")
    assert lines[-1].endswith("  !KeyError")

    def boom(line):
        raise OSError("closed")

    with span("ok", print_fn=boom) as s:
        pass
    assert s.duration_ms >= 0


def test_run_wide_print_and_plugins():
    lines: list[str] = []
    seen = []
    store, writer = FakeStore(), FakeWriter()
    prev = set_active_recorder(
        SpanRecorder(
            store,
            writer,
            print_fn=lines.append,
            plugins=[lambda s: seen.append(s.path) or {"x": 1}],
        )
    )
    try:
        with span("a"):
            with span("b", plugins=[]):
                pass
    finally:
        set_active_recorder(prev)
    assert lines[0].startswith("-> a") and lines[1].startswith("  -> b")
    assert seen == ["a"]
    assert store.calls[1][0] == {"time_ms/a": store.calls[1][1], "x/a": 1}


def test_oversize_record_dropped_metrics_kept(caplog):
    store, writer = FakeStore(), FakeWriter()
    r = SpanRecorder(store, writer, max_record_bytes=200)
    prev = set_active_recorder(r)
    try:
        for _ in range(3):
            with span("big", blob="x" * 500):
                pass
        with span("small"):
            pass
    finally:
        set_active_recorder(prev)
    assert len(store.calls) == 4
    assert [orjson.loads(x)["name"] for x in writer.lines] == ["small"]
    assert r.stats()["dropped_oversize"] == 3
    assert sum("max_record_bytes" in x.getMessage() for x in caplog.records) == 1


def test_writer_refusal_counted():
    store, writer = FakeStore(), FakeWriter(accept=False)
    r = SpanRecorder(store, writer)
    prev = set_active_recorder(r)
    try:
        with span("a"):
            pass
    finally:
        set_active_recorder(prev)
    assert r.stats()["dropped_pending"] == 1 and len(store.calls) == 1


def test_close_unsets_and_stops_recording():
    store, writer = FakeStore(), FakeWriter()
    r = SpanRecorder(store, writer)
    prev = set_active_recorder(r)
    try:
        r.close()
        assert get_active_recorder() is None
        set_active_recorder(r)
        with span("late"):
            pass
        assert store.calls == [] and writer.lines == []
    finally:
        set_active_recorder(prev)


def test_span_misuse():
    with pytest.raises(ValueError):
        span("")
    s = span("once")
    with s:
        pass
    with pytest.raises(RuntimeError):
        with s:
            pass


def _in_forked_child(child) -> bytes:
    """Run ``child() -> int`` in a forked child; its code (1 when it raised) as one byte."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            code = child()
        finally:
            os.write(wfd, bytes([code]))
            os._exit(0)
    os.close(wfd)
    got = os.read(rfd, 1)
    os.waitpid(pid, 0)
    os.close(rfd)
    return got


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_rejects_inherited_recorder(rec):
    r, _, _ = rec

    def child() -> int:
        try:
            with span("child"):
                pass
        except ForkedRunError:
            try:
                r.stats()
            except ForkedRunError:
                return 0
        return 1

    assert _in_forked_child(child) == b"\x00"


class RawStore(FakeStore):
    """A store with the raw-span queue (the batched path of plain spans)."""

    def __init__(self) -> None:
        super().__init__()
        self.raw: list = []

    def ingest_span(self, metrics, dur_ms, record=None, since=0):
        self.calls.append((dict(metrics), dur_ms))
        return self.open_step

    def hold_spans(self, sink, *, max_seconds=None, max_bytes=0) -> None:
        pass

    def attach_raw_spans(self, convert, sink=None):
        return self.raw

    def raw_spans_waiting(self) -> None:
        pass

    def pull_raw_spans(self) -> None:
        pass


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_spans_around_the_fork():
    """In a forked child: a span nested in one the parent started raises ForkedRunError;
    one the parent started and the child ends is not queued (the queue is the parent's);
    get_active_recorder() still names the parent's recorder. The parent is unaffected."""
    store = RawStore()
    r = SpanRecorder(store, FakeWriter())
    prev = set_active_recorder(r)
    try:
        outer = span("outer").__enter__()

        def child() -> int:
            try:
                with span("inner"):
                    pass
            except ForkedRunError:
                try:
                    with span("top"):
                        pass
                except ForkedRunError:
                    outer.__exit__(None)
                    if get_active_recorder() is r and store.raw == [] and not outer.running:
                        return 0
            return 1

        got = _in_forked_child(child)
        with span("inner"):
            pass
        outer.__exit__(None)
        assert got == b"\x00"
        assert current_span() is None
        assert [e[0].path for e in store.raw] == ["outer/inner", "outer"]
    finally:
        set_active_recorder(prev)
