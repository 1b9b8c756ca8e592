"""``SystemSampler``: the background thread that samples the machine into the ``system``
stream (docs/system.md).

It never slows or breaks training: it runs on its own daemon thread, shares no lock with
``log()`` (its own file writer, written on this thread; its own warning counter; its own
alert engine), drops a probe after that probe's first failure with one warning, and
``close(timeout)`` waits for it at most ``timeout`` seconds.

A run that ends while the thread is still making its probes (``import psutil`` can take
seconds on a loaded machine) is not held up by them, and what that import then does is
not reported: an import cut short by the run's end or the interpreter's shutdown says
nothing about psutil, and no sample would follow it anyway (docs/system.md).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from expr_tracker._warn import Warner

__all__ = ["SystemSampler"]

log = logging.getLogger("expr_tracker")


class SystemSampler:
    """Samples ``probes()`` every ``interval`` seconds on its own thread.

    Args:
        make_probes: called once on the sampler's thread (so psutil and NVML are imported
            there, never on the training thread): returns the probes, a list of
            ``(name, fn)`` with ``fn() -> {metric: number}``
            (:mod:`expr_tracker.system.probes`).
        write: called with each row, on the sampler's thread.
        interval: seconds between samples (> 0).
        host: the host name every row carries (``"host"``).
        on_row: also called with each row (the system rules' engine); its failure is
            warned about once and the sampling goes on.
        clock: wall time, seconds since the epoch (``_time``; ``_step`` is it in
            milliseconds, kept strictly increasing).
        warner: the sampler's own warn-once counter (never the run's: no lock shared with
            ``log()``).

    A row: ``{"host": str, "<group>/<metric>": number, ..., "_step": int, "_time": float}``;
    ``None`` and non-finite readings are left out. A sample where every probe is gone
    writes nothing.
    """

    def __init__(
        self,
        make_probes: Callable[[], list[tuple[str, Callable[[], dict[str, Any]]]]],
        write: Callable[[dict[str, Any]], Any],
        *,
        interval: float,
        host: str | None,
        on_row: Callable[[dict[str, Any]], Any] | None = None,
        clock: Callable[[], float] = time.time,
        warner: Warner | None = None,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        self._make_probes = make_probes
        self._write = write
        self.interval = float(interval)
        self.host = host
        self._on_row = on_row
        self._clock = clock
        self.warner = warner or Warner()
        self._probes: list[tuple[str, Callable[[], dict[str, Any]]]] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._last_step = -1
        self.rows = 0  # rows written
        self.samples = 0  # samples taken (a sample with no reading writes no row)
        self.cpu_s = 0.0  # CPU seconds the sampling took (its thread's)
        self.dropped: list[str] = []  # probes dropped after a failure, in order
        self.started_at: float | None = None  # monotonic
        self._preparing = False  # the thread has begun making its probes

    # ------------------------------------------------------------------ the thread

    def start(self) -> None:
        """Start the thread (once). Returns at once: the probes are made on the thread, by
        its first sample."""
        if self._thread is not None:
            return
        self.started_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="et-system-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            # the probes (``import psutil``, NVML) are made by the first sample, one interval
            # in, not while the run starts: the start and its first steps never share the
            # GIL with that import (docs/architecture.md "Cold start")
            while not self._stop.wait(self.interval):
                if self._probes is None:
                    self.prepare()
                    if self._stop.is_set():  # the run ended during the import: no sample
                        break
                self.sample()
        except Exception as exc:  # noqa: BLE001 - the sampler never takes training down
            self.warner.warn(
                ("system", "sampler"),
                "expr_tracker: the system sampler stopped (%s: %s); the run goes on without",
                type(exc).__name__,
                exc,
            )

    def prepare(self) -> None:
        """Make the probes (the thread does it before its first sample). A failure leaves no
        probe, with one warning."""
        if self._probes is not None:
            return
        t0 = time.thread_time()
        self._preparing = True
        try:
            self._probes = list(self._make_probes())
        except Exception as exc:  # noqa: BLE001
            self._probes = []
            if self._stop.is_set() or sys.is_finalizing():  # the module docstring
                log.debug("expr_tracker: system probes not made, the run ended: %s", exc)
                return
            self.warner.warn(
                ("system", "probes"),
                "expr_tracker: system metrics are off: %s",
                exc if str(exc) else type(exc).__name__,
            )
        self.cpu_s += time.thread_time() - t0

    def sample(self) -> dict[str, Any] | None:
        """Take one sample now and write it; returns the row (None when no probe read
        anything). Runs on the sampler's thread; callable directly (tests)."""
        self.prepare()
        t0 = time.thread_time()
        readings: dict[str, Any] = {}
        probes = self._probes or []
        for probe in list(probes):
            name, fn = probe
            try:
                values = fn()
            except Exception as exc:  # noqa: BLE001 - a probe is dropped, never raised
                probes.remove(probe)
                self.dropped.append(name)
                self.warner.warn(
                    ("system", name),
                    "expr_tracker: the system probe %r failed (%s: %s); it is dropped, the "
                    "other readings go on",
                    name,
                    type(exc).__name__,
                    exc,
                )
                continue
            for key, value in values.items():
                if _is_number(value):
                    readings[key] = value
        self.samples += 1
        if not readings:
            self.cpu_s += time.thread_time() - t0
            return None
        now = self._clock()
        step = max(int(now * 1000), self._last_step + 1)  # wall time, ms, never backwards
        self._last_step = step
        row = {"host": self.host, **readings, "_step": step, "_time": now}
        sinks: tuple[tuple[str, Callable[[dict[str, Any]], Any] | None], ...] = (
            ("write", self._write),
            ("rules", self._on_row),
        )
        for what, sink in sinks:
            if sink is None:
                continue
            try:
                sink(row)
            except Exception as exc:  # noqa: BLE001
                self.warner.warn(
                    ("system", what),
                    "expr_tracker: the system sampler could not %s a row (%s: %s)",
                    "write" if what == "write" else "evaluate the rules on",
                    type(exc).__name__,
                    exc,
                )
        self.rows += 1
        self.cpu_s += time.thread_time() - t0
        return row

    # ------------------------------------------------------------------ the end

    def close(self, timeout: float = 2.0) -> bool:
        """Stop the thread and wait for it at most ``timeout`` seconds (a probe stuck in a
        driver call is given up on: the thread is a daemon). True when it stopped, or
        when it is still making its probes (it stops after them without sampling). In a
        forked child (where the thread does not run) it returns at once."""
        self._stop.set()
        t = self._thread
        if t is None or os.getpid() != self._pid or t is threading.current_thread():
            return True
        if self._probes is None and self._preparing:  # still making its probes: nothing
            return True  # is sampled after them
        t.join(timeout)
        if t.is_alive():
            self.warner.warn(
                ("system", "close"),
                "expr_tracker: the system sampler did not stop within %.1fs; its sample in "
                "progress is not written",
                timeout,
            )
            return False
        return True

    def stats(self) -> dict[str, Any]:
        """``et.info()["system"]``: rows, samples, probes (live and dropped), its CPU
        seconds and their share of one core since it started, the interval."""
        elapsed = time.monotonic() - self.started_at if self.started_at is not None else 0.0
        return {
            "host": self.host,
            "interval_s": self.interval,
            "rows": self.rows,
            "samples": self.samples,
            "probes": [name for name, _ in self._probes or ()],
            "dropped_probes": list(self.dropped),
            "cpu_s": round(self.cpu_s, 6),
            "core_share": round(self.cpu_s / elapsed, 6) if elapsed > 0 else 0.0,
            "warnings": dict(self.warner.counts),
        }


def _is_number(value: Any) -> bool:
    if type(value) is bool or not isinstance(value, (int, float)):
        return False
    return not isinstance(value, float) or math.isfinite(value)
