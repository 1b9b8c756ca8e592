"""Delivery wiring: channels and a dispatcher from an ``AlertsSpec`` (``build_dispatcher``)
and the ``notify_on`` message of a run's end (``run_end_message``), from plain values.
A run's delivery is hooked in by ``expr_tracker.assemble.alerts`` (``open_delivery``,
``attach_delivery``); ``et.alert`` itself is in ``delivery.direct``.

``dispatcher.notify`` is the ``notify(event)`` callable for ``AlertEngine`` (rule events,
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
from collections.abc import Iterable, Mapping
from typing import Any

from expr_tracker.alerts.delivery.channels import create_channel
from expr_tracker.alerts.delivery.channels.base import config_error
from expr_tracker.alerts.delivery.dispatcher import Dispatcher
from expr_tracker.alerts.delivery.message import AlertMessage, event_to_message
from expr_tracker.alerts.delivery.policy import Policy

__all__ = ["alerts_spec_of", "build_dispatcher", "event_to_message", "run_end_message"]

log = logging.getLogger("expr_tracker.alerts")


def alerts_spec_of(alerts: Any) -> Any:
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
    spec = alerts_spec_of(alerts)
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
