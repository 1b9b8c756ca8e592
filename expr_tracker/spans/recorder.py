"""SpanRecorder: turns each ended span into metrics for the store and a span-file record.

"When" is decided here and "where" elsewhere: the recorder builds ``time_ms/<path>`` (and
``count/<path>``) plus ``<key>/<path>`` for each plugin measurement, hands them to
``store.ingest_span(metrics, dur_ms) -> step`` (the store aggregates: sum / max /
duration-weighted mean, and resets on commit), and enqueues one encoded record with
``writer.append(line_bytes)``. It never writes a file itself.

Record format (one JSON line of ``spans[.S][.rankN].jsonl``; see docs/architecture.md)::

    {"_step": 42, "name": "forward/attention", "depth": 1, "start": 1754323200.123456,
     "dur_ms": 18.4, "id": 7, "parent": 6, "pid": 4242, "tid": 4242, "thread": "MainThread",
     "task"?: "Task-3", "args"?: {...}, "metrics"?: {...}, "error"?: "ValueError"}
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from expr_tracker.errors import ForkedRunError
from expr_tracker.spans import core
from expr_tracker.spans._codec import Warner, encode_row, has_nonfinite, normalize_value

log = logging.getLogger("expr_tracker.spans")

_dumps = orjson.dumps
_tl = threading.local()
_modules = sys.modules
_NUMBER = (float, int)


def _thread_identity() -> tuple[int, str]:
    # cached per thread: (native thread id, name at the thread's first span)
    v = _tl.v = (threading.get_native_id(), threading.current_thread().name)
    return v


def _task_name() -> str | None:
    aio = _modules.get("asyncio")
    if aio is None:
        return None
    loop = aio._get_running_loop()
    if loop is None:
        return None
    task = aio.current_task(loop)
    return task.get_name() if task is not None else None


class SpanRecorder:
    """Receives every span that ends while it is the active recorder.

    - ``store``: an object with ``ingest_span(metrics: dict[str, float], dur_ms: float) ->
      int`` (the step the metrics landed on) and a ``current_step`` attribute (read when
      ``metrics=False``), or None (records then carry ``"_step": null``).
    - ``writer``: an object with ``append(line: bytes)`` (one record, no newline) and
      optionally ``pending_bytes`` (queued plus in-flight bytes), or None for no span file
      (``spans=False``).
    - ``metrics``: False keeps every metric out of the store (``span_metrics=False``).
    - ``count``: also add ``count/<path>`` = 1 per span (``span_count=True``).
    - ``print_fn`` / ``plugins``: run-wide defaults for outermost spans (children inherit).
    - ``max_record_bytes`` / ``max_pending_bytes`` (bytes): a record longer than the first,
      or one that would take the writer's ``pending_bytes`` past the second, is dropped,
      counted in :meth:`stats` and warned about once; its metrics still aggregate.
    - ``identity``: ``{"pid", "host", "stream", "rank"}``; ``pid`` is written in each record
      (default ``os.getpid()``), the rest is kept for :meth:`stats`.

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
    ) -> None:
        if max_record_bytes <= 0 or max_pending_bytes <= 0:
            raise ValueError("max_record_bytes and max_pending_bytes must be positive byte counts")
        self._store = store
        self._writer = writer
        self._metrics = bool(metrics) and store is not None
        self._count = bool(count)
        self._print_fn = print_fn or None
        self._plugins = tuple(plugins or ())
        self._max_record = int(max_record_bytes)
        self._max_pending = int(max_pending_bytes)
        self.identity = dict(identity or {})
        self._pid = os.getpid()
        self._rec_pid = self.identity.get("pid") or self._pid
        self.identity.setdefault("pid", self._rec_pid)
        self._has_pending = writer is not None and hasattr(writer, "pending_bytes")
        self._closed = False
        self._lock = threading.Lock()  # counters only, never on the fast path
        self._dropped_oversize = 0
        self._dropped_pending = 0
        self._dropped_error = 0
        self._warner = Warner(log)
        # wall-clock anchor: start = wall0 + (perf_ns - perf0) / 1e9 (one clock read per span)
        self._perf0 = time.perf_counter_ns()
        self._wall0 = time.time()

    # ------------------------------------------------------------------ fast path

    def record(self, span: Any, pm: dict[str, Any] | None = None) -> None:
        """Record one ended span; ``pm`` holds its plugin measurements (unprefixed keys).

        Called by the span itself; sets ``span._pm`` to the normalised measurements.
        """
        if self._closed:
            span._pm = pm
            return
        path = span.path
        dur_ms = (span._end_ns - span._start_ns) / 1e6
        if pm:
            pm = self._normalize_metrics(pm)
        span._pm = pm
        store = self._store
        if self._metrics:
            m = {"time_ms/" + path: dur_ms}
            if self._count:
                m["count/" + path] = 1
            if pm:
                for k, v in pm.items():
                    m[k + "/" + path] = v
            step = store.ingest_span(m, dur_ms)
        elif store is not None:
            step = getattr(store, "current_step", None)
        else:
            step = None
        writer = self._writer
        if writer is None:
            return
        parent = span.parent
        try:
            tid, tname = _tl.v
        except AttributeError:
            tid, tname = _thread_identity()
        rec = {
            "_step": step,
            "name": path,
            "depth": span.depth,
            "start": self._wall0 + (span._start_ns - self._perf0) / 1e9,
            "dur_ms": dur_ms,
            "id": span.id,
            "parent": parent.id if parent is not None else None,
            "pid": self._rec_pid,
            "tid": tid,
            "thread": tname,
        }
        task = _task_name()
        if task is not None:
            rec["task"] = task
        attrs = span.attrs
        if attrs or span.step is not None or pm or span.error:
            line = self._encode_full(rec, span, attrs, pm)
        else:
            line = _dumps(rec)
        n = len(line)
        if n > self._max_record:
            self._drop(
                "oversize",
                "expr_tracker: span record for %r is %d bytes, over max_record_bytes=%d; "
                "dropped (its timing metrics still aggregate). Warned once; see stats().",
                path,
                n,
                self._max_record,
            )
            return
        if self._has_pending and writer.pending_bytes + n > self._max_pending:
            pending = writer.pending_bytes
            self._drop(
                "pending",
                "expr_tracker: span writer holds %d bytes, max_pending_bytes=%d; dropping "
                "span records until it drains. Warned once; see stats().",
                pending,
                self._max_pending,
            )
            return
        writer.append(line)

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

    def _drop(self, kind: str, message: str, *args: Any) -> None:
        with self._lock:
            if kind == "oversize":
                self._dropped_oversize += 1
            else:
                self._dropped_pending += 1
        self._warner.warn(("drop", kind), message, *args)

    # ------------------------------------------------------------------ control

    def _check_fork(self) -> None:
        if self._pid != core._PID:
            raise ForkedRunError(
                "this SpanRecorder belongs to the parent process; create a new run in the "
                "forked child"
            )

    def stats(self) -> dict[str, Any]:
        """Counters: ``dropped`` (total), ``dropped_oversize``, ``dropped_pending``, and the
        settings in effect (``metrics``, ``count``, ``max_record_bytes``, ``max_pending_bytes``,
        ``spans_file`` whether a writer is attached, ``closed``)."""
        self._check_fork()
        with self._lock:
            over, pend = self._dropped_oversize, self._dropped_pending
        return {
            "dropped": over + pend,
            "dropped_oversize": over,
            "dropped_pending": pend,
            "metrics": self._metrics,
            "count": self._count,
            "spans_file": self._writer is not None,
            "max_record_bytes": self._max_record,
            "max_pending_bytes": self._max_pending,
            "closed": self._closed,
        }

    def close(self) -> dict[str, Any]:
        """Stop accepting spans (later ones only time and print) and stop being the active
        recorder. Does not close the store or the writer: the run owns and drains them.
        Returns :meth:`stats`."""
        self._check_fork()
        self._closed = True
        if core._active is self:
            core.set_active_recorder(None)
        return self.stats()
