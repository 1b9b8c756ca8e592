"""HistoryStore: the open row, the commit rules, the row cache and tail queries.

One ingress for everything that becomes a metric (DESIGN.md "Data flow"):
:meth:`HistoryStore.ingest` for ``et.log`` and :meth:`HistoryStore.ingest_span` for span and
plugin measurements. A committed row is encoded once, appended to the cache and queued to
the :class:`~expr_tracker.history.writer.JsonlWriter` under one lock (the ordinal
invariant, spec design.txt G), then handed to every sink outside the lock, in commit order.

Commit table (spec design.txt A.1, aligned with wandb)::

    log(d)                 merge into the open row, commit, step += 1
    log(d, commit=False)   merge only
    log(d, step=N)         N > open: commit the old row (if it holds data), open N, merge
                           N == open: merge
                           N < open: "monotonic" drops it with a warning (counted);
                                     "allow" commits the open row and opens N
    log(d, step=N, commit=True)   as above, then commit N

``log({})`` commits a row holding only ``_step``/``_time``. An open row idle for
``max_open_seconds`` is written to disk without committing (no sink sees it); data that
arrives for that step afterwards becomes a patch line, and readers merge by step.

Span time joins the row the next ``log()`` writes (docs/spans.md "Which row a span joins"):
:meth:`HistoryStore.ingest_span` aggregates into a *pending* row, and each accepted
``log()`` call folds it into the row it writes to, after opening that row's step and before
merging its own metrics. Span records handed to ``ingest_span`` are held with it and get
their ``_step`` at that fold, so a record always names the row its time was summed into.
``commit()``, ``flush()``, ``close()`` and a hold deadline (:meth:`HistoryStore.hold_spans`)
fold into the row open at that moment.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from expr_tracker.errors import ForkedRunError
from expr_tracker.history.cache import DecodedTail, RowCache, decode_lines
from expr_tracker.history.codec import (
    FLOAT_MAX_INT,
    Warner,
    _has_nonfinite,
    encode_row,
    normalize_value,
    sanitize_row,
)
from expr_tracker.history.reader import JsonlReader, merge_by_step, step_key
from expr_tracker.history.writer import BackgroundFlusher, JsonlWriter, get_flusher

log = logging.getLogger("expr_tracker")

RESERVED = frozenset({"_step", "_time"})
#: the largest step (int64, what every reader and the cache index can hold exactly)
MAX_STEP = (1 << 63) - 1
_DROP = object()

_FORK_GEN = 0


def _after_fork_in_child() -> None:
    global _FORK_GEN
    _FORK_GEN += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def fork_generation() -> int:
    """Incremented in a child after each ``fork``: objects remember the one they were made in."""
    return _FORK_GEN


FORK_MESSAGE = (
    "this process was forked from the one that started the run (a DataLoader worker or "
    "multiprocessing child?); an inherited run cannot be used here — it would write into the "
    "parent's files. Start the child's own run with et.init(..., stream='worker') (or log "
    "from the parent only)."
)

# span/plugin measurement -> aggregation within one open row (spec spans.txt)
SUM, MAX, MEAN = 0, 1, 2
AGGREGATION = {
    "time_ms": SUM,
    "cpu_time_ms": SUM,
    "gpu_mem_delta_mb": SUM,
    "count": SUM,
    "gpu_mem_peak_mb": MAX,
    "gpu_mem_used_mb": MAX,
    "cpu_percent": MEAN,
    "gpu_percent": MEAN,
}

_NUMERIC = (int, float)

#: span records held for their step at most once ``log(step=N)`` is in use; one more folds
#: the pending span data at once (into the open row)
HOLD_MAX_RECORDS = 65_536
#: the same bound before any ``log(step=N)``: the open row is then the one the next
#: ``log()`` writes anyway, so records are released in small batches
HOLD_RECORDS_BEFORE_STEPS = 1024


def _raised_in(exc: BaseException, fn: Callable[..., Any]) -> bool:
    """Whether ``exc`` was raised inside a call of ``fn`` (its frame is on the traceback);
    True when ``fn`` has no Python code to look for and the traceback goes deeper."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    tb = exc.__traceback__
    if code is None:
        return tb is not None and tb.tb_next is not None
    while tb is not None:
        if tb.tb_frame.f_code is code:
            return True
        tb = tb.tb_next
    return False


def _changed(row: dict[str, Any], written: dict[str, Any]) -> dict[str, Any] | None:
    """The patch line for ``row`` after ``written`` reached disk: changed keys plus
    ``_step``/``_time``; None when no metric changed."""
    patch = {
        k: v
        for k, v in row.items()
        if k not in RESERVED and (k not in written or not _same(written[k], v))
    }
    if not patch:
        return None
    patch["_step"] = row["_step"]
    patch["_time"] = row["_time"]
    return patch


def _same(a: Any, b: Any) -> bool:
    return a is b or (type(a) is type(b) and a == b)


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
        self._flusher = flusher
        self._lock = threading.Lock()
        self._fork_gen = _FORK_GEN
        prefix = writer.prefix_lines if writer is not None else 0
        self.disk_prefix_rows = prefix
        self.cache = RowCache(cache_bytes, cache_rows, first_ordinal=prefix)
        self.open_step = int(start_step)
        self._open: dict[str, Any] = {}
        self._open_nonfinite = False
        self._agg: dict[str, list[float]] = {}
        # span data since the last log(): it joins the row the next log() writes
        self._pend: dict[str, Any] = {}
        self._pagg: dict[str, list[float]] = {}
        self._preset: set[str] | None = None  # pending keys that restarted (non-numeric)
        self._pend_nonfinite = False
        self._pend_since = 0.0  # monotonic time of the oldest pending span
        self._pend_armed = False
        self._held: list[Any] = []  # span records waiting for their step
        self._held_bytes = 0
        self._span_sink: Callable[[int, list[Any]], Any] | None = None
        self._hold_seconds: float | None = None
        self._hold_max_bytes = 64 << 20
        self._explicit_steps = False  # a log(step=N) was accepted
        self._hold_cap = HOLD_RECORDS_BEFORE_STEPS
        self._written_open: dict[str, Any] | None = None  # what a timeout wrote for this step
        self._gen = 0
        self._touched = 0.0
        self._timer_armed = False
        self._closed = False
        self.sinks: list[Callable[[dict[str, Any]], Any]] = []
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
        self.queries = 0
        self.disk_queries = 0
        self.disk_bytes_read = 0
        self.disk_lines_skipped = 0  # lines of the file that are not rows, met by queries
        self.disk_lines_no_step = 0  # ... of them: objects without an integer _step
        self._memo: DecodedTail | None = None  # decoded rows of the last tail(n) query
        self.dropped: dict[str, int] = {}
        self.sink_errors = 0

    # ------------------------------------------------------------------ ingress

    def _check_fork(self) -> None:
        if self._fork_gen != _FORK_GEN:
            raise ForkedRunError(FORK_MESSAGE)

    def _drop(self, cause: str, message: str, *args: Any) -> None:
        self.dropped[cause] = self.dropped.get(cause, 0) + 1
        self.warner.warn(("drop", cause), message, *args)

    def ingest(
        self, metrics: Mapping[str, Any], step: int | None = None, commit: bool | None = None
    ) -> int:
        """Merge ``metrics`` into the open row and apply the commit table.

        Returns the step the metrics landed on (-1 when they were dropped).

        Raises:
            TypeError: ``metrics`` is not a mapping.
            ForkedRunError: called in a forked child of the process that made this store.
        """
        if self._fork_gen != _FORK_GEN:
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
        committed = None
        with self._lock:
            if self._closed:
                self._drop("closed", "expr_tracker: log() after the history was closed; dropped")
                return -1
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
                        return -1
                    if self._open:
                        committed = self._commit_locked()
                    self.open_step = step
                if not self._explicit_steps:
                    self._explicit_steps = True
                    self._hold_cap = HOLD_MAX_RECORDS
                if commit is None:
                    commit = False
            elif commit is None:
                commit = True
            pend = self._pend
            if pend:  # span time since the last log() joins the row this call writes
                if not self._open and self._preset is None and not self._pend_nonfinite:
                    # the common case, inlined: swap in the pending row (see _fold_locked)
                    self._open, self._pend = pend, self._open
                    self._agg, self._pagg = self._pagg, self._agg
                else:
                    self._fold_locked()
                if self._held:
                    self._emit_held_locked()
            if metrics:
                self._merge(metrics)
            landed = self.open_step
            if commit:
                row = self._commit_locked()
                if committed is None:
                    committed = row
                else:
                    committed = (committed, row)
            elif self.max_open_seconds is not None and self._open:
                self._touch()
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

    def _coerce_step(self, step: Any) -> int | None:
        if isinstance(step, bool):
            ok = False
        else:
            try:
                ok = int(step) == step
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

    def _merge(self, metrics: dict[str, Any]) -> None:
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
                v = normalize_value(v, self.warner)
                if _has_nonfinite(v):
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

    #: metric key -> its aggregation, so the hot path does one dict lookup instead of a
    #: ``split`` per call; shared by all stores (it only depends on the name) and cleared
    #: when it grows past a bound, so unique span names cannot grow it without limit
    _kind_cache: dict[str, int] = {}

    def ingest_span(self, metrics: dict[str, Any], dur_ms: float, record: Any = None) -> int | None:
        """Accumulate span/plugin metrics until the next ``log()`` places them in its row.

        Aggregation by measurement name (spec spans.txt "Repeated plugin measurements"): sum
        (``time_ms``, ``cpu_time_ms``, ``gpu_mem_delta_mb``, ``count`` and unknown names),
        maximum (``gpu_mem_peak_mb``, ``gpu_mem_used_mb``), duration-weighted mean
        (``cpu_percent``, ``gpu_percent``). A span never commits a step.

        The metrics wait in a pending row that the next accepted ``log()`` folds into the
        row it writes (after ``step=`` opened it); ``commit()``, ``flush()``, ``close()``
        and the hold deadline (:meth:`hold_spans`) fold it into the row open then.
        ``record`` (a span record: ``bytes``, or a dict) waits with them and reaches the
        span sink with the step of that row.

        Returns None when ``record`` is held, else the step open now (the one a fold would
        use now); -1 when the store is closed (nothing is kept).
        """
        if self._fork_gen != _FORK_GEN:
            raise ForkedRunError(FORK_MESSAGE)
        kinds = self._kind_cache
        with self._lock:
            if self._closed:
                return -1
            pend = self._pend
            if not pend:  # the first span since the last fold: start the hold deadline
                self._pend_since = self._clock()
                if not self._pend_armed:
                    self._arm_pending()
            pagg = self._pagg
            for k, v in metrics.items():
                tv = type(v)
                if tv is not float and tv is not int:
                    pend[k] = v
                    pagg.pop(k, None)
                    if self._preset is None:  # remember that this metric restarted
                        self._preset = set()
                    self._preset.add(k)
                    continue
                if v - v != 0:
                    self._pend_nonfinite = True
                kind = kinds.get(k)
                if kind is None:
                    kind = self._kind(k)
                cur = pend.get(k)
                if kind == MEAN:
                    a = pagg.get(k)
                    if a is None or type(cur) not in _NUMERIC:
                        a = pagg[k] = [0.0, 0.0]
                    if dur_ms > 0:
                        a[0] += v * dur_ms
                        a[1] += dur_ms
                        pend[k] = a[0] / a[1]
                    elif a[1] == 0:
                        pend[k] = v
                # exact type checks: a bool or non-number already in the row is replaced
                elif (tc := type(cur)) is not float and tc is not int:
                    pend[k] = v
                elif kind == SUM:
                    pend[k] = cur + v
                elif v > cur or cur != cur:
                    pend[k] = v
            if record is None:
                return self.open_step
            held = self._held
            held.append(record)
            if type(record) is not dict:  # an encoded record (attributes, plugins, error)
                self._held_bytes += len(record)
            if len(held) < self._hold_cap and self._held_bytes < self._hold_max_bytes:
                return None
            self._fold_locked()  # bounded memory
            self._emit_held_locked()
            return None

    @classmethod
    def _kind(cls, k: str) -> int:
        kinds = cls._kind_cache
        if len(kinds) >= 65536:
            kinds.clear()
        kind = kinds[k] = AGGREGATION.get(k.split("/", 1)[0], SUM)
        return kind

    # ------------------------------------------------------------------ pending span data

    def hold_spans(
        self,
        sink: Callable[[int, list[Any]], Any],
        *,
        max_seconds: float | None = 5.0,
        max_bytes: int = 64 << 20,
    ) -> None:
        """Hold span records passed to :meth:`ingest_span` until their row is known.

        ``sink(step, records)`` receives them, in the order they were ingested, with the
        step of the row their metrics were folded into; it is called under the store lock
        (so records reach the span file in fold order and ``flush()`` misses none), must
        not call back into the store, and is never called with an empty list.

        ``max_seconds`` bounds how long the oldest pending span waits for a ``log()`` while
        this store has not accepted a ``log(step=N)``: the row open then is the one the
        next ``log()`` writes anyway. Once explicit steps are in use the bound is
        ``max_open_seconds`` (the open row's own crash bound). None: no timed fold beyond
        ``max_open_seconds``. Memory is bounded by ``max_bytes`` (of records held encoded,
        i.e. those with attributes, plugin metrics or an error) and by :data:`HOLD_MAX_RECORDS`
        records (:data:`HOLD_RECORDS_BEFORE_STEPS` before the first ``log(step=N)``); past
        a bound the pending data is placed in the open row at once.
        """
        with self._lock:
            self._span_sink = sink
            self._hold_seconds = max_seconds
            self._hold_max_bytes = int(max_bytes)

    @property
    def held_span_records(self) -> int:
        """Span records waiting for the ``log()`` that fixes their step."""
        return len(self._held)

    def fold_spans(self) -> None:
        """Place pending span data in the open row now and hand its records to the sink
        (what ``flush()`` and a closing span recorder do). Never commits."""
        self._check_fork()
        with self._lock:
            if self._pend:
                self._fold_locked()
                self._emit_held_locked()

    def _fold_locked(self) -> None:
        """Join the pending span data into the open row (its held records stay in
        ``_held`` until :meth:`_emit_held_locked` hands them to the sink)."""
        pend = self._pend
        if pend:
            if not self._open:  # the common case: the row this log() opened is empty
                # swap, no copy: an empty open row has no aggregation state either
                self._open, self._pend = pend, self._open
                self._agg, self._pagg = self._pagg, self._agg
            else:
                self._fold_into(self._open, self._agg)
                self._pend = {}
                self._pagg = {}
            if self._preset is not None:
                self._preset = None
            if self._pend_nonfinite:
                self._open_nonfinite = True
                self._pend_nonfinite = False

    def _fold_into(self, row: dict[str, Any], agg: dict[str, list[float]]) -> None:
        """Combine the pending row into ``row`` as if its spans had been ingested there."""
        pagg = self._pagg
        reset = self._preset
        kinds = self._kind_cache
        for k, v in self._pend.items():
            tv = type(v)
            if (reset is not None and k in reset) or (tv is not float and tv is not int):
                row[k] = v  # a non-numeric value restarted this metric's aggregation
                a = pagg.get(k)
                if a is not None:
                    agg[k] = list(a)
                else:
                    agg.pop(k, None)
                continue
            kind = kinds.get(k)
            if kind is None:
                kind = self._kind(k)
            cur = row.get(k)
            if kind == MEAN:
                a = agg.get(k)
                if a is None or type(cur) not in _NUMERIC:
                    a = agg[k] = [0.0, 0.0]
                pa = pagg.get(k)
                if pa is not None and pa[1] > 0:
                    a[0] += pa[0]
                    a[1] += pa[1]
                    row[k] = a[0] / a[1]
                elif a[1] == 0:
                    row[k] = v
            elif (tc := type(cur)) is not float and tc is not int:
                row[k] = v
            elif kind == SUM:
                row[k] = cur + v
            elif v > cur or cur != cur:
                row[k] = v

    def _emit_held_locked(self) -> None:
        """Hand the held records to the span sink with the open step. Under the store lock,
        so records reach the span file in fold order and ``flush()``/``close()`` never miss
        a batch another thread has folded but not yet written.

        All or nothing under an interrupt (Ctrl-C, SIGTERM's ``SystemExit``): the records
        leave ``_held`` in the same statement that calls the sink, so one raised before the
        sink was entered leaves them held (the next fold hands them over), and one raised
        inside the sink leaves them with the sink, which had them.
        """
        held = self._held
        if not held:
            return
        sink = self._span_sink
        if sink is None:  # nothing will ever take them
            self._held, self._held_bytes = [], 0
            return
        try:  # one statement: no signal is handled between the sink's return and the stores
            self._held, self._held_bytes = [], (sink(self.open_step, held), 0)[1]
        except Exception as exc:  # noqa: BLE001 - a span sink never breaks log()
            if self._held is held:
                self._held, self._held_bytes = [], 0
            self._sink_failed(exc)
        except BaseException as exc:
            if self._held is held and _raised_in(exc, sink):
                self._held, self._held_bytes = [], 0
            raise

    def _sink_failed(self, exc: Exception) -> None:
        self.warner.warn(
            ("span_sink", type(exc).__name__),
            "expr_tracker: writing span records failed (%s: %s); ignored (warned once)",
            type(exc).__name__,
            exc,
        )

    def _hold_limit(self) -> float | None:
        hold = self._hold_seconds
        if hold is None or self._explicit_steps:
            return self.max_open_seconds
        if self.max_open_seconds is None:
            return hold
        return min(hold, self.max_open_seconds)

    def _arm_pending(self) -> None:
        limit = self._hold_limit()
        if limit is None:
            return
        self._pend_armed = True
        (self._flusher or get_flusher()).schedule(
            ("spans", id(self)), self._pend_since + limit, self._pending_timeout
        )

    def _pending_timeout(self) -> None:
        """Runs on the flusher thread: fold span data that waited past the hold deadline."""
        with self._lock:
            self._pend_armed = False
            if self._closed or not self._pend:
                return
            limit = self._hold_limit()
            if limit is None:
                return
            due = self._pend_since + limit
            if self._clock() < due:
                self._arm_pending()
                return
            self._fold_locked()
            self._emit_held_locked()
            if self.max_open_seconds is not None:
                self._touch()

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
        gen = self._gen
        committed = self.rows_committed
        mark = self.cache.next_ordinal
        try:
            row["_step"] = step
            row["_time"] = self._wall()
            if self._written_open is None:
                self._append_locked(self._encode(row), step)
            else:
                self._write_row_locked(row, step)
                self._written_open = None
            # inline (the fast path); the same assignments as _open_step_after
            self._open = {}
            self._open_nonfinite = False
            if self._agg:
                self._agg = {}
            self._gen = gen + 1
            self.rows_committed = committed + 1
            self.last_row = row
            self.open_step = step + 1
        except BaseException:
            if self.cache.next_ordinal != mark and self.open_step == step:
                self._open_step_after(row, step, gen, committed)
            raise
        return row

    def _open_step_after(self, row: dict[str, Any], step: int, gen: int, committed: int) -> None:
        """The state after committing ``row`` at ``step`` (idempotent: plain assignments)."""
        self._written_open = None
        self._open = {}
        self._open_nonfinite = False
        self._agg = {}
        self._gen = gen + 1
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
        """Append to the cache and the writer: both or neither, whatever exception arrives
        in between (the cache ordinal and the writer's count say how far it got)."""
        cache = self.cache
        w = self.writer
        mark = cache.next_ordinal
        queued = w.appended if w is not None else 0
        try:
            cache.append(line, step)
            if w is not None:
                w.append(line, step)
        except BaseException:
            in_cache = cache.next_ordinal != mark
            in_writer = w is not None and w.appended != queued
            if in_cache or in_writer:  # it got in somewhere: finish the other half
                if not in_cache:
                    cache.append(line, step)
                if w is not None and not in_writer:
                    w.append(line, step)
            raise
        if cache.nbytes > cache.max_bytes or cache.nrows > cache.max_rows:
            self._evict_locked()

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
            if self._pend:
                self._fold_locked()
                self._emit_held_locked()
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
                        self.sink_errors += 1
                        self.warner.warn(
                            ("sink", getattr(sink, "__qualname__", repr(sink))),
                            "expr_tracker: a row consumer failed (%s: %s); it is skipped "
                            "for this row (warned once)",
                            type(exc).__name__,
                            exc,
                        )

    # ------------------------------------------------------------------ open-row timer

    def _touch(self) -> None:
        self._touched = self._clock()
        if not self._timer_armed:
            self._timer_armed = True
            (self._flusher or get_flusher()).schedule(
                ("open", id(self)), self._touched + self.max_open_seconds, self._open_timeout
            )

    def _open_timeout(self) -> None:
        """Runs on the flusher thread: write an idle open row to disk without committing."""
        with self._lock:
            self._timer_armed = False
            if self._closed or not self._open or self.max_open_seconds is None:
                return
            due = self._touched + self.max_open_seconds
            if self._clock() < due:
                self._timer_armed = True
                (self._flusher or get_flusher()).schedule(
                    ("open", id(self)), due, self._open_timeout
                )
                return
            self._write_open_locked()
        if self.writer is not None:
            self.writer.flush()

    def _write_row_locked(self, row: dict[str, Any], step: int) -> None:
        """Append ``row`` whole, or, once this step was written early (max_open_seconds), as
        a patch line holding what changed since (nothing when nothing did)."""
        written = self._written_open
        if written is None:
            self._append_locked(self._encode(row), step)
            return
        patch = _changed(row, written)
        if patch is None:
            return
        self._append_locked(self._encode(patch), step)
        self.patch_rows += 1
        if self.writer is not None:
            self.writer.mark_duplicate_steps()

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
            if not self._open:
                return False
            self._write_open_locked()
            return True

    # ------------------------------------------------------------------ queries
    # Query planning (spec design.txt B.0-B.2). The cache/disk boundary is the row ordinal
    # ``cache.first_ordinal``: rows before it are on disk (evicted, or a resume's prefix),
    # rows from it on are in memory. Every result is a list of new dicts: a snapshot.

    def open_row(self) -> dict[str, Any] | None:
        """A copy of the open row with its ``_step`` (None when it holds nothing)."""
        with self._lock:
            return self._open_copy_locked()

    def _open_copy_locked(self) -> dict[str, Any] | None:
        """The open row as a query shows it: with the pending span data folded in (a view:
        the next ``log()`` decides the row that data really joins)."""
        if not self._open:
            if not self._pend:
                return None
            row = dict(self._pend)
        else:
            row = dict(self._open)
            if self._pend:
                self._fold_into(row, {k: list(a) for k, a in self._agg.items()})
        row["_step"] = self.open_step
        return row

    def tail(self, n: int | None = 50, include_open: bool = True) -> list[dict[str, Any]]:
        """The newest ``n`` steps (``None``/``-1``: all, in step order), oldest first.

        Returns new dicts (a snapshot). Rows of one step are merged (later lines win per
        key); the open row counts as the newest step when ``include_open``. The cache
        answers without any IO when it holds the window; otherwise the rows before the
        cache boundary are read backwards from the file (``disk_queries`` += 1).

        Raises:
            ForkedRunError: called in a forked child of the process that made this store.
        """
        self._check_fork()
        if n is not None and n < 0:
            n = None
        if n == 0:
            with self._lock:
                self.queries += 1
            return []
        memo_rows = None
        with self._lock:
            self.queries += 1
            cache = self.cache
            openrow = self._open_copy_locked() if include_open else None
            # a timed-out open row is on disk but not committed: hidden without include_open
            hide = None if include_open or self._written_open is None else self.open_step
            stop = cache.next_ordinal
            if n is None:
                start, complete, simple = cache.first_ordinal, False, False
                want = None
            else:
                want = n - 1 if openrow is not None else n + (hide is not None)
                if want <= 0:
                    start, complete, simple = stop, True, True
                else:
                    start, complete, simple = cache.tail_start(want)
                    memo = self._memo
                    if memo is None:
                        memo = self._memo = DecodedTail()
                    memo_rows = memo.get(cache, start, stop)
            lines = cache.lines(start, stop) if memo_rows is None else None
            first = cache.first_ordinal
            first_step = cache.first_step()
            is_sorted = cache.sorted and (self.writer is None or self.writer.sorted)
            disk = not complete and first > 0 and self.writer is not None
        rows = memo_rows if memo_rows is not None else decode_lines(lines or [])
        if disk:
            reader = self._disk_reader(first)
            if reader is not None:
                if want is None:
                    drows = list(reader.iter_rows())
                else:
                    drows = reader.tail_physical(want)
                if not reader.meta and first_step is not None:  # degraded: by step
                    drows = [r for r in drows if step_key(r) < first_step]
                self._count_disk(reader)
                rows = drows + rows
                simple = False
        if hide is not None:
            while rows and rows[-1].get("_step") == hide:
                rows.pop()
        if openrow is not None:
            rows.append(openrow)
            if simple and len(rows) > 1 and step_key(rows[-2]) >= openrow["_step"]:
                simple = False
        if not simple:
            rows = merge_by_step(rows)
            if n is None and not is_sorted:
                rows.sort(key=step_key)
        if n is not None and len(rows) > n:
            del rows[:-n]
        return rows

    def step_range(
        self, start: int | None, end: int | None, include_open: bool = True
    ) -> list[dict[str, Any]]:
        """Steps ``start <= _step < end`` (None: open side), merged, in step order.

        Exact by step. When the store is sorted the cache is binary-searched and the file
        is read only for the part of the range older than the cache, through the sidecar
        index (never a full scan); an unsorted store (``step_policy="allow"`` with
        backward steps) walks the cache and scans the disk part once.

        Raises:
            ForkedRunError: called in a forked child of the process that made this store.
        """
        self._check_fork()
        lo = -(1 << 63) if start is None else int(start)
        hi = 1 << 63 if end is None else int(end)
        if hi <= lo:
            with self._lock:
                self.queries += 1
            return []
        with self._lock:
            self.queries += 1
            cache = self.cache
            w = self.writer
            is_sorted = cache.sorted and (w is None or w.sorted)
            if cache.nrows == 0:
                lines: list[bytes] = []
            elif cache.sorted:
                lines = cache.lines(cache.ordinal_of_step(lo), cache.ordinal_of_step(hi))
            else:
                lines = [cache.lines(o, o + 1)[0] for o in cache.ordinals_in(lo, hi)]
            first = cache.first_ordinal
            first_step = cache.first_step()
            disk = (
                first > 0
                and w is not None
                and (not is_sorted or first_step is None or lo <= first_step)
            )
            openrow = None
            hide = None
            if lo <= self.open_step < hi:
                if include_open:
                    openrow = self._open_copy_locked()
                elif self._written_open is not None:
                    hide = self.open_step
        rows = decode_lines(lines)
        if disk:
            reader = self._disk_reader(first)
            if reader is not None:
                drows = reader.range_rows(lo, hi)
                if not reader.meta and first_step is not None:
                    drows = [r for r in drows if step_key(r) < first_step]
                self._count_disk(reader)
                rows = drows + rows
        if hide is not None:
            while rows and rows[-1].get("_step") == hide:
                rows.pop()
        if openrow is not None:
            rows.append(openrow)
        rows = merge_by_step(rows)
        rows.sort(key=step_key)
        return rows

    def _disk_reader(self, boundary: int) -> JsonlReader | None:
        """A reader over the file's lines before ordinal ``boundary`` (None: no file).

        Plans with the writer's in-memory sidecar (fresher than meta.json). When records
        were dropped, line numbers no longer equal ordinals: the whole file is read with
        no sidecar and the caller keeps only steps older than the cache (spec B.2).
        """
        w = self.writer
        if w is None or not w.path.exists():
            return None
        if w.dropped:
            return JsonlReader(w.path, meta={}, warner=self.warner)
        meta = w.meta()
        meta["index"] = list(meta["index"])
        reader = JsonlReader(w.path, meta=meta, warner=self.warner)
        reader.set_end(reader.offset_of_line(boundary))
        return reader

    def _count_disk(self, reader: JsonlReader) -> None:
        self.disk_queries += 1
        self.disk_bytes_read += reader.bytes_read
        self.disk_lines_skipped += reader.skipped
        self.disk_lines_no_step += reader.no_step

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
            if self._pend:
                self._fold_locked()
                self._emit_held_locked()
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
        flusher = self._flusher or get_flusher()
        flusher.cancel(("open", id(self)))
        flusher.cancel(("spans", id(self)))
        return row

    def stats(self) -> dict[str, Any]:
        """Counters for ``et.info()`` (spec design.txt B.2).

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
        stats.
        """
        c = self.cache
        w = self.writer
        q = self.queries
        out = {
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
            "disk_queries": self.disk_queries,
            "disk_bytes_read": self.disk_bytes_read,
            "disk_lines_skipped": self.disk_lines_skipped,
            "disk_lines_no_step": self.disk_lines_no_step,
            "hit_rate": (q - self.disk_queries) / q if q else None,
            "dropped": dict(self.dropped),
            "sink_errors": self.sink_errors,
            "held_span_records": len(self._held),
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
