"""Queries over a live store: ``tail(n)`` and ``step_range``, cache first, then the file.

:class:`StoreReader` is owned by :class:`~expr_tracker.history.store.HistoryStore`, which
hands it the store lock, the row cache, the writer and a function showing the open row;
it owns the query counters and the decoded-tail memo. ``query.py`` plans which of these
(or the files) answers a read.

Query planning (docs/history.md "Where the answer comes from"): the cache/disk boundary is
the row ordinal ``cache.first_ordinal``: rows before it are on disk (evicted, or a resume's
prefix), rows from it on are in memory. Every result is a list of new dicts: a snapshot.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from expr_tracker._warn import Warner
from expr_tracker.history.cache import DecodedTail, RowCache, decode_lines
from expr_tracker.history.reader import JsonlReader, merge_by_step, step_key
from expr_tracker.history.writer import JsonlWriter

#: ``shown(include_open)`` -> ``(open_step, open row as shown or None, written early)``,
#: called under the store lock
ShownOpen = Callable[[bool], tuple[int, dict[str, Any] | None, bool]]


class StoreReader:
    """The reads of one store (its ``tail`` and ``step_range``).

    Args:
        lock: the store lock, taken while the cache and the open row are looked at (and
            the counters and memo changed); never held while the file is read.
        cache / writer / warner: the store's.
        shown: called under ``lock`` with ``include_open``: the open step, the open row as
            a query shows it (None when it holds nothing or ``include_open`` is False), and
            whether it was written early (a timed-out open row is on disk but not committed:
            hidden without ``include_open``).
    """

    def __init__(
        self,
        lock: threading.Lock,
        cache: RowCache,
        writer: JsonlWriter | None,
        warner: Warner,
        shown: ShownOpen,
    ) -> None:
        self._lock = lock
        self.cache = cache
        self.writer = writer
        self.warner = warner
        self._shown = shown
        self.queries = 0
        self.disk_queries = 0
        self.disk_bytes_read = 0
        self.disk_lines_skipped = 0  # lines of the file that are not rows, met by queries
        self.disk_lines_no_step = 0  # ... of them: objects without an integer _step
        self._memo: DecodedTail | None = None  # decoded rows of the last tail(n) query

    def tail(self, n: int | None = 50, include_open: bool = True) -> list[dict[str, Any]]:
        """``HistoryStore.tail``: the newest ``n`` steps (``None``/``-1``: all, in step
        order), oldest first, merged per step; the open row counts as the newest step when
        ``include_open``. The cache answers without any IO when it holds the window;
        otherwise the rows before the cache boundary are read backwards from the file
        (``disk_queries`` += 1)."""
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
            open_step, openrow, written = self._shown(include_open)
            # a timed-out open row is on disk but not committed: hidden without include_open
            hide = open_step if written and not include_open else None
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
        """``HistoryStore.step_range``: steps ``start <= _step < end`` (None: open side),
        merged, in step order. When the store is sorted the cache is binary-searched and
        the file is read only for the part of the range older than the cache, through the
        sidecar index (never a full scan); an unsorted store (``step_policy="allow"`` with
        backward steps) walks the cache and scans the disk part once."""
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
            openrow = hide = None
            open_step, _, written = self._shown(False)
            if lo <= open_step < hi:
                if include_open:
                    openrow = self._shown(True)[1]
                elif written:
                    hide = open_step
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
        no sidecar and the caller keeps only steps older than the cache (docs/history.md
        "Where the answer comes from").
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
