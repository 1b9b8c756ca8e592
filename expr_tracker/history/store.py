"""HistoryStore: the open row, the commit rules, the row cache and tail queries.

One ingress for everything that becomes a metric (docs/architecture.md, the history
contract): :meth:`HistoryStore.ingest` for ``et.log`` and :meth:`HistoryStore.ingest_span`
for span and plugin measurements. A committed row is encoded once and appended to the cache
under one lock; the cache is the :class:`~expr_tracker.history.writer.JsonlWriter`'s queue
too (``JsonlWriter.feed_from``: one append per row, so a row's ordinal in the cache is its
line in the file: docs/history.md "Where the answer comes from"); then it is handed to every
sink outside the lock, in commit order.

Commit table (docs/logging.md "The commit table", aligned with wandb)::

    log(d)                 merge into the open row, commit, step += 1
    log(d, commit=False)   merge only
    log(d, step=N)         N > open: commit the old row (if it holds data), open N, merge
                           N == open: merge
                           N < open: "monotonic" drops it with a warning (counted);
                                     "allow" commits the open row and opens N
    log(d, step=N, commit=True)   as above, then commit N

``log({})`` commits a row holding only ``_step``/``_time``.

The store is one object over one lock (``_lock``; the methods named ``*_locked`` run with
it held). It keeps the open row (and when it last changed) and the last ``log()`` mark, and
owns three small objects, each holding only its own state:

- :class:`~expr_tracker.history.spanfold.PendingSpans`: span data no ``log()`` reached
  yet, held span records and their sink, the hold deadline (the aggregation table is
  handed in); every method of it runs with the store lock held;
- :class:`~expr_tracker.history.openrow.OpenRowTimer`: the idle open row's deadline;
  every method of it runs with the store lock held. The deadline callbacks of both are the
  store's (``_spans_due``, ``_open_row_due``), which take the lock on the flusher thread;
- :class:`~expr_tracker.history.storeread.StoreReader`: ``tail`` and ``step_range`` with
  their counters; it takes the store lock itself to look at the cache and the open row
  (``_shown_open_locked``, called under it), and reads the file after releasing it.
"""

from __future__ import annotations

import logging
import operator
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from functools import partial
from operator import delitem
from typing import Any

from expr_tracker import _current
from expr_tracker._current import FORK_MESSAGE
from expr_tracker._current import sequence as _sequence
from expr_tracker._warn import Warner
from expr_tracker.errors import ForkedRunError
from expr_tracker.history.cache import RowCache
from expr_tracker.history.codec import (
    FLOAT_MAX_INT,
    MAX_STEP,
    PLAIN_TYPES,
    encode_plain,
    encode_row,
    has_nonfinite,
    normalize_value,
    sanitize_row,
)
from expr_tracker.history.flusher import BackgroundFlusher
from expr_tracker.history.openrow import RESERVED, OpenRowTimer, changed
from expr_tracker.history.spanfold import FULL, HELD, NEVER, OPEN_NONFINITE, OUT, PendingSpans
from expr_tracker.history.storeread import StoreReader
from expr_tracker.history.writer import JsonlWriter

log = logging.getLogger("expr_tracker")


def _as_index(v: Any) -> Any:
    """A NumPy/torch integer (anything with ``__index__``) as an ``int``; anything else as
    it is, for the reader's own checks (docs/performance.md "A compiled build": a compiled
    cache takes only a real ``int``)."""
    if v is None or type(v) is int:
        return v
    try:
        return operator.index(v)
    except TypeError:
        return v


_DROP = object()
#: keys a row of one log() call may not hold as they are (the general path drops or
#: renames them with a warning): the reserved ones and the empty name
_NOT_PLAIN_KEYS = RESERVED | {""}
_JSONEncodeError = TypeError  # orjson.JSONEncodeError is a TypeError


def _same_value(a: Any, b: Any) -> bool:
    """``_same``, and NaN is the same as NaN (a value logged twice is not a conflict)."""
    return a is b or (type(a) is type(b) and (a == b or (type(a) is float and a != a and b != b)))


class HistoryStore:
    """The per-stream store; see the module docstring.

    Args:
        writer: where committed rows go (None: memory only, used by tests and offline tools).
        step_policy: ``"monotonic"`` or ``"allow"``.
        max_open_seconds: idle seconds before the open row is written to disk (None: never).
        cache_bytes / cache_rows: the cache limits (rows not on disk are never evicted).
        start_step: the first open step (``max_step + 1`` after a resume).
        clock: monotonic seconds (injectable); wall_clock: epoch seconds for ``_time``.
    """

    def __init__(
        self,
        writer: JsonlWriter | None = None,
        *,
        step_policy: str = "monotonic",
        max_open_seconds: float | None = 60.0,
        cache_bytes: int = 1 << 30,
        cache_rows: int = 2_000_000,
        start_step: int = 0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        warner: Warner | None = None,
        flusher: BackgroundFlusher | None = None,
        aggregation: Mapping[str, str] | None = None,
    ) -> None:
        if step_policy not in ("monotonic", "allow"):
            raise ValueError(f"step_policy {step_policy!r} is not valid: 'monotonic' or 'allow'")
        self.writer = writer
        self.step_policy = step_policy
        self._allow = step_policy == "allow"
        self.max_open_seconds = max_open_seconds
        self._clock = clock
        self._wall = wall_clock
        self.warner = warner or Warner()
        self._lock = threading.Lock()
        self._fork_gen = _current.fork_gen
        prefix = writer.prefix_lines if writer is not None else 0
        self.disk_prefix_rows = prefix
        self.cache = RowCache(cache_bytes, cache_rows, first_ordinal=prefix)
        if writer is not None:  # the cache is the writer's queue: one append per row
            writer.feed_from(self.cache)
        self.open_step = int(start_step)
        self._open: dict[str, Any] = {}
        self._open_nonfinite = False
        self._agg: dict[str, list[float]] = {}  # the open row's mean state (span metrics)
        # the last accepted log()'s mark (from _current.sequence, as span ids): a span whose
        # id is below it saw a log() while it ran and joins the open row when it ends
        self._log_mark = 0
        # span data of spans that saw no log() while they ran (it joins the row the next
        # log() writes), their held records, the hold deadline (spanfold.py)
        self._spans = PendingSpans(
            aggregation,
            open_seconds=max_open_seconds,
            clock=clock,
            flusher=flusher,
            on_due=self._spans_due,
            warner=self.warner,
        )
        self._place = self._spans.place  # bound once: ingest_span is a hot path
        # ended spans not placed yet, in the order they ended, and what places them
        # (attach_raw_spans): a span costs one list append, its data is placed in a batch
        self._raw: list[Any] = []
        self._raw_convert: Callable[..., Any] | None = None
        self._raw_sink: Callable[..., Any] | None = None  # entries' records
        self._raw_since = 0.0  # monotonic time the first of them arrived
        self._written_open: dict[str, Any] | None = None  # what a timeout wrote for this step
        self._touched = 0.0  # monotonic time the open row last changed (for the timer)
        # the open row's crash bound (None: max_open_seconds=None, never written early)
        self._timer = (
            OpenRowTimer(max_open_seconds, clock, flusher, self._open_row_due)
            if max_open_seconds is not None
            else None
        )
        self._closed = False
        #: values that are not float/int/str/bool/None become row data through this (run with
        #: the lock held): normalize_value, or the run's media store (docs/media.md)
        self.convert: Callable[[Any, Warner], Any] = normalize_value
        self.sinks: list[Callable[[dict[str, Any]], Any]] = []
        #: called with each committed row under the store lock, in commit order, before the
        #: sinks see it (the run's summary: a dict update, cheaper here than a sink's
        #: hand-off); it must be quick, never call back into the store, and its exceptions
        #: are counted in ``sink_errors`` as a sink's
        self.on_commit: Callable[[dict[str, Any]], Any] | None = None
        self.flush_hooks: list[Callable[[], Any]] = []
        self._fanq: deque[dict[str, Any]] = deque()
        # fan-out: rows are numbered as they are queued (under _lock) and delivered in that
        # order under _fan_lock; a committing thread delivers up to its own row and no
        # further, so no thread is kept busy with rows that other threads keep committing
        self._fan_lock = threading.RLock()  # re-entrant: a sink may log()
        self._fan_seq = 0  # rows queued
        self._fan_done = 0  # rows delivered
        self.last_row: dict[str, Any] | None = None
        # counters
        self.rows_committed = 0
        self.patch_rows = 0
        self.dropped: dict[str, int] = {}
        self.sink_errors = 0
        # the queries (tail, step_range) and their counters (storeread.py)
        self._reader = StoreReader(
            self._lock, self.cache, writer, self.warner, self._shown_open_locked
        )

    # ------------------------------------------------------------------ ingress

    @property
    def lock(self) -> threading.Lock:
        """The store's lock (not re-entrant): held while a row is committed and while
        ``on_commit`` runs; the run's summary shares it."""
        return self._lock

    def _check_fork(self) -> None:
        if self._fork_gen != _current.fork_gen:
            raise ForkedRunError(FORK_MESSAGE)

    def _drop(self, cause: str, message: str, *args: Any) -> None:
        self.dropped[cause] = self.dropped.get(cause, 0) + 1
        self.warner.warn(("drop", cause), message, *args)

    def ingest(self, metrics: Mapping[str, Any], step: Any = None, commit: Any = None) -> int:
        """Merge ``metrics`` into the open row and apply the commit table.

        ``step``: an int in [0, 2**63-1] or None; ``commit``: a bool or None. Both are typed
        ``Any`` because they come from the user unchecked: a bad one drops the call with a
        warning here (counted in ``dropped``), never a ``TypeError`` from the annotation of
        a compiled build (docs/performance.md "A compiled build").

        Returns the step the metrics landed on (-1 when they were dropped).

        Raises:
            TypeError: ``metrics`` is not a mapping.
            ForkedRunError: called in a forked child of the process that made this store.
        """
        if self._fork_gen != _current.fork_gen:
            raise ForkedRunError(FORK_MESSAGE)
        if type(metrics) is not dict:
            if not isinstance(metrics, Mapping):
                raise TypeError(
                    f"log() takes a mapping of metric names to values, got {type(metrics).__name__}"
                )
            metrics = dict(metrics)
        if step is not None and (type(step) is not int or step < 0 or step > MAX_STEP):
            step = self._coerce_step(step)
            if step is None:
                return -1
        if commit is not None and commit is not True and commit is not False:
            commit = self._coerce_commit(commit)
            if commit is _DROP:
                return -1
        if step is None and commit is None and not self._spans.row:
            # the one-call path (docs/logging.md "What one log() costs"): log(d) of plain
            # values into an empty open row with no span data waiting is the row itself,
            # copied and encoded once; with plain spans waiting (docs/spans.md "Cost") it
            # is their metrics and the row in one dict; anything else takes the general
            # path below
            row = metrics.copy()
            if _NOT_PLAIN_KEYS.isdisjoint(row) and PLAIN_TYPES.issuperset(map(type, row.values())):
                sinks = self.sinks
                if sinks and len(sinks) == 1:
                    landed = self._log_direct(row, sinks[0])
                    if landed >= 0:
                        return landed
                else:
                    with self._lock:
                        if self._raw:
                            landed = self._commit_spans_plain_locked(row)
                            if landed >= 0:  # the row committed: the spans' metrics and row
                                row = self.last_row  # type: ignore[assignment]
                        else:
                            landed = self._commit_plain_locked(row)
                        upto = 0
                        if landed >= 0 and sinks:
                            self._fanq.append(row)
                            self._fan_seq = upto = self._fan_seq + 1
                    if landed >= 0:
                        if upto:
                            self._drain(upto)
                        return landed
        committed: Any = None  # the row committed, a tuple of two rows, or None
        with self._lock:
            if self._raw:  # spans that ended before this call are placed first
                self._pull_locked()
            if self._closed:
                self._drop("closed", "expr_tracker: log() after the history was closed; dropped")
                return -1
            if step is None and self.open_step > MAX_STEP:
                # the step after 2**63-1 cannot be stored (int64 in the file, the cache and
                # the query cache): dropped, never an OverflowError into the training loop
                self._drop(
                    "step_overflow",
                    "expr_tracker: log() after step 2**63-1, the last step there is; dropped "
                    "(warned once, counted in et.info())",
                )
                return -1
            spans = self._spans
            if step is not None:
                cur = self.open_step
                if step > cur:
                    if self._open:
                        committed = self._commit_locked()
                    self.open_step = step
                elif step < cur:
                    if not self._allow:
                        self._drop(
                            "backward_step",
                            "expr_tracker: log(step=%d) is behind the current step %d; dropped "
                            "(step_policy='monotonic'; use step_policy='allow' to accept "
                            "out-of-order steps). Warned once, counted in et.info().",
                            step,
                            cur,
                        )
                        if spans.row:  # the span time measured for the dropped row
                            self._drop_pending_locked(step)
                        return -1
                    if self._open:
                        committed = self._commit_locked()
                    self.open_step = step
                if not spans.explicit:
                    spans.use_steps()
                if commit is None:
                    commit = False
            elif commit is None:
                commit = True
            # the mark of an accepted log(), from the sequence span ids come from: spans
            # running now saw this call (spanfold.py)
            self._log_mark = next(_sequence)
            pend = spans.row
            if pend:  # span time waiting since the last log() joins the row this call writes
                if not self._open and spans.plain:
                    # the common case, inlined: the exchange of _fold_locked
                    pagg = spans.agg
                    self._open, self._agg, spans.row, spans.agg = pend, pagg, self._open, self._agg
                else:
                    self._fold_locked()
                if spans.held:
                    spans.emit(self.open_step)
            if metrics:
                self._merge(metrics)
            landed = self.open_step
            if commit:
                row = self._commit_locked()
                if committed is None:
                    committed = row
                else:
                    committed = (committed, row)
            elif self._open and (timer := self._timer) is not None:
                # the open row changed: its idle deadline moves (openrow.py)
                self._touched = now = self._clock()
                if not timer.armed:
                    timer.arm(now)
            upto = 0
            if committed is not None and self.sinks:
                # queued under the lock, so sinks see rows in commit order across threads
                if type(committed) is tuple:
                    self._fanq.extend(committed)
                    self._fan_seq += 2
                else:
                    self._fanq.append(committed)
                    self._fan_seq += 1
                upto = self._fan_seq
        if upto:
            self._drain(upto)
        return landed

    def _log_direct(self, row: dict[str, Any], sink: Callable[[dict[str, Any]], Any]) -> int:
        """The one-call path of ``ingest`` for a store with exactly one sink (the alert
        engine, most often; docs/alerts.md "Cost"): commit ``row`` and hand it to ``sink``
        without the fan-out queue when no earlier row waits in it. Returns the step, or -1
        when the general path must decide (nothing changed).

        Order: the fan-out lock is taken before the store lock (the order a sink that logs
        already takes them in), so no other thread delivers between this commit and its
        delivery, and a row committed after this one by another thread waits for the lock
        and is delivered after it. A row queued earlier (another thread, the idle timer, a
        commit from inside a sink) is delivered first: this row is queued behind it.

        Interrupts: an interrupt after the commit and before the sink is called queues the
        row (at the front when it was to be handed directly: no one delivered since, so it
        is still the next row in commit order), delivered by the next ``log()``, commit or
        close. Left: the line of the sink's call itself (the queue path's ``_drain`` has
        the same point, between taking a row and calling its sinks).
        """
        with self._fan_lock:  # re-entrant: a sink that logs takes it again
            landed = -1
            direct = False
            handed = False
            try:
                with self._lock:
                    if self._raw:  # spans waiting: the general path places them first
                        return -1
                    q = self._fanq
                    direct = not q  # decided before the commit: no earlier row waits
                    try:
                        landed = self._commit_plain_locked(row)
                    except BaseException:
                        if self.last_row is row:  # the interrupted commit completed
                            q.append(row)
                            self._fan_seq = self._fan_done + len(q)
                            direct = False
                        raise
                    if landed < 0:
                        return -1
                    if not direct:  # behind the rows that wait
                        q.append(row)
                        self._fan_seq = upto = self._fan_seq + 1
                if direct:
                    handed = True
                    try:
                        sink(row)
                    except Exception as exc:  # noqa: BLE001 - a sink never breaks log()
                        self._sink_failed(sink, exc)
                else:
                    self._drain(upto)
            except BaseException:
                if landed >= 0 and not handed:  # committed, not yet handed to the sink
                    with self._lock:
                        q = self._fanq
                        if direct:  # the next row in commit order: no one delivered since
                            q.appendleft(row)
                        elif not any(r is row for r in q):
                            q.append(row)
                        self._fan_seq = self._fan_done + len(q)
                raise
        return landed

    def _sink_failed(self, sink: Callable[[dict[str, Any]], Any], exc: Exception) -> None:
        """A row consumer (a sink, or the ``on_commit`` hook) raised: counted in
        ``sink_errors``, warned once per consumer, never raised into ``log()``."""
        self.sink_errors += 1
        self.warner.warn(
            ("sink", getattr(sink, "__qualname__", repr(sink))),
            "expr_tracker: a row consumer failed (%s: %s); it is skipped for this row "
            "(warned once)",
            type(exc).__name__,
            exc,
        )

    def _commit_plain_locked(self, row: dict[str, Any]) -> int:
        """Commit ``row`` (a copy of one ``log(d)``'s plain values) as the open step, as
        ``_merge`` and ``_commit_locked`` would, when the open row is empty and no span data
        waits; returns the step, or -1 when the general path must decide (the store is
        closed, the open row holds data, a value is NaN/±inf/None or orjson refuses the row),
        with nothing changed.

        All or nothing, as ``_commit_locked``: an interrupt after the line reached the cache
        completes the commit; before that, the values stay in the open row.
        """
        if (
            self._closed
            or self._open
            or self._spans.row
            or self._raw
            or self._written_open is not None
        ):
            return -1
        step = self.open_step
        if step > MAX_STEP:  # past the last step a file can hold: the general path drops it
            return -1
        row["_step"] = step
        row["_time"] = self._wall()
        try:
            line = encode_plain(row)
        except _JSONEncodeError:
            return -1
        if line.count(b"null"):  # NaN/±inf (orjson writes null) or a None: the general path
            return -1  # (count, not `in`: bytes.__contains__ tries the operand as an int first)
        self._log_mark = next(_sequence)
        committed = self.rows_committed
        # _append_locked and _call_hook, inlined (one frame for the whole commit)
        cache = self.cache
        w = self.writer
        mark = cache.next_ordinal
        try:
            cache.append(line, step)  # the writer's queue too (JsonlWriter.feed_from)
            if w is not None and cache.next_ordinal > w.poke_at:
                w.added()  # a flush to schedule (not the common case)
            self.rows_committed = committed + 1
            self.last_row = row
            self.open_step = step + 1
            if self._agg:
                self._agg = {}
            hook = self.on_commit
            if hook is not None:
                try:
                    hook(row)
                except Exception as exc:  # noqa: BLE001 - a consumer never breaks log()
                    self._sink_failed(hook, exc)
        except BaseException:
            if cache.next_ordinal != mark:  # committed (the cache's append is all or nothing)
                if self.open_step == step:
                    self._open_step_after(row, step, committed)
            else:  # nothing written: the values wait in the open row, as a merge leaves them
                self._open = row
            raise
        if cache.nbytes > cache.max_bytes or cache.nrows > cache.max_rows:
            self._evict_locked()
        return step

    def _commit_spans_plain_locked(self, values: dict[str, Any]) -> int:
        """Commit ``values`` (a copy of one ``log(d)``'s plain values) with the plain spans
        waiting in the raw queue as the open step, in one dict, as placing the spans
        (``_pull_locked``), folding, emitting their records, ``_merge`` and
        ``_commit_locked`` would; returns the step, or -1 with nothing changed when the
        general path must decide: the open row, the pending span data or the held records
        are not empty, a span saw a ``log()`` while it ran, the producer gave no merged
        metrics (a store that does not sum them), a key of ``values`` is also a span
        metric, a bound on held records is reached, the row holds a NaN/±inf/None (or
        ``null`` in a name) or orjson refuses it, or the store is closed. A name repeated
        among the spans is one key holding their sum (what placing them gives).

        Under an interrupt (Ctrl-C, SIGTERM's ``SystemExit``): the records leave the queue
        in the statement that hands them to the span sink (exactly once,
        ``PendingSpans.emit_now``); after that the row is committed all or nothing, as
        ``_commit_plain_locked``: before its line reached the cache, the row (the spans'
        metrics and ``values``) waits in the open row.
        """
        spans = self._spans
        convert = self._raw_convert
        if (
            convert is None
            or self._closed
            or self._open
            or spans.row
            or spans.held
            or self._written_open is not None
        ):
            return -1
        raw = self._raw
        n = len(raw)
        if n >= spans._cap:
            return -1
        batch = raw[:n]
        try:
            _items, row, first, records = convert(batch)
        except Exception:  # noqa: BLE001 - the general path drops them with a warning
            return -1
        if row is None or first < self._log_mark or not values.keys().isdisjoint(row):
            return -1
        row.update(values)
        step = self.open_step
        if step > MAX_STEP:  # (as _commit_plain_locked)
            return -1
        row["_step"] = step
        row["_time"] = self._wall()
        try:
            line = encode_plain(row)
        except _JSONEncodeError:
            return -1
        if line.count(b"null"):  # (count, not `in`: see _commit_plain_locked)
            return -1
        self._log_mark = next(_sequence)
        if records is not None:
            head = batch[0]

            def done() -> None:  # once, however often it is called (emit_now)
                if raw and raw[0] is head:
                    del raw[:n]

            spans.emit_now(step, records, done, self._raw_sink)
        else:
            del raw[:n]
        committed = self.rows_committed
        mark = self.cache.next_ordinal
        try:
            self._append_locked(line, step)
            self.rows_committed = committed + 1
            self.last_row = row
            self.open_step = step + 1
            if self._agg:
                self._agg = {}
            hook = self.on_commit
            if hook is not None:  # _call_hook, inlined
                try:
                    hook(row)
                except Exception as exc:  # noqa: BLE001 - a consumer never breaks log()
                    self._sink_failed(hook, exc)
        except BaseException:
            if self.cache.next_ordinal != mark:
                if self.open_step == step:
                    self._open_step_after(row, step, committed)
            else:  # nothing written: the values wait in the open row, as a merge leaves them
                self._open = row
            raise
        return step

    def _call_hook(self, hook: Callable[[dict[str, Any]], Any], row: dict[str, Any]) -> None:
        """``on_commit(row)`` under the store lock; an exception is counted and warned about
        once, as a sink's, never raised into ``log()``."""
        try:
            hook(row)
        except Exception as exc:  # noqa: BLE001 - a consumer never breaks log()
            self._sink_failed(hook, exc)

    def _coerce_step(self, step: Any) -> int | None:
        if isinstance(step, bool):
            ok = False
        else:
            try:
                # bool(): NumPy and torch compare to their own bool types
                ok = bool(int(step) == step)
            except (TypeError, ValueError, OverflowError):
                ok = False
        if not ok or not 0 <= int(step) <= MAX_STEP:
            self._drop(
                "bad_step",
                "expr_tracker: log(step=%r) is not an integer in [0, 2**63-1]; the call was "
                "dropped",
                step,
            )
            return None
        return int(step)

    def _coerce_commit(self, commit: Any) -> Any:
        """NumPy bools and 0/1 are accepted; anything else drops the call (never a guess)."""
        if type(commit).__name__ in ("bool_", "bool") or (type(commit) is int and commit in (0, 1)):
            return bool(commit)
        self._drop(
            "bad_commit",
            "expr_tracker: log(commit=%r) is not a bool; the call was dropped",
            commit,
        )
        return _DROP

    def _merge(self, metrics: dict[Any, Any]) -> None:
        # dict[Any, ...]: keys are the user's, any hashable until _fix_key has seen them (a
        # compiled build would check dict[str, ...]'s keys and raise TypeError on an int)
        open_row = self._open
        agg = self._agg
        for k, v in metrics.items():
            if type(k) is not str or not k or k in RESERVED:
                k = self._fix_key(k)
                if k is None:
                    continue
            t = type(v)
            if t is float:
                if v - v != 0.0:
                    self._open_nonfinite = True
            elif t is int:
                if v > FLOAT_MAX_INT or v < -FLOAT_MAX_INT:
                    self._drop(
                        "int_too_large",
                        "expr_tracker: %r is an int too large for a float (%d bits); no JSON "
                        "reader outside Python takes it, so it was dropped (warned once, "
                        "counted in et.info())",
                        k,
                        v.bit_length(),
                    )
                    continue
            elif t is not str and t is not bool and v is not None:
                v = self.convert(v, self.warner)
                if has_nonfinite(v):
                    self._open_nonfinite = True
            if k in open_row:
                if not _same_value(open_row[k], v):
                    self.warner.warn(
                        ("last_wins", k),
                        "expr_tracker: %r was logged twice for one step with different "
                        "values; the last value wins (warned once per key)",
                        k,
                    )
                if agg:
                    agg.pop(k, None)
            open_row[k] = v

    def _fix_key(self, k: Any) -> str | None:
        if isinstance(k, str):
            if not k:
                self._drop("empty_key", "expr_tracker: a metric with an empty name was dropped")
                return None
            if type(k) is not str:  # np.str_, a StrEnum member: the name as a plain str
                name = str.__str__(k)
                if name not in RESERVED:
                    return name
            self._drop(
                "reserved_key",
                "expr_tracker: %r is reserved (the row's step and time); the value was dropped",
                k,
            )
            return None
        name = str(normalize_value(k, self.warner))
        self.warner.warn(
            ("key_type", type(k).__name__),
            "expr_tracker: metric names must be strings; %r was written as %r",
            k,
            name,
        )
        return name or None

    # ------------------------------------------------------------------ span data

    def ingest_span(
        self, metrics: dict[str, Any], dur_ms: float, record: Any = None, since: int = NEVER
    ) -> int | None:
        """Place one ended span's metrics (docs/spans.md "Which row a span joins").

        Aggregation by measurement name (the part before the first ``/``), as the table
        handed to the store says (``HistoryStore(aggregation=...)``): sum (also every name
        not in the table), maximum, or duration-weighted mean. A span never commits a step.

        ``since`` is the span's id, drawn from ``_current.sequence`` when it started; each
        accepted ``log()`` takes a mark from the same sequence. When a ``log()`` reached the
        store while the span ran (``since`` is below the last mark), that call chose the
        step and the metrics join the row open now. Otherwise (and by default) they wait in
        a pending row that the next accepted ``log()`` folds into the row it writes (after
        ``step=`` opened it); ``commit()``, ``flush()``, ``close()`` and the hold deadline
        (:meth:`hold_spans`) fold it into the row open then. ``record`` (a span record:
        ``bytes``, or a dict) reaches the span sink with the step of the row its metrics
        joined.

        Returns the step open now when the record, if any, can be written at once with it
        (``record`` None, or its metrics joined the open row and no held record is ahead
        of it); None when ``record`` is held; -1 when the store is closed (nothing kept).
        """
        if self._fork_gen != _current.fork_gen:
            raise ForkedRunError(FORK_MESSAGE)
        with self._lock:
            if self._raw:  # spans that ended before this one are placed first
                self._pull_locked()
            return self._ingest_span_locked(metrics, dur_ms, record, since)

    def _ingest_span_locked(
        self, metrics: dict[str, Any], dur_ms: float, record: Any, since: int
    ) -> int | None:
        """:meth:`ingest_span` under the lock."""
        if self._closed:
            return -1
        if since >= self._log_mark:  # no log() came while the span ran: it waits
            verdict = self._place(metrics, dur_ms, record, None, None, 0)
            if verdict == HELD:
                return None
        else:  # a log() came while the span ran (it chose the step): the open row
            verdict = self._place(metrics, dur_ms, record, self._open, self._agg, self.open_step)
            if verdict & OPEN_NONFINITE:
                self._open_nonfinite = True
                verdict ^= OPEN_NONFINITE
            timer = self._timer
            if timer is not None and not timer.armed:  # the open row's crash bound
                self._touched = now = self._clock()  # (a running deadline stays)
                timer.arm(now)
        if verdict == OUT:
            return self.open_step
        if verdict == FULL:  # bounded memory: the pending data joins the open row now
            self._fold_locked()
            self._spans.emit(self.open_step)
        return None

    # ------------------------------------------------------------------ raw spans

    def attach_raw_spans(
        self,
        convert: Callable[[list[Any]], list[tuple[dict[str, Any], float, Any, int]]],
        sink: Callable[[int, list[Any], Callable[[], Any]], Any] | None = None,
    ) -> list[Any]:
        """Let a span producer hand over ended spans in batches (docs/spans.md "Cost").

        Returns the list the producer appends one entry per ended span to (any object;
        ``list.append`` is atomic, so any thread may append without the store lock); it
        calls :meth:`raw_spans_waiting` when it appends to an empty list, and may call
        :meth:`pull_raw_spans` to bound it. Before anything reads or changes the open row
        or the pending span data (every ``log()``, ``commit``, ``flush``, ``close``, a
        query of the open row, a deadline), the store places the waiting entries, in
        order. ``convert(entries, full=False, start=None)`` (under the store lock; it must
        not change anything) returns ``(items, merged, first, records)``: one ``(metrics,
        dur_ms, record, since)`` per entry, :meth:`ingest_span`'s arguments, each placed
        as that call would have placed it (``record`` is the entry's record, or None;
        ``items`` may be None when ``merged`` is given and ``full`` is false); ``merged``,
        the entries' metrics in one dict as placing them one by one in the pending row
        ``start`` (a dict of finite numbers, not to be changed; None: an empty one) would
        leave those keys, or None (the producer sums only what :meth:`span_aggregation`
        says sums, adding in the order the spans ended: the same floats); ``first``, the
        smallest ``since``; ``records``, the entries' records, one per entry in order (the
        same objects as the ``record`` of ``items``), or None when there are none.

        Under an interrupt (Ctrl-C, SIGTERM's ``SystemExit``) a record leaves the queue in
        the statement that hands it on (held, or to the ``hold_spans`` sink), so it reaches
        the sink exactly once; the span's metrics are placed after that (an interrupt then
        loses that one span's metrics, never counts them twice). An exception from
        ``convert`` is warned about once and the entries are dropped, never raised into
        ``log()``.

        ``sink(step, entries, done)``, when given, takes a list of entries whose records
        all go out at ``step`` (a ``log(d)`` that commits them with its row at once, see
        ``_commit_spans_plain_locked``) instead of the ``hold_spans`` sink: what that sink
        does with the same entries, without asking what each item is; it calls ``done()``
        (the queue lets go of them) once they are queued, before it returns
        (``PendingSpans.emit_now``).
        """
        with self._lock:
            self._raw_convert = convert
            self._raw_sink = sink
            return self._raw

    def span_aggregation(self, name: str) -> str:
        """How the span measurement ``name`` (a metric name's part before its first
        ``/``, e.g. ``"time_ms"``) combines within a row: ``"sum"``, ``"max"`` or
        ``"mean"``, from the ``aggregation`` table (a name not in it sums)."""
        return self._spans.aggregation_of(name)

    def raw_spans_waiting(self) -> None:
        """The producer appended to an empty raw-span queue: start the span hold deadline
        (:meth:`hold_spans`) from now, as :meth:`ingest_span` would have."""
        now = self._clock()
        self._raw_since = now
        spans = self._spans
        if not spans._armed:
            with self._lock:
                if not self._closed and not spans._armed:
                    if not spans.row:
                        spans._since = now
                    spans._arm()

    def pull_raw_spans(self) -> None:
        """Place the waiting raw spans now (the producer's bound on their number)."""
        self._check_fork()
        with self._lock:
            if self._raw:
                self._pull_locked()

    def _drop_raw(self, n: int, exc: Exception) -> None:
        """Drop the first ``n`` raw spans, whose conversion raised ``exc`` (warned once per
        kind of error): measuring never breaks ``log()``."""
        del self._raw[:n]
        self.warner.warn(
            ("raw_spans", type(exc).__name__),
            "expr_tracker: placing span data failed (%s: %s); ignored (warned once)",
            type(exc).__name__,
            exc,
        )

    def _pull_locked(self) -> None:
        """Place the raw spans waiting, in order (under the lock; see attach_raw_spans)."""
        raw = self._raw
        convert = self._raw_convert
        if convert is None:
            return
        spans = self._spans
        fresh = not spans.row
        n = len(raw)
        while n:
            items = None
            # the common case (a loop's spans, then its log()): none saw a log(), so their
            # metrics are summed into the pending row, what placing them one by one gives
            # (the producer sums them in order, from the pending row's numbers). In parts
            # that end where one by one would fold: at the bound on held records
            m = min(n, max(1, spans._cap - len(spans.held)))
            pend = spans.row
            if pend and not spans.plain:  # a restarted or non-finite value: one by one
                break
            batch = raw[:m]
            try:
                items, merged, first, records = (
                    convert(batch, False, pend) if pend else convert(batch)
                )
            except Exception as exc:  # noqa: BLE001 - measuring never breaks log()
                self._drop_raw(n, exc)
                return
            if (
                merged is None
                or first < self._log_mark
                or self._closed
                or spans._held_bytes >= spans._max_bytes
            ):
                break
            # the records first, in one expression with their removal (exactly once); an
            # interrupt before the metrics are placed loses only metrics
            if records is not None:
                spans.held.extend(records) or delitem(raw, slice(0, m))  # type: ignore[func-returns-value]
            else:
                del raw[:m]
            n -= m
            if pend:
                pend.update(merged)  # one call: the part's sums all land, or none
            else:
                spans.start_row(merged)
            if records is not None and len(spans.held) >= spans._cap:
                self._fold_locked()  # bounded memory: the pending data joins the open row
                spans.emit(self.open_step)
        if n:
            if items is None or len(items) != n:
                try:
                    items = convert(raw[:n], True)[0]
                except Exception as exc:  # noqa: BLE001 - measuring never breaks log()
                    self._drop_raw(n, exc)
                    return
            self._place_raw_locked(items)
        if fresh and spans.row and self._raw_since < spans._since:
            spans._since = self._raw_since  # the deadline counts from the first span's end

    def _place_raw_locked(self, items: list[Any]) -> None:
        """Place converted raw spans one by one, each as :meth:`ingest_span` would (the
        general path of :meth:`_pull_locked`): ``items`` are the first ones waiting."""
        raw = self._raw
        spans = self._spans
        place = self._place
        for metrics, dur_ms, record, since in items:
            if self._closed:  # as ingest_span: nothing kept
                del raw[0]
                continue
            if since >= self._log_mark:  # no log() came while the span ran: it waits
                if record is None:
                    del raw[0]
                else:
                    # one expression: no interrupt between the two (exactly once)
                    spans.held.append(record) or delitem(raw, 0)  # type: ignore[func-returns-value]
                place(metrics, dur_ms, None, None, None, 0)
                if record is not None and len(spans.held) >= spans._cap:
                    self._fold_locked()  # bounded memory: the pending data joins the open row
                    spans.emit(self.open_step)
                continue
            step = self.open_step
            if record is None:
                del raw[0]
            elif spans.held:  # behind held records: waits with them, its step fixed
                spans.held.append((step, record)) or delitem(raw, 0)  # type: ignore[func-returns-value]
            else:
                spans.write_now(step, record, partial(delitem, raw, 0))
            if place(metrics, dur_ms, None, self._open, self._agg, step) & OPEN_NONFINITE:
                self._open_nonfinite = True
            timer = self._timer
            if timer is not None and not timer.armed:  # the open row's crash bound
                self._touched = now = self._clock()
                timer.arm(now)
            if record is not None and len(spans.held) >= spans._cap:
                self._fold_locked()  # the bound, as ingest_span meets it (place's FULL)
                spans.emit(self.open_step)

    def hold_spans(
        self,
        sink: Callable[[int, list[Any]], Any],
        *,
        max_seconds: float | None = 5.0,
        max_bytes: int = 64 << 20,
    ) -> None:
        """Hold span records passed to :meth:`ingest_span` until their row is known.

        ``sink(step, records)`` receives them, in the order they were ingested, with the
        step of the row their metrics were folded into (a ``(step, record)`` pair: a record
        whose step was fixed when its span ended, held behind earlier records to keep the
        file's order); it is called under the store lock
        (so records reach the span file in fold order and ``flush()`` misses none), must
        not call back into the store, and is never called with an empty list.

        ``max_seconds`` bounds how long the oldest pending span waits for a ``log()`` while
        this store has not accepted a ``log(step=N)``: the row open then is the one the
        next ``log()`` writes anyway (``spanfold.FIRST_HOLD_SECONDS`` at most until the
        first record went out). Once explicit steps are in use the bound is
        ``max_open_seconds`` (the open row's own crash bound). None: no timed fold beyond
        ``max_open_seconds`` (but the first record's). Memory is bounded by ``max_bytes``
        (of records held encoded, i.e. those with attributes, plugin metrics or an error)
        and by ``spanfold.HOLD_MAX_RECORDS`` records (``HOLD_RECORDS_BEFORE_STEPS`` before
        the first ``log(step=N)``); past a bound the pending data is placed in the open row
        at once.
        """
        with self._lock:
            self._spans.configure(sink, max_seconds, max_bytes)

    @property
    def held_span_records(self) -> int:
        """Span records waiting for the ``log()`` that fixes their step."""
        with self._lock:
            if self._raw:
                self._pull_locked()
            return len(self._spans.held)

    def fold_spans(self) -> None:
        """Place pending span data in the open row now and hand its records to the sink
        (what ``flush()`` and a closing span recorder do). Never commits."""
        self._check_fork()
        with self._lock:
            if self._raw:
                self._pull_locked()
            if self._spans.row:
                self._fold_locked()
                self._spans.emit(self.open_step)

    def _fold_locked(self) -> None:
        """Join the pending span data into the open row (its held records stay held until
        ``_spans.emit``)."""
        spans = self._spans
        pend = spans.row
        if not pend:
            return
        if not self._open and spans.plain:
            # the common case: the row this log() opened is empty (so is its mean state):
            # exchange it for the pending row, no copy, in one statement (no interrupt
            # leaves the pending data in both rows or in neither)
            pagg = spans.agg
            self._open, self._agg, spans.row, spans.agg = pend, pagg, self._open, self._agg
            return
        if spans.nonfinite:  # first: an interrupt in the fold leaves the flag set (safe)
            self._open_nonfinite = True
        spans.fold_into(self._open, self._agg)

    def _drop_pending_locked(self, step: int) -> None:
        """A ``log(step=N)`` was dropped (behind the open step): the span data pending for
        it is dropped with it (counted in ``dropped["span_metrics"]``), never summed into a
        later row it was not measured for; its held records still reach the span file (the
        time was spent), naming ``N``, the step they were measured for."""
        self.dropped["span_metrics"] = self.dropped.get("span_metrics", 0) + 1
        self._spans.discard()
        self._spans.emit(step)

    def _spans_due(self) -> None:
        """Runs on the flusher thread at the span hold deadline: fold span data that waited
        past it into the open row (spanfold.py)."""
        with self._lock:
            if self._raw:
                self._pull_locked()
            if not self._spans.expired(self._closed):
                return
            self._fold_locked()
            self._spans.emit(self.open_step)
            timer = self._timer
            if timer is not None:  # the open row changed
                self._touched = now = self._clock()
                if not timer.armed:
                    timer.arm(now)

    # ------------------------------------------------------------------ commit

    def _commit_locked(self) -> dict[str, Any]:
        """Commit the open row: encode it, append it to the cache and the writer, open the
        next step.

        All or nothing under an exception raised at any point (Ctrl-C, SIGTERM's
        ``SystemExit``): once the row reached the cache (``_append_locked`` puts it in both
        or neither) the commit completes before the exception propagates, so a step is
        never written twice; before that, the row stays open and nothing was written.
        """
        row = self._open
        step = self.open_step
        committed = self.rows_committed
        mark = self.cache.next_ordinal
        try:
            row["_step"] = step
            row["_time"] = self._wall()
            if self._written_open is None:
                try:  # _encode, inlined: one call less per commit (the common case)
                    line = encode_row(row, self._open_nonfinite)
                except Exception:  # noqa: BLE001 - a hostile value: the slow path
                    line = self._encode(row)
                self._append_locked(line, step)
            else:
                self._write_row_locked(row, step)
                self._written_open = None
            # inline (the fast path); the same assignments as _open_step_after
            self._open = {}
            self._open_nonfinite = False
            if self._agg:
                self._agg = {}
            self.rows_committed = committed + 1
            self.last_row = row
            self.open_step = step + 1
            hook = self.on_commit
            if hook is not None:
                self._call_hook(hook, row)
        except BaseException:
            if self.cache.next_ordinal != mark and self.open_step == step:
                self._open_step_after(row, step, committed)
            raise
        return row

    def _open_step_after(self, row: dict[str, Any], step: int, committed: int) -> None:
        """The state after committing ``row`` at ``step`` (idempotent: plain assignments)."""
        self._written_open = None
        self._open = {}
        self._open_nonfinite = False
        self._agg = {}
        self.rows_committed = committed + 1
        self.last_row = row
        self.open_step = step + 1

    def _encode(self, row: dict[str, Any]) -> bytes:
        """``encode_row``, never raising for a value JSON cannot hold: such values are
        converted or dropped in ``row`` itself (so the cache, the file and the sinks agree),
        with one warning per cause, counted in ``et.info()``."""
        try:
            return encode_row(row, self._open_nonfinite)
        except Exception:  # noqa: BLE001 - the slow path: a hostile value
            dropped = sanitize_row(row, self.warner)
            for _ in range(dropped):
                self.dropped["unencodable"] = self.dropped.get("unencodable", 0) + 1
            return encode_row(row, None)

    def _append_locked(self, line: bytes, step: int) -> None:
        """Append to the cache, which is the writer's queue too (``JsonlWriter.feed_from``):
        all or nothing, whatever exception arrives (the cache ordinal says which); then
        tell the writer when it asks to be told (``poke_at``: a flush to schedule)."""
        cache = self.cache
        cache.append(line, step)
        w = self.writer
        if w is not None and cache.next_ordinal > w.poke_at:
            w.added()
        if cache.nbytes > cache.max_bytes or cache.nrows > cache.max_rows:
            self._evict_locked()

    def _write_row_locked(self, row: dict[str, Any], step: int) -> None:
        """Append ``row`` whole, or, once this step was written early (max_open_seconds), as
        a patch line holding what changed since (nothing when nothing did)."""
        written = self._written_open
        if written is None:
            self._append_locked(self._encode(row), step)
            return
        patch = changed(row, written)
        if patch is None:
            return
        self._append_locked(self._encode(patch), step)
        self.patch_rows += 1
        if self.writer is not None:
            self.writer.mark_duplicate_steps()

    def _flushed_ordinal(self) -> int:
        w = self.writer
        if w is None:
            return self.cache.next_ordinal
        return self.disk_prefix_rows + w.flushed

    def _evict_locked(self) -> None:
        cache = self.cache
        flushed = self._flushed_ordinal()
        if cache.needs_flush_to_evict(flushed) and self.writer is not None:
            # over budget with rows not on disk: flush first, then evict (not while the disk
            # fails: the writer spaces its retries, and the rows stay cached meanwhile)
            self.writer.flush(only_if_due=True)
            flushed = self._flushed_ordinal()
        cache.evict(flushed)

    def commit(self) -> dict[str, Any] | None:
        """Commit the open row if it holds data (``finish`` and ``flush`` use this).

        Pending span data is folded into it first (it counts as data).
        """
        self._check_fork()
        with self._lock:
            if self._raw:
                self._pull_locked()
            if self._spans.row:
                self._fold_locked()
                self._spans.emit(self.open_step)
            row = None
            upto = 0
            if self._open:
                row = self._commit_locked()
                if self.sinks:
                    self._fanq.append(row)
                    self._fan_seq += 1
                    upto = self._fan_seq
        if upto:
            self._drain(upto)
        return row

    def _drain(self, upto: int) -> None:
        """Deliver queued rows to the sinks, in order, up to row number ``upto``.

        Blocks while another thread delivers earlier rows (back-pressure: alert rules never
        fall behind the rows being committed, and the queue stays short).
        """
        q = self._fanq
        with self._fan_lock:
            while self._fan_done < upto and q:
                row = q.popleft()
                self._fan_done += 1
                for sink in self.sinks:
                    try:
                        sink(row)
                    except Exception as exc:  # noqa: BLE001 - a sink never breaks log()
                        self._sink_failed(sink, exc)

    # ------------------------------------------------------------------ reads

    def open_row(self) -> dict[str, Any] | None:
        """A copy of the open row with its ``_step`` (None when it holds nothing)."""
        with self._lock:
            return self._shown_open_locked(True)[1]

    def _shown_open_locked(self, include_open: bool) -> tuple[int, dict[str, Any] | None, bool]:
        """For the reader, under the lock: the open step; when ``include_open``, a copy of
        the open row as a query shows it, with its ``_step`` and with the pending span data
        folded in (a view: the next ``log()`` decides the row that data really joins; None
        when it holds nothing); whether the open row was written early (max_open_seconds)."""
        if self._raw:
            self._pull_locked()
        step = self.open_step
        row = None
        if include_open:
            spans = self._spans
            if self._open:
                row = dict(self._open)
                if spans.row:
                    spans.combine(row, {k: list(a) for k, a in self._agg.items()})
                row["_step"] = step
            elif spans.row:
                row = dict(spans.row)
                row["_step"] = step
        return step, row, self._written_open is not None

    def tail(self, n: Any = 50, include_open: Any = True) -> list[dict[str, Any]]:
        """The newest ``n`` steps (``None``/``-1``: all, in step order), oldest first.

        Returns new dicts (a snapshot). Rows of one step are merged (later lines win per
        key); the open row counts as the newest step when ``include_open``. The cache
        answers without any IO when it holds the window; otherwise the rows before the
        cache boundary are read backwards from the file (``disk_queries`` += 1).

        Raises:
            ForkedRunError: called in a forked child of the process that made this store.
        """
        if self._fork_gen != _current.fork_gen:
            raise ForkedRunError(FORK_MESSAGE)
        return self._reader.tail(_as_index(n), bool(include_open))

    def step_range(self, start: Any, end: Any, include_open: Any = True) -> list[dict[str, Any]]:
        """Steps ``start <= _step < end`` (None: open side), merged, in step order.

        Exact by step. When the store is sorted the cache is binary-searched and the file
        is read only for the part of the range older than the cache, through the sidecar
        index (never a full scan); an unsorted store (``step_policy="allow"`` with
        backward steps) walks the cache and scans the disk part once.

        Raises:
            ForkedRunError: called in a forked child of the process that made this store.
        """
        self._check_fork()
        return self._reader.step_range(_as_index(start), _as_index(end), bool(include_open))

    # ------------------------------------------------------------------ the open row early

    def _open_row_due(self) -> None:
        """Runs on the flusher thread at the open-row timer's deadline: write an idle open
        row to disk without committing it (openrow.py)."""
        with self._lock:
            if self._raw:
                self._pull_locked()
            timer = self._timer
            waiting = not self._closed and bool(self._open)
            if timer is None or not timer.expired(waiting, self._touched):
                return
            self._write_open_locked()
        if self.writer is not None:
            self.writer.flush()

    def _write_open_locked(self) -> None:
        row = dict(self._open)
        row["_step"] = self.open_step
        row["_time"] = self._wall()
        mark = self.cache.next_ordinal
        try:
            self._write_row_locked(row, self.open_step)
        except BaseException:
            if self.cache.next_ordinal != mark:  # it was written: remember it (no repeat)
                self._written_open = row
            raise
        self._written_open = row

    def write_open_row(self) -> bool:
        """Write the open row to disk now, without committing it (what the timer does)."""
        with self._lock:
            if self._raw:
                self._pull_locked()
            if not self._open:
                return False
            self._write_open_locked()
            return True

    # ------------------------------------------------------------------ lifecycle

    def flush(self) -> None:
        """Write every committed row (and, through ``flush_hooks``, every completed span
        record) to disk and wait. The open row stays open; pending span data is folded
        into it first (:meth:`fold_spans`), so its records can be written."""
        self._check_fork()
        self.fold_spans()
        if self.writer is not None:
            self.writer.flush()
        for hook in self.flush_hooks:
            hook()

    def close(self) -> dict[str, Any] | None:
        """Commit the open row (if it holds data), flush and close the writer."""
        self._check_fork()
        with self._lock:  # commit and close in one step: nothing can slip in between
            if self._raw:
                self._pull_locked()
            if self._spans.row:
                self._fold_locked()
                self._spans.emit(self.open_step)
            row = None
            if self._open:
                try:
                    row = self._commit_locked()
                except Exception as exc:  # noqa: BLE001 - the writer is closed regardless
                    self._drop(
                        "commit_failed",
                        "expr_tracker: the open row could not be committed at close (%s: %s); "
                        "dropped",
                        type(exc).__name__,
                        exc,
                    )
            self._closed = True
            if row is not None and self.sinks:
                self._fanq.append(row)
                self._fan_seq += 1
            upto = self._fan_seq
        self._drain(upto)
        if self.writer is not None:
            self.writer.close()
        if self._timer is not None:
            self._timer.cancel()
        self._spans.cancel()
        return row

    def stats(self) -> dict[str, Any]:
        """Counters for ``et.info()`` (docs/history.md "Is the cache earning its keep?").

        Keys: ``rows_logged`` (committed steps), ``patch_rows``, ``rows_on_disk`` (lines in
        the file, including a resume's prefix), ``disk_prefix_rows``, ``pending_rows``,
        ``cached_rows`` / ``cached_bytes`` (encoded bytes) and their limits, ``evicted_rows``,
        ``cache_sorted``, ``queries``, ``disk_queries`` and ``disk_bytes_read`` (what the
        queries read from the file), ``disk_lines_skipped`` (lines of the file that are not
        rows, counted each time a query meets them) and ``disk_lines_no_step`` (those of
        them without an integer ``_step``), ``hit_rate`` (share of queries answered from memory,
        None before the first), ``dropped`` (cause -> count: ``backward_step``,
        ``bad_step``, ``empty_key``, ``reserved_key``, ``closed``, ``disk``, ``oversize``),
        ``dropped_rows`` (their sum), ``sink_errors``, ``held_span_records`` (span records
        waiting for the ``log()`` that fixes their step) and the writer's own ``writer``
        stats; ``log_dir`` (the run directory), ``metrics_file`` (this producer's file) and
        ``last_step`` (the step of the last committed row, the file's after a resume;
        None before any), as the names of the spec's ``info()``.
        """
        c = self.cache
        w = self.writer
        r = self._reader
        q = r.queries
        last = self.last_row
        out: dict[str, Any] = {
            "log_dir": str(w.path.parent) if w is not None else None,
            "metrics_file": str(w.path) if w is not None else None,
            "last_step": last.get("_step") if last else (w.last_step if w is not None else None),
            "open_step": self.open_step,
            "rows_logged": self.rows_committed,
            "patch_rows": self.patch_rows,
            "rows_on_disk": w.lines if w is not None else 0,
            "disk_prefix_rows": self.disk_prefix_rows,
            "pending_rows": w.pending if w is not None else 0,
            "cached_rows": c.nrows,
            "cached_bytes": c.nbytes,
            "cache_limit_bytes": c.max_bytes,
            "cache_limit_rows": c.max_rows,
            "evicted_rows": c.evicted_rows,
            "cache_sorted": c.sorted,
            "queries": q,
            "disk_queries": r.disk_queries,
            "disk_bytes_read": r.disk_bytes_read,
            "disk_lines_skipped": r.disk_lines_skipped,
            "disk_lines_no_step": r.disk_lines_no_step,
            "hit_rate": (q - r.disk_queries) / q if q else None,
            "dropped": dict(self.dropped),
            "sink_errors": self.sink_errors,
            "held_span_records": len(self._spans.held),
        }
        if w is not None:
            ws = w.stats()
            out["writer"] = ws
            if ws["dropped"]:
                out["dropped"]["disk"] = ws["dropped"]
            if ws["dropped_oversize"]:
                out["dropped"]["oversize"] = ws["dropped_oversize"]
        out["dropped_rows"] = sum(out["dropped"].values())
        return out
