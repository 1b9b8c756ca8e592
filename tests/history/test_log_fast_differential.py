"""Differential checks for the cheaper log() path (docs/logging.md "What one log() costs"):
the writer notes a batch's steps at once (``FileState.note_batch``) exactly as one
``note_step`` per line would, and a summary whose store hook is ``dict.update`` between
saves holds exactly what ``on_row_locked`` for every row gives, define_metric included."""

from __future__ import annotations

import threading
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from expr_tracker.history.recovery import FileState
from expr_tracker.history.store import HistoryStore
from expr_tracker.runsummary import Summary

STEPS = st.lists(st.one_of(st.none(), st.integers(0, 40)), max_size=30)


def _state(f: FileState) -> tuple:
    return (f.lines, f.size, f.last_step, f.max_step, f.sorted, f.has_duplicate_steps, f.index)


@settings(max_examples=300, deadline=None)
@given(
    before=st.lists(STEPS, max_size=3),
    batch_steps=STEPS,
    shape=st.sampled_from(["any", "rising", "never falling"]),
    every=st.integers(1, 7),
    lens=st.lists(st.integers(1, 9), min_size=30, max_size=30),
    rises=st.lists(st.integers(0, 1), min_size=30, max_size=30),
)
def test_note_batch_equals_note_step_per_line(before, batch_steps, shape, every, lens, rises):
    if shape == "rising":  # the fast case: steps strictly rising past what is on disk
        batch_steps = [100 + i * 2 for i in range(len(batch_steps))]
    elif shape == "never falling":  # a span file: several records a step, from the last
        top = max((s for steps in before for s in steps if s is not None), default=0)
        batch_steps = [top + sum(rises[:i]) for i in range(len(batch_steps))]
    a = FileState(Path("m.jsonl"), every)
    b = FileState(Path("m.jsonl"), every)
    for steps in [*before, batch_steps]:
        batch = [b"x" * lens[i] for i in range(len(steps))]
        a.lines, a.size = a.note_batch(batch, list(steps), a.lines, a.size)
        line_no, off = b.lines, b.size
        for line, step in zip(batch, steps, strict=True):
            b.note_step(step, line_no, off)
            off += len(line) + 1
            line_no += 1
        b.lines, b.size = line_no, off
        assert _state(a) == _state(b)


OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("log"),
            st.dictionaries(st.sampled_from("abcd"), st.floats(-5, 5), max_size=3),
        ),
        st.tuples(st.just("save_due"), st.none()),
        st.tuples(st.just("define"), st.sampled_from(["min", "max,mean", "last"])),
        st.tuples(st.just("assign"), st.floats(0, 1)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops=OPS)
def test_attached_summary_equals_one_fed_row_by_row(tmp_path_factory, ops):
    d = tmp_path_factory.mktemp("s")
    store = HistoryStore(None, max_open_seconds=None)
    fast = Summary(d / "a.json", lock=store.lock)
    fast.attach(store)
    slow = Summary(d / "b.json", lock=threading.Lock())
    store.sinks.append(slow.on_row)  # every committed row, one call each
    try:
        for op, arg in ops:
            if op == "log":
                store.ingest(dict(arg))
            elif op == "save_due":
                fast._save_due()
                slow._save_due()
            elif op == "define":
                fast.define("a", summary=arg)
                slow.define("a", summary=arg)
            else:
                fast["best"] = arg
                slow["best"] = arg
            assert fast.to_dict() == slow.to_dict()
            assert fast.saved().get("_step") == slow.saved().get("_step")
        fast.close()
        slow.close()
        assert (d / "a.json").read_bytes() == (d / "b.json").read_bytes()
    finally:
        fast.close()
        slow.close()


def test_the_hook_is_the_dict_update_between_saves(tmp_path):
    store = HistoryStore(None, max_open_seconds=None)
    s = Summary(tmp_path / "s.json", lock=store.lock)
    s.attach(store)
    try:
        assert store.on_commit == s.on_row_locked
        store.ingest({"a": 1.0})  # schedules the save: from now on only the update
        assert store.on_commit == s._last.update
        s._save_due()
        assert store.on_commit == s.on_row_locked
        store.ingest({"a": 2.0})
        s.define("a", summary="min")  # an aggregation: every row through on_row_locked
        assert store.on_commit == s.on_row_locked
        store.ingest({"a": 0.5})
        assert store.on_commit == s.on_row_locked
        assert s["a"] == {"min": 0.5}
    finally:
        s.close()
