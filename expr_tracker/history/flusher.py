"""The process-wide background flusher: one reusable daemon thread runs due callbacks.

Writer flushes (:class:`~expr_tracker.history.writer.JsonlWriter`) and the store's open-row
timers are scheduled on it; no Timer is ever created per commit. A forked child gets a new
one on first use.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

log = logging.getLogger("expr_tracker")


class BackgroundFlusher:
    """One daemon thread running scheduled callbacks at their due time (monotonic seconds).

    ``schedule(key, due, callback)`` keeps the earliest due time per key; callbacks run on
    the flusher thread, outside its lock; an exception in one is logged and ignored.

    Safe against an exception raised at any point of ``schedule``/``cancel`` on the caller's
    thread (a Ctrl-C while ``et.log()`` schedules a flush): the table is guarded by a plain
    ``threading.Lock`` in a ``with`` block (its C-level ``__enter__``/``__exit__`` cannot be
    split by a signal, unlike ``threading.Condition``'s, which run Python code and can leave
    the lock held), and the thread is woken through a ``queue.SimpleQueue`` whose ``put`` is
    one C call.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._due: dict[Hashable, tuple[float, Callable[[], Any]]] = {}
        self._thread: threading.Thread | None = None
        self.thread_starts = 0
        self.busy = False

    def start(self) -> None:
        """Start the thread now (writers call this when they are made, so that ``log()``
        on the main thread never runs ``Thread.start``, whose Python-level waits a Ctrl-C
        can leave holding a lock). ``schedule`` starts it too if it is not running."""
        with self._lock:
            self._start_locked()

    def _start_locked(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._run, name="expr_tracker-flusher", daemon=True
            )
            self.thread_starts += 1
            self._thread.start()

    def schedule(self, key: Hashable, due: float, callback: Callable[[], Any]) -> None:
        with self._lock:
            cur = self._due.get(key)
            if cur is not None and cur[0] <= due:
                return
            self._due[key] = (due, callback)
            if self._thread is None or not self._thread.is_alive():
                self._start_locked()
        self._wake.put(None)

    def cancel(self, key: Hashable) -> None:
        with self._lock:
            self._due.pop(key, None)

    def _run(self) -> None:
        wake = self._wake
        while True:
            with self._lock:
                timeout = 30.0
                cb = None
                if self._due:
                    key, (due, cb) = min(self._due.items(), key=lambda kv: kv[1][0])
                    now = self._clock()
                    if due > now:
                        timeout = min(due - now, 30.0)
                        cb = None
                    else:
                        del self._due[key]
                        self.busy = True
            if cb is None:
                try:
                    wake.get(timeout=timeout)
                except queue.Empty:
                    pass
                continue
            try:
                cb()
            except Exception:  # noqa: BLE001 - the flusher must survive anything
                log.exception("expr_tracker: background flush failed")
            finally:
                self.busy = False


_FLUSHER: BackgroundFlusher | None = None
_FLUSHER_LOCK = threading.Lock()


def get_flusher() -> BackgroundFlusher:
    """The process-wide flusher (a new one after ``fork``)."""
    global _FLUSHER
    f = _FLUSHER
    if f is None:
        with _FLUSHER_LOCK:
            if _FLUSHER is None:
                _FLUSHER = BackgroundFlusher()
            f = _FLUSHER
    return f


def _after_fork_in_child() -> None:
    global _FLUSHER, _FLUSHER_LOCK
    _FLUSHER = None
    _FLUSHER_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
