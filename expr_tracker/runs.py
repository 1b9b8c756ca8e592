"""Run: what :func:`expr_tracker.build.build` made, and the fan-out of committed rows.

A run owns, per producer (stream and rank), the :class:`HistoryStore` and its writer, the
summary, and whatever the spec enabled (span recorder, alert engine). A committed row
reaches every sink in :attr:`HistoryStore.sinks` (summary, alert engine, backends), outside
the store lock. ``finish()`` commits the open row first (alerts are evaluated at commit),
then drains and closes everything, and records the final status in ``run.json``.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

from expr_tracker._current import FORK_MESSAGE, fork_generation
from expr_tracker._warn import Warner
from expr_tracker.errors import NoActiveRunError
from expr_tracker.history.codec import dumps_pretty, normalize_value
from expr_tracker.history.flusher import get_flusher
from expr_tracker.history.paths import atomic_write
from expr_tracker.history.runinfo import write_run_info
from expr_tracker.history.store import HistoryStore

log = logging.getLogger("expr_tracker")


_MISSING = object()


#: seconds between background saves of summary.json while rows arrive
SUMMARY_SAVE_INTERVAL_S = 2.0


class Summary(MutableMapping):
    """The last value of every metric plus what the user assigns (``summary["best"] = 0.9``).

    Persisted to ``summary[.S][.rankN].json`` on the background flusher at most every
    :data:`SUMMARY_SAVE_INTERVAL_S` seconds while rows arrive, on ``flush()`` and at finish,
    so a crash leaves it at most that far behind (and a resume catches up from the metrics
    file). Assigned keys are kept even when a later row carries the same metric.
    """

    def __init__(
        self,
        path: Path | None,
        initial: dict[str, Any] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self._last: dict[str, Any] = dict(initial or {})
        self._assigned: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._clock = clock
        self._save_scheduled = False
        self._failed = False

    def on_row(self, row: dict[str, Any]) -> None:
        with self._lock:
            self._last.update(row)
        if not self._save_scheduled and self.path is not None:
            self._save_scheduled = True
            get_flusher().schedule(
                ("summary", id(self)), self._clock() + SUMMARY_SAVE_INTERVAL_S, self._save_due
            )

    def _save_due(self) -> None:
        self._save_scheduled = False
        self.save()

    def close(self) -> None:
        """Save now and stop the background saves."""
        get_flusher().cancel(("summary", id(self)))
        self.save()

    def __getitem__(self, key: str) -> Any:
        if key in self._assigned:
            return self._assigned[key]
        return self._last[key]

    def __setitem__(self, key: str, value: Any) -> None:
        with self._lock:
            self._assigned[str(key)] = normalize_value(value)

    def __delitem__(self, key: str) -> None:
        with self._lock:
            found = self._assigned.pop(key, _MISSING) is not _MISSING
            found = self._last.pop(key, _MISSING) is not _MISSING or found
        if not found:
            raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        with self._lock:
            return {**self._last, **self._assigned}

    def __repr__(self) -> str:
        return f"Summary({self.to_dict()!r})"

    def save(self) -> None:
        if self.path is None:
            return
        try:
            atomic_write(self.path, dumps_pretty(self.to_dict()))
            self._failed = False
        except OSError as exc:
            if not self._failed:  # once per outage, not every 2 s
                self._failed = True
                log.warning(
                    "expr_tracker: cannot write %s (%s); retried in the background",
                    self.path,
                    exc,
                )


class Run:
    """One tracked run of this process (one stream, one rank).

    Attributes:
        project, name, stream, rank: identity.
        dir: the run directory (``Path``).
        spec: the validated, frozen ``RunSpec``.
        history: the :class:`HistoryStore` (``run.history.flush()`` waits for the write).
        summary: the :class:`Summary`.
        config: the normalised run config (what ``config.json`` holds).
        spans: the span recorder, or None when spans are disabled.
        alerts: the alert engine, or None when no rule is registered.
    """

    def __init__(
        self,
        *,
        spec: Any,
        resolved: Any,
        run_dir: Path,
        stream: str | None,
        rank: int,
        store: HistoryStore,
        summary: Summary,
        config: dict[str, Any],
        info: dict[str, Any],
        info_path: Path,
        warner: Warner,
        started_mono: float | None = None,
    ) -> None:
        self.spec = spec
        self.resolved = resolved
        self.dir = run_dir
        self.project = spec.project
        self.name = spec.name
        self.stream = stream
        self.rank = rank
        self.history = store
        self.summary = summary
        self.config = config
        self.info_record = info
        self._info_path = info_path
        self.warner = warner
        self.spans: Any = None
        self.alerts: Any = None
        self.dispatcher: Any = None
        self._closers: list[tuple[str, Callable[[], Any]]] = []
        self._late_closers: list[tuple[str, Callable[[], Any]]] = []
        # monotonic time at run.json's started_at: duration_s never follows wall-clock jumps
        self._started_mono = time.monotonic() if started_mono is None else started_mono
        self._stats: dict[str, Callable[[], Any]] = {}
        self._finished = False  # True once finish() completed
        self._finishing_thread: int | None = None
        self._finish_stage = 0  # the next stage of finish() to run (see _finish_stages)
        self._exit_code: int | None = None
        self._close_error = False
        self._finish_lock = threading.RLock()
        self._fork_gen = fork_generation()
        self.exception: tuple[type[BaseException], BaseException, Any] | None = None
        self._listeners: list[Callable[[str, dict[str, Any]], Any]] = []
        self.ingest = store.ingest

    # ------------------------------------------------------------------ use

    @property
    def forked(self) -> bool:
        """True in a forked child that inherited this run object."""
        return self._fork_gen != fork_generation()

    @property
    def finished(self) -> bool:
        """True once :meth:`finish` completed (everything closed, ``run.json`` written)."""
        return self._finished

    @property
    def finishing(self) -> bool:
        """True while :meth:`finish` runs (not after it was interrupted, nor once done)."""
        return self._finishing_thread is not None

    @property
    def exit_code(self) -> int | None:
        """The exit code the run ends with, for mirrors: the code given to ``finish()``,
        else 1 after an exception, else 0 once finishing (None before ``finish()``)."""
        if self._exit_code is not None:
            return self._exit_code
        if self.exception is not None:
            return 1
        return 0 if (self._finishing_thread is not None or self._finished) else None

    def log(
        self, metrics: dict[str, Any], step: int | None = None, commit: bool | None = None
    ) -> int:
        """Log ``metrics`` (see :meth:`HistoryStore.ingest`); returns the step they landed on."""
        return self.history.ingest(metrics, step, commit)

    def add_closer(self, name: str, fn: Callable[[], Any], *, late: bool = False) -> None:
        """Register ``fn`` to run at finish, in registration order.

        Closers run after the open row is committed and before the history is closed;
        ``late`` ones run after everything is on disk and ``run.json`` is written (alert
        delivery: its drain may wait on a slow endpoint, which must never hold the data).
        """
        (self._late_closers if late else self._closers).append((name, fn))

    def subscribe(self, fn: Callable[[str, dict[str, Any]], Any]) -> None:
        """Call ``fn(event, payload)`` for each run event other than rows (rows reach
        :attr:`HistoryStore.sinks`): ``"config"`` (the keys that changed), ``"summary"``
        (keys the user assigned), ``"define_metric"`` (one definition), ``"artifact"`` (one
        version logged or used). Mirrors subscribe here."""
        self._listeners.append(fn)

    def emit(self, event: str, payload: dict[str, Any]) -> None:
        """Hand ``payload`` to every subscriber; a subscriber that raises is logged once per
        event and never reaches the caller (measuring never breaks the training loop)."""
        for fn in list(self._listeners):
            try:
                fn(event, payload)
            except Exception as exc:  # noqa: BLE001
                self.warner.warn(
                    ("listener", event, type(exc).__name__),
                    "expr_tracker: a %s listener failed (%s: %s); ignored",
                    event,
                    type(exc).__name__,
                    exc,
                )

    def add_stats(self, name: str, fn: Callable[[], Any]) -> None:
        """Register a section of :meth:`info`."""
        self._stats[name] = fn

    def add_rule(self, rule: Any, **overrides: Any) -> Any:
        """Register an alert rule on this live run (``et.add_alert_rule``); returns the
        registered ``AlertRule``. The engine sees every row committed from now on.

        Raises:
            RuleError: the rule does not compile.
            NoActiveRunError: alerts are disabled for this run (``alerts.enabled: false``).
        """
        engine = self.alerts
        if engine is None:
            raise NoActiveRunError("alerts are disabled for this run (alerts.enabled: false)")
        registered = engine.add_rule(rule, **overrides)
        sinks = self.history.sinks
        if engine.on_step not in sinks:
            sinks.append(engine.on_step)
        return registered

    def flush(self) -> None:
        """Write committed rows and completed span records to disk, and wait.

        The open row stays open (it is not committed).
        """
        self.history.flush()
        self.summary.save()

    def info(self) -> dict[str, Any]:
        """Everything countable about the run: history, cache, writer, spans, alerts."""
        out: dict[str, Any] = {
            "project": self.project,
            "name": self.name,
            "stream": self.stream,
            "rank": self.rank,
            "dir": str(self.dir),
            "status": self.info_record.get("status"),
            "history": self.history.stats(),
            "warnings": {str(k): v for k, v in self.warner.counts.items()},
        }
        for name, fn in self._stats.items():
            try:
                out[name] = fn()
            except Exception as exc:  # noqa: BLE001
                out[name] = {"error": f"{type(exc).__name__}: {exc}"}
        return out

    # ------------------------------------------------------------------ finish

    def finish(
        self,
        exit_code: int | None = None,
        exception: BaseException | None = None,
    ) -> None:
        """Commit the open row, drain and close everything, record the final status.

        Idempotent, and resumable: each stage runs to completion once; an exception that
        interrupts one (Ctrl-C, SIGTERM's ``SystemExit``) propagates, and the next call
        (``et.finish()`` again, or the exit hook) redoes that stage and completes the rest.
        A second thread calling it waits until the first completes. ``finished`` turns
        True, and ``run.json`` says ``finished``, only once the history writer is closed;
        ``exception`` (or a non-zero ``exit_code``, or a history that failed to close)
        marks the run ``failed``.
        """
        if self.forked:
            from expr_tracker.errors import ForkedRunError

            raise ForkedRunError(FORK_MESSAGE)
        with self._finish_lock:  # re-entrant: a closer or sink calling finish() returns
            if self._finished or self._finishing_thread == threading.get_ident():
                return
            try:
                self._finishing_thread = threading.get_ident()
                if exception is not None:
                    self.exception = (type(exception), exception, exception.__traceback__)
                if exit_code is not None and self._exit_code is None:
                    self._exit_code = exit_code
                stages = self._finish_stages()
                while self._finish_stage < len(stages):
                    name, fn = stages[self._finish_stage]
                    try:
                        fn()
                    except Exception:  # noqa: BLE001 - finishing must always complete
                        log.exception("expr_tracker: %s at finish failed", name)
                        if name == "closing the history":
                            self._close_error = True
                    self._finish_stage += 1
                self._finished = True
            finally:
                self._finishing_thread = None

    def _finish_stages(self) -> list[tuple[str, Callable[[], Any]]]:
        return [
            ("committing the open row", self.history.commit),
            *[(f"closing {name}", fn) for name, fn in self._closers],
            ("closing the history", self.history.close),
            ("saving the summary", self.summary.close),
            ("writing run.json", self._write_final_info),
            *[(f"closing {name}", fn) for name, fn in self._late_closers],
        ]

    def _write_final_info(self) -> None:
        info = self.info_record
        info["ended_at"] = time.time()
        info["duration_s"] = round(time.monotonic() - self._started_mono, 3)  # not wall time
        # over every attempt of the run, as `et runs` counts them (a resume continues at
        # the file's highest step + 1)
        resumed_at = int(info.get("resumed_at_step") or 0)
        info["steps"] = resumed_at + self.history.rows_committed
        last = (self.history.last_row or {}).get("_step")
        info["last_step"] = last if last is not None else (resumed_at - 1 if resumed_at else None)
        writer = self.history.writer
        exit_code = self._exit_code
        if self.exception is not None:
            etype, evalue, tb = self.exception
            info["status"] = "failed"
            info["exception"] = {
                "type": etype.__name__,
                "message": str(evalue),
                "traceback": "".join(traceback.format_exception(etype, evalue, tb))[-8000:],
            }
        elif exit_code not in (None, 0):
            info["status"] = "failed"
            info["exit_code"] = exit_code
        elif self._close_error or (writer is not None and not writer.closed):
            # never "finished" while the metrics file is still open
            info["status"] = "failed"
            info["error"] = "the history writer could not be closed (see the log)"
        else:
            info["status"] = "finished"
        try:
            write_run_info(self._info_path, info)
        except OSError as exc:
            log.warning("expr_tracker: cannot write %s (%s)", self._info_path, exc)

    def __repr__(self) -> str:
        return f"Run(project={self.project!r}, name={self.name!r}, dir={str(self.dir)!r})"
