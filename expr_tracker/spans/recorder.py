"""SpanRecorder: turns each ended span into metrics for the store and a span-file record.

"When" is decided here and "where" elsewhere: the recorder builds ``time_ms/<path>`` (and
``count/<path>``) plus ``<key>/<path>`` for each plugin measurement, hands them to
``store.ingest_span(metrics, dur_ms) -> step`` (the store aggregates: sum / max /
duration-weighted mean, and resets on commit), and enqueues one encoded record with
``writer.append(line_bytes)``, or, for a writer with ``append_deferred`` (the
``JsonlWriter``), a step's plain span records as one entry that the writer encodes when it
writes it (:class:`_PlainRecords`). It never writes a file itself.

A store with ``hold_spans`` (the :class:`~expr_tracker.history.store.HistoryStore`) places
the time of a span that saw no ``log()`` while it ran in the row the next ``log()`` writes,
so a record's step is not always known when the span ends: the record is encoded then
without ``_step``, handed to ``ingest_span`` with the metrics and the span's id (which tells
the store whether a ``log()`` came while it ran: then the open row takes the time and the
step is known at once), and comes back through :meth:`SpanRecorder._write_held` with the
step of the row its time was summed into when it was held (docs/spans.md "Which row a span
joins").

Record format (one JSON line of ``spans[.S][.rankN].jsonl``; see docs/architecture.md)::

    {"_step": 42, "name": "forward/attention", "depth": 1, "start": 1754323200.123456,
     "dur_ms": 18.4, "id": 7, "parent": 6, "pid": 4242, "tid": 4242, "thread": "MainThread",
     "track": "MainThread (tid 4242)", "task"?: "Task-3", "args"?: {...}, "metrics"?: {...},
     "error"?: "ValueError"}

``track`` is the name ``et trace`` gives the span's track
(:func:`~expr_tracker.history.spanfiles.track_name`: ``"MainThread (tid 4242) · Task-3"``
inside an asyncio task).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson

from expr_tracker._warn import Warner
from expr_tracker.errors import ForkedRunError
from expr_tracker.history.codec import encode_row, has_nonfinite, normalize_value
from expr_tracker.history.spanfiles import track_name
from expr_tracker.spans import core
from expr_tracker.spans.core import RAW_MAX, task_name, thread_cache, thread_identity

log = logging.getLogger("expr_tracker.spans")

_dumps = orjson.dumps
_modules = sys.modules
_NUMBER = (float, int)


#: an encoded record starts with ``{"_step":null,`` until its step is known: cut there
_NULL_STEP = len(b'{"_step":null,')
#: bytes a plain span's record counts for against the writer's ``max_pending_bytes``
#: until it is encoded (a record of a short name in the main thread is about 200)
DEFERRED_RECORD_BYTES = 256
#: bytes a step adds to a cut record at most (``{"_step":`` + 20 characters + ``,``)
_STEP_ROOM = 30


#: the recorders whose ``raw_queue`` is set: a forked child clears it, so a span ending
#: there takes ``record()``'s path (not recorded, warned) without a pid check of its own
_queued: weakref.WeakSet[SpanRecorder] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for rec in list(_queued):
        rec.raw_queue = None
    _queued.clear()


if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _record_of(entry: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
    """A raw-queue entry ``(span, thread identity, task name)`` as its record
    ``(fields, thread identity, task name)``: the span's fields as plain values
    (:meth:`SpanRecorder._convert_raw`)."""
    span, ident, task = entry
    parent = span.parent
    fields = (
        span.path,
        span.depth,
        span._start_ns,
        span._end_ns,
        span.id,
        None if parent is None else parent.id,
    )
    return fields, ident, task


class _PlainRecords:
    """Plain span records of one step, queued to the span file's writer as one entry
    (``JsonlWriter.append_deferred``) and encoded when it writes them:
    ``SpanRecorder._raw_lines`` of the entries (ended spans: everything it reads is fixed),
    the records over ``max_record_bytes`` dropped and counted then."""

    __slots__ = ("_rec", "_step", "_entries", "_size")

    def __init__(self, rec: SpanRecorder, step: Any, entries: list[Any]) -> None:
        self._rec = rec
        self._step = step
        self._entries = entries
        self._size = DEFERRED_RECORD_BYTES * len(entries)

    def __len__(self) -> int:
        return self._size

    def lines(self) -> list[bytes]:
        lines = self._rec._raw_lines(self._step, self._entries)
        if None in lines:
            return [line for line in lines if line is not None]
        return lines  # type: ignore[return-value]


class SpanRecorder:
    """Receives every span that ends while it is the active recorder.

    - ``store``: an object with ``ingest_span(metrics: dict[str, float], dur_ms: float) ->
      int`` (the step the metrics landed on) and an ``open_step`` attribute (read when
      ``metrics=False``), or None (records then carry ``"_step": null``). A store that
      also has ``hold_spans(sink, max_seconds=, max_bytes=)`` (the ``HistoryStore``) gets
      each record with the metrics and the span's id, ``ingest_span(metrics, dur_ms,
      record, span_id) -> step | None``: a step means write the record now with it; None
      means the store holds it and hands it back to ``sink(step, records)`` once the
      ``log()`` that places the metrics fixes the step; with ``metrics=False`` records are
      written at once with the open step.
    - ``writer``: an object with ``append(line: bytes) -> bool | None`` (one record, no
      newline; ``False`` means it was dropped, e.g. past the writer's pending-byte bound) and
      ``flush()``, or None for no span file (``spans=False``). Optional: ``append_many``
      (a batch of lines) and ``append_deferred`` (an entry encoded when it is written; plain
      span records then go that way).
    - ``metrics``: False keeps every metric out of the store (``span_metrics=False``).
    - ``count``: also add ``count/<path>`` = 1 per span (``span_count=True``).
    - ``print_fn`` / ``plugins``: run-wide defaults for outermost spans (children inherit).
    - ``max_record_bytes`` (bytes): a longer record is dropped, counted in :meth:`stats` and
      warned about once; its metrics still aggregate. ``max_pending_bytes`` (bytes) is the
      bound ``expr_tracker.assemble.spans`` gives the writer; records the writer refuses are counted
      as ``dropped_pending``.
    - ``identity``: ``{"pid", "host", "stream", "rank"}``; ``pid`` is written in each record
      (default ``os.getpid()``), the rest is kept for :meth:`stats`.
    - ``owns_writer``: :meth:`close` also closes (drains) the writer.
    - ``warner``: the run's ``Warner`` (default: one of its own).

    Raises ``ValueError`` for non-positive byte limits. Methods raise ``ForkedRunError``
    when called in a forked child of the process that created the recorder.
    """

    def __init__(
        self,
        store: Any,
        writer: Any,
        *,
        metrics: bool = True,
        count: bool = False,
        print_fn: Callable[[str], Any] | None = None,
        plugins: Iterable[Any] = (),
        max_record_bytes: int = 8 << 20,
        max_pending_bytes: int = 64 << 20,
        identity: dict[str, Any] | None = None,
        owns_writer: bool = False,
        warner: Warner | None = None,
    ) -> None:
        if max_record_bytes <= 0 or max_pending_bytes <= 0:
            raise ValueError("max_record_bytes and max_pending_bytes must be positive byte counts")
        self._store = store
        self._writer = writer
        self._metrics = bool(metrics) and store is not None
        self._count = bool(count)
        self._print_fn = print_fn or None
        self._plugins = tuple(plugins or ())
        # no print_fn and no plugins: a span that sets neither inherits nothing (the fast
        # path of Span._start)
        self._plain_spans = self._print_fn is None and not self._plugins
        self._max_record = int(max_record_bytes)
        self._max_pending = int(max_pending_bytes)
        self.identity = dict(identity or {})
        self._pid = os.getpid()
        self._rec_pid = self.identity.get("pid") or self._pid
        self.identity.setdefault("pid", self._rec_pid)
        self._owns_writer = bool(owns_writer)
        self._append_many = getattr(writer, "append_many", None)
        # a writer that encodes queued entries itself when it writes (JsonlWriter): a step's
        # plain span records go to it as one entry, built and encoded on its thread
        self._append_deferred = getattr(writer, "append_deferred", None)
        self._closed = False
        # the store fixes each record's step at the log() that places its metrics
        self._hold = self._metrics and callable(getattr(store, "hold_spans", None))
        # bound once: the call every span makes (the fast path reads one attribute)
        self._ingest_span = store.ingest_span if self._metrics else None
        if self._hold and writer is not None:
            store.hold_spans(
                self._write_held,
                max_seconds=getattr(writer, "max_seconds", None),
                max_bytes=self._max_pending,
            )
        # a plain span (no plugin measurement, attribute, step= or error) costs one list
        # append when it ends: the store places a batch of them before it next reads or
        # changes its rows (store.attach_raw_spans), and the records are encoded then
        self._raw: Any = None  # the store's queue (a list), or None
        self._keys: dict[str, str] = {}  # path -> "time_ms/<path>"
        # whether the store sums time_ms (and count): then a batch's metrics go to it in
        # one dict, a repeated name's values added in order (_convert_raw); the store says
        self._sums = False
        if self._hold and callable(getattr(store, "attach_raw_spans", None)):
            kind = getattr(store, "span_aggregation", None)
            self._sums = callable(kind) and all(
                kind(name) == "sum" for name in (("time_ms", "count") if count else ("time_ms",))
            )
            self._raw = store.attach_raw_spans(self._convert_raw, self._write_raw)
            self._raw_waiting = store.raw_spans_waiting
            self._raw_pull = store.pull_raw_spans
        #: the queue a plain span appends itself to as it ends (``Span.__exit__``, which
        #: then calls neither :meth:`record` nor anything else here: ``(span, thread
        #: identity, task name)``, ``_raw_waiting()`` on an empty queue, ``_raw_pull()``
        #: at ``RAW_MAX``); None without one, and from :meth:`close` on
        self.raw_queue: Any = self._raw
        if self._raw is not None:
            _queued.add(self)  # a forked child lets go of the queue (_after_fork_in_child)
        self._lock = threading.Lock()  # counters only, never on the fast path
        self._dropped_oversize = 0
        self._dropped_pending = 0
        self._dropped_error = 0
        self._dropped_after_close = 0
        self._warner = warner if warner is not None else Warner(log)
        # wall-clock anchor: start = wall0 + (perf_ns - perf0) / 1e9 (one clock read per span)
        self._perf0 = time.perf_counter_ns()
        self._wall0 = time.time()

    # ------------------------------------------------------------------ fast path

    def record(self, span: Any, pm: dict[str, Any] | None = None) -> None:
        """Record one ended span; ``pm`` holds its plugin measurements (unprefixed keys).

        Called by the span itself, except a plain one while :attr:`raw_queue` is set
        (``Span.__exit__`` appends that one to the queue, as the first branch here would);
        sets ``span._pm`` to the normalised measurements.
        """
        # the hot path of every span: attributes and globals are read once into locals
        if self._closed:
            span._pm = pm
            self._after_close()
            return
        raw = self._raw
        if raw is not None and not pm and span.attrs is None and span.step is None:
            if span.error is None:
                try:
                    ident = thread_cache.identity
                except AttributeError:
                    ident = thread_identity()
                aio = _modules.get("asyncio")  # no asyncio imported: no task, and no call
                if not raw:
                    self._raw_waiting()
                raw.append((span, ident, task_name(aio) if aio is not None else None))
                if len(raw) >= RAW_MAX:
                    self._raw_pull()
                return
        path = span.path
        start_ns = span._start_ns
        dur_ms = (span._end_ns - start_ns) / 1e6
        if pm:
            pm = self._normalize_metrics(pm)
        span._pm = pm
        writer = self._writer
        item: Any = None  # the record: a dict, or bytes without "_step" when already encoded
        if writer is not None:
            parent = span.parent
            try:
                tid, tname, track = thread_cache.identity
            except AttributeError:
                tid, tname, track = thread_identity()
            item = {
                "_step": None,  # set when known: here, or at the log() that places the metrics
                "name": path,
                "depth": span.depth,
                "start": self._wall0 + (start_ns - self._perf0) / 1e9,
                "dur_ms": dur_ms,
                "id": span.id,
                "parent": parent.id if parent is not None else None,
                "pid": self._rec_pid,
                "tid": tid,
                "thread": tname,
                "track": track,
            }
            aio = _modules.get("asyncio")  # no asyncio imported: no task, and no call
            if aio is not None:
                task = task_name(aio)  # only inside a running event loop
                if task is not None:
                    item["task"] = task
                    item["track"] = track_name(tname, tid, task)
            if span.attrs or span.step is not None or pm or span.error:
                # encoded now: attribute values are the user's objects and may change later
                item = self._encode_full(item, span, span.attrs, pm)[_NULL_STEP:]
                if not self._fits(len(item) + _STEP_ROOM, path):  # with the longest step
                    item = None
        if self._metrics:
            m = {"time_ms/" + path: dur_ms}
            if self._count:
                m["count/" + path] = 1
            if pm:
                for k, v in pm.items():
                    m[k + "/" + path] = v
            if self._hold:
                # the span's id tells the store whether a log() came while it ran
                step = self._ingest_span(m, dur_ms, item, span.id)
                if step is None:  # held: written with its step by the log() that places it
                    return
            else:
                step = self._ingest_span(m, dur_ms)
        else:
            store = self._store
            step = store.open_step if store is not None else None
        if item is None:
            return
        if type(item) is dict:
            item["_step"] = step
            line = _dumps(item)
            if len(line) > self._max_record and not self._fits(len(line), path):
                return
        else:
            line = (b'{"_step":%d,' % step if type(step) is int else b'{"_step":null,') + item
        if writer.append(line) is False:
            self._refused()

    def _convert_raw(
        self, batch: list[Any], full: bool = False, start: dict[str, Any] | None = None
    ) -> tuple[list[Any] | None, Any, int, list[Any] | None]:
        """Plain spans, each entry ``(span, thread identity, task name)``, in order, as the
        store places them (``HistoryStore.attach_raw_spans``): ``(metrics, dur_ms, record,
        span id)`` each, what :meth:`record` would have handed to ``ingest_span`` one by
        one (None when the merged metrics are given: the store asks again with ``full``
        when it needs them); all the metrics in one dict, as placing them one by one in
        ``start`` (None: an empty row) leaves them when the store sums ``time_ms`` and
        ``count`` (the store says so: ``span_aggregation``): a key's first value as it is
        (or added to its number in ``start``), each later one added to the sum, in the
        order the spans ended (the same floats); else, or with ``full``, None; the
        smallest span id; the records, one per entry (None without a span file). A span's
        record is ``(fields, thread identity, task name)``, its fields a tuple of plain
        values (``(path, depth, start ns, end ns, id, parent id)``), encoded when its step
        is known (:meth:`_raw_lines`): a record waiting for its step or for the writer holds
        no span, so the ended span is freed at once instead of living on in the cyclic
        garbage collector's generations (docs/spans.md "Cost")."""
        keys = self._keys
        count = self._count
        recs: list[Any] | None = [] if self._writer is not None else None
        first = 1 << 62
        if self._sums and not full:
            merged: dict[str, Any] = {}
            if start is None and not count:  # the common case, on its own: a test less
                for span, ident, task in batch:
                    path = span.path
                    try:
                        key = keys[path]
                    except KeyError:
                        if len(keys) >= 65536:  # unique span names cannot grow it without limit
                            keys.clear()
                        key = keys[path] = "time_ms/" + path
                    sid = span.id
                    if sid < first:
                        first = sid
                    start_ns = span._start_ns
                    end_ns = span._end_ns
                    if key in merged:  # a repeated name: added in order, as place() adds
                        merged[key] += (end_ns - start_ns) / 1e6
                    else:
                        merged[key] = (end_ns - start_ns) / 1e6
                    if recs is not None:
                        parent = span.parent
                        recs.append(
                            (
                                (
                                    path,
                                    span.depth,
                                    start_ns,
                                    end_ns,
                                    sid,
                                    None if parent is None else parent.id,
                                ),
                                ident,
                                task,
                            )
                        )
                return None, merged, first, recs
            start = start or {}
            for entry in batch:  # the same, with count/ and the pending row's sums
                span = entry[0]
                path = span.path
                try:
                    key = keys[path]
                except KeyError:
                    if len(keys) >= 65536:
                        keys.clear()
                    key = keys[path] = "time_ms/" + path
                sid = span.id
                if sid < first:
                    first = sid
                dur_ms = (span._end_ns - span._start_ns) / 1e6
                if recs is not None:
                    recs.append(_record_of(entry))
                if key in merged:
                    merged[key] += dur_ms
                    if count:
                        merged["count/" + path] += 1
                    continue
                s = start.get(key)  # the sums go on from the pending row's numbers
                merged[key] = dur_ms if s is None else s + dur_ms
                if count:
                    ckey = "count/" + path
                    s = start.get(ckey)
                    merged[ckey] = 1 if s is None else s + 1
            return None, merged, first, recs
        out = []
        add = out.append
        for entry in batch:
            span = entry[0]
            path = span.path
            dur_ms = (span._end_ns - span._start_ns) / 1e6
            m = {keys.get(path) or "time_ms/" + path: dur_ms}
            if count:
                m["count/" + path] = 1
            sid = span.id
            if sid < first:
                first = sid
            record = None
            if recs is not None:
                record = _record_of(entry)
                recs.append(record)
            add((m, dur_ms, record, sid))
        return out, None, first, recs

    def _raw_lines(self, step: Any, entries: Iterable[Any]) -> list[bytes | None]:
        """The lines of plain span records (``(fields, thread identity, task)``, see
        :meth:`_convert_raw`) at ``step``, one per record: the dict :meth:`record` builds,
        encoded by orjson (a template with the numbers encoded apart measured slower). None
        for a line over ``max_record_bytes`` (dropped, counted)."""
        wall0 = self._wall0
        perf0 = self._perf0
        pid = self._rec_pid
        limit = self._max_record
        out: list[bytes | None] = []
        add = out.append
        for (path, depth, start_ns, end_ns, sid, parent), (tid, tname, track), task in entries:
            item = {
                "_step": step,
                "name": path,
                "depth": depth,
                "start": wall0 + (start_ns - perf0) / 1e9,
                "dur_ms": (end_ns - start_ns) / 1e6,
                "id": sid,
                "parent": parent,
                "pid": pid,
                "tid": tid,
                "thread": tname,
                "track": track,
            }
            if task is not None:
                item["task"] = task
                item["track"] = track_name(tname, tid, task)
            line = _dumps(item)
            add(line if len(line) <= limit or self._fits(len(line), path) else None)
        return out

    def _fits(self, size: int, path: str) -> bool:
        """False (the record dropped, counted, warned once) when ``size`` bytes are over
        ``max_record_bytes``."""
        if size <= self._max_record:
            return True
        self._drop(
            "oversize",
            "expr_tracker: span record for %r is %d bytes, over max_record_bytes=%d; "
            "dropped (its timing metrics still aggregate). Warned once; see stats().",
            path,
            size,
            self._max_record,
        )
        return False

    def _write_held(self, step: Any, items: Iterable[Any]) -> None:
        """Write records now that their row's step is known (also the store's span sink).

        ``items`` are record dicts (encoded here) or encoded records without their
        ``_step`` (see ``record``), each of them for ``step``; or ``(step, record)`` pairs,
        a record whose step was fixed when its span ended (held behind earlier records to
        keep the file's order)."""
        writer = self._writer
        if writer is None:
            return
        if type(items) is not list:
            items = list(items)
        for item in items:
            if type(item) is not tuple or len(item) != 3:
                break
        else:  # every record a plain span (see _convert_raw): the common case
            self._write_raw(step, items)
            return
        limit = self._max_record
        head = None
        raws = [item for item in items if type(item) is tuple and len(item) == 3]
        it = iter(self._raw_lines(step, raws)) if raws else None
        out: list[bytes] = []
        for item in items:
            if type(item) is tuple and len(item) == 3:  # a plain span (see _convert_raw)
                line = next(it)  # type: ignore[call-overload]
                if line is None:
                    continue
            elif type(item) is dict:
                item["_step"] = step
                line = _dumps(item)
                if len(line) > limit and not self._fits(len(line), item["name"]):
                    continue
            elif type(item) is bytes:
                if head is None:
                    head = b'{"_step":%d,' % step if type(step) is int else b'{"_step":null,'
                line = head + item
            else:  # (step, record): a step fixed when its span ended (rare: not per item)
                line = self._line_at(*item)
                if line is None:
                    continue
            out.append(line)
        self._append_lines(writer, out)

    def _write_raw(
        self, step: Any, entries: list[Any], done: Callable[[], Any] | None = None
    ) -> None:
        """Write plain spans' records (``(span, thread identity, task)`` entries, see
        :meth:`_convert_raw`) at ``step``: to a writer that encodes when it writes
        (``append_deferred``) as one entry, else encoded now. ``done()``, when given, is
        called once they are queued (the store's raw queue lets go of them:
        ``HistoryStore.attach_raw_spans``), before this returns."""
        deferred = self._append_deferred
        if deferred is not None:  # encoded when the writer writes them, off this thread
            refused = deferred(_PlainRecords(self, step, entries)) is False
        else:
            refused = False
            writer = self._writer
            if writer is not None:
                lines = self._raw_lines(step, entries)
                if None in lines:
                    lines = [line for line in lines if line is not None]
                many = self._append_many
                if many is None:
                    self._append_lines(writer, lines)
                else:
                    for _ in range(many(lines)):  # refused: counted
                        self._refused()
        if done is not None:
            done()
        if refused:
            for _ in entries:  # counted
                self._refused()

    def _append_lines(self, writer: Any, lines: list[bytes]) -> None:
        """Queue ``lines`` in one call where the writer takes a batch; count refusals."""
        many = self._append_many
        if many is not None:
            refused = many(lines)
        else:
            append = writer.append
            refused = sum(append(line) is False for line in lines)
        for _ in range(refused):
            self._refused()

    def _line_at(self, step: Any, item: Any) -> bytes | None:
        """One record (a dict, or encoded bytes without ``_step``) as its line at ``step``;
        None when it is over ``max_record_bytes`` (dropped, counted)."""
        if type(item) is tuple:  # a plain span (see _place_raw)
            return self._raw_lines(step, (item,))[0]
        if type(item) is dict:
            item["_step"] = step
            line = _dumps(item)
            if len(line) > self._max_record and not self._fits(len(line), item["name"]):
                return None
            return line
        return (b'{"_step":%d,' % step if type(step) is int else b'{"_step":null,') + item

    def _refused(self) -> None:
        """The writer refused a record: closed meanwhile, or past its pending-byte bound."""
        if self._closed:  # closed while this span was being recorded
            self._after_close()
            return
        with self._lock:  # the writer's max_pending_bytes (it warns once)
            self._dropped_pending += 1

    # ------------------------------------------------------------------ slow path

    def _normalize_metrics(self, pm: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for k, v in pm.items():
            out[k] = v if type(v) in _NUMBER else normalize_value(v, self._warner)
        return out

    def _encode_full(
        self, rec: dict[str, Any], span: Any, attrs: dict[str, Any] | None, pm: Any
    ) -> bytes:
        nonfinite = False
        if attrs or span.step is not None:
            args = {str(k): normalize_value(v, self._warner) for k, v in (attrs or {}).items()}
            if span.step is not None:
                args["step"] = normalize_value(span.step, self._warner)
            rec["args"] = args
            nonfinite = has_nonfinite(args)
        if pm:
            rec["metrics"] = pm
            nonfinite = nonfinite or has_nonfinite(pm)
        if span.error:
            rec["error"] = span.error
        return encode_row(rec, nonfinite)

    def _after_close(self) -> None:
        """A span that ended after this recorder closed: timed, printed, not recorded."""
        with self._lock:
            self._dropped_after_close += 1
            first = self._dropped_after_close == 1
        if first:
            log.info(
                "expr_tracker: a span ended after the run finished; it was timed but not "
                "recorded (counted in stats as dropped_after_close; logged once)"
            )

    def _drop(self, kind: str, message: str, *args: Any) -> None:
        with self._lock:
            if kind == "oversize":
                self._dropped_oversize += 1
            else:
                self._dropped_pending += 1
        self._warner.warn(("drop", kind), message, *args)

    # ------------------------------------------------------------------ control

    def _check_fork(self) -> None:
        if self._pid != os.getpid():
            raise ForkedRunError(
                "this SpanRecorder belongs to the parent process; create a new run in the "
                "forked child"
            )

    @property
    def writer(self) -> Any:
        """The span file's writer (a :class:`~expr_tracker.history.writer.JsonlWriter`, or
        whatever object was given), None when spans are not written."""
        return self._writer

    def stats(self) -> dict[str, Any]:
        """Counters: ``dropped`` (total), ``dropped_oversize``, ``dropped_pending``,
        ``dropped_after_close`` (spans that ended after :meth:`close`), ``held`` (records
        waiting for the ``log()`` that fixes their step), and the settings in effect
        (``metrics``, ``count``, ``max_record_bytes``, ``max_pending_bytes``, ``spans_file``
        whether a writer is attached, ``closed``)."""
        self._check_fork()
        with self._lock:
            over, pend = self._dropped_oversize, self._dropped_pending
            late = self._dropped_after_close
        out = {
            "dropped": over + pend + late,
            "dropped_oversize": over,
            "dropped_pending": pend,
            "dropped_after_close": late,
            "held": self._store.held_span_records if self._hold else 0,
            "metrics": self._metrics,
            "count": self._count,
            "spans_file": self._writer is not None,
            "max_record_bytes": self._max_record,
            "max_pending_bytes": self._max_pending,
            "closed": self._closed,
        }
        if self._writer is not None and hasattr(self._writer, "stats"):
            try:
                out["writer"] = self._writer.stats()
            except Exception:  # noqa: BLE001
                pass
        return out

    def flush(self) -> None:
        """Write every completed span record now and wait (the open metric row stays open).

        Records still waiting for the ``log()`` that fixes their step are placed in the
        open row first (``store.fold_spans()``), so they can be written.
        """
        self._check_fork()
        self._fold()
        if self._writer is not None:
            self._writer.flush()

    def _fold(self) -> None:
        if self._hold and self._writer is not None:
            self._store.fold_spans()

    def close(self) -> dict[str, Any]:
        """Stop accepting spans (later ones only time and print) and stop being the active
        recorder. Records still waiting for their step are placed in the store's open row
        and written; then the writer is closed (drained) when it owns it (``owns_writer``); never the store. Returns :meth:`stats`."""
        self._check_fork()
        self.raw_queue = None  # spans that end from now on take record(): counted, dropped
        self._closed = True
        if core.get_active_recorder() is self:
            core.set_active_recorder(None)
        try:
            self._fold()  # held records reach the writer before it closes
        except Exception:  # noqa: BLE001 - closing must complete
            log.exception("expr_tracker: placing pending span records failed")
        if self._owns_writer and self._writer is not None:
            self._writer.close()
        return self.stats()


# ---------------------------------------------------------------------- from the run spec

#: ``spans.plugins[].type`` -> factory (``options`` are its keyword arguments)
PLUGIN_TYPES: dict[str, Callable[..., Any]] = {}


def _plugin_types() -> dict[str, Callable[..., Any]]:
    if not PLUGIN_TYPES:
        from expr_tracker.spans.plugins import CpuTime, GpuStats, TorchMemory

        for cls, snake in (
            (CpuTime, "cpu_time"),
            (TorchMemory, "torch_memory"),
            (GpuStats, "gpu_stats"),
        ):
            PLUGIN_TYPES[snake] = cls
            PLUGIN_TYPES[cls.__name__] = cls
    return PLUGIN_TYPES


def plugin_problems(entries: Iterable[Any]) -> list[dict[str, Any]]:
    """Every problem of the ``{type, options}`` entries of ``spans.plugins``, found by
    constructing each plugin as the run would (the built-in constructors have no side
    effect; objects and callables are not checked). Each problem is a dict: ``index``,
    ``field`` (``type``, ``options`` or ``options.<name>``), ``message``, ``value`` (absent
    when there is none to show) and ``suggestion`` (or None)."""
    import difflib
    import inspect

    from expr_tracker.spans.plugins import PluginOptionError

    types = _plugin_types()
    valid_types = sorted(k for k in types if k.islower())
    out: list[dict[str, Any]] = []
    for i, e in enumerate(entries or ()):
        kind, options = _entry(e)
        if kind is None:
            continue
        factory = types.get(kind)
        if factory is None:
            close = difflib.get_close_matches(str(kind), valid_types, n=1)
            out.append(
                {
                    "index": i,
                    "field": "type",
                    "message": f"unknown plugin; valid: {', '.join(valid_types)}",
                    "value": kind,
                    "suggestion": f"did you mean `{close[0]}`?" if close else None,
                }
            )
            continue
        if not isinstance(options, Mapping):
            out.append(
                {"index": i, "field": "options", "message": "must be a mapping", "value": options}
            )
            continue
        try:
            params = inspect.signature(factory).parameters
        except (TypeError, ValueError):
            params = None
        if params is not None and not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            names = sorted(n for n in params if n != "self")
            unknown = [k for k in options if k not in params]
            for key in unknown:
                close = difflib.get_close_matches(str(key), names, n=1)
                out.append(
                    {
                        "index": i,
                        "field": f"options.{key}",
                        "message": f"unknown option of {kind} (valid: {', '.join(names) or 'none'})",
                        "suggestion": f"did you mean `{close[0]}`?" if close else None,
                    }
                )
            if unknown:
                continue
        try:
            factory(**options)
        except PluginOptionError as exc:
            out.append(
                {
                    "index": i,
                    "field": f"options.{exc.option}",
                    "message": exc.problem,
                    "value": exc.value,
                }
            )
        except (TypeError, ValueError) as exc:
            out.append({"index": i, "field": "options", "message": str(exc)})
    return out


def _entry(e: Any) -> tuple[Any, Any]:
    """``(type, options)`` of a plugin entry; type None for a plugin object or callable."""
    if isinstance(e, Mapping) and "type" in e:
        return e["type"], e.get("options") or {}
    if callable(e):
        return None, None
    return getattr(e, "type", None), getattr(e, "options", None) or {}


def resolve_plugins(entries: Iterable[Any]) -> list[Any]:
    """Plugin objects from ``spans.plugins``: ``{type, options}`` entries are constructed
    (types: ``cpu_time``, ``torch_memory``, ``gpu_stats`` or the class names); objects and
    callables pass through. Raises ``ValueError`` naming the first bad entry (an unknown
    type, an unknown option, an option of the wrong type); ``assemble.check`` reports every
    one as a ``SpecError`` first (``plugin_problems``)."""
    entries = list(entries or ())
    if not entries:  # the usual start: spans/plugins.py is not imported
        return []
    problems = plugin_problems(entries)
    if problems:
        p = problems[0]
        raise ValueError(f"spans.plugins[{p['index']}].{p['field']}: {p['message']}")
    types = _plugin_types()
    out = []
    for e in entries:
        kind, options = _entry(e)
        out.append(e if kind is None else types[kind](**options))
    return out


def resolve_print(value: Any) -> Callable[[str], Any] | None:
    """``spans.print`` -> a callable: None/False off; True or ``"stdout"`` print;
    ``"stderr"``; ``"logging"`` (logger ``expr_tracker.spans``, INFO); ``"logger:<name>"``;
    a callable as given. Raises ``ValueError`` for anything else."""
    if value is None or value is False:
        return None
    if callable(value):
        return value
    if value is True or value == "stdout":
        return print
    if value == "stderr":
        return lambda line: print(line, file=sys.stderr)
    if value == "logging":
        return logging.getLogger("expr_tracker.spans").info
    if isinstance(value, str) and value.startswith("logger:") and len(value) > 7:
        return logging.getLogger(value[7:]).info
    raise ValueError(
        f"spans.print: {value!r} is not null, a bool, stdout, stderr, logging, "
        "logger:<name> or a callable"
    )
