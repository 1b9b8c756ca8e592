"""Span and plugin measurements within the store: the pending row, the fold, held records.

A span belongs to the step open when it ends (docs/spans.md "Which row a span joins"), with
one refinement for the loop that calls ``log(d, step=i)`` after its spans: a span that no
``log()`` reached while it ran waits for the next one. :meth:`SpanFolding.ingest_span` is
handed the span's id, drawn from the sequence each accepted ``log()`` also takes a mark
from (``_current.sequence``): an id below the last mark means a ``log()`` came while the
span ran, and the metrics join the open row at once. Otherwise they aggregate into a
*pending* row, and each accepted ``log()`` call folds it into the row it writes, after
opening that row's step and before merging its own metrics. Span records of pending spans
are held with it and get their ``_step`` at that fold, so a record always names the row its
time was summed into. ``commit()``, ``flush()``, ``close()`` and a hold deadline
(:meth:`SpanFolding.hold_spans`) fold into the row open at that moment.

How each measurement combines (sum, max, duration-weighted mean) is a table handed to the
store (``HistoryStore(aggregation=...)``): the history package knows no measurement names.
:class:`SpanFolding` is a part of :class:`~expr_tracker.history.store.HistoryStore` (a
mixin over its state and its one lock), kept in its own module by job.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from expr_tracker import _current
from expr_tracker._current import FORK_MESSAGE
from expr_tracker.errors import ForkedRunError
from expr_tracker.history.flusher import get_flusher

# how a measurement combines within one open row; which measurement (the name before the
# first "/") uses which is the span package's table, handed to the store (spec spans.txt)
SUM, MAX, MEAN = 0, 1, 2
_KINDS = {"sum": SUM, "max": MAX, "mean": MEAN}


def aggregation_kinds(table: Mapping[str, str] | None) -> dict[str, int]:
    """``{"time_ms": "sum", "gpu_mem_peak_mb": "max", ...}`` -> the store's kind codes;
    a name not in the table sums."""
    kinds: dict[str, int] = {}
    for name, how in (table or {}).items():
        if how not in _KINDS:
            raise ValueError(f"aggregation {how!r} of {name!r} is not valid: sum, max or mean")
        kinds[name] = _KINDS[how]
    return kinds


_NUMERIC = (int, float)

#: ``ingest_span(..., since=NEVER)``: no ``log()`` ever counts as having come while the span
#: ran (larger than any id or mark ``_current.sequence`` will hand out)
NEVER = 1 << 62

#: until the first span record went out, and while no ``log(step=N)`` came, pending span
#: data waits this long at most, so a lone span's record reaches the span file within about
#: a second (the first completed span requests an immediate write: docs/spans.md "Which row
#: a span joins")
FIRST_HOLD_SECONDS = 1.0

#: span records held for their step at most once ``log(step=N)`` is in use; one more folds
#: the pending span data at once (into the open row)
HOLD_MAX_RECORDS = 65_536
#: the same bound before any ``log(step=N)``: the open row is then the one the next
#: ``log()`` writes anyway, so records are released in small batches
HOLD_RECORDS_BEFORE_STEPS = 1024


def _encoded_size(record: tuple[int, Any]) -> int:
    """Bytes of a held ``(step, record)`` pair (0 for a record dict)."""
    return 0 if type(record[1]) is dict else len(record[1])


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


class SpanFolding:
    """The span half of :class:`~expr_tracker.history.store.HistoryStore` (its state is set
    up by ``HistoryStore.__init__``; every method runs under, or takes, the store lock)."""

    _kind_cache: dict[str, int]
    _aggregation: dict[str, int]

    def ingest_span(
        self, metrics: dict[str, Any], dur_ms: float, record: Any = None, since: int = NEVER
    ) -> int | None:
        """Place one ended span's metrics (docs/spans.md "Which row a span joins").

        Aggregation by measurement name (the part before the first ``/``), as the table
        handed to the store says (``HistoryStore(aggregation=...)``; spec spans.txt
        "Repeated plugin measurements"): sum (also every name not in the table), maximum,
        or duration-weighted mean. A span never commits a step.

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
        kinds = self._kind_cache
        with self._lock:
            if self._closed:
                return -1
            if since < self._log_mark:  # a log() came while the span ran: the open row
                row = self._open
                agg = self._agg
                pend = None
            else:
                row = pend = self._pend
                agg = self._pagg
                if not pend:  # the first span since the last fold: start the hold deadline
                    self._pend_since = self._clock()
                    if not self._pend_armed:
                        self._arm_pending()
            for k, v in metrics.items():
                tv = type(v)
                if tv is not float and tv is not int:
                    row[k] = v
                    agg.pop(k, None)
                    if pend is not None:  # remember that this pending metric restarted
                        if self._preset is None:
                            self._preset = set()
                        self._preset.add(k)
                    continue
                if v - v != 0:
                    if pend is None:
                        self._open_nonfinite = True
                    else:
                        self._pend_nonfinite = True
                kind = kinds.get(k)
                if kind is None:
                    kind = self._kind(k)
                cur = row.get(k)
                if kind == MEAN:
                    a = agg.get(k)
                    if a is None or type(cur) not in _NUMERIC:
                        a = agg[k] = [0.0, 0.0]
                    if dur_ms > 0:
                        a[0] += v * dur_ms
                        a[1] += dur_ms
                        row[k] = a[0] / a[1]
                    elif a[1] == 0:
                        row[k] = v
                # exact type checks: a bool or non-number already in the row is replaced
                elif (tc := type(cur)) is not float and tc is not int:
                    row[k] = v
                elif kind == SUM:
                    row[k] = cur + v
                elif v > cur or cur != cur:
                    row[k] = v
            held = self._held
            if pend is None:
                if self._timer is not None:
                    self._timer.start()  # the open row's crash bound (openrow.py)
                if record is None:
                    return self.open_step
                if not held:
                    self._first_hold = False  # this record goes out now
                    return self.open_step
                # records held ahead of it (a span nested in this one, ended after the
                # log()) keep the file's order: this one waits with them, its step fixed
                record = (self.open_step, record)
            elif record is None:
                return self.open_step
            held.append(record)
            if type(record) is not dict:  # an encoded record (attributes, plugins, error)
                self._held_bytes += (
                    len(record) if type(record) is not tuple else _encoded_size(record)
                )
            if len(held) < self._hold_cap and self._held_bytes < self._hold_max_bytes:
                return None
            self._fold_locked()  # bounded memory
            self._emit_held_locked()
            return None

    def _kind(self, k: str) -> int:
        kinds = self._kind_cache
        if len(kinds) >= 65536:
            kinds.clear()
        kind = kinds[k] = self._aggregation.get(k.split("/", 1)[0], SUM)
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
        step of the row their metrics were folded into (a ``(step, record)`` pair: a record
        whose step was fixed when its span ended, held behind earlier records to keep the
        file's order); it is called under the store lock
        (so records reach the span file in fold order and ``flush()`` misses none), must
        not call back into the store, and is never called with an empty list.

        ``max_seconds`` bounds how long the oldest pending span waits for a ``log()`` while
        this store has not accepted a ``log(step=N)``: the row open then is the one the
        next ``log()`` writes anyway (:data:`FIRST_HOLD_SECONDS` at most until the first
        record went out). Once explicit steps are in use the bound is ``max_open_seconds``
        (the open row's own crash bound). None: no timed fold beyond ``max_open_seconds``
        (but the first record's). Memory is bounded by ``max_bytes`` (of records held encoded,
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

    def _drop_pending_spans(self, step: int) -> None:
        """A ``log(step=N)`` was dropped (behind the open step): the span data pending for
        it is dropped with it (counted in ``dropped["span_metrics"]``), never summed into a
        later row it was not measured for; its held records still reach the span file (the
        time was spent), naming ``N``, the step they were measured for."""
        self.dropped["span_metrics"] = self.dropped.get("span_metrics", 0) + 1
        self._pend = {}
        self._pagg = {}
        self._preset = None
        self._pend_nonfinite = False
        if self._held:
            self._emit_held_locked(step)

    def _emit_held_locked(self, step: int | None = None) -> None:
        """Hand the held records to the span sink with the open step (or ``step``). Under
        the store lock, so records reach the span file in fold order and
        ``flush()``/``close()`` never miss a batch another thread has folded but not yet
        written.

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
        at = self.open_step if step is None else step
        self._first_hold = False
        # one statement, on one line: no signal is handled between the sink's return and the
        # stores (a line event inside a statement split over lines would be such a point)
        try:
            self._held, self._held_bytes = [], (sink(at, held), 0)[1]
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
        if self._explicit_steps:
            return self.max_open_seconds
        hold = self._hold_seconds
        if self._first_hold and self._span_sink is not None:
            # no span record went out yet: the first one reaches the file promptly (the
            # open row is the one the next plain log(d) writes: nothing moves)
            hold = FIRST_HOLD_SECONDS if hold is None else min(hold, FIRST_HOLD_SECONDS)
        if hold is None:
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
            if self._timer is not None:
                self._timer.touch()
