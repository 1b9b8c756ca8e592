"""Buffered, crash-safe JSONL appends, flushed on the shared background thread.

:class:`JsonlWriter` appends encoded lines to one file:

- ``append(line, step)`` queues one record (bytes, no newline); the first record of a
  writer's life, a full buffer (``buffer_size``), ``buffer_interval`` after the previous
  flush and ``max_buffer_seconds`` after the oldest pending record make a flush due, run on
  the process-wide :class:`~expr_tracker.history.flusher.BackgroundFlusher`;
- a flush takes its batch and writes it in order (an I/O lock serialises flushes, so
  physical line numbers always equal the order of ``append`` calls);
- a failed write is rolled back (the file is truncated to where it was), the batch is put
  back at the front of the queue, one warning is logged, and the write is retried later:
  ``RETRY_DELAY_S`` after the failed attempt, doubling up to ``RETRY_MAX_DELAY_S`` while the
  disk keeps failing (reset by a success); nothing (a full buffer, the store's eviction
  path through ``flush(only_if_due=True)``) retries earlier, only an explicit ``flush()``
  or ``close()``; past ``max_pending_records`` the oldest records are dropped, counted and
  logged loudly, but first (at most every ``PROBE_INTERVAL_S``) the oldest record is
  tried on disk: when that works the disk is back, and the queue is written instead of
  dropped; the steps of dropped records are kept as ranges (``stats()["dropped_steps"]``)
  (the queue is a :class:`~expr_tracker.history.pending.PendingQueue`, which drops and
  keeps the ranges);
- before each write the open file is checked with one ``fstat``: a file unlinked under the
  writer (the run directory was deleted) is recreated with its directory, and a file that
  is shorter than the writer wrote (truncated by another process) has a torn tail repaired
  and its line count, steps and index rescanned before the batch is appended (one warning
  each; :mod:`~expr_tracker.history.recovery` repairs and rescans the writer's
  :class:`~expr_tracker.history.recovery.FileState`);
- ``close`` refuses new records first (counted as ``dropped_closed``), then flushes, so a
  record accepted by ``append`` is never left behind by a concurrent close;
- the sidecar ``*.meta.json`` (docs/history.md "Where the answer comes from") is written
  atomically (temp file +
  ``os.replace``) at most every 2 s during flushes and always on close;
- ``before_write``: callables run after a batch is taken and before it is written (the
  run's media store waits there for the files the batch's rows reference, docs/media.md
  "Storage layout"); each one bounds its own wait, and one that raises an ``Exception``
  is logged once and skipped (the rows are still written);
- opening an existing file, the one-writer lock and the repairs are in
  :mod:`~expr_tracker.history.recovery`;
- ``warming``: when set, told the file's size after each batch once it passed its next
  mark: the run extends the query cache of the file as it grows
  (:mod:`expr_tracker.query.warmer`);
- a store's writer is fed by its row cache (:meth:`JsonlWriter.feed_from`): the cache's rows
  from ``flushed`` on are the queue (a :class:`~expr_tracker.history.pending.CacheQueue`),
  a flush copies its batch from the cache, and the store tells the writer of new rows only
  past :attr:`JsonlWriter.poke_at` (:meth:`JsonlWriter.added`: what ``append`` does after
  queueing); everything above (retries, the probe, drop-oldest, rollback) works the same.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from expr_tracker._warn import Warner
from expr_tracker.history.flusher import BackgroundFlusher, get_flusher
from expr_tracker.history.paths import atomic_write
from expr_tracker.history.pending import (  # MAX_DROPPED_RANGES re-exported: its old home
    MAX_DROPPED_RANGES,  # noqa: F401
    PROBE_INTERVAL_S,
    CacheQueue,
    PendingQueue,
)
from expr_tracker.history.reader import META_SCHEMA
from expr_tracker.history.recovery import (
    FileState,
    open_existing,
    recreate,
    release_lock_fd,
    repair_torn_tail,
    repair_truncated,
    rescan,
    take_lock,
    warn_io,
)

if TYPE_CHECKING:
    from expr_tracker.history.cache import RowCache

log = logging.getLogger("expr_tracker")

META_MIN_INTERVAL_S = 2.0
INDEX_EVERY = 1000
RETRY_DELAY_S = 1.0
RETRY_MAX_DELAY_S = 30.0


class SizeWatcher(Protocol):
    """What :attr:`JsonlWriter.warming` is told: ``written(size)`` once the file's size
    reached ``next_at`` bytes (called on the writing thread after a batch; it must not
    block and must not raise an ``Exception``)."""

    next_at: int

    def written(self, size: int) -> None: ...


class JsonlWriter:
    """Appends JSON lines to ``path``; see the module docstring.

    Args:
        path: the ``.jsonl`` file (created with its parent directories).
        buffer_size: pending records that make a flush due at once (>= 1).
        interval: seconds after the previous flush before pending records are written.
        max_seconds: seconds a pending record may wait at most (None: no deadline).
        max_pending_records: records kept in memory while the disk fails; past it the
            oldest are dropped (counted in ``stats()["dropped"]``).
        max_pending_bytes: bound on queued bytes (None: unbounded); ``append`` returns
            False and counts a drop when a record would exceed it.
        async_write: False performs due writes on the producer thread.
        meta_path: the sidecar file (None: no sidecar).
        run_meta: the ``run`` mapping stored in the sidecar.
        lock: take the one-writer lock (``<path>.lock``).
        lock_fd: a lock already taken with :func:`acquire_lock` (the builder takes it
            before it reads anything of the run); the writer owns it from then on and
            releases it at ``close``. ``lock`` is then ignored.
        index_every: one ``[step, line, offset]`` index anchor every this many lines.

    Its state, owned here and handed to the helper modules: ``queue``, a
    :class:`~expr_tracker.history.pending.PendingQueue` (records accepted, not yet written;
    under ``_lock``), and ``file``, a :class:`~expr_tracker.history.recovery.FileState`
    (descriptors, size, lines, steps and index of what is on disk; under ``_io_lock``).

    Raises:
        RunLockedError: another live process holds the lock.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        buffer_size: int = 50,
        interval: float | None = 1.0,
        max_seconds: float | None = 5.0,
        max_pending_records: int = 100_000,
        max_pending_bytes: int | None = None,
        async_write: bool = True,
        meta_path: str | os.PathLike[str] | None = None,
        run_meta: dict[str, Any] | None = None,
        lock: bool = True,
        lock_fd: int | None = None,
        index_every: int = INDEX_EVERY,
        flusher: BackgroundFlusher | None = None,
        clock: Callable[[], float] = time.monotonic,
        warner: Warner | None = None,
    ) -> None:
        self.path = Path(path)
        self.meta_path = Path(meta_path) if meta_path is not None else None
        self.buffer_size = max(1, int(buffer_size))
        self.interval = interval
        self.max_seconds = max_seconds
        self.max_pending_records = max(1, int(max_pending_records))
        self.max_pending_bytes = max_pending_bytes
        self.async_write = async_write
        self.run_meta = dict(run_meta or {})
        self.index_every = max(1, int(index_every))
        self._flusher = flusher
        self._clock = clock
        self._warner = warner or Warner()

        self._lock = threading.Lock()  # the pending queue
        self._io_lock = threading.RLock()  # one flush at a time, in order
        self.queue = PendingQueue()  # records accepted, not yet written (under _lock)
        self.file = FileState(self.path, self.index_every)  # what is on disk (_io_lock)
        self._last_flush = -1e18
        self._scheduled = False
        self._urgent = False
        self._closed = False
        self._failing = False
        self._retry_delay = RETRY_DELAY_S  # the wait after the next failed attempt
        self._next_retry = -1e18  # monotonic: no attempt before this while failing
        self._probe_at = -1e18  # monotonic: no probe (append at the bound) before this
        self.appended = 0  # records accepted by append()
        self.flushed = 0  # records written or dropped: the eviction watermark (an ordinal)
        self.dropped_oversize = 0
        self.dropped_closed = 0  # appended after close() began
        self.write_errors = 0
        self.flushes = 0
        self.batches_written = 0  # successful writes (the commit point of a flush)
        self._meta_written_at = -1e18
        self._deferred = False  # an append_deferred entry was ever queued
        self._fed: CacheQueue | None = None  # the store's row cache is the queue (feed_from)
        #: fed by a cache: the store calls :meth:`added` once ``cache.next_ordinal`` exceeds
        #: this (-1: at every row); below it a flush (or a running flush's check) covers
        #: every row appended (written under ``_lock``; read without it: :meth:`added`)
        self.poke_at = -1
        #: run before each batch is written, on the writing thread (the module docstring)
        self.before_write: list[Callable[[], object]] = []
        #: told the file's size after each batch written, when set: the run keeps the query
        #: cache of its file with it (:class:`expr_tracker.query.warmer.CacheWarmer`)
        self.warming: SizeWatcher | None = None

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._warn_io(exc, "create the directory")
        self._pid = os.getpid()  # a forked child never closes the parent's descriptors
        if lock_fd is not None:
            self.file.lock_fd = lock_fd
        elif lock:
            self.file.lock_fd = take_lock(self.path, self._warner)  # RunLockedError propagates
        try:
            open_existing(self.file, self.meta_path, self._warner)
        except OSError as exc:
            self._warn_io(exc, "open")
        self.prefix_lines = self.file.lines  # lines that existed before this writer
        if async_write:
            (self._flusher or get_flusher()).start()

    # ---------------------------------------------------------------- what is on disk

    @property
    def size(self) -> int:
        """Bytes written to the file (what the writer knows of it)."""
        return self.file.size

    @property
    def lines(self) -> int:
        """Lines in the file, including those it held before this writer."""
        return self.file.lines

    @property
    def last_step(self) -> int | None:
        return self.file.last_step

    @property
    def max_step(self) -> int | None:
        return self.file.max_step

    @property
    def sorted(self) -> bool:
        """No step in the file is behind an earlier one."""
        return self.file.sorted

    @property
    def has_duplicate_steps(self) -> bool:
        return self.file.has_duplicate_steps

    @property
    def index(self) -> list[list[int]]:
        return self.file.index

    @property
    def dropped(self) -> int:
        """Records the pending bound dropped while the disk failed."""
        return self.queue.dropped

    @property
    def dropped_steps(self) -> list[list[int]]:
        return self.queue.dropped_steps

    # ---------------------------------------------------------------- append / flush

    def append(self, line: bytes, step: int | None = None) -> bool:
        """Queue one record (encoded JSON, no newline). Returns False when it was dropped."""
        n = len(line)
        with self._lock:
            if self._closed:
                self.dropped_closed += 1
                return False
            q = self.queue
            pending = q.nbytes + n
            limit = self.max_pending_bytes
            if limit is not None and pending > limit:
                self.dropped_oversize += 1
                self._warner.warn(
                    ("pending_bytes", str(self.path)),
                    "expr_tracker: %s: more than %d bytes pending; a record was dropped "
                    "(counted in stats; warned once)",
                    self.path.name,
                    limit,
                )
                return False
            lines = q.lines
            steps = q.steps
            count = len(lines)
            appended = self.appended
            try:  # all or nothing, whatever exception (a Ctrl-C) arrives in between
                lines.append(line)
                steps.append(step)
                self.appended = appended + 1
            except BaseException:
                del lines[count:]
                del steps[count:]
                self.appended = appended
                raise
            q.nbytes = pending
            count += 1
            sync = not self.async_write
            if count == 1:
                q.oldest = self._clock()
            elif count > self.max_pending_records:
                if self._failing and not (self._clock() >= self._probe_at and self._probe()):
                    # memory is bounded here, not only when a retry runs
                    self.flushed += q.drop_oldest(self.max_pending_records, self.path)
                    return True
                # the disk works but the flusher fell behind, or one record fit: write the
                # queue now (the disk is back when it lands)
                sync = True
            if not sync and self._scheduled:
                if count < self.buffer_size or self._urgent or self._failing:
                    return True  # the common case: a flush (or a retry) is already scheduled
            now = self._clock()
            due = self._due_time(now, count)
            if not self.async_write:
                if due > now and count <= self.max_pending_records:
                    return True
            elif not sync:
                self._scheduled = True
                self._urgent = due <= now
        if sync:
            self.flush()  # back-pressure: the producer waits for the disk, nothing is dropped
            return True
        try:
            (self._flusher or get_flusher()).schedule(id(self), due, self._flush_from_worker)
        except BaseException:  # interrupted: let the next append schedule it again
            self._scheduled = False
            raise
        return True

    def feed_from(self, cache: RowCache) -> None:
        """Take the pending records from ``cache`` (the store's :class:`RowCache`, holding
        exactly the records this writer is to write, in order, from ordinal
        ``prefix_lines``) instead of a queue of its own: one append per row. The store
        appends each row to the cache, then calls :meth:`added` when ``cache.next_ordinal``
        exceeds :attr:`poke_at`. A flush copies its batch from the cache
        (:meth:`RowCache.batch`) and the rows stay queued until it commits; a drop past
        ``max_pending_records`` advances ``flushed`` (the cache keeps those rows, now
        evictable). ``append``, ``append_many`` and ``append_deferred`` then raise
        ``RuntimeError``; a row the cache receives after ``close()`` is not written (the
        store refuses rows after its own close).

        Raises:
            ValueError: records were appended already, or the cache does not start at
                ``prefix_lines``.
        """
        with self._lock:
            if self.appended or self.queue.lines or self._fed is not None:
                raise ValueError(f"{self.path}: the writer holds records already")
            if cache.next_ordinal != self.prefix_lines:
                raise ValueError(f"{self.path}: the cache does not start at the file's end")
            q = CacheQueue(cache=cache, base=self.prefix_lines)
            self.queue = self._fed = q
            self.poke_at = -1
            self.append = self.append_many = self.append_deferred = self._refuse  # type: ignore[method-assign,assignment]

    def _refuse(self, *args: Any) -> Any:
        raise RuntimeError(f"{self.path}: this writer takes its records from the row cache")

    def _set_poke_locked(self) -> None:
        """Fed by a cache, under ``_lock``: :attr:`poke_at` for the state now. While a flush
        is scheduled, rows below it need no call: the scheduled flush's check covers them;
        past ``buffer_size`` pending (or ``max_pending_records`` when the flush is urgent
        or a retry) the store calls :meth:`added` again. Otherwise -1 (at every row)."""
        fed = self._fed
        if fed is None:
            return
        if self._scheduled and self.async_write and not self._closed:
            if self._urgent or self._failing:
                room = self.max_pending_records
            else:
                room = self.buffer_size - 1
            self.poke_at = fed.base + self.flushed + room
        else:
            self.poke_at = -1

    def added(self) -> None:
        """Fed by a cache (:meth:`feed_from`): rows reached the cache up to its
        ``next_ordinal``; what :meth:`append` does after queueing one. The store calls it
        (holding its own lock, so producers are serialised) after ``RowCache.append``
        when ``cache.next_ordinal > poke_at``; nothing to call below that, the common
        case: one attribute read per row.

        Why no row is left without a flush: ``poke_at`` is raised only under ``_lock``
        while a flush is scheduled (:meth:`_set_poke_locked`) or running on the worker
        (:meth:`_flush_from_worker`), and the worker's check after its flush sets it to
        -1 before it counts the pending rows: a row appended before that is counted (and
        scheduled), one appended after finds -1 and calls this (the GIL orders the two
        threads' statements). An interrupt between the cache append and this call leaves
        the row queued (the next row, ``flush()`` or ``close()`` writes it)."""
        fed = self._fed
        assert fed is not None  # only the store calls it, after feed_from
        scheduling = False
        try:
            with self._lock:
                if self._closed:
                    return
                appended = fed.cache.next_ordinal - fed.base  # type: ignore[union-attr]
                self.appended = appended
                count = appended - self.flushed
                if count <= 0:
                    self._set_poke_locked()
                    return
                if fed.oldest is None:
                    fed.oldest = self._clock()
                sync = not self.async_write
                if count > self.max_pending_records:
                    if self._failing and not (self._clock() >= self._probe_at and self._probe()):
                        # memory is bounded here, not only when a retry runs; in order: not
                        # while a write of the oldest rows is in flight (it drops when it fails)
                        if self._io_lock.acquire(blocking=False):
                            try:
                                self.flushed += fed.drop_oldest(
                                    self.max_pending_records, self.path, self.flushed
                                )
                            finally:
                                self._io_lock.release()
                        self._set_poke_locked()
                        return
                    sync = True  # the disk works but the flusher fell behind: write now
                if not sync and self._scheduled:
                    if count < self.buffer_size or self._urgent or self._failing:
                        self._set_poke_locked()
                        return  # a flush (or a retry) is scheduled already
                now = self._clock()
                due = self._due_time(now, count)
                if not self.async_write:
                    if due > now and count <= self.max_pending_records:
                        return
                elif not sync:
                    self._scheduled = scheduling = True
                    self._urgent = due <= now
                    self._set_poke_locked()
            if sync:
                self.flush()  # back-pressure: the producer waits for the disk
                return
            (self._flusher or get_flusher()).schedule(id(self), due, self._flush_from_worker)
        except BaseException:  # interrupted: the next row calls this again
            if scheduling:
                self._scheduled = False
            self.poke_at = -1
            raise

    def append_deferred(self, entry: Any) -> bool:
        """Queue ``entry``, whose records are encoded when they are written: one queue
        entry (counted once in ``appended``, ``pending`` and ``max_pending_records``) that
        ``entry.lines() -> list[bytes]`` turns into its lines (encoded JSON, no newline;
        possibly none) on the thread that writes, each time a write of it is tried;
        ``len(entry)`` is its bytes as counted against ``max_pending_bytes`` (an
        estimate). ``lines()`` must not change anything it reads and should not raise: an
        ``Exception`` from it drops the entry's records with one warning per cause. In
        order with :meth:`append`; returns False when it was dropped (as ``append``)."""
        self._deferred = True
        n = len(entry)
        with self._lock:  # the common case, as append_many's: a write already scheduled
            q = self.queue
            lines = q.lines
            count = len(lines)
            if (
                count
                and self._scheduled
                and self.async_write
                and not self._closed
                and (count + 1 < self.buffer_size or self._urgent or self._failing)
                and count < self.max_pending_records
            ):
                size = q.nbytes + n
                limit = self.max_pending_bytes
                if limit is None or size <= limit:
                    steps = q.steps
                    appended = self.appended
                    try:  # all or nothing, as append
                        lines.append(entry)
                        steps.append(None)
                        self.appended = appended + 1
                    except BaseException:
                        del lines[count:]
                        del steps[count:]
                        self.appended = appended
                        raise
                    q.nbytes = size
                    return True
        return self.append(entry)

    def append_many(self, lines: list[bytes]) -> int:
        """Queue records (encoded JSON, no newline, no step) in order, exactly as
        :meth:`append` of each in turn would; returns how many were dropped. Under one lock
        in the common case (a write already scheduled and the batch within every bound);
        otherwise one :meth:`append` each."""
        k = len(lines)
        with self._lock:
            q = self.queue
            count = len(q.lines)
            if (
                count
                and self._scheduled
                and self.async_write
                and not self._closed
                and (count + k < self.buffer_size or self._urgent or self._failing)
                and count + k <= self.max_pending_records
            ):
                size = q.nbytes + sum(map(len, lines))
                limit = self.max_pending_bytes
                if limit is None or size <= limit:
                    ql = q.lines
                    steps = q.steps
                    appended = self.appended
                    try:  # all or nothing, as append
                        ql.extend(lines)
                        steps.extend([None] * k)
                        self.appended = appended + k
                    except BaseException:
                        del ql[count:]
                        del steps[count:]
                        self.appended = appended
                        raise
                    q.nbytes = size
                    return 0
        append = self.append
        return sum(append(line) is False for line in lines)

    def _due_time(self, now: float, count: int) -> float:
        if self._failing:  # spaced from the last failed attempt, whatever is pending
            return max(now, self._next_retry)
        if count >= self.buffer_size or self.flushes == 0 and self.appended <= 1:
            return now
        due = float("inf")
        if self.interval is not None:
            due = self._last_flush + self.interval
        oldest = self.queue.oldest
        if self.max_seconds is not None and oldest is not None:
            due = min(due, oldest + self.max_seconds)
        return max(due, now) if due != float("inf") else due

    def _flush_from_worker(self) -> None:
        with self._lock:
            self._scheduled = False
            self._urgent = False
            if self._fed is not None:  # the check below covers rows appended meanwhile
                self.poke_at = self._fed.base + self.flushed + self.max_pending_records
        try:
            self.flush(only_if_due=True)
        except BaseException:
            self.poke_at = -1  # the next row schedules again (as after a plain append)
            raise
        # records that arrived during the write (or a retry not yet due) need a due time
        with self._lock:
            # fed by a cache: -1 BEFORE counting, so a row the count below misses was
            # appended after it, by a producer that then read -1 (and calls added())
            self.poke_at = -1
            q = self.queue
            count = q.count(self.flushed)
            if count and not self._closed and not self._scheduled:
                now = self._clock()
                if q.oldest is None:
                    q.oldest = now
                due = self._due_time(now, count)
                if due != float("inf"):
                    self._scheduled = True
                    (self._flusher or get_flusher()).schedule(
                        id(self), due, self._flush_from_worker
                    )
            self._set_poke_locked()

    def flush(self, wait: bool = True, *, only_if_due: bool = False) -> bool:
        """Write every pending record now. Returns True when nothing is left pending.

        ``wait`` is accepted for symmetry with the recorder; a flush always completes (or
        fails and requeues) before returning. ``only_if_due``: while writes are failing,
        do not attempt before the retry is due (returns False at once); for internal
        callers such as the store's eviction path. An explicit ``flush()`` always tries.
        """
        q = self.queue
        fed = self._fed
        if only_if_due and self._failing and self._clock() < self._next_retry:
            return not q.count(self.flushed)
        with self._io_lock:
            if only_if_due and self._failing and self._clock() < self._next_retry:
                return not q.count(self.flushed)  # another thread just failed
            # A batch taken for writing is on disk or back at the front of the queue, whatever
            # exception (Ctrl-C, SIGTERM's SystemExit) arrives at any point: the write rolls
            # the file back unless it completed, and ``batches_written`` tells which happened.
            # Fed by a cache, the batch is a copy and never leaves the queue: ``flushed``
            # moves past it in the statement that commits the write.
            batch: list[bytes] | None = None
            steps: list[int | None] | None = None
            written = self.batches_written
            taken_at = self._clock()
            try:
                if fed is not None:
                    batch, steps = fed.take(self.flushed)
                    if not batch:
                        return True
                else:
                    with self._lock:
                        if not q.lines:
                            return True
                        batch, steps, q.lines, q.steps = q.lines, q.steps, [], []
                        q.nbytes = 0
                        q.oldest = None
                if self.before_write:
                    self._run_before_write()
                ok = self._write_batch(batch, steps)
            except BaseException:
                if batch is not None and self.batches_written == written:
                    with self._lock:
                        q.requeue(batch, steps, self._clock())  # type: ignore[arg-type]  # set with batch
                raise
            if not ok:
                with self._lock:
                    q.requeue(batch, steps, self._clock())
                    self.flushed += q.drop_oldest(self.max_pending_records, self.path, self.flushed)
                    left = q.count(self.flushed) > 0
                    if left and self.async_write and not self._closed and not self._scheduled:
                        self._scheduled = True
                        (self._flusher or get_flusher()).schedule(
                            id(self), self._next_retry, self._flush_from_worker
                        )
                    self._set_poke_locked()
                return False
            if fed is not None:
                with self._lock:  # rows appended during the write arrived after taken_at
                    fed.oldest = taken_at if fed.count(self.flushed) else None
            self.flushes += 1
            self._last_flush = self._clock()
            if (
                self.file.meta_dirty
                and self._last_flush - self._meta_written_at >= META_MIN_INTERVAL_S
            ):
                self.write_meta()
            return True

    def _probe(self) -> bool:
        """Under ``_lock``, at the pending bound while failing: try to write the oldest
        record alone (one small write) unless a flush is in flight. True when it landed:
        the caller then flushes the queue instead of dropping, and the writer stays failing
        (a full disk may take one small record and refuse the rest) until that whole batch
        lands, which announces the recovery. Either way the retry schedule is left as it
        was."""
        self._probe_at = self._clock() + PROBE_INTERVAL_S
        if not self._io_lock.acquire(blocking=False):
            return False  # a flush is writing now: it is the probe
        try:
            q = self.queue
            if self.before_write:
                self._run_before_write()
            retry = (self._retry_delay, self._next_retry)
            written = self.batches_written
            try:
                ok = self._write_batch(*q.first(self.flushed), probe=True)
            finally:
                if self.batches_written != written:  # on disk: it leaves the queue
                    q.pop_front()
            self._retry_delay, self._next_retry = retry
            return ok
        finally:
            self._io_lock.release()

    def _run_before_write(self) -> None:
        """The ``before_write`` hooks; an interrupt propagates (the caller requeues)."""
        for fn in list(self.before_write):
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - the rows are written regardless
                self._warner.warn(
                    ("before_write", type(exc).__name__),
                    "expr_tracker: a hook before writing %s failed (%s: %s); the rows are "
                    "written anyway (warned once per cause)",
                    self.path,
                    type(exc).__name__,
                    exc,
                )

    def _write_batch(
        self, batch: list[bytes], steps: list[int | None], *, probe: bool = False
    ) -> bool:
        """Write one batch; True when it is on disk. Under any other exception (an
        interrupt) the file is cut back and the bookkeeping restored before it propagates,
        unless the batch was complete: the last statement (counting ``flushed`` and
        ``batches_written``) is the commit point the caller checks.

        ``probe``: one record tried while writes fail (:meth:`_probe`): landing, it proves
        little (a full disk may still take a small record), so the writer stays failing,
        its retry schedule unchanged; the disk is back, and announced, when a whole batch
        lands."""
        written = self.batches_written
        saved = self.file.saved()
        try:
            return self._write_batch_inner(batch, steps, probe)
        except BaseException:
            if self.batches_written == written:
                self.file.restore(saved)
                self._rollback(self.file.size)
            raise

    def _write_batch_inner(
        self, batch: list[bytes], steps: list[int | None], probe: bool = False
    ) -> bool:
        entries = len(batch)
        if self._deferred:  # entries of append_deferred become their lines here
            batch, steps = self._expand(batch, steps)
            if not batch:  # every record dropped: nothing to write (the commit point)
                self.flushed, self.batches_written = (
                    self.flushed + entries,
                    self.batches_written + 1,
                )
                return True
        data = b"\n".join(batch) + b"\n"
        f = self.file
        start = f.size
        try:
            if f.fd is not None:
                self._check_file()
            if f.fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                f.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                actual = os.fstat(f.fd).st_size
                if actual < f.size:
                    repair_truncated(f, actual, self._warner)
                elif actual > f.size:  # created by someone else meanwhile: measure it
                    rescan(f, repair_torn_tail(self.path, actual), None)
            start = f.size
            self._write_all(data)
            if os.fstat(f.fd).st_nlink == 0:  # deleted during the write: write it again
                recreate(f, self._warner)
                start = f.size
                self._write_all(data)
        except OSError as exc:
            self.write_errors += 1
            self._rollback(start)
            now = self._clock()
            self._next_retry = now + self._retry_delay
            self._retry_delay = min(self._retry_delay * 2, RETRY_MAX_DELAY_S)
            self._failing = True
            self._warn_io(exc, "write to")
            return False
        if self._failing and not probe:  # a probe alone is no recovery (_write_batch)
            self._retry_delay = RETRY_DELAY_S
            self._next_retry = -1e18
            self._failing = False
            log.warning(
                "expr_tracker: writes to %s work again; %d queued records written",
                self.path,
                len(batch),
            )
        f.lines, f.size = f.note_batch(batch, steps, f.lines, start)
        f.meta_dirty = True
        # the commit point (see _write_batch): one line, no call in between
        self.flushed, self.batches_written = self.flushed + entries, self.batches_written + 1
        w = self.warming
        if w is not None and f.size >= w.next_at:
            w.written(f.size)  # queues the cache's extension; never raises an Exception
        return True

    def _expand(
        self, batch: list[Any], steps: list[int | None]
    ) -> tuple[list[bytes], list[int | None]]:
        """``batch`` with each :meth:`append_deferred` entry replaced by its lines (their
        steps None); the queue keeps the entries (a failed write tries them again)."""
        if all(type(x) is bytes for x in batch):
            return batch, steps
        out: list[bytes] = []
        out_steps: list[int | None] = []
        for x, step in zip(batch, steps, strict=True):
            if type(x) is bytes:
                out.append(x)
                out_steps.append(step)
                continue
            try:
                lines = x.lines()
            except Exception as exc:  # noqa: BLE001 - one entry never stops the others
                self._warner.warn(
                    ("deferred", type(exc).__name__),
                    "expr_tracker: encoding records for %s failed (%s: %s); they were "
                    "dropped (warned once per cause)",
                    self.path.name,
                    type(exc).__name__,
                    exc,
                )
                continue
            out.extend(lines)
            out_steps.extend([None] * len(lines))
        return out, out_steps

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        fd = self.file.fd
        assert fd is not None  # opened by the caller
        while view:
            n = os.write(fd, view)
            view = view[n:]

    def _check_file(self) -> None:
        """One ``fstat`` before a write: recreate a deleted file, repair a truncated one."""
        f = self.file
        assert f.fd is not None  # checked by the caller
        st = os.fstat(f.fd)
        if st.st_nlink == 0:
            recreate(f, self._warner)
        elif st.st_size < f.size:
            repair_truncated(f, st.st_size, self._warner)

    def _rollback(self, size: int) -> None:
        fd = self.file.fd
        if fd is None:
            return
        try:
            if os.fstat(fd).st_size > size:
                os.ftruncate(fd, size)
        except OSError:
            pass

    def _warn_io(self, exc: OSError, what: str) -> None:
        warn_io(self._warner, self.path, exc, what)

    def mark_duplicate_steps(self) -> None:
        """Record that a step occupies more than one line (a patch line was written)."""
        self.file.has_duplicate_steps = True
        self.file.meta_dirty = True

    def meta(self) -> dict[str, Any]:
        """The sidecar content for what is on disk now (docs/history.md "Where the answer
        comes from")."""
        f = self.file
        return {
            "schema": META_SCHEMA,
            "size": f.size,
            "lines": f.lines,
            "last_step": f.last_step,
            "max_step": f.max_step,
            "sorted": f.sorted,
            "has_duplicate_steps": f.has_duplicate_steps,
            "index_every": self.index_every,
            "index": f.index,
            "run": self.run_meta,
        }

    def write_meta(self) -> None:
        if self.meta_path is None or (self.file.lines == 0 and not self.path.exists()):
            return  # nothing written: no sidecar for a file that does not exist
        try:
            atomic_write(self.meta_path, json.dumps(self.meta(), separators=(",", ":")))
            self._meta_written_at = self._clock()
            self.file.meta_dirty = False
        except OSError as exc:
            self._warner.warn(
                ("io", str(self.meta_path), "sidecar"),
                "expr_tracker: cannot write the sidecar %s (%s); the records themselves are "
                "on disk and readers rescan the file instead of using the sidecar; it is "
                "rewritten at a later flush and at close (warned once)",
                self.meta_path,
                exc.strerror or exc,
            )

    @property
    def pending(self) -> int:
        return self.queue.count(self.flushed)

    def close(self) -> None:
        """Flush what is pending, write the sidecar, release the file and the lock."""
        with self._lock:  # refuse new records first, so nothing accepted is left behind
            self._closed = True
            self.poke_at = -1
        with self._io_lock:
            self.flush()
            left = self.queue.count(self.flushed)
            if left:
                log.error(
                    "expr_tracker: %d records could not be written to %s before close",
                    left,
                    self.path,
                )
            (self._flusher or get_flusher()).cancel(id(self))
            self.write_meta()
            # forget each descriptor before closing it: a close() interrupted here and
            # called again never closes a number the process has reused meanwhile
            f = self.file
            fd, f.fd = f.fd, None
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
            fd, f.lock_fd = f.lock_fd, None
            if fd is not None and os.getpid() == self._pid:
                # a forked child closed its copies at fork (the number may be reused since)
                release_lock_fd(fd)

    @property
    def closed(self) -> bool:
        """True once ``close()`` completed (the file and the lock are released)."""
        return self._closed and self.file.fd is None and self.file.lock_fd is None

    def stats(self) -> dict[str, Any]:
        f, q = self.file, self.queue
        flushed = self.flushed
        pending = q.count(flushed)
        return {
            "path": str(self.path),
            "lines": f.lines,
            "bytes": f.size,
            "appended": flushed + pending if self._fed is not None else self.appended,
            "pending": pending,
            "pending_bytes": q.pending_bytes(flushed),
            "flushes": self.flushes,
            "write_errors": self.write_errors,
            "dropped": q.dropped,
            "dropped_oversize": self.dropped_oversize,
            "dropped_closed": self.dropped_closed,
            "dropped_steps": [list(r) for r in q.dropped_steps],
            "recreated": f.recreated,
            "truncations": f.truncations,
        }
