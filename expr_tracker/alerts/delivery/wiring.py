"""Delivery wiring: channels and a dispatcher from an ``AlertsSpec``, and the run hooks
(``et.alert`` itself is in ``delivery.direct``).

For the runtime (``build.py``):

- ``open_delivery(alerts_spec, alerts_path, context=, finish=, ...) -> Delivery``: from
  plain values, the dispatcher, its closer (the ``notify_on`` message, then the drain
  within the deadline) and its ``delivery`` section of ``et.info()``.
- ``attach_delivery(run, alerts_spec, alerts_path) -> Dispatcher``: the small wiring that
  hooks a ``Delivery`` into a ``Run`` (``run.dispatcher``, the closer, the stats).
- ``dispatcher.notify``: the ``notify(event)`` callable for ``AlertEngine`` (rule events,
  routed by the rule's ``channels`` and ``tags``, always queued).

Routing: a message goes to the channels admitting its level (``levels`` allowlist, else
``min_level``) and tags (a channel with ``tags`` takes only messages carrying one of them);
a message (or rule) naming ``channels`` goes only to those. With no channel configured,
alerts go to the console channel (not rate-limited: ``ConsoleChannel.policy_defaults``; and,
in a run, ``alerts.jsonl`` records every outcome).
"""

from __future__ import annotations

import logging
import os
import time
import traceback as _traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from expr_tracker.alerts.delivery.channels import create_channel
from expr_tracker.alerts.delivery.channels.base import config_error
from expr_tracker.alerts.delivery.dispatcher import Dispatcher
from expr_tracker.alerts.delivery.message import AlertMessage, event_to_message
from expr_tracker.alerts.delivery.policy import Policy

__all__ = [
    "Delivery",
    "attach_delivery",
    "build_dispatcher",
    "event_to_message",
    "finish_message",
    "open_delivery",
    "run_end_message",
]

log = logging.getLogger("expr_tracker.alerts")


def _alerts_spec(alerts: Any) -> Any:
    from expr_tracker.spec.models import AlertsSpec

    if alerts is None:
        return AlertsSpec()
    if isinstance(alerts, AlertsSpec):
        return alerts
    if isinstance(alerts, Mapping):
        return AlertsSpec.model_validate(dict(alerts))
    raise TypeError(f"alerts must be an AlertsSpec, a mapping or None, not {type(alerts).__name__}")


def build_dispatcher(
    alerts: Any = None,
    *,
    record: Any = None,
    context: Any = None,
    environ: Mapping[str, str] | None = None,
    console_fallback: bool = True,
    **dispatcher_kwargs: Any,
) -> Dispatcher:
    """A dispatcher with one lane per enabled channel of ``alerts``.

    Args:
        alerts: an ``AlertsSpec``, a mapping validated as one, or None (defaults).
        record: ``record(dict)`` for delivery outcomes (``AlertLog.write``).
        context: ``context() -> {"project", "run", "step"}``.
        environ: where ``url_env`` and ``*_env`` options are read (default ``os.environ``).
        console_fallback: with no channel configured (or every one off), add a ``console``
            channel.
        **dispatcher_kwargs: ``Dispatcher`` arguments (clock, sleep, random, start, ...).

    Returns:
        The dispatcher (threads started unless ``start=False``). ``alerts.enabled: false``
        gives one with no channels. A channel whose ``url_env`` variable is unset (and no
        ``url``) is skipped with one info line: that is how an example channel stays off until
        its variable is set.

    Raises:
        ChannelConfigError: an unknown type or invalid options (with the
            ``alerts.channels.<name>`` path), raised before any thread starts.
        pydantic.ValidationError: ``alerts`` given as an invalid mapping.
    """
    spec = _alerts_spec(alerts)
    env = os.environ if environ is None else environ
    lanes: list[tuple[Any, Policy, Any]] = []
    skipped: dict[str, str] = {}
    if spec.enabled:
        for channel_spec in spec.channels:
            if not channel_spec.enabled:
                skipped[channel_spec.name] = "disabled"
                continue
            if channel_spec.url_env and channel_spec.url is None:
                value = env.get(channel_spec.url_env)
                if not value or not value.strip():
                    skipped[channel_spec.name] = f"{channel_spec.url_env} is not set"
                    # expected, not a fault: that is how a checked-in channel stays off
                    log.info(
                        "expr_tracker: alert channel %s is off: environment variable %s is not set",
                        channel_spec.name,
                        channel_spec.url_env,
                    )
                    continue
            channel = create_channel(channel_spec, env)
            try:
                policy = _channel_policy(spec, channel, channel_spec)
            except ValueError as exc:
                raise config_error(channel_spec.name, "policy", str(exc)) from None
            lanes.append((channel, policy, channel_spec))
    d = Dispatcher(record=record, context=context, **dispatcher_kwargs)
    d.skipped = skipped
    d.on_rank = spec.on_rank
    for channel, policy, cs in lanes:
        d.add_channel(
            channel,
            policy=policy,
            enabled=True,
            min_level=cs.min_level,
            levels=cs.levels,
            tags=cs.tags,
        )
    if spec.enabled and not lanes and console_fallback:  # nothing configured, or all off
        from expr_tracker.alerts.delivery.channels.console import ConsoleChannel

        console = ConsoleChannel("console")
        d.add_channel(console, policy=_channel_policy(spec, console))
    return d


def _channel_policy(spec: Any, channel: Any, channel_spec: Any = None) -> Policy:
    """The channel's ``Policy``: ``alerts.policy`` with the channel's overrides on top, and the
    channel type's ``policy_defaults`` for every field neither of them sets (the console
    channel: no rate limit)."""
    from expr_tracker.spec.models import effective_policy

    given = set(spec.policy.model_fields_set)
    if channel_spec is None:
        merged = spec.policy
    else:
        merged = effective_policy(spec, channel_spec)
        given |= set(channel_spec.policy.model_dump(exclude_unset=True))
    defaults = getattr(type(channel), "policy_defaults", None) or {}
    return Policy.from_spec(merged, **{k: v for k, v in defaults.items() if k not in given})


# --------------------------------------------------------------------------- run hooks


def run_end_message(
    notify_on: Iterable[str],
    *,
    project: Any = "?",
    name: Any = "?",
    exception: Any = None,
    steps: int | None = None,
    started_at: float | None = None,
) -> AlertMessage | None:
    """The built-in ``notify_on`` message for a run ending, or None.

    ``exception``: the ``(type, value, traceback)`` the run failed with, or None.
    ``failure`` (it failed): level error, the exception type and message, the traceback.
    ``finish``: level info on success (error when it failed and ``failure`` is not asked
    for). Fields: status, steps (``steps``, rows committed), duration_s (from ``started_at``,
    epoch seconds).
    """
    wanted = set(notify_on or ())
    if not wanted:
        return None
    fields: dict[str, Any] = {}
    if steps is not None:
        fields["steps"] = steps
    if started_at:
        fields["duration_s"] = round(time.time() - float(started_at), 1)
    if exception is not None:
        if not wanted & {"failure", "finish"}:
            return None
        etype, evalue, tb = exception
        text = "".join(_traceback.format_exception(etype, evalue, tb))
        fields = {"status": "failed", **fields}
        return AlertMessage(
            title=f"Run {project}/{name} failed: {etype.__name__}",
            text=str(evalue)[:2000],
            level="error",
            traceback=text[-8000:] if "failure" in wanted else None,
            fields=fields,
            source="failure",
            dedup_key=f"run-end:{project}/{name}",
        )
    if "finish" not in wanted:
        return None
    return AlertMessage(
        title=f"Run {project}/{name} finished",
        level="info",
        fields={"status": "finished", **fields},
        source="finish",
        dedup_key=f"run-end:{project}/{name}",
    )


def finish_message(run: Any, notify_on: Iterable[str]) -> AlertMessage | None:
    """``run_end_message`` for ``run`` (its ``project``, ``name``, ``exception``,
    ``history.rows_committed`` and ``info_record["started_at"]``, each when present)."""
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
        started_at=(getattr(run, "info_record", None) or {}).get("started_at"),
    )


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
    enabled = _alerts_spec(alerts_spec).enabled

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
    """Build the run's delivery (``open_delivery``) and hook it into the run: the small
    wiring left here until the composition root (``build``) does it.

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
    spec = _alerts_spec(alerts_spec)

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
