"""Delivery wiring: channels and a dispatcher from an ``AlertsSpec``, and the run hooks
(``et.alert`` itself is in ``delivery.direct``).

For the runtime (``build.py`` / ``api.py``):

- ``attach_delivery(run, alerts_spec, alerts_path) -> Dispatcher``: builds the dispatcher,
  sets ``run.dispatcher``, registers the closer (``notify_on`` messages, then drain within
  the deadline) and the ``delivery`` section of ``et.info()``.
- ``dispatcher.notify``: the ``notify(event)`` callable for ``AlertEngine`` (rule events,
  routed by the rule's ``channels`` and ``tags``, always queued).
- ``alert(title, text="", level="warning", channels=None, tags=(), fields=None, **extra)``:
  ``et.alert``; never raises. With an active run it goes through the run's own dispatcher
  (its ``init(alert=...)`` configuration); on a run that does not alert (a rank outside
  ``alerts.on_rank``, or ``alerts.enabled: false``) it sends nothing and returns False.
  Without a run it uses one built from ``expr_tracker.spec.resolve()`` (environment,
  ``ET_ALERT_CONFIG``, ``ET_CONFIG``, ``configure_alert``), cached on those inputs, and
  honours that configuration's ``alerts.on_rank`` against ``RANK`` / ``LOCAL_RANK``.

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
from collections.abc import Iterable, Mapping
from typing import Any

from expr_tracker.alerts.delivery.channels import create_channel
from expr_tracker.alerts.delivery.channels.base import config_error
from expr_tracker.alerts.delivery.dispatcher import Dispatcher
from expr_tracker.alerts.delivery.message import AlertMessage, event_to_message
from expr_tracker.alerts.delivery.policy import Policy

__all__ = [
    "attach_delivery",
    "build_dispatcher",
    "event_to_message",
    "finish_message",
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


def finish_message(run: Any, notify_on: Iterable[str]) -> AlertMessage | None:
    """The built-in ``notify_on`` message for ``run`` at finish, or None.

    ``failure`` (the run ends with an exception): level error, the exception type and message,
    the traceback. ``finish``: level info on success (error when it failed and ``failure``
    is not asked for). Fields: status, steps, duration_s.
    """
    wanted = set(notify_on or ())
    if not wanted:
        return None
    exc = getattr(run, "exception", None)
    project = getattr(run, "project", "?")
    name = getattr(run, "name", "?")
    fields: dict[str, Any] = {}
    try:
        fields["steps"] = run.history.rows_committed
    except Exception:  # noqa: BLE001
        pass
    started = (getattr(run, "info_record", None) or {}).get("started_at")
    if started:
        fields["duration_s"] = round(time.time() - float(started), 1)
    if exc is not None:
        if not wanted & {"failure", "finish"}:
            return None
        etype, evalue, tb = exc
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


def _open_step(run: Any) -> Any:
    try:
        return run.history.open_step
    except Exception:  # noqa: BLE001
        return None


def attach_delivery(
    run: Any,
    alerts_spec: Any,
    alerts_path: Any = None,
    *,
    environ: Mapping[str, str] | None = None,
    **dispatcher_kwargs: Any,
) -> Dispatcher:
    """Build the run's dispatcher and hook it into the run.

    Args:
        run: the ``Run`` (uses ``project``, ``name``, ``history.open_step``, ``warner``,
            ``exception``, ``add_closer``, ``add_stats``).
        alerts_spec: the run's ``AlertsSpec``.
        alerts_path: the run's ``alerts[.S][.rankN].jsonl`` path, or an object with
            ``write(record)`` (the ``AlertLog`` the engine also writes transitions to), or
            None to record nothing.
        environ, dispatcher_kwargs: as ``build_dispatcher``.

    Effects: ``run.dispatcher`` is set; a closer ``"alert delivery"`` sends the
    ``notify_on`` message and drains within the deadline (``drain_timeout``, 10 s); a stats
    section ``"delivery"`` lists each channel's counters.

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

    def context() -> dict[str, Any]:
        return {"project": run.project, "run": run.name, "step": _open_step(run)}

    dispatcher_kwargs.setdefault("warner", getattr(run, "warner", None))
    d = build_dispatcher(
        alerts_spec, record=record, context=context, environ=environ, **dispatcher_kwargs
    )
    spec = _alerts_spec(alerts_spec)

    def close() -> None:
        try:
            if spec.enabled:
                message = finish_message(run, spec.notify_on)
                if message is not None:
                    d.submit(message, direct=False)
        finally:
            d.close()
            if owned is not None:
                owned.close()

    run.dispatcher = d
    # late: after the history and run.json are on disk, so a slow endpoint never holds them
    run.add_closer("alert delivery", close, late=True)
    run.add_stats("delivery", lambda: {"channels": d.stats(), "skipped": dict(d.skipped)})
    return d
