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
from expr_tracker.history.cache import RowCache
from expr_tracker.history.codec import (
    Warner,
    _has_nonfinite,
    decode_line,
    encode_row,
    normalize_value,
)
from expr_tracker.history.reader import iter_lines_backward, iter_rows, merge_by_step
from expr_tracker.history.writer import BackgroundFlusher, JsonlWriter, get_flusher

log = logging.getLogger("expr_tracker")

RESERVED = frozenset({"_step", "_time"})

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


def aggregation_of(key: str) -> int:
    """The aggregation of a span metric key ``<measurement>/<path>`` (SUM for unknown)."""
    return AGGREGATION.get(key.split("/", 1)[0], SUM)


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
        self._written_open: dict[str, Any] | None = None  # what a timeout wrote for this step
        self._gen = 0
        self._touched = 0.0
        self._timer_armed = False
        self._closed = False
        self.sinks: list[Callable[[dict[str, Any]], Any]] = []
        self._fanq: deque[dict[str, Any]] = deque()
        self._fan_lock = threading.Lock()
        self.last_row: dict[str, Any] | None = None
        # counters
        self.rows_committed = 0
        self.patch_rows = 0
        self.queries = 0
        self.disk_queries = 0
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
        if step is not None and (type(step) is not int or step < 0):
            step = self._coerce_step(step)
            if step is None:
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
                if commit is None:
                    commit = False
            elif commit is None:
                commit = True
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
        if committed is not None and self.sinks:
            if type(committed) is tuple:
                self._fanq.extend(committed)
            else:
                self._fanq.append(committed)
            self._drain()
        return landed

    def _coerce_step(self, step: Any) -> int | None:
        if isinstance(step, bool):
            ok = False
        else:
            try:
                ok = int(step) == step
            except (TypeError, ValueError, OverflowError):
                ok = False
        if not ok or int(step) < 0:
            self._drop(
                "bad_step",
                "expr_tracker: log(step=%r) is not a non-negative integer; the call was dropped",
                step,
            )
            return None
        return int(step)

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
            elif t is not int and t is not str and t is not bool and v is not None:
                v = normalize_value(v, self.warner)
                if _has_nonfinite(v):
                    self._open_nonfinite = True
            if k in open_row:
                self.warner.warn(
                    ("last_wins", k),
                    "expr_tracker: %r was logged twice for one step; the last value wins "
                    "(warned once per key)",
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

    def ingest_span(self, metrics: dict[str, Any], dur_ms: float) -> int:
        """Accumulate span/plugin metrics into the open row; returns the step they landed on.

        Aggregation by measurement name (spec spans.txt "Repeated plugin measurements"): sum
        (``time_ms``, ``cpu_time_ms``, ``gpu_mem_delta_mb``, ``count`` and unknown names),
        maximum (``gpu_mem_peak_mb``, ``gpu_mem_used_mb``), duration-weighted mean
        (``cpu_percent``, ``gpu_percent``). A span never commits a step.
        """
        if self._fork_gen != _FORK_GEN:
            raise ForkedRunError(FORK_MESSAGE)
        with self._lock:
            if self._closed:
                return -1
            open_row = self._open
            for k, v in metrics.items():
                cur = open_row.get(k)
                tv = type(v)
                if tv is not float and tv is not int:
                    open_row[k] = v
                    self._agg.pop(k, None)
                    continue
                if v - v != 0:
                    self._open_nonfinite = True
                kind = AGGREGATION.get(k.split("/", 1)[0], SUM)
                if kind == MEAN:
                    a = self._agg.get(k)
                    if a is None or type(cur) not in _NUMERIC:
                        a = self._agg[k] = [0.0, 0.0]
                    if dur_ms > 0:
                        a[0] += v * dur_ms
                        a[1] += dur_ms
                        open_row[k] = a[0] / a[1]
                    elif a[1] == 0:
                        open_row[k] = v
                elif cur is None or type(cur) not in _NUMERIC or type(cur) is bool:
                    open_row[k] = v
                elif kind == SUM:
                    open_row[k] = cur + v
                elif v > cur or cur != cur:
                    open_row[k] = v
            if self.max_open_seconds is not None:
                self._touch()
            return self.open_step

    # ------------------------------------------------------------------ commit

    def _commit_locked(self) -> dict[str, Any]:
        row = self._open
        step = self.open_step
        row["_step"] = step
        row["_time"] = self._wall()
        written = self._written_open
        if written is not None:
            patch = _changed(row, written)
            if patch is not None:
                self._append_locked(encode_row(patch, self._open_nonfinite), step)
                self.patch_rows += 1
                if self.writer is not None:
                    self.writer.mark_duplicate_steps()
            self._written_open = None
        else:
            self._append_locked(encode_row(row, self._open_nonfinite), step)
        self._open = {}
        self._open_nonfinite = False
        if self._agg:
            self._agg = {}
        self._gen += 1
        self.open_step = step + 1
        self.rows_committed += 1
        self.last_row = row
        return row

    def _append_locked(self, line: bytes, step: int) -> None:
        cache = self.cache
        cache.append(line, step)
        w = self.writer
        if w is not None:
            w.append(line, step)
            if cache.nbytes > cache.max_bytes or cache.nrows > cache.max_rows:
                self._evict_locked()
        elif cache.nbytes > cache.max_bytes or cache.nrows > cache.max_rows:
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
            self.writer.flush()  # over budget with rows not on disk: flush first, then evict
            flushed = self._flushed_ordinal()
        cache.evict(flushed)

    def commit(self) -> dict[str, Any] | None:
        """Commit the open row if it holds data (``finish`` and ``flush`` use this)."""
        self._check_fork()
        with self._lock:
            if not self._open:
                return None
            row = self._commit_locked()
        if self.sinks:
            self._fanq.append(row)
            self._drain()
        return row

    def _drain(self) -> None:
        q = self._fanq
        while q:
            if not self._fan_lock.acquire(blocking=False):
                return  # another thread is fanning out; it picks our rows up in order
            try:
                while q:
                    row = q.popleft()
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
            finally:
                self._fan_lock.release()

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

    def _write_open_locked(self) -> None:
        row = dict(self._open)
        written = self._written_open
        row["_step"] = self.open_step
        row["_time"] = self._wall()
        if written is not None:
            part = _changed(row, written)
            if part is None:
                return
            self._append_locked(encode_row(part, self._open_nonfinite), self.open_step)
            self.patch_rows += 1
            if self.writer is not None:
                self.writer.mark_duplicate_steps()
        else:
            self._append_locked(encode_row(row, self._open_nonfinite), self.open_step)
        self._written_open = row

    def write_open_row(self) -> bool:
        """Write the open row to disk now, without committing it (what the timer does)."""
        with self._lock:
            if not self._open:
                return False
            self._write_open_locked()
            return True

    # ------------------------------------------------------------------ queries

    def open_row(self) -> dict[str, Any] | None:
        """A copy of the open row with its ``_step`` (None when it holds nothing)."""
        with self._lock:
            if not self._open:
                return None
            row = dict(self._open)
            row["_step"] = self.open_step
            return row

    def tail(self, n: int | None = 50, include_open: bool = True) -> list[dict[str, Any]]:
        """The newest ``n`` steps (``None``/``-1``: all), oldest first, as new dicts.

        Rows of one step are merged (later lines win per key); the open row counts as the
        newest step when ``include_open``. Reads the file only for steps older than the cache.
        """
        self._check_fork()
        if n is not None and n < 0:
            n = None
        with self._lock:
            self.queries += 1
            openrow = None
            if include_open and self._open:
                openrow = dict(self._open)
                openrow["_step"] = self.open_step
            want = None if n is None else (n - 1 if openrow is not None else n)
            if want is None:
                lines, _steps = self._all_cached_lines()
                complete = False
            elif want <= 0:
                lines, complete = [], True
            else:
                lines, _steps, complete = self.cache.tail_lines(want)
            provisional = self.open_step if self._written_open is not None else None
            first = self.cache.first_ordinal
            disk_before = first if not complete and first > 0 else 0
        rows = [decode_line(x) for x in lines]
        if disk_before:
            self.disk_queries += 1
            rows = self._disk_rows_before(disk_before, want) + rows
        if openrow is not None:
            rows.append(openrow)
        merged = merge_by_step(rows)
        if not include_open and provisional is not None:
            # the open step was written early (max_open_seconds) but is not committed
            merged = [r for r in merged if r.get("_step") != provisional]
        if n is not None and len(merged) > n:
            merged = merged[-n:]
        return merged

    def _all_cached_lines(self) -> tuple[list[bytes], list[int]]:
        lines = []
        steps = []
        for _o, s, line in self.cache.iter_forward():
            lines.append(line)
            steps.append(s)
        return lines, steps

    def _disk_rows_before(self, ordinal: int, want: int | None) -> list[dict[str, Any]]:
        """Rows of the file before line ``ordinal`` (the newest ``want``+1 steps or all)."""
        w = self.writer
        if w is None:
            return []
        path = w.path
        if not path.exists():
            return []
        from expr_tracker.history.reader import offset_of_line

        if w.dropped:  # line numbers no longer equal ordinals: address by what is on disk
            end = None
        else:
            end = offset_of_line(path, ordinal, w.index)
        if want is None:
            return list(iter_rows(path, end))
        out: list[dict[str, Any]] = []
        seen = 0
        last = None
        for raw in iter_lines_backward(path, end):
            try:
                rec = decode_line(raw)
            except ValueError:
                continue
            if not isinstance(rec, dict):
                continue
            s = rec.get("_step")
            if s != last:
                seen += 1
                if seen > want + 1:
                    break
                last = s
            out.append(rec)
        out.reverse()
        return out

    # ------------------------------------------------------------------ lifecycle

    def flush(self) -> None:
        """Write every committed row to disk and wait (the open row stays open)."""
        self._check_fork()
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> dict[str, Any] | None:
        """Commit the open row (if it holds data), flush and close the writer."""
        row = self.commit()
        with self._lock:
            self._closed = True
        if self.writer is not None:
            self.writer.close()
        (self._flusher or get_flusher()).cancel(("open", id(self)))
        return row

    def stats(self) -> dict[str, Any]:
        """Counters for ``et.info()`` (spec design.txt B.2)."""
        c = self.cache
        w = self.writer
        out = {
            "open_step": self.open_step,
            "rows_logged": self.rows_committed,
            "patch_rows": self.patch_rows,
            "rows_on_disk": w.lines if w is not None else 0,
            "disk_prefix_rows": self.disk_prefix_rows,
            "cached_rows": c.nrows,
            "cached_bytes": c.nbytes,
            "cache_limit_bytes": c.max_bytes,
            "cache_limit_rows": c.max_rows,
            "evicted_rows": c.evicted_rows,
            "queries": self.queries,
            "disk_queries": self.disk_queries,
            "dropped": dict(self.dropped),
            "sink_errors": self.sink_errors,
        }
        if w is not None:
            ws = w.stats()
            out["writer"] = ws
            if ws["dropped"]:
                out["dropped"]["disk"] = ws["dropped"]
        return out
