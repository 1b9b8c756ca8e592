"""One mirror: a backend fed from a bounded queue by its own background thread.

The committing thread only appends to the queue (:meth:`Mirror.put`: a length check, a
``deque.append`` and, when the thread sleeps, a wake-up through a ``SimpleQueue``); the
backend's ``init``, ``log``, event calls and ``finish`` all run on the mirror's thread, so
a slow or failing backend never slows ``log()``. When the queue is full the new row is
dropped and counted. Each cause of trouble (library missing, init failed, a log call
raising, queue full, finish deadline passed) is warned about once, through the run's
:class:`~expr_tracker._warn.Warner`, and counted in :meth:`Mirror.stats`.

:meth:`Mirror.close` (the run's late closer) queues the final summary and ``finish``, waits
for them within a deadline, and counts what it could not send as dropped. The deadline is
the closing's, not the call's: a finish interrupted and resumed waits only for what is left
of it. The wait comes after everything is on disk, so a signal ends it: a SIGTERM while a
run finishes (or a Ctrl-C at process exit) asks :mod:`expr_tracker.process_exit` to cut it,
and :func:`close_mirrors` then gives every mirror up within :data:`CUT_POLL_S`; a Ctrl-C
that interrupts the wait and ends the program leaves the exit hook nothing to wait for
(docs/mirrors.md "When something goes wrong").
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from expr_tracker import process_exit
from expr_tracker._warn import Warner

__all__ = [
    "MAX_CONSECUTIVE_FAILURES",
    "BackendOff",
    "BackendUnavailable",
    "Mirror",
    "close_mirrors",
]

log = logging.getLogger("expr_tracker")

#: log calls failing in a row before a backend is given up (its later rows are dropped)
MAX_CONSECUTIVE_FAILURES = 20

#: seconds the thread waits after a wake-up before it drains, so rows arrive in batches and
#: a fast training loop pays for a wake-up (a futex call) at most every few ms, not per row
BATCH_DELAY_S = 0.005

_FINISH = "__finish__"  # queue item (_FINISH, exit_code): the last one the thread handles


#: how often a wait at finish looks whether a signal asked it to stop (seconds)
CUT_POLL_S = 0.05


def close_mirrors(
    mirrors: list[Mirror],
    exit_code: int,
    timeout: float,
    final_summary: dict[str, Any] | None = None,
) -> None:
    """Close ``mirrors`` together: each gets the final summary and ``finish``, and all of
    them get ``timeout`` seconds in all, counted from the first call: called again (a
    finish interrupted by Ctrl-C and resumed), it waits only for what is left of them.
    After a signal while the run finishes (:func:`process_exit.skip_mirror_wait`) it waits
    for none: every mirror not done is given up (counted, said once each). An interrupt
    during the wait (Ctrl-C) propagates; if it ends the program, the exit hook waits for
    none either."""
    deadline = time.monotonic() + timeout
    try:
        for mirror in mirrors:
            mirror.begin_close(exit_code, final_summary)
            if mirror._deadline is None:
                mirror._deadline = deadline
        for mirror in mirrors:
            if process_exit.skip_mirror_wait():
                break
            mirror.wait_closed(exit_code, (mirror._deadline or deadline) - time.monotonic())
    except BaseException:
        process_exit.mirror_wait_interrupted()
        raise
    if process_exit.skip_mirror_wait():  # a signal came while the run finished: skipped
        process_exit.mirrors_given_up()
        for mirror in mirrors:
            mirror.abandon(exit_code, interrupted=True)


def _atexit_hooks() -> int | None:
    """How many ``atexit`` hooks are registered (None where the interpreter does not say)."""
    count = getattr(atexit, "_ncallbacks", None)
    return count() if callable(count) else None


class BackendOff(Exception):
    """Raised by a backend's call to turn its mirror off for good (said once with the
    message; later rows are dropped and counted as ``backend_off``)."""


class BackendUnavailable(BackendOff):
    """A built-in backend's library is not installed (raised by its ``init``)."""

    def __init__(self, library: str, extra: str) -> None:
        super().__init__(
            f"{library} is not installed; pip install 'expr-tracker[{extra}]' to mirror to it"
        )
        self.library = library
        self.extra = extra


class Mirror:
    """Feeds one backend (an :class:`~expr_tracker.backends.protocol.Adapted`) from a bounded
    queue on a daemon thread.

    Args:
        backend: the adapted backend (``init``/``log``/``event``/``finish``).
        info: the keywords handed to ``init`` (identity, config; see protocol.py).
        label: the name it is counted under in ``et.info()["backends"]``.
        queue_size: rows (and events) held while the backend is busy; more are dropped.
        warner: the run's warn-once counter.
    """

    def __init__(
        self,
        backend: Any,
        info: dict[str, Any],
        *,
        label: str,
        queue_size: int,
        warner: Warner,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self.info = info
        self.label = label
        self.warner = warner
        self._clock = clock
        self._rows: deque[Any] = deque()
        self._max = queue_size  # 0 once the mirror refuses rows (off or closed)
        self._size = queue_size
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._sleeping = False
        self._done = threading.Event()
        self._abandoned = False
        self._closed = False
        self._deadline: float | None = None  # when close_mirrors stops waiting (monotonic)
        self._refused: str | None = None  # why put() refuses rows: "backend_off", "closed"
        self._warned_full = False
        self._full = 0  # rows dropped because the queue was full
        self._thread: threading.Thread | None = None
        # counters (written by one thread each: put() under the store's fan-out lock, the
        # rest by the mirror thread or close())
        self.queued = 0
        self.sent = 0
        self.events_sent = 0
        self.failures = 0
        self.dropped: dict[str, int] = {}
        self.alive: bool | None = None  # None until init returned
        self.finished = False
        self.last_error: str | None = None
        self._consecutive = 0
        self._initialised = False
        self._inflight = False  # a row is being handed to the backend

    # ------------------------------------------------------------------ feeding

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"expr_tracker-mirror-{self.label}", daemon=True
        )
        self._thread.start()

    def put(self, row: dict[str, Any]) -> None:
        """The row sink (``HistoryStore.sinks``): O(1), never blocks, never raises."""
        rows = self._rows
        if len(rows) >= self._max:
            if self._refused is None:  # full (the common drop: a slow backend)
                self._full += 1
                if not self._warned_full:
                    self._refuse(1)
            else:
                self._refuse(1)
            return
        rows.append(row)
        self.queued += 1
        if self._sleeping:
            self._sleeping = False
            self._wake.put(None)

    def on_event(self, event: str, payload: dict[str, Any]) -> None:
        """The run-event listener (``Run.subscribe``): queued behind the rows before it."""
        rows = self._rows
        if len(rows) >= self._max:
            self._refuse(0)
            return
        rows.append((event, dict(payload)))
        if self._sleeping:
            self._sleeping = False
            self._wake.put(None)

    def _refuse(self, is_row: int) -> None:
        cause = self._refused or "queue_full"
        if not (is_row and cause == "queue_full"):  # full rows: counted in put() (_full)
            key = cause if is_row else f"{cause}_events"
            self.dropped[key] = self.dropped.get(key, 0) + 1
        if cause == "queue_full" and not self._warned_full:
            self._warned_full = True
            self.warner.warn(
                ("backend", self.label, "queue_full"),
                "expr_tracker: the %s mirror is behind (%d rows queued); new rows are dropped "
                "from the mirror until it catches up (the local files keep everything; counted "
                "in et.info()['backends'])",
                self.label,
                self._size,
            )

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        try:
            self._init()
            rows = self._rows
            wake = self._wake
            sleep = time.sleep
            while True:
                if not rows:
                    self._sleeping = True
                    if rows:  # a put() between the check and the flag: no wake-up coming
                        self._sleeping = False
                        continue
                    wake.get()
                    if not self._closed:
                        sleep(BATCH_DELAY_S)
                    continue
                item = rows.popleft()
                if type(item) is dict:
                    if self.alive and not self._abandoned:
                        self._inflight = True
                        self._send(item)
                        self._inflight = False
                    else:
                        self._count_drop("finish_timeout" if self._abandoned else "backend_off")
                elif item[0] == _FINISH:
                    self._finish(item[1])
                    return
                elif self.alive and not self._abandoned:
                    self._event(*item)
        except BaseException as exc:  # noqa: BLE001 - the thread must never die silently
            if self._inflight:
                self._count_drop("log_failed")
            self._off(
                f"its thread stopped ({type(exc).__name__}: {exc})",
                ("backend", self.label, "thread"),
            )
        finally:
            self._done.set()

    def _init(self) -> None:
        hooks = _atexit_hooks()
        try:
            self.backend.init(self.info)
        except BackendUnavailable as exc:
            self._off(str(exc), ("backend", self.label, "missing"))
            return
        except BackendOff as exc:
            self._off(str(exc), ("backend", self.label, "off"))
            return
        except Exception as exc:  # noqa: BLE001
            self._off(f"init failed ({type(exc).__name__}: {exc})", ("backend", self.label, "init"))
            return
        self._initialised = True
        self.alive = True
        if hooks is None or _atexit_hooks() != hooks:
            # the backend registered exit hooks of its own (wandb: its service's teardown):
            # the run's exit finish, which drains this mirror, must run before them
            process_exit.exit_hook_first()

    def _off(self, reason: str, key: Any) -> None:
        self.alive = False
        self._refused = "backend_off"
        self._max = 0
        self.last_error = reason
        self.warner.warn(
            key,
            "expr_tracker: the %s mirror is off: %s; training goes on and the local files "
            "keep everything",
            self.label,
            reason,
        )

    def _count_drop(self, cause: str) -> None:
        self.dropped[cause] = self.dropped.get(cause, 0) + 1

    def _send(self, row: dict[str, Any]) -> None:
        step = row.get("_step")
        metrics = {k: v for k, v in row.items() if k != "_step" and k != "_time"}
        try:
            self.backend.log(metrics, step)
        except BackendOff as exc:
            self._count_drop("backend_off")
            self._off(str(exc), ("backend", self.label, "off"))
            return
        except Exception as exc:  # noqa: BLE001
            self.failures += 1
            self._count_drop("log_failed")
            self._consecutive += 1
            self._fail("log", exc)
            if self._consecutive >= MAX_CONSECUTIVE_FAILURES:
                self._off(
                    f"{self._consecutive} log calls failed in a row (last: "
                    f"{type(exc).__name__}: {exc})",
                    ("backend", self.label, "gave_up"),
                )
            return
        self._consecutive = 0
        self.sent += 1

    def _event(self, event: str, payload: dict[str, Any]) -> None:
        try:
            self.backend.event(event, payload)
            self.events_sent += 1
        except BackendOff as exc:
            self._off(str(exc), ("backend", self.label, "off"))
        except Exception as exc:  # noqa: BLE001
            self.failures += 1
            self._fail(event, exc)

    def _finish(self, exit_code: int) -> None:
        if not self._initialised:
            return
        try:
            self.backend.finish(exit_code)
            self.finished = True
        except BackendOff as exc:
            self._off(str(exc), ("backend", self.label, "off"))
        except Exception as exc:  # noqa: BLE001
            self.failures += 1
            self._fail("finish", exc)

    def _fail(self, what: str, exc: BaseException) -> None:
        self.last_error = f"{what}: {type(exc).__name__}: {exc}"
        self.warner.warn(
            ("backend", self.label, what, type(exc).__name__),
            "expr_tracker: the %s mirror failed in %s (%s: %s); skipped and counted (warned "
            "once; training goes on)",
            self.label,
            what,
            type(exc).__name__,
            exc,
        )

    # ------------------------------------------------------------------ closing

    def disable(self, reason: str) -> None:
        """Turn the mirror off before it starts (its library is missing): said once,
        shown in :meth:`stats`."""
        self._off(reason, ("backend", self.label, "missing"))
        self._done.set()

    def close(
        self, exit_code: int, timeout: float, final_summary: dict[str, Any] | None = None
    ) -> bool:
        """Queue the final summary and ``finish(exit_code)``, wait up to ``timeout`` seconds
        for the backend to take everything; rows it could not take by then are counted as
        dropped (``finish_timeout``) and said once. Returns True when the mirror drained.

        Idempotent; an interrupted call (Ctrl-C) may be repeated."""
        self.begin_close(exit_code, final_summary)
        return self.wait_closed(exit_code, timeout)

    def begin_close(self, exit_code: int, final_summary: dict[str, Any] | None = None) -> None:
        """Refuse further rows; queue the final summary and ``finish`` (does not wait)."""
        if self._closed:
            return
        self._closed = True
        self._refused = self._refused or "closed"
        self._max = 0
        if final_summary:
            self._rows.append(("summary", {"changes": final_summary, "final": True}))
        self._rows.append((_FINISH, exit_code))
        self._sleeping = False
        self._wake.put(None)

    def wait_closed(self, exit_code: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for :meth:`begin_close`'s ``finish``; past it, what
        is left is counted as dropped and said once (see :meth:`close`). A mirror given up
        already (past its deadline, or interrupted) is not waited for again. The wait ends
        early, returning False, when a signal asks to cut it
        (:func:`process_exit.mirror_wait_cut`; the caller then gives the mirror up:
        :func:`close_mirrors`); an interrupt (Ctrl-C) propagates
        and leaves the mirror to a resumed finish."""
        if self._thread is None or self._done.is_set():
            self._count_leftovers()
            return True
        if self._abandoned:
            return False
        end = time.monotonic() + max(0.0, timeout)
        while True:
            left = end - time.monotonic()
            if self._done.wait(max(0.0, min(left, CUT_POLL_S))):
                self._count_leftovers()
                return True
            if process_exit.mirror_wait_cut():
                return False
            if left <= CUT_POLL_S:
                break
        self.abandon(exit_code, timeout=timeout)
        return False

    def abandon(
        self, exit_code: int, *, timeout: float | None = None, interrupted: bool = False
    ) -> None:
        """Stop waiting for the backend: the rows it has not taken are counted as dropped
        (``finish_timeout``) and said once; its ``finish`` is still called when the call it
        is stuck in returns, unless the process ends first. Nothing for a mirror that is
        done, or given up already."""
        if self._abandoned or self._thread is None or self._done.is_set():
            return
        self._abandoned = True
        left = 0
        while True:
            try:
                item = self._rows.popleft()
            except IndexError:
                break
            if type(item) is dict:
                left += 1
        if left:
            self.dropped["finish_timeout"] = self.dropped.get("finish_timeout", 0) + left
        self._rows.append((_FINISH, exit_code))  # finish once the call it is stuck in returns
        self._wake.put(None)
        if interrupted:
            self.warner.warn(
                ("backend", self.label, "finish_timeout"),
                "expr_tracker: stopped waiting for the %s mirror at finish (interrupted); %d "
                "queued rows were not mirrored (the local files hold them); counted in "
                "et.info()['backends']",
                self.label,
                left,
            )
            return
        self.warner.warn(
            ("backend", self.label, "finish_timeout"),
            "expr_tracker: the %s mirror did not drain within %.1f s at finish; %d queued rows "
            "were not mirrored (the local files hold them); counted in et.info()['backends']",
            self.label,
            timeout or 0.0,
            left,
        )

    def _count_leftovers(self) -> None:
        """Rows a stopped thread left in the queue (it never got to them): dropped."""
        while True:
            try:
                item = self._rows.popleft()
            except IndexError:
                return
            if type(item) is dict:
                self._count_drop("backend_off")

    def stats(self) -> dict[str, Any]:
        """``et.info()["backends"][label]``: ``queued`` (rows accepted), ``sent``, ``dropped``
        (cause -> rows: ``queue_full``, ``backend_off``, ``log_failed``, ``finish_timeout``,
        ``closed``; ``*_events`` for run events), ``pending`` (rows and events waiting),
        ``failures`` (calls that raised), ``events_sent``, ``alive`` (None until ``init``
        returned), ``finished``, ``last_error``, ``run`` (the backend run's name)."""
        dropped = dict(self.dropped)
        if self._full:
            dropped["queue_full"] = self._full
        return {
            "queued": self.queued,
            "sent": self.sent,
            "dropped": dropped,
            "pending": len(self._rows),
            "failures": self.failures,
            "events_sent": self.events_sent,
            "alive": self.alive,
            "finished": self.finished,
            "last_error": self.last_error,
            "run": self.info.get("name"),
        }
