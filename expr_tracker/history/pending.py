"""A writer's pending queue, and its bound while the disk fails: drop-oldest, dropped steps.

:class:`PendingQueue` holds what a :class:`~expr_tracker.history.writer.JsonlWriter`
accepted and has not written: the encoded records and their steps, in ``append`` order. The
writer owns it and changes it under its queue lock.

Past ``max_pending_records`` while writes fail, the writer first tries its oldest record
alone on disk (at most every :data:`PROBE_INTERVAL_S`): when that works the disk may be
back and the queue is written instead of dropped (the writer recovers, and says so, only
when that whole batch lands). Otherwise the oldest records are dropped
(:meth:`PendingQueue.drop_oldest`), counted and logged loudly, and their steps kept as
``[first, last]`` ranges (:func:`note_dropped`, ``stats()["dropped_steps"]``;
docs/logging.md "Buffering and crashes").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from expr_tracker.history.cache import RowCache

log = logging.getLogger("expr_tracker")

#: while the disk fails and ``max_pending_records`` is reached, ``append`` tries one record
#: on disk at most this often before dropping the oldest (so a disk that came back stops
#: the loss at once, and a dead one costs one failed write per interval, not per record)
PROBE_INTERVAL_S = 0.1
#: ``[first, last]`` ranges of dropped steps kept in ``stats()["dropped_steps"]``
MAX_DROPPED_RANGES = 64


@dataclass(slots=True)
class PendingQueue:
    """Records accepted and not yet written, under the writer's queue lock.

    ``lines`` and ``steps`` are parallel lists (the writer takes both as a batch, in one
    statement, and puts a failed batch back with :meth:`requeue`); ``nbytes`` is the sum of
    the lines' lengths, ``oldest`` the monotonic time the oldest of them arrived (None:
    empty). ``dropped`` and ``dropped_steps`` count what the pending bound dropped.
    """

    lines: list[bytes] = field(default_factory=list)
    steps: list[int | None] = field(default_factory=list)
    nbytes: int = 0
    oldest: float | None = None
    dropped: int = 0
    dropped_steps: list[list[int]] = field(default_factory=list)  # [first, last] ranges
    drop_logged_at: int = 1  # log the pending-limit drops again at this count

    def count(self, flushed: int) -> int:
        """Records pending (``flushed``, the writer's count of records written or dropped,
        matters to :class:`CacheQueue` only)."""
        return len(self.lines)

    def pending_bytes(self, flushed: int) -> int:
        return self.nbytes

    def first(self, flushed: int) -> tuple[list[bytes], list[int | None]]:
        """The oldest record alone, left in the queue (what a probe tries on disk)."""
        return self.lines[:1], self.steps[:1]

    def requeue(self, batch: list[bytes], steps: list[int | None], now: float) -> None:
        """Put a batch that did not reach the file back at the front (one assignment, so
        an interrupt cannot requeue it twice)."""
        if self.lines is batch:  # interrupted before the queue was replaced
            return
        self.lines, self.steps = batch + self.lines, steps + self.steps
        self.nbytes = sum(map(len, self.lines))
        self.oldest = now

    def pop_front(self) -> None:
        """The oldest record reached the file on its own (a probe): it leaves the queue."""
        self.lines, self.steps = self.lines[1:], self.steps[1:]
        self.nbytes = sum(map(len, self.lines))

    def drop_oldest(self, limit: int, path: Path, flushed: int = 0) -> int:
        """Drop the oldest records past ``limit`` (``max_pending_records`` of the writer of
        ``path``); returns how many (the writer adds them to its ``flushed``). Counted in
        ``dropped`` and logged as an error at the first drop of an outage and each time the
        count doubles (loud, but not one line per row)."""
        over = len(self.lines) - limit
        if over <= 0:
            return 0
        note_dropped(self.dropped_steps, self.steps[:over])
        lines = self.lines[over:]
        self.lines, self.steps, self.nbytes = lines, self.steps[over:], sum(map(len, lines))
        return self._count_dropped(over, limit, path)

    def _count_dropped(self, over: int, limit: int, path: Path) -> int:
        self.dropped += over
        if self.dropped >= self.drop_logged_at:
            self.drop_logged_at = self.dropped * 2
            log.error(
                "expr_tracker: %s: the disk has kept failing and more than %d records were "
                "pending; dropped the oldest (%d dropped so far, counted in et.info(); logged "
                "again when the count doubles). Fix the disk to stop the loss.",
                path,
                limit,
                self.dropped,
            )
        return over


@dataclass(slots=True)
class CacheQueue(PendingQueue):
    """The pending queue of a writer fed by a store's row cache
    (:meth:`~expr_tracker.history.writer.JsonlWriter.feed_from`): the records are the
    cache's rows ``[base + flushed, cache.next_ordinal)``, ``flushed`` being the writer's
    count of records written or dropped, so a committed row is queued by the one
    ``RowCache.append`` that caches it. ``lines``/``steps``/``nbytes`` stay empty: the
    cache holds the records. A batch is a copy (:meth:`take`); nothing leaves the queue
    but through ``flushed``, which the writer advances in the statement that commits a
    write (or counts a drop), under its I/O lock. ``oldest`` is set by the writer.

    The cache is read without the store's lock, on the writing thread; what makes that
    safe is in :meth:`~expr_tracker.history.cache.RowCache.batch`.
    """

    cache: RowCache | None = None
    base: int = 0  # the ordinal of the writer's first record (the disk prefix)

    def count(self, flushed: int) -> int:
        assert self.cache is not None  # set at construction
        return self.cache.next_ordinal - self.base - flushed

    def pending_bytes(self, flushed: int) -> int:
        assert self.cache is not None
        start = self.base + flushed
        return self.cache.nbytes_between(start, start + self.count(flushed))

    def take(self, flushed: int, limit: int | None = None) -> tuple[list[bytes], list[int | None]]:
        """A copy of the pending records (at most ``limit``) and their steps, oldest first;
        they stay queued until the write commits."""
        assert self.cache is not None
        start = self.base + flushed
        stop = self.cache.next_ordinal
        if limit is not None:
            stop = min(stop, start + limit)
        lines, steps = self.cache.batch(start, stop)
        return lines, cast("list[int | None]", steps)  # ints, as the writer takes them

    def first(self, flushed: int) -> tuple[list[bytes], list[int | None]]:
        return self.take(flushed, 1)

    def requeue(self, batch: list[bytes], steps: list[int | None], now: float) -> None:
        """A batch that did not reach the file: still queued (``flushed`` did not move)."""
        self.oldest = now

    def pop_front(self) -> None:
        """A probe's record reached the file: ``flushed`` moved past it already."""

    def drop_oldest(self, limit: int, path: Path, flushed: int = 0) -> int:
        """Count and log the oldest records past ``limit`` as dropped and return how many;
        the writer then adds them to ``flushed`` (which drops them: the cache keeps the
        rows, now evictable), holding its I/O lock, so no write of them is in flight."""
        over = self.count(flushed) - limit
        if over <= 0:
            return 0
        note_dropped(self.dropped_steps, self.take(flushed, over)[1])
        return self._count_dropped(over, limit, path)


def note_dropped(ranges: list[list[int]], steps: list[int | None]) -> None:
    """Keep the steps of dropped records in ``ranges`` as ``[first, last]`` ranges (at
    most ``MAX_DROPPED_RANGES``; past it the last range widens), so span records naming
    those steps can be told apart (docs/logging.md "Buffering and crashes")."""
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
