"""The open row's crash bound: the idle timer, and the patch line written after it fired.

An open row idle for ``max_open_seconds`` is written to disk without committing (no sink
sees it); data that arrives for that step afterwards becomes a patch line holding what
changed (:func:`changed`), and readers merge by step (docs/history.md "Steps, not lines").

:class:`OpenRowTimer` is owned by :class:`~expr_tracker.history.store.HistoryStore`: it
holds the deadline (whether a callback is scheduled on the shared
:class:`~expr_tracker.history.flusher.BackgroundFlusher`) and nothing of the row itself;
the store keeps when its open row last changed, and writes the row when the timer says it
is due.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from expr_tracker.history.flusher import BackgroundFlusher, get_flusher

RESERVED = frozenset({"_step", "_time"})


def changed(row: dict[str, Any], written: dict[str, Any]) -> dict[str, Any] | None:
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
    """The deadline of one store's open row: ``seconds`` after it last changed.

    The store keeps when its open row last changed (its own state) and the timer the
    deadline: whether a callback is scheduled on the flusher (``armed``, read by the store)
    and when. Every method runs under the store lock (the store calls them while it holds
    it). ``on_due`` (the store's) runs on the flusher thread when the deadline may have
    come: it takes the store lock and asks :meth:`expired`, which re-arms the timer when
    the row changed meanwhile.
    """

    __slots__ = ("armed", "seconds", "_clock", "_flusher", "_key", "_on_due")

    def __init__(
        self,
        seconds: float,
        clock: Callable[[], float],
        flusher: BackgroundFlusher | None,
        on_due: Callable[[], Any],
    ) -> None:
        self.seconds = seconds
        self.armed = False  # a callback is scheduled on the flusher
        self._clock = clock
        self._flusher = flusher  # None: the process-wide one, looked up each time (fork)
        self._key = ("open", id(self))
        self._on_due = on_due

    def arm(self, changed_at: float) -> None:
        """Schedule ``on_due`` ``seconds`` after ``changed_at`` (monotonic), when the open
        row changed and the timer is not armed."""
        self.armed = True
        (self._flusher or get_flusher()).schedule(
            self._key, changed_at + self.seconds, self._on_due
        )

    def expired(self, waiting: bool, changed_at: float) -> bool:
        """In ``on_due``: True when the open row, last changed at ``changed_at``, has been
        idle past the deadline (the store writes it now). False when nothing waits
        (``waiting`` False: the store is closed or its open row empty), or when the row
        changed meanwhile: the timer is then armed again for the rest of the idle time."""
        self.armed = False
        if not waiting:
            return False
        if self._clock() < changed_at + self.seconds:
            self.arm(changed_at)
            return False
        return True

    def cancel(self) -> None:
        """The store closed: nothing is scheduled any more."""
        (self._flusher or get_flusher()).cancel(self._key)
