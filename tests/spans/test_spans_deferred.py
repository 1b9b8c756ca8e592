"""Plain span records encoded by the span file's writer, and log() with spans waiting.

A step's plain span records reach the span file's writer as one queue entry
(``JsonlWriter.append_deferred``) that the writer turns into lines when it writes them, off
the training thread; ``log(d)`` of plain values with plain spans waiting commits their
metrics and ``d`` in one dict (docs/spans.md "Cost"). The byte-for-byte comparison with
the old path is in ``test_spans_batch_diff.py``; here: interrupts, order, failures.
"""

from __future__ import annotations

import collections
import json
import logging

import pytest
from helpers import Injector, count_events

import expr_tracker as et
from expr_tracker.history.writer import JsonlWriter
from expr_tracker.spans.recorder import _PlainRecords


def _records(run) -> list[dict]:
    with open(run.dir / "spans.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _steps(run) -> list[int]:
    with open(run.dir / "metrics.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["_step"] for line in f]


def test_a_step_of_plain_spans_is_one_deferred_entry(tmp_path):
    run = et.init(project="proj", name="r1", dir=str(tmp_path / "runs"), span_buffer_size=1000)
    try:
        et.log({})  # the writer's first record is written at once: not this test's subject
        run.spans.flush()
        w = run.spans._writer
        with et.span("outer"):
            with et.span("inner"):
                pass
        assert et.log({"loss": 1.0}) == 1
        with w._lock:
            queued = list(w.queue.lines)
        assert [type(x) for x in queued] == [_PlainRecords]
        row = et.history(1)[-1]
        assert row["loss"] == 1.0 and row["time_ms/outer"] >= row["time_ms/outer/inner"] >= 0
    finally:
        et.finish()
    recs = _records(run)
    assert [(r["name"], r["_step"]) for r in recs] == [("outer/inner", 1), ("outer", 1)]
    assert recs[0]["parent"] == recs[1]["id"]


@pytest.mark.parametrize("buffer_size", [1, 50])
def test_interrupt_at_every_point_of_a_log_with_spans_waiting(tmp_path, buffer_size):
    """``log({})`` with two nested plain spans waiting, interrupted at each of its points in
    turn: no span reaches the span file twice (before this path, an interrupt as the span
    sink returned wrote its records again at the next ``log()``), no step is written twice,
    every step ``log()`` returned is on disk, and the next call works. (An interrupt inside
    the sink before the writer took the records loses them, as before: at most once.)"""
    run = et.init(
        project="proj", name="r1", dir=str(tmp_path / "runs"), span_buffer_size=buffer_size
    )
    ended: list[int] = []
    returned: list[int] = []

    def step(at: int | None) -> None:
        with et.span("outer") as outer:
            with et.span("inner") as inner:
                pass
        ended.extend((inner.id, outer.id))
        if at is None:
            returned.append(et.log({}))
            return
        inj = Injector(at)
        try:
            returned.append(inj.run(et.log, {}))
        except KeyboardInterrupt:
            pass

    step(None)
    with et.span("outer") as outer:
        with et.span("inner") as inner:
            pass
    ended.extend((inner.id, outer.id))
    n = count_events(et.log, {}) + 10
    for at in range(1, n):
        step(at)
        step(None)  # the next call works (no lock left held)
    et.finish()
    ids = [r["id"] for r in _records(run)]
    twice = [i for i, c in collections.Counter(ids).items() if c > 1]
    assert twice == []
    assert set(ids) <= set(ended)
    assert len(set(ids)) > len(ended) // 2  # most calls were not interrupted in the sink
    steps = _steps(run)
    assert sorted(set(steps)) == steps  # no step twice, in order
    assert set(returned) <= set(steps)


class _Boom:
    """A deferred entry whose encoding fails."""

    def __len__(self) -> int:
        return 10

    def lines(self) -> list[bytes]:
        raise ValueError("no")


def test_deferred_entries_keep_their_place_and_a_failing_one_drops_only_itself(tmp_path, caplog):
    class Two:
        def __len__(self) -> int:
            return 20

        def lines(self) -> list[bytes]:
            return [b'{"b":1}', b'{"b":2}']

    class Empty:
        def __len__(self) -> int:
            return 0

        def lines(self) -> list[bytes]:
            return []

    w = JsonlWriter(tmp_path / "s.jsonl", async_write=False, buffer_size=100, lock=False)
    assert w.append(b'{"a":1}', 0)
    assert w.append_deferred(Two())
    assert w.append_deferred(_Boom())
    assert w.append(b'{"c":1}', 1)
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        w.flush()
    assert w.append_deferred(Empty())
    w.flush()  # a batch of no lines writes nothing, and is done
    assert w.pending == 0
    w.close()
    assert (tmp_path / "s.jsonl").read_bytes().splitlines() == [
        b'{"a":1}',
        b'{"b":1}',
        b'{"b":2}',
        b'{"c":1}',
    ]
    assert "encoding records" in caplog.text


def test_a_deferred_entry_refused_by_a_closed_writer_is_counted(tmp_path):
    run = et.init(project="proj", name="r1", dir=str(tmp_path / "runs"))
    rec = run.spans
    rec._writer.close()  # closed under the recorder: what it refuses is counted
    with et.span("late"):
        pass
    et.log({})
    assert rec.stats()["dropped_pending"] == 1
    et.finish()
