"""The plain span's end inline in ``Span.__exit__`` against ``SpanRecorder.record``.

A plain span appends itself to the recorder's raw queue in ``__exit__``
(``SpanRecorder.raw_queue``) instead of calling ``record()``; the stack is a chain of
spans whose top is a ``ContextVar`` (docs/spans.md "Cost"). The same program (nested
spans, spans ended out of order, spans in threads and in asyncio tasks, a failing span,
spans with attributes, ``log()`` between them) runs once with the inline end and once with
it switched off (``raw_queue`` None: every span through ``record()``, which queues plain
spans itself): the rows and the span file must be the same, bar the times and the ids.
"""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from helpers import compiled

import expr_tracker as et
from expr_tracker.history import store as store_mod
from expr_tracker.spans import core, current_span, get_active_recorder, span, start_span


def _program() -> None:
    for i in range(3):
        with span("step"):
            with span("forward"):
                with span("attention"):
                    pass
                with span("attention", layer=i):
                    pass
            try:
                with span("backward"):
                    raise ValueError("x")
            except ValueError:
                pass
            manual = start_span("manual")
            with span("inside_manual"):
                pass
            with span("after_manual"):
                manual.end()  # ended out of order: the next span is not its child
            with span("sibling"):
                pass
        et.log({"i": float(i)})

    def worker(k: int) -> None:
        for _ in range(2):
            with span(f"thread{k}"):
                with span("inner"):
                    pass

    threads = [threading.Thread(target=worker, args=(k,), name=f"w{k}") for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    async def task(name: str) -> None:
        with span(name):
            await asyncio.sleep(0)
            with span("inner"):
                await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(
            asyncio.create_task(task("a"), name="ta"), asyncio.create_task(task("b"), name="tb")
        )

    with span("outer"):
        asyncio.run(main())
    et.log({"i": 9.0})
    for _ in range(5):  # spans that wait for the next log()
        with span("tail"):
            pass
    et.log({})


def _run(tmp_path, name: str, inline: bool) -> tuple[list[dict], list[dict]]:
    run = et.init(project="p", name=name, dir=str(tmp_path))
    rec = get_active_recorder()
    assert rec.raw_queue is not None
    if not inline:
        rec.raw_queue = None  # every span through record() (its own raw branch)
    _program()
    rows = et.history()
    assert current_span() is None
    et.finish()
    lines = (run.dir / "spans.jsonl").read_text().splitlines()
    return rows, [json.loads(x) for x in lines]


def _normal(rows: list[dict], recs: list[dict]) -> tuple[list[dict], list[dict]]:
    """Times removed, ids renumbered in order of appearance (parents by the same map)."""
    ids = {r["id"]: n for n, r in enumerate(sorted(recs, key=lambda r: r["id"]))}
    out = []
    for r in recs:
        r = {k: v for k, v in r.items() if k not in ("start", "dur_ms", "tid", "pid", "track")}
        r["id"] = ids[r["id"]]
        r["parent"] = ids.get(r["parent"]) if r["parent"] is not None else None
        out.append(r)
    keys = [{k: type(v).__name__ for k, v in row.items() if k != "_time"} for row in rows]
    return keys, out


def test_inline_end_records_what_record_records(tmp_path):
    fast = _normal(*_run(tmp_path, "fast", inline=True))
    slow = _normal(*_run(tmp_path, "slow", inline=False))
    assert fast == slow
    rows, recs = fast
    by_name = {}
    for r in recs:
        by_name.setdefault(r["name"], []).append(r)
    assert len(by_name["step/forward/attention"]) == 6
    assert [r.get("error") for r in by_name["step/backward"]] == ["ValueError"] * 3
    assert "step/manual/inside_manual" in by_name and "step/manual/after_manual" in by_name
    assert "step/manual/sibling" not in by_name and "step/sibling" in by_name
    assert {r["task"] for r in by_name["outer/a"] + by_name["outer/b"]} == {"ta", "tb"}
    assert {r["task"] for r in by_name["outer/a/inner"]} == {"ta"}
    assert {r["thread"] for r in by_name["thread0"]} == {"w0"}
    assert "thread0/inner" in by_name and "outer/thread0" not in by_name
    assert [r["_step"] for r in by_name["tail"]] == [4] * 5
    assert "time_ms/tail" in rows[-1] and "time_ms/step" in rows[0]


def test_ended_spans_are_skipped_and_let_go(tmp_path):
    """The stack's top may be an ended span until the next span starts; every reader skips
    it, and set_active_recorder (init/finish) lets go of ended ones in its context."""
    et.init(project="p", name="r", dir=str(tmp_path))
    with span("a"):
        with span("b") as b:
            pass
        assert core._top_get() is b and current_span().name == "a"
        with span("c") as c:
            assert c.parent.name == "a" and c.path == "a/c"
    assert current_span() is None
    et.finish()
    assert core._top_get() is None


@pytest.mark.parametrize("attrs", [False, True])
def test_set_on_a_started_plain_span_takes_the_slow_end(tmp_path, attrs):
    et.init(project="p", name="r", dir=str(tmp_path))
    with span("a") as s:
        with span("b"):
            pass
        if attrs:
            s.set(k=1)
    et.log({})
    run = et.get_run()
    et.finish()
    recs = [json.loads(x) for x in (run.dir / "spans.jsonl").read_text().splitlines()]
    assert [r["name"] for r in recs] == ["a/b", "a"]
    assert recs[1].get("args") == ({"k": 1} if attrs else None)


@pytest.mark.parametrize("slow", [False, True], ids=["plain", "with-attributes"])
def test_an_idle_threads_ended_span_does_not_keep_its_run_alive(tmp_path, slow) -> None:
    """An ended span stays its thread's top until the thread starts another one; it must
    not hold its run's recorder (and through it the store and its row cache) once ended:
    a worker thread idle after one span would otherwise keep a finished run in memory."""
    import gc
    import weakref

    run = et.init(project="p", name="r", dir=str(tmp_path), system=False)
    # a compiled store takes no weak reference: the recorder's is the one checked then
    # (the span reaches the store only through its recorder)
    store = (lambda: None) if compiled(store_mod) else weakref.ref(run.history)
    recorder = weakref.ref(get_active_recorder())
    started, release = threading.Event(), threading.Event()

    def worker() -> None:
        with span("load", **({"shard": 1} if slow else {})):
            pass
        started.set()
        release.wait(30)  # idle, its last span still its top

    t = threading.Thread(target=worker)
    t.start()
    try:
        assert started.wait(30)
        et.log({"x": 1.0})
        et.finish()
        del run
        gc.collect()
        assert recorder() is None
        assert store() is None
    finally:
        release.set()
        t.join()
    lines = (tmp_path / "p" / "r" / "spans.jsonl").read_text().splitlines()
    assert [json.loads(x)["name"] for x in lines] == ["load"]


def test_a_record_waiting_for_the_writer_holds_no_span(tmp_path) -> None:
    # a plain span's record is its fields as plain values once placed (a log(), or the
    # raw queue's bound), not the span: spans do not live on, through the collector's
    # generations, until the writer encodes their records (docs/spans.md "Cost")
    import gc
    import weakref

    run = et.init(
        dir=str(tmp_path),
        project="p",
        system=False,
        spec={"spans": {"buffer": {"size": 100000, "interval": 3600, "max_seconds": None}}},
    )
    refs = []
    try:
        with span("first"):  # the first record is written at once; the rest wait
            pass
        et.log({"x": 0.0})
        run.history.flush()
        for i in range(4):
            with span("outer") as outer:
                with span("inner") as inner:
                    pass
            refs += [weakref.ref(outer), weakref.ref(inner)]
            del outer, inner
            et.log({"x": float(i)})
        for _ in range(core.RAW_MAX + 1):  # a loop of spans, no log(): placed at the bound
            with span("loop") as s:
                pass
            refs.append(weakref.ref(s))
            del s
        gc.collect()
        pending = et.info()["spans"]["writer"]["pending"] + et.info()["spans"]["held"]
        assert pending > 0  # records wait: what holds them is what this test is about
        alive = [r() for r in refs[:-2] if r() is not None]  # the last ones may be the top
        assert not alive, sorted({s.path for s in alive})
    finally:
        et.finish()
    lines = (tmp_path / "p").glob("*/spans.jsonl")
    records = [json.loads(x) for f in lines for x in f.read_text().splitlines()]
    assert len(records) == 1 + 8 + core.RAW_MAX + 1
    assert {r["name"] for r in records} == {"first", "outer", "outer/inner", "loop"}
    inner_parents = {r["parent"] for r in records if r["name"] == "outer/inner"}
    assert inner_parents == {r["id"] for r in records if r["name"] == "outer"}
