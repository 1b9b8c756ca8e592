"""Span and plugin measurements waiting for their row: :class:`PendingSpans`.

A span belongs to the step open when it ends (docs/spans.md "Which row a span joins"), with
one refinement for the loop that calls ``log(d, step=i)`` after its spans: a span that no
``log()`` reached while it ran waits for the next one. The store's ``ingest_span`` is
handed the span's id, drawn from the sequence each accepted ``log()`` also takes a mark
from (``_current.sequence``): an id below the last mark means a ``log()`` came while the
span ran, and the metrics join the open row at once (:meth:`PendingSpans.place`).
Otherwise they aggregate into the *pending* row, and each
accepted ``log()`` call folds it into the row it writes, after opening that row's step and
before merging its own metrics. Span records of pending spans are held with it and get
their ``_step`` at that fold (:meth:`PendingSpans.emit`), so a record always names the row
its time was summed into. ``commit()``, ``flush()``, ``close()`` and a hold deadline
(:meth:`PendingSpans.configure`) fold into the row open at that moment.

How each measurement combines (sum, max, duration-weighted mean) is a table handed to the
store (``HistoryStore(aggregation=...)``): the history package knows no measurement names.

:class:`PendingSpans` is owned by :class:`~expr_tracker.history.store.HistoryStore` and
runs under its lock: the pending row with its aggregation state, the held records and
their sink, the hold deadline. The store owns the open row; it passes it in where span
data joins it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from expr_tracker._warn import Warner
from expr_tracker.history.flusher import BackgroundFlusher, get_flusher

# how a measurement combines within one open row; which measurement (the name before the
# first "/") uses which is the span package's table, handed to the store
SUM, MAX, MEAN = 0, 1, 2
_KINDS = {"sum": SUM, "max": MAX, "mean": MEAN}
_KIND_NAMES = ("sum", "max", "mean")


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

#: what :meth:`PendingSpans.place` says about a record: nothing is held (no record, or it
#: goes out now with the open step), it is held, or it is held and a bound is reached (the
#: store folds the pending data and emits the records now); plus a bit: a NaN/inf joined
#: the store's open row
OUT, HELD, FULL = 0, 1, 2
OPEN_NONFINITE = 4


def _encoded_size(record: tuple[int, Any]) -> int:
    """Bytes of a held ``(step, record)`` pair (0 for a record not yet encoded)."""
    return len(record[1]) if type(record[1]) is bytes else 0


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


class PendingSpans:
    """Span data of one store that waits for its row; every method runs under the store
    lock (the store calls them while it holds it).

    Read by the store: ``row`` (the pending row; empty: nothing waits), ``agg`` (its mean
    state), ``plain`` (no NaN/inf in it and no restarted metric: its values are what they
    would be in an empty row), ``nonfinite`` (a NaN/inf in it), ``held`` (records waiting
    for their step) and ``explicit`` (a ``log(step=N)`` was accepted). When its open row
    is empty and ``plain`` holds, the store takes ``row`` and ``agg`` in exchange for its
    empty open row and aggregation state, in one statement (no copy, and no interrupt
    splits it); otherwise it calls :meth:`fold_into`.

    ``on_due`` (the store's) runs on the flusher thread when the hold deadline may have
    come: it takes the store lock and asks :meth:`expired`.
    """

    __slots__ = (
        "row",
        "agg",
        "plain",
        "nonfinite",
        "held",
        "explicit",
        "_reset",
        "_held_bytes",
        "_cap",
        "_max_bytes",
        "_sink",
        "_hold_seconds",
        "_first_hold",
        "_since",
        "_armed",
        "_open_seconds",
        "_aggregation",
        "_kinds",
        "_clock",
        "_flusher",
        "_key",
        "_on_due",
        "_warner",
    )

    def __init__(
        self,
        aggregation: Mapping[str, str] | None,
        *,
        open_seconds: float | None,
        clock: Callable[[], float],
        flusher: BackgroundFlusher | None,
        on_due: Callable[[], Any],
        warner: Warner,
    ) -> None:
        self.row: dict[str, Any] = {}
        self.agg: dict[str, list[float]] = {}
        self.plain = True
        self.nonfinite = False
        self.held: list[Any] = []  # span records (and (step, record) pairs) waiting
        self.explicit = False
        self._reset: set[str] | None = None  # pending keys that restarted (non-numeric)
        self._held_bytes = 0
        self._cap = HOLD_RECORDS_BEFORE_STEPS
        self._max_bytes = 64 << 20
        self._sink: Callable[[int, list[Any]], Any] | None = None
        self._hold_seconds: float | None = None
        self._first_hold = True  # no span record went out yet (FIRST_HOLD_SECONDS)
        self._since = 0.0  # monotonic time of the oldest pending span
        self._armed = False
        self._open_seconds = open_seconds  # the store's max_open_seconds
        # measurement name -> sum/max/mean (the span package's table), and each metric
        # key's kind, so the hot path does one dict lookup instead of a ``split`` per
        # call (cleared past a bound: unique span names cannot grow it without limit)
        self._aggregation = aggregation_kinds(aggregation)
        self._kinds: dict[str, int] = {}
        self._clock = clock
        self._flusher = flusher  # None: the process-wide one, looked up each time (fork)
        self._key = ("spans", id(self))
        self._on_due = on_due
        self._warner = warner

    def configure(
        self, sink: Callable[[int, list[Any]], Any], max_seconds: float | None, max_bytes: int
    ) -> None:
        """Hold span records for ``sink`` (``HistoryStore.hold_spans`` says how)."""
        self._sink = sink
        self._hold_seconds = max_seconds
        self._max_bytes = int(max_bytes)

    def use_steps(self) -> None:
        """A ``log(step=N)`` was accepted: records are held in larger batches, and the hold
        deadline is the open row's (``max_open_seconds``)."""
        self.explicit = True
        self._cap = HOLD_MAX_RECORDS

    # ------------------------------------------------------------------ aggregation

    def place(
        self,
        metrics: dict[str, Any],
        dur_ms: float,
        record: Any,
        open_row: dict[str, Any] | None = None,
        open_agg: dict[str, list[float]] | None = None,
        step: int = 0,
    ) -> int:
        """One ended span's metrics and record (``record`` None: none).

        ``open_row`` None: no ``log()`` came while the span ran, so the metrics join the
        pending row and the record is held. Otherwise a ``log()`` chose the step: the
        metrics join ``open_row`` (the store's, with its mean state ``open_agg``, at
        ``step``), and the record goes out now unless records are held ahead of it (a span
        nested in this one, ended after the ``log()``): then it waits with them, its step
        fixed (a ``(step, record)`` pair), to keep the file's order.

        Combines by the measurement name before the first ``/``: sum (also every name not
        in the table), maximum or duration-weighted mean; a non-numeric value replaces.
        Returns :data:`OUT` (no record held), :data:`HELD` or :data:`FULL`, plus
        :data:`OPEN_NONFINITE` when a NaN/inf joined ``open_row``.
        """
        if open_row is None:
            row = self.row
            agg = self.agg
            if not row:  # the first span since the last fold: start the hold deadline
                self._since = self._clock()
                if not self._armed:
                    self._arm()
        else:
            row = open_row
            agg = open_agg  # type: ignore[assignment]
        kinds = self._kinds
        nonfinite = False
        for k, v in metrics.items():
            tv = type(v)
            if tv is not float and tv is not int:
                row[k] = v
                agg.pop(k, None)
                if open_row is None:  # remember that this pending metric restarted
                    if self._reset is None:
                        self._reset = set()
                    self._reset.add(k)
                    self.plain = False
                continue
            if v - v != 0:
                nonfinite = True
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
        held = self.held
        if open_row is None:
            if nonfinite:
                self.nonfinite = True
                self.plain = False
            if record is None:
                return OUT
            held.append(record)
            if type(record) is bytes:  # an encoded record (attributes, plugins, error)
                self._held_bytes += len(record)
            if len(held) < self._cap and self._held_bytes < self._max_bytes:
                return HELD
            return FULL
        else:
            flag = OPEN_NONFINITE if nonfinite else 0
            if record is None:
                return OUT | flag
            if not held:
                self._first_hold = False  # this record goes out now
                return OUT | flag
            record = (step, record)
        held.append(record)
        self._held_bytes += _encoded_size(record)
        if len(held) < self._cap and self._held_bytes < self._max_bytes:
            return HELD | flag
        return FULL | flag

    def start_row(self, row: dict[str, Any]) -> None:
        """The pending row is empty: it becomes ``row``, finite numbers of span metrics
        each placed once (what :meth:`place` gives for them, in one step)."""
        self._since = self._clock()
        if not self._armed:
            self._arm()
        self.row = row

    def aggregation_of(self, name: str) -> str:
        """``"sum"``, ``"max"`` or ``"mean"``: how measurement ``name`` combines."""
        return _KIND_NAMES[self._aggregation.get(name, SUM)]

    def _kind(self, k: str) -> int:
        kinds = self._kinds
        if len(kinds) >= 65536:
            kinds.clear()
        kind = kinds[k] = self._aggregation.get(k.split("/", 1)[0], SUM)
        return kind

    # ------------------------------------------------------------------ fold

    def combine(self, row: dict[str, Any], agg: dict[str, list[float]]) -> None:
        """Combine the pending row into ``row`` as if its spans had been ingested there
        (the pending row is left as it is: a view, for queries)."""
        pagg = self.agg
        reset = self._reset
        kinds = self._kinds
        for k, v in self.row.items():
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

    def fold_into(self, row: dict[str, Any], agg: dict[str, list[float]]) -> None:
        """Join the pending row into ``row`` (the store's open row) and start a new one
        (the held records stay held until :meth:`emit`). The store notes ``nonfinite``
        first."""
        self.combine(row, agg)
        self.row, self.agg, self._reset, self.nonfinite, self.plain = {}, {}, None, False, True

    def discard(self) -> None:
        """The ``log(step=N)`` this data waited for was dropped: so is the data (the store
        counts it); the held records stay, for :meth:`emit` with that step."""
        self.row, self.agg, self._reset, self.nonfinite, self.plain = {}, {}, None, False, True

    def emit(self, step: int) -> None:
        """Hand the held records to the sink with ``step`` (a ``(step, record)`` pair keeps
        its own). Under the store lock, so records reach the span file in fold order and
        ``flush()``/``close()`` never miss a batch another thread has folded but not yet
        written.

        All or nothing under an interrupt (Ctrl-C, SIGTERM's ``SystemExit``): the records
        leave ``held`` in the same statement that calls the sink, so one raised before the
        sink was entered leaves them held (the next fold hands them over), and one raised
        inside the sink leaves them with the sink, which had them.
        """
        held = self.held
        if not held:
            return
        sink = self._sink
        if sink is None:  # nothing will ever take them
            self.held, self._held_bytes = [], 0
            return
        self._first_hold = False
        # one statement, on one line: no signal is handled between the sink's return and the
        # stores (a line event inside a statement split over lines would be such a point)
        try:
            self.held, self._held_bytes = [], (sink(step, held), 0)[1]
        except Exception as exc:  # noqa: BLE001 - a span sink never breaks log()
            if self.held is held:
                self.held, self._held_bytes = [], 0
            self._sink_failed(exc)
        except BaseException as exc:
            if self.held is held and _raised_in(exc, sink):
                self.held, self._held_bytes = [], 0
            raise

    def emit_now(
        self,
        step: int,
        records: list[Any],
        done: Callable[[], Any],
        sink: Callable[[int, list[Any], Callable[[], Any]], Any] | None = None,
    ) -> None:
        """Hand ``records`` (nothing is held ahead of them) to the sink with ``step`` and
        call ``done()`` (the caller's queue lets go of them; it must do so once however
        often it is called), as :meth:`write_now` does with one record. ``sink(step,
        records, done)``: one that does what the sink would do with these records and
        calls ``done()`` itself once they are queued, before it returns (None: the sink).

        Under an interrupt: one raised inside ``sink`` leaves the records with it (``done()``
        runs); one raised as it returns finds ``done()`` already run; one raised before it
        was entered leaves them with the caller."""
        self._first_hold = False
        own = self._sink
        if own is None:  # nothing will ever take them
            done()
            return
        called: Callable[..., Any] = own if sink is None else sink
        try:
            if sink is None:
                own(step, records) or done()
            else:
                sink(step, records, done)  # calls done() itself before it returns
        except BaseException as exc:
            self._sink_raised(exc, called, done)

    def _sink_raised(
        self, exc: BaseException, sink: Callable[..., Any], done: Callable[[], Any]
    ) -> None:
        """``exc`` came out of a hand-off to ``sink`` (``emit``, ``write_now``). Raised
        inside the sink: the records are with it, so ``done()`` runs; an ``Exception`` is
        then counted and warned (a span sink never breaks ``log()``), anything else (Ctrl-C,
        SIGTERM's ``SystemExit``) re-raised. Raised outside it (a signal handler's
        exception, a ``TimeoutError`` as well as Ctrl-C, before the call or after ``done()``
        ran): re-raised with the records where that left them, and ``done()`` not called
        again (it would let go of the next record in the caller's queue)."""
        if not _raised_in(exc, sink):
            raise exc
        done()
        if not isinstance(exc, Exception):
            raise exc
        self._sink_failed(exc)

    def _sink_failed(self, exc: Exception) -> None:
        """The span sink raised: warned once per cause, never into ``log()``."""
        self._warner.warn(
            ("span_sink", type(exc).__name__),
            "expr_tracker: writing span records failed (%s: %s); ignored (warned once)",
            type(exc).__name__,
            exc,
        )

    def write_now(self, step: int, record: Any, done: Callable[[], Any]) -> None:
        """Hand one record to the sink now with ``step`` (nothing is held ahead of it) and
        call ``done()`` in the same statement (the caller's queue lets go of it). As
        :meth:`emit` under an interrupt: one raised inside the sink leaves the record with
        the sink (``done()`` runs), one raised before it leaves it with the caller."""
        self._first_hold = False
        sink = self._sink
        if sink is None:  # nothing will ever take it
            done()
            return
        try:
            sink(step, [record]) or done()
        except BaseException as exc:
            self._sink_raised(exc, sink, done)

    # ------------------------------------------------------------------ hold deadline

    def _limit(self) -> float | None:
        if self.explicit:
            return self._open_seconds
        hold = self._hold_seconds
        if self._first_hold and self._sink is not None:
            # no span record went out yet: the first one reaches the file promptly (the
            # open row is the one the next plain log(d) writes: nothing moves)
            hold = FIRST_HOLD_SECONDS if hold is None else min(hold, FIRST_HOLD_SECONDS)
        if hold is None:
            return self._open_seconds
        if self._open_seconds is None:
            return hold
        return min(hold, self._open_seconds)

    def _arm(self) -> None:
        limit = self._limit()
        if limit is None:
            return
        self._armed = True
        (self._flusher or get_flusher()).schedule(self._key, self._since + limit, self._on_due)

    def expired(self, closed: bool) -> bool:
        """In ``on_due``: True when the pending data waited past the hold deadline (the
        store folds it now). False when nothing waits (or the store is ``closed``), or
        when the deadline moved later: the deadline is then armed again."""
        self._armed = False
        if closed or not self.row:
            return False
        limit = self._limit()
        if limit is None:
            return False
        if self._clock() < self._since + limit:
            self._arm()
            return False
        return True

    def cancel(self) -> None:
        """The store closed: nothing is scheduled any more."""
        (self._flusher or get_flusher()).cancel(self._key)
