"""The query cache of a file kept current by the process writing it (docs/query.md "The
cache", "Kept by the run").

The first ``et query`` after a run decodes every line of its JSONL into the columnar cache
(:mod:`expr_tracker.query.cache`): ~0.24 s of CPU for 100,000 lines of 5 metrics (17 MB)
here, 24 s for a folder of 100 such runs. A run that writes a file past :data:`STEP_BYTES` extends that
cache itself, on a background thread of its own, every :data:`STEP_BYTES` it writes, and
once more at finish for the rest, so a finished run's cache covers its whole file and the
first query reads none of it. A file that never reaches :data:`STEP_BYTES` is left to the
first query (a few tenths of a second at most), and neither ``pyarrow`` nor ``polars`` is
imported by a run that writes less.

:class:`CacheWarmer` is one file's: the writer calls :meth:`CacheWarmer.written` after each
batch it writes (an integer comparison), which queues the file on the process-wide worker
thread once :data:`STEP_BYTES` more were written since the last time; :meth:`finish`, at
the end of the run's finish (after ``run.json``), waits for that thread to be done with the
file (at most ``wait`` seconds) and extends the cache over the rest, when the file reached
:data:`STEP_BYTES`. What the worker runs is :func:`expr_tracker.query.cache.warm`: the
reader's own refresh, under the cache's lock, writing only into the run directory, never
warning, never falling back; a file it cannot keep (no ``pyarrow``, a full disk, a run
directory that is not this user's) is given up quietly for the rest of the run (debug
log), and the first query builds its cache as it always did.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["STEP_BYTES", "CacheWarmer"]

log = logging.getLogger("expr_tracker")

#: bytes written between two extensions of a file's cache on the background thread, and
#: the size below which a run leaves its file's cache to the first query
STEP_BYTES = 8 << 20
#: seconds :meth:`CacheWarmer.finish` waits for the background thread to be done with the
#: file before it gives up (the cache then stays where that thread leaves it)
FINISH_WAIT_S = 30.0


class CacheWarmer:
    """The query cache of ``path`` (a ``kind`` file: ``"metrics"`` or ``"spans"``), kept by
    the writer of ``path``. ``step``: bytes between background extensions (None: the
    module's :data:`STEP_BYTES` now).

    Raises ``ValueError`` for another ``kind`` or a ``step`` that is not a positive int.

    Counters (``stats()``): ``warms`` (extensions done), ``covered`` (bytes of the file the
    cache covered after the last one), ``seconds`` (wall time spent in them), ``gave_up``
    (the reason the file was given up, or None).
    """

    def __init__(self, path: str | os.PathLike[str], kind: str, step: int | None = None) -> None:
        if kind not in ("metrics", "spans"):
            raise ValueError(f"kind={kind!r} is not valid: use 'metrics' or 'spans'")
        if step is None:
            step = STEP_BYTES
        if type(step) is not int or step < 1:
            raise ValueError(f"step={step!r} is not valid: a positive number of bytes")
        self.path = Path(path)
        self.kind = kind
        self.step = step
        #: the file size at which :meth:`written` queues the next extension
        self.next_at = step
        self.warms = 0
        self.covered = 0
        self.seconds = 0.0
        self.gave_up: str | None = None
        self._queued = False  # on the worker's queue (set after the put: see _Worker.put)
        self._busy = False  # being extended by the worker
        self._finished = False

    def written(self, size: int) -> None:
        """The file is ``size`` bytes long now (the writer, after a batch); queues an
        extension on the worker thread when ``size`` reached :attr:`next_at`. Never raises
        an ``Exception``."""
        if size < self.next_at:
            return
        self.next_at = size + self.step
        if self._finished or self.gave_up is not None:
            return
        try:
            _worker().put(self)
        except Exception as exc:  # noqa: BLE001 - never the writer's problem
            self._give_up(f"the worker thread could not start ({type(exc).__name__}: {exc})")

    def run(self) -> None:
        """One extension, on the calling thread (the worker's, or :meth:`finish`'s)."""
        if self.gave_up is not None:
            return
        from expr_tracker.query.cache import warm

        t0 = time.monotonic()
        try:
            covered = warm(self.path, self.kind)
        except Exception as exc:  # noqa: BLE001 - a reader will build it instead
            self._give_up(f"{type(exc).__name__}: {exc}")
            return
        finally:
            self.seconds += time.monotonic() - t0
        if covered is None:
            self._give_up("its cache folder cannot be used or written")
            return
        self.warms += 1
        self.covered = covered

    def finish(self, wait: float = FINISH_WAIT_S) -> None:
        """At the run's finish, the file closed: wait (at most ``wait`` seconds) for the
        worker to be done with it, then extend the cache over the rest when the file
        reached :attr:`step` bytes. Idempotent."""
        self._finished = True
        deadline = time.monotonic() + wait
        while self._queued or self._busy:  # polled: nothing here can be left half-done
            if time.monotonic() >= deadline:
                log.debug("expr_tracker: the query cache of %s is still being extended", self.path)
                return
            time.sleep(0.005)
        if self.gave_up is not None:
            return
        try:
            size = os.stat(self.path).st_size
        except OSError:
            return
        if size >= self.step and size != self.covered:
            self.run()

    def stats(self) -> dict[str, Any]:
        return {
            "warms": self.warms,
            "covered": self.covered,
            "seconds": round(self.seconds, 3),
            "gave_up": self.gave_up,
        }

    def _give_up(self, why: str) -> None:
        self.gave_up = why
        log.debug("expr_tracker: not keeping the query cache of %s: %s", self.path, why)


class _Worker:
    """One daemon thread extending the queued files' caches, one at a time (a file queued
    while it is queued is not queued twice; queued while being extended, it is extended
    once more after).

    Safe against an exception raised at any point of :meth:`put` on the caller's thread (a
    Ctrl-C during a flush on the main thread): the thread is started before anything is
    marked, the queue's ``put`` is one C call and a file is marked queued only after it:
    at worst a file is queued twice (the second extension finds nothing new), never marked
    queued without being on the queue (which :meth:`CacheWarmer.finish` would wait on).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake: queue.SimpleQueue[CacheWarmer] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def put(self, w: CacheWarmer) -> None:
        t = self._thread
        if t is None or not t.is_alive():
            with self._lock:
                t = self._thread
                if t is None or not t.is_alive():
                    t = threading.Thread(
                        target=self._run, name="expr_tracker-query-cache", daemon=True
                    )
                    t.start()
                    self._thread = t
        with self._lock:
            if not w._queued:
                self._wake.put(w)
                w._queued = True

    def _run(self) -> None:
        while True:
            w = self._wake.get()
            with self._lock:  # busy first: finish() reads the two without the lock
                w._busy = True
                w._queued = False
            try:
                w.run()
            finally:
                w._busy = False


_WORKER: _Worker | None = None
_WORKER_LOCK = threading.Lock()


def _worker() -> _Worker:
    global _WORKER
    w = _WORKER
    if w is None:
        with _WORKER_LOCK:
            if _WORKER is None:
                _WORKER = _Worker()
            w = _WORKER
    return w


def _after_fork_in_child() -> None:
    global _WORKER, _WORKER_LOCK
    _WORKER = None
    _WORKER_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
