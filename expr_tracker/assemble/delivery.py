"""Delivery, composed: the channels, their policies and the dispatcher from an
``AlertsSpec``. Below this module, ``alerts/delivery/`` takes plain values (a channel's
fields, a ``Policy``, callables); only here does a spec become a ``Dispatcher``
(docs/architecture.md "Import direction"; a test in tests/test_import_graph.py keeps it so).

- ``build_dispatcher(alerts, *, record=, context=, environ=, ...)``: one lane per enabled
  channel, each with its policy; the console channel when none is configured.
- ``open_delivery(alerts_spec, alerts_path, ...) -> Delivery`` and
  ``attach_delivery(run, alerts_spec, alerts_path)``: a run's delivery (dispatcher, its closer
  with the ``notify_on`` message, its ``delivery`` section of ``et.info()``), from plain
  values, then hooked into the ``Run``; ``finish_message(run, notify_on)``.
- ``standalone_dispatcher()``: the process-wide dispatcher of ``et.alert`` without a run,
  resolved from ``expr_tracker.spec.resolve()``; api registers it in the leaf ``_current``
  (``_current.standalone_dispatcher``), so ``alerts/delivery/direct.py`` needs no spec.

Routing: a message goes to the channels admitting its level (``levels`` allowlist, else
``min_level``) and tags (a channel with ``tags`` takes only messages carrying one of them);
a message (or rule) naming ``channels`` goes only to those. With no channel configured,
alerts go to the console channel (not rate-limited: ``ConsoleChannel.policy_defaults``; and,
in a run, ``alerts.jsonl`` records every outcome). ``dispatcher.notify`` is the
``notify(event)`` callable for ``AlertEngine`` (rule events, routed by the rule's
``channels`` and ``tags``, always queued).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from expr_tracker import _current
from expr_tracker.alerts.delivery.channels import create_channel
from expr_tracker.alerts.delivery.channels.base import config_error
from expr_tracker.alerts.delivery.dispatcher import Dispatcher
from expr_tracker.alerts.delivery.message import AlertMessage, run_end_message
from expr_tracker.alerts.delivery.policy import Policy

__all__ = [
    "Delivery",
    "alerts_spec_of",
    "attach_delivery",
    "build_dispatcher",
    "finish_message",
    "open_delivery",
    "standalone_dispatcher",
]

log = logging.getLogger("expr_tracker.alerts")


def alerts_spec_of(alerts: Any) -> Any:
    """``alerts`` as delivery reads it: an ``AlertsSpec`` (None: the defaults; a mapping:
    validated), or the ``spec.quick.SpecView`` of a section with no channel as it is (it
    answers every field delivery reads, ``policy.model_fields_set`` included, so a run with
    rules and the console fallback starts without Pydantic: docs/architecture.md "Cold
    start")."""
    materialize = getattr(type(alerts), "materialize", None)
    if materialize is not None:  # spec.quick.SpecView
        if not alerts.channels:
            return alerts
        return materialize(alerts)  # pragma: no cover - the quick check vouches no channel
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
    given = set(spec.policy.model_fields_set)
    if channel_spec is None:  # the console fallback of a run with rules and no channel
        merged = spec.policy
    else:
        from expr_tracker.spec.models import effective_policy

        merged = effective_policy(spec, channel_spec)
        given |= set(channel_spec.policy.model_dump(exclude_unset=True))
    defaults = getattr(type(channel), "policy_defaults", None) or {}
    return Policy.from_spec(merged, **{k: v for k, v in defaults.items() if k not in given})


# --------------------------------------------------------------------------- a run's delivery


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


def _first_start(info: dict[str, Any]) -> float | None:
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
        from expr_tracker.history.alertlog import AlertLog

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


# --------------------------------------------------------------------------- run-less


_standalone: tuple[Any, Dispatcher] | None = None
#: what the standalone dispatcher was resolved from: (configure_alert values, environment
#: and file inputs, names of the variables its channels read, their values)
_standalone_inputs: tuple[Any, Any, tuple[str, ...], tuple[Any, ...]] | None = None
_standalone_lock = threading.Lock()
_ENV_NAMES: tuple[str, ...] | None = None


def _fingerprint(alerts: Any) -> str:
    def reveal(value: Any) -> Any:
        getter = getattr(value, "get_secret_value", None)
        if getter is not None:
            return getter()
        if isinstance(value, Mapping):
            return {k: reveal(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [reveal(v) for v in value]
        return value

    raw = repr(reveal(alerts.model_dump())).encode("utf-8", "replace")
    return hashlib.sha256(raw).hexdigest()


def _env_names() -> tuple[str, ...]:
    """Every variable ``resolve()`` reads; the first two name files."""
    global _ENV_NAMES
    if _ENV_NAMES is None:
        from expr_tracker.spec.sources import ALERT_CONFIG_ENV, CONFIG_ENV, WEBHOOK_ENV

        _ENV_NAMES = (ALERT_CONFIG_ENV, CONFIG_ENV) + tuple(name for name, _ in WEBHOOK_ENV)
    return _ENV_NAMES


def _file_state(path: str | None) -> Any:
    """What tells a changed configuration file: mtime, size and inode (and the working
    directory for a relative path); None without a path, "missing" when it cannot be read."""
    if not path:
        return None
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return "missing"
    where = None if os.path.isabs(path) else os.getcwd()
    return (st.st_mtime_ns, st.st_size, st.st_ino, where)


def _resolve_inputs(env: Mapping[str, str]) -> tuple[Any, ...]:
    """The environment variables and files ``resolve()`` reads for the alerts section."""
    values = tuple(env.get(name) for name in _env_names())
    return values + (_file_state(values[0]), _file_state(values[1]))


def _channel_env_names(alerts: Any) -> tuple[str, ...]:
    """Variables the channels of ``alerts`` read when built: ``url_env`` and every
    ``*_env`` option (a name, or a mapping of names such as ``headers_env``)."""
    out: list[str] = []
    for channel in alerts.channels:
        if channel.url_env:
            out.append(channel.url_env)
        for key, value in (channel.options or {}).items():
            if not str(key).endswith("_env"):
                continue
            if isinstance(value, str):
                out.append(value)
            elif isinstance(value, Mapping):
                out.extend(v for v in value.values() if isinstance(v, str))
    return tuple(dict.fromkeys(out))


def standalone_dispatcher(environ: Mapping[str, str] | None = None) -> Dispatcher:
    """The process-wide dispatcher for alerts sent without a run, built from
    ``expr_tracker.spec.resolve()`` and drained at interpreter exit.

    Resolving is not repeated while its inputs stay the same: the ``configure_alert``
    values, the webhook and ``ET_ALERT_CONFIG``/``ET_CONFIG`` variables, those files'
    mtime/size/inode, and the variables the channels read (``url_env``, ``*_env``). When one
    of them changes the spec is resolved again, and the dispatcher rebuilt when the alerts
    configuration (or a variable its channels read) differs.

    Raises:
        SpecError, ChannelConfigError: the configuration is invalid.
    """
    global _standalone, _standalone_inputs
    env = os.environ if environ is None else environ
    configured = _current.configured_alert or None
    inputs = _resolve_inputs(env)
    with _standalone_lock:
        cached, current = _standalone_inputs, _standalone
        if (
            cached is not None
            and current is not None
            and not current[1].closed
            and cached[0] is configured
            and cached[1] == inputs
            and tuple(env.get(name) for name in cached[2]) == cached[3]
        ):
            return current[1]
    from expr_tracker.spec import resolve

    alerts = resolve(configure_alert=configured, environ=environ).spec.alerts
    names = _channel_env_names(alerts)
    used = tuple(env.get(name) for name in names)
    key = (_fingerprint(alerts), used)
    old = None
    with _standalone_lock:
        if _standalone is not None and _standalone[0] == key and not _standalone[1].closed:
            d = _standalone[1]
        else:
            old = _standalone[1] if _standalone is not None else None
            d = build_dispatcher(alerts, environ=environ, at_exit=True)
            _standalone = (key, d)
        _standalone_inputs = (configured, inputs, names, used)
    if old is not None:
        old.close()
    return d
