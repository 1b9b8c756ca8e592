"""Sync during training: the upload of ``et sync`` run from a daemon thread of the producer
(docs/team.md "Sync during training").

:class:`BackgroundSync` decides *when* (every ``interval`` seconds, and once more at
``close``); the upload it is handed (a call of :func:`expr_tracker.sync.upload.sync_dir`
over the process's own files) decides *what*. It reads the files the run writes and shares
no lock with ``et.log()``: a slow or unreachable bucket never blocks or breaks training.

A pass that fails (the store unreachable, a producer refused) is warned about once per
cause, counted in :meth:`stats` (``et.info()["sync"]``) and retried with backoff: the wait
before the next pass doubles with each failure in a row, from ``interval`` up to 32 times
it (at most :data:`MAX_BACKOFF_S`, never below ``interval``), and is back to ``interval``
after a clean pass (the S3 client itself retries each request within a pass); the upload
is incremental, so a later pass uploads whatever an earlier one could not.
:meth:`close` asks for the last pass and waits for it at most ``timeout`` seconds; past
that the run ends all the same (the thread is a daemon) and ``et sync DIR URL`` uploads
the rest.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from expr_tracker._warn import Warner

__all__ = ["MAX_BACKOFF_S", "BackgroundSync"]

#: the longest wait (seconds) between two passes after failures, unless ``interval`` is longer
MAX_BACKOFF_S = 600.0
#: the wait doubles at most this many times (32 x ``interval``)
_MAX_DOUBLINGS = 5


class BackgroundSync:
    """Call ``upload()`` every ``interval`` seconds on a daemon thread, and once more at
    :meth:`close`. ``upload`` returns a report with ``bytes``, ``commits`` and ``errors``
    (a list of strings: producers not synced) or raises; ``url`` only names the target in
    messages (never a credential: a URL with one is refused by the spec)."""

    def __init__(
        self,
        upload: Callable[[], Any],
        *,
        interval: float,
        url: str,
        warner: Warner | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, not {interval!r}")
        self._upload = upload
        self.interval = float(interval)
        self.url = url
        self._warner = warner or Warner()
        self._clock = clock
        self._wake = threading.Event()
        self._done = threading.Event()
        self._final = False
        self._lock = threading.Lock()  # the counters: the sync thread vs stats()
        self.passes = 0
        self.failures = 0
        self.failed_in_row = 0
        self.bytes = 0
        self.commits = 0
        self.last_error: str | None = None
        self.last_ok_at: float | None = None  # wall time of the last clean pass
        self._last_ok_mono: float | None = None
        self._thread = threading.Thread(target=self._loop, name="expr_tracker-sync", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while True:
            self._wake.wait(self.next_wait())
            self._wake.clear()
            final = self._final
            self._pass()
            if final:
                self._done.set()
                return

    def next_wait(self) -> float:
        """Seconds until the next pass: ``interval``, doubled for each failed pass in a
        row (up to 32x, at most :data:`MAX_BACKOFF_S` unless ``interval`` is longer)."""
        with self._lock:
            n = min(self.failed_in_row, _MAX_DOUBLINGS)
        if n == 0:
            return self.interval
        return max(self.interval, min(self.interval * 2**n, MAX_BACKOFF_S))

    def _pass(self) -> None:
        error: str | None
        try:
            report = self._upload()
            errors = list(getattr(report, "errors", ()) or ())
            error = "; ".join(errors[:3]) if errors else None
            sent, commits = int(report.bytes), int(report.commits)
        except Exception as exc:  # noqa: BLE001 - training goes on; retried next interval
            error = f"{type(exc).__name__}: {exc}"
            sent = commits = 0
        with self._lock:
            self.passes += 1
            self.bytes += sent
            self.commits += commits
            if error is None:
                self.failed_in_row = 0
                self.last_error = None
                self.last_ok_at = time.time()
                self._last_ok_mono = self._clock()
            else:
                self.failures += 1
                self.failed_in_row += 1
                self.last_error = error[:500]
        if error is not None:
            self._warner.warn(
                ("sync", error.split(":", 1)[0][:80]),
                "expr_tracker: background sync to %s failed (%s); retried with backoff "
                "from %gs, training goes on (et.info()['sync'])",
                self.url,
                error[:300],
                self.interval,
            )

    def close(self, timeout: float) -> bool:
        """Ask for the last pass and wait for it at most ``timeout`` seconds; True when it
        completed (cleanly or not: see :meth:`stats`), False when the wait ran out (one
        warning: the rest is for ``et sync``)."""
        self._final = True
        self._wake.set()
        if not self._thread.is_alive() and not self._done.is_set():
            return False  # never started
        done = self._done.wait(max(0.0, timeout))
        if not done:
            self._warner.warn(
                ("sync", "finish timeout"),
                "expr_tracker: the last background sync to %s did not finish within %gs; "
                "the run ends anyway: `et sync DIR URL` uploads the rest",
                self.url,
                timeout,
            )
        return done

    def stats(self) -> dict[str, Any]:
        """``et.info()["sync"]``: ``url``, ``interval`` (s), ``passes``, ``failures`` (all
        and ``failed_in_row``), ``bytes`` uploaded and manifest ``commits``, ``last_error``
        (None after a clean pass), ``last_ok_at`` (wall time), ``lag_s`` (seconds since
        the last clean pass, None before one) and ``next_wait_s`` (the wait before the next
        pass: ``interval``, or longer after failures)."""
        wait = self.next_wait()
        with self._lock:
            lag = None if self._last_ok_mono is None else self._clock() - self._last_ok_mono
            return {
                "url": self.url,
                "interval": self.interval,
                "passes": self.passes,
                "failures": self.failures,
                "failed_in_row": self.failed_in_row,
                "bytes": self.bytes,
                "commits": self.commits,
                "last_error": self.last_error,
                "last_ok_at": self.last_ok_at,
                "lag_s": None if lag is None else round(lag, 3),
                "next_wait_s": wait,
            }
