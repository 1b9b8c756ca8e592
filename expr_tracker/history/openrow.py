"""The open row's crash bound: an idle open row is written to disk without committing.

An open row idle for ``max_open_seconds`` is written (no sink sees it); data that arrives for
that step afterwards becomes a patch line holding what changed, and readers merge by step.
Part of :class:`~expr_tracker.history.store.HistoryStore` (a mixin over its state and its
one lock), kept in its own module by job.
"""

from __future__ import annotations

from typing import Any

from expr_tracker.history.flusher import get_flusher

RESERVED = frozenset({"_step", "_time"})


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


class OpenRowTimer:
    """The open-row timer and patch lines of :class:`~expr_tracker.history.store.HistoryStore`."""

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
