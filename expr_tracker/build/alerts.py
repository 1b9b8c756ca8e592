"""The alert side of a run: the engine (rules compiled by ``check.make_engine``), the
alert log, the channels with their policies and the dispatcher, hooked into the run.

- ``open_delivery(alerts_spec, alerts_path, context=, finish=, ...) -> Delivery``: from
  plain values, the dispatcher, its closer (the ``notify_on`` message, then the drain
  within the deadline) and its ``delivery`` section of ``et.info()``.
- ``attach_delivery(run, alerts_spec, alerts_path) -> Dispatcher``: hooks a ``Delivery``
  into a ``Run`` (``run.dispatcher``, the closer, the stats).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from expr_tracker._warn import Warner
from expr_tracker.alerts.delivery.dispatcher import Dispatcher
from expr_tracker.alerts.delivery.message import AlertMessage
from expr_tracker.alerts.delivery.wiring import alerts_spec_of, build_dispatcher, run_end_message
from expr_tracker.history.paths import file_name
from expr_tracker.runs import Run

log = logging.getLogger("expr_tracker")


def build_alerts(
    run: Run,
    spec: Any,
    run_dir: Path,
    stream: str | None,
    file_rank: int,
    rank: int,
    warner: Warner,
    engine: Any,
) -> None:
    """Hook the alert engine (rules compiled by :func:`make_engine`) into the run: its
    record file, delivery, the watchdog and the row sink.

    Rules on a rank that does not alert (``alerts.on_rank``) stay registered, listed and
    evaluated, and recorded in that rank's ``alerts.rankN.jsonl``; they just do not deliver.
    """
    if engine is None:
        return
    from expr_tracker.alerts.delivery.record import AlertLog

    a = spec.alerts
    alerts_path = run_dir / file_name("alerts", stream, file_rank)
    record = AlertLog(alerts_path)

    def close() -> None:
        engine.close()
        for message in engine.finish_warnings():
            log.warning("expr_tracker: %s", message)

    # closers run in order: stop the engine (and its watchdog) before delivery drains, so
    # nothing is submitted to a closed dispatcher; the record file closes last
    run.add_closer("alerts", close)
    engine.record = record
    engine.notify = _delivery(run, a, alerts_path, record, engine.deliver)
    run.add_closer("alert_log", record.close, late=True)  # after delivery records outcomes
    engine.start_watchdog(a.watchdog_interval)
    run.alerts = engine
    if engine.rules:
        run.history.sinks.append(engine.on_step)
    run.add_stats("alerts", engine.stats)


def _delivery(run: Run, alerts: Any, alerts_path: Path, record: Any, deliver: bool) -> Any:
    """The callable rule events go to: the run's dispatcher (channels with their policies;
    with no channel configured, the console and ``alerts.jsonl``). None on a rank that does
    not alert."""
    if not deliver:
        return None
    dispatcher = attach_delivery(run, alerts, record)
    return dispatcher.notify


# --------------------------------------------------------------------------- delivery


def finish_message(run: Any, notify_on: Iterable[str]) -> AlertMessage | None:
    """``run_end_message`` for ``run`` (its ``project``, ``name``, ``exception``,
    ``history.rows_committed`` and the run's first start, each when present: a resumed
    run's message gives its whole wall duration, as ``et runs`` does — docs/streams.md
    "Run identity")."""
    steps = None
    try:
        steps = run.history.rows_committed
    except Exception:  # noqa: BLE001
        pass
    return run_end_message(
        notify_on,
        project=getattr(run, "project", "?"),
        name=getattr(run, "name", "?"),
        exception=getattr(run, "exception", None),
        steps=steps,
        started_at=_first_start(getattr(run, "info_record", None) or {}),
    )


def _first_start(info: dict) -> float | None:
    first = info.get("first_started_at")
    return first if isinstance(first, (int, float)) else info.get("started_at")


@dataclass(frozen=True)
class Delivery:
    """A run's delivery, built from plain values, for the composition root to hook in.

    Attributes:
        dispatcher: the ``Dispatcher`` (``dispatcher.notify`` is the engine's ``notify``).
        close: the closer: the ``notify_on`` message (``finish()``), then the drain within
            the deadline (``drain_timeout``), then the alert log it opened, if any.
        stats: the ``delivery`` section of ``et.info()``: each channel's counters and the
            channels that are off.
    """

    dispatcher: Dispatcher
    close: Callable[[], None]
    stats: Callable[[], dict[str, Any]]


def open_delivery(
    alerts_spec: Any,
    alerts_path: Any = None,
    *,
    context: Callable[[], Mapping[str, Any]] | None = None,
    finish: Callable[[], AlertMessage | None] | None = None,
    environ: Mapping[str, str] | None = None,
    **dispatcher_kwargs: Any,
) -> Delivery:
    """Build a run's delivery from plain values.

    Args:
        alerts_spec: the run's ``AlertsSpec`` (or a mapping / None, as ``build_dispatcher``).
        alerts_path: the run's ``alerts[.S][.rankN].jsonl`` path (an ``AlertLog`` is opened
            on it and closed by ``close``), an object with ``write(record)`` (the
            ``AlertLog`` the engine also writes transitions to), or None to record nothing.
        context: ``context() -> {"project", "run", "step"}`` for each message.
        finish: ``finish() -> AlertMessage | None``, called by ``close`` when alerts are
            enabled: the ``notify_on`` message (``run_end_message``).
        environ, dispatcher_kwargs: as ``build_dispatcher`` (``warner``, ``drain_timeout``,
            ``clock``, ...).

    Raises:
        ChannelConfigError: as ``build_dispatcher``.
    """
    owned = None
    if alerts_path is None:
        record = None
    elif callable(getattr(alerts_path, "write", None)):
        record = alerts_path.write
    else:
        from expr_tracker.alerts.delivery.record import AlertLog

        owned = AlertLog(alerts_path)
        record = owned.write
    d = build_dispatcher(
        alerts_spec, record=record, context=context, environ=environ, **dispatcher_kwargs
    )
    enabled = alerts_spec_of(alerts_spec).enabled

    def close() -> None:
        try:
            if enabled and finish is not None:
                message = finish()
                if message is not None:
                    d.submit(message, direct=False)
        finally:
            d.close()
            if owned is not None:
                owned.close()

    def stats() -> dict[str, Any]:
        return {"channels": d.stats(), "skipped": dict(d.skipped)}

    return Delivery(d, close, stats)


def attach_delivery(
    run: Any,
    alerts_spec: Any,
    alerts_path: Any = None,
    *,
    environ: Mapping[str, str] | None = None,
    **dispatcher_kwargs: Any,
) -> Dispatcher:
    """Build the run's delivery (``open_delivery``) and hook it into the run.

    Args:
        run: the ``Run`` (uses ``project``, ``name``, ``history.open_step``, ``warner``,
            ``exception``, ``add_closer``, ``add_stats``).
        alerts_spec, alerts_path, environ, dispatcher_kwargs: as ``open_delivery``.

    Effects: ``run.dispatcher`` is set; a closer ``"alert delivery"`` sends the
    ``notify_on`` message and drains within the deadline (``drain_timeout``, 10 s); a stats
    section ``"delivery"`` lists each channel's counters.

    Raises:
        ChannelConfigError: as ``build_dispatcher``.
    """
    spec = alerts_spec_of(alerts_spec)

    def context() -> dict[str, Any]:
        return {"project": run.project, "run": run.name, "step": _open_step(run)}

    dispatcher_kwargs.setdefault("warner", getattr(run, "warner", None))
    delivery = open_delivery(
        spec,
        alerts_path,
        context=context,
        finish=lambda: finish_message(run, spec.notify_on),
        environ=environ,
        **dispatcher_kwargs,
    )
    run.dispatcher = delivery.dispatcher
    # late: after the history and run.json are on disk, so a slow endpoint never holds them
    run.add_closer("alert delivery", delivery.close, late=True)
    run.add_stats("delivery", delivery.stats)
    return delivery.dispatcher


def _open_step(run: Any) -> Any:
    try:
        return run.history.open_step
    except Exception:  # noqa: BLE001
        return None
