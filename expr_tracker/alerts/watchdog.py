"""Watchdog: the daemon thread that calls an engine's ``check_time()`` every interval, so
time-based rules (``no_data``/``age``/``elapsed``) fire when no row comes."""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["Watchdog"]


class Watchdog:
    """One daemon thread calling ``check()`` every ``interval`` seconds until ``stop()``;
    an exception ``check`` raises goes to ``on_error(None, exc, "watchdog")``."""

    __slots__ = ("thread", "_stop")

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def start(
        self,
        interval: float,
        check: Callable[[], None],
        on_error: Callable[..., None],
        thread_factory: Callable[..., threading.Thread] = threading.Thread,
    ) -> None:
        """Start the thread (``thread_factory``: same signature as ``threading.Thread``)."""
        self._stop.clear()
        thread = thread_factory(
            target=self._watch,
            args=(interval, check, on_error),
            name="et-alert-watchdog",
            daemon=True,
        )
        self.thread = thread
        thread.start()

    def _watch(
        self, interval: float, check: Callable[[], None], on_error: Callable[..., None]
    ) -> None:
        while not self._stop.wait(interval):
            try:
                check()
            except Exception as exc:  # pragma: no cover - check_time catches rule errors
                on_error(None, exc, "watchdog")

    def stop(self, timeout: float) -> None:
        """Stop the thread and join it up to ``timeout`` s (not from the thread itself)."""
        self._stop.set()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        self.thread = None
