"""The pending bound of a writer whose disk keeps failing: probe, drop-oldest, dropped steps.

Past ``max_pending_records`` (while writes fail) a
:class:`~expr_tracker.history.writer.JsonlWriter` first tries its oldest record alone on
disk (:func:`probe`, at most every ``PROBE_INTERVAL_S``): when that works the disk may be
back and the queue is written instead of dropped (the writer recovers, and says so, only
when that whole batch lands). Otherwise the oldest records are dropped
(:func:`enforce_limit`), counted and logged loudly, and their steps kept as ``[first,
last]`` ranges (:func:`note_dropped`, ``stats()["dropped_steps"]``).

The functions taking ``w`` run under the writer's ``_lock`` and update its queue and
counters in place.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("expr_tracker")

#: while the disk fails and ``max_pending_records`` is reached, ``append`` tries one record
#: on disk at most this often before dropping the oldest (so a disk that came back stops
#: the loss at once, and a dead one costs one failed write per interval, not per record)
PROBE_INTERVAL_S = 0.1
#: ``[first, last]`` ranges of dropped steps kept in ``stats()["dropped_steps"]``
MAX_DROPPED_RANGES = 64


def probe(w: Any) -> bool:
    """Under ``w._lock``, at the pending bound while failing: try to write the oldest
    record alone (one small write) unless a flush is in flight. True when it landed: the
    caller then flushes the queue instead of dropping, and the writer stays failing (a
    full disk may take one small record and refuse the rest) until that whole batch lands,
    which announces the recovery. Either way the retry schedule is left as it was."""
    w._probe_at = w._clock() + PROBE_INTERVAL_S
    if not w._io_lock.acquire(blocking=False):
        return False  # a flush is writing now: it is the probe
    try:
        retry = (w._retry_delay, w._next_retry)
        written = w.batches_written
        try:
            ok = w._write_batch(w._lines[:1], w._steps[:1], probe=True)
        finally:
            if w.batches_written != written:  # on disk: leave the queue (one step)
                w._lines, w._steps = w._lines[1:], w._steps[1:]
                w._pending_bytes = sum(map(len, w._lines))
        w._retry_delay, w._next_retry = retry
        return ok
    finally:
        w._io_lock.release()


def enforce_limit(w: Any) -> None:
    """Drop the oldest pending records past ``max_pending_records`` (under ``w._lock``):
    counted in ``dropped`` and logged as an error at the first drop of an outage and
    each time the count doubles (loud, but not one line per row)."""
    over = len(w._lines) - w.max_pending_records
    if over <= 0:
        return
    note_dropped(w.dropped_steps, w._steps[:over])
    del w._lines[:over]
    del w._steps[:over]
    w._pending_bytes = sum(map(len, w._lines))
    w.dropped += over
    w.flushed += over
    if w.dropped >= w._drop_logged_at:
        w._drop_logged_at = w.dropped * 2
        log.error(
            "expr_tracker: %s: the disk has kept failing and more than %d records were "
            "pending; dropped the oldest (%d dropped so far, counted in et.info(); logged "
            "again when the count doubles). Fix the disk to stop the loss.",
            w.path,
            w.max_pending_records,
            w.dropped,
        )


def note_dropped(ranges: list[list[int]], steps: list[int | None]) -> None:
    """Keep the steps of dropped records in ``ranges`` as ``[first, last]`` ranges (at
    most ``MAX_DROPPED_RANGES``; past it the last range widens), so span records naming
    those steps can be told apart (docs/logging.md "When the disk fails")."""
    for step in steps:
        if step is None:
            continue
        if ranges and ranges[-1][0] <= step <= ranges[-1][1] + 1:
            if step > ranges[-1][1]:
                ranges[-1][1] = step
        elif len(ranges) < MAX_DROPPED_RANGES:
            ranges.append([step, step])
        else:
            last = ranges[-1]
            last[0], last[1] = min(last[0], step), max(last[1], step)
