"""Delivery wiring: channels and a dispatcher from an ``AlertsSpec``, the run hooks, and the
public ``alert()``.

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

import hashlib
import logging
import os
import threading
import time
import traceback as _traceback
from collections.abc import Iterable, Mapping
from typing import Any

from expr_tracker.alerts.channels import create_channel
from expr_tracker.alerts.channels.base import config_error
from expr_tracker.alerts.dispatch import Dispatcher, Policy, event_to_message
from expr_tracker.alerts.message import AlertMessage, normalize_level

__all__ = [
    "alert",
    "attach_delivery",
    "build_dispatcher",
    "event_to_message",
    "finish_message",
    "standalone_dispatcher",
]

log = logging.getLogger("expr_tracker.alerts")

_MESSAGE_KEYS = ("subtitle", "traceback", "mentions", "link", "dedup_key", "step", "source")


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
        from expr_tracker.alerts.channels.console import ConsoleChannel

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
        from expr_tracker.alerts.record import AlertLog

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


# --------------------------------------------------------------------------- et.alert

_standalone: tuple[Any, Dispatcher] | None = None
#: what the standalone dispatcher was resolved from: (configure_alert values, environment
#: and file inputs, names of the variables its channels read, their values)
_standalone_inputs: tuple[Any, Any, tuple[str, ...], tuple[Any, ...]] | None = None
_standalone_lock = threading.Lock()
_warned: set[str] = set()
_ENV_NAMES: tuple[str, ...] | None = None


def _warn_once(key: str, message: str, *args: Any, level: int = logging.WARNING) -> None:
    if key not in _warned:
        _warned.add(key)
        log.log(level, message, *args)


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


def _configured_alert() -> Any:
    try:
        from expr_tracker import api

        return getattr(api, "_configured_alert", None) or None
    except Exception:  # noqa: BLE001
        return None


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
    configured = _configured_alert()
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


def _run_dispatcher() -> Dispatcher | str | None:
    """Where a direct alert goes while a run is active: its dispatcher; a reason (str) when
    the run does not alert (no dispatcher: a rank outside ``alerts.on_rank`` or
    ``alerts.enabled: false``); None without a live run (none, finished, or a forked child
    of a run that alerts) or once its delivery is closed."""
    try:
        from expr_tracker import api

        run = api.get_run()
    except Exception:  # noqa: BLE001
        return None
    if run is None or getattr(run, "finished", False):
        return None
    d = getattr(run, "dispatcher", None)
    if isinstance(d, Dispatcher):
        if getattr(run, "forked", False) or d.closed:
            return None
        return d
    engine = getattr(run, "alerts", None)
    if engine is None:
        return "alerts are disabled for this run (alerts.enabled: false)"
    if not getattr(engine, "deliver", True):
        return f"rank {getattr(run, 'rank', '?')} does not alert (alerts.on_rank)"
    return None


def rank_alerts(on_rank: Any, rank: int) -> bool:
    """Whether a process of ``rank`` delivers alerts under ``alerts.on_rank`` (a rank, a
    list of ranks, or ``"all"``)."""
    if on_rank == "all":
        return True
    if isinstance(on_rank, (list, tuple)):
        return rank in on_rank
    return rank == on_rank


def _rank_muted(d: Dispatcher, environ: Mapping[str, str] | None = None) -> str | None:
    """Why a run-less alert from this process is not sent (its ``RANK`` / ``LOCAL_RANK`` is
    outside the resolved ``alerts.on_rank``), or None when it is."""
    from expr_tracker.history.paths import detect_rank

    rank = detect_rank(environ)
    if rank_alerts(d.on_rank, rank):
        return None
    return f"rank {rank} does not alert (alerts.on_rank: {d.on_rank!r})"


def make_message(
    title: Any,
    text: Any = "",
    level: Any = "warning",
    channels: Any = None,
    tags: Any = (),
    fields: Mapping[str, Any] | None = None,
    **extra: Any,
) -> AlertMessage:
    """The ``AlertMessage`` ``alert()`` sends. ``backends=`` is the old name of ``channels``;
    ``subtitle``, ``traceback``, ``mentions``, ``link``, ``dedup_key``, ``step`` and
    ``source`` set those attributes; any other keyword becomes a field. An unknown level is
    warned about once and sent as ``warning``."""
    if channels is None and "backends" in extra:
        channels = extra.pop("backends")
    else:
        extra.pop("backends", None)
    attrs = {k: extra.pop(k) for k in _MESSAGE_KEYS if k in extra}
    all_fields = dict(fields or {})
    all_fields.update(extra)
    lvl = normalize_level(level)
    from expr_tracker.alerts.message import LEVELS

    if lvl not in LEVELS:
        _warn_once(
            f"level:{lvl}",
            "expr_tracker: alert level %r is not one of %s; sent as 'warning'",
            level,
            ", ".join(LEVELS),
        )
        lvl = "warning"
    if isinstance(tags, str):
        tags = (tags,)
    if isinstance(attrs.get("mentions"), str):
        attrs["mentions"] = (attrs["mentions"],)
    return AlertMessage(
        title=str(title),
        text="" if text is None else str(text),
        level=lvl,
        channels=channels,
        tags=tuple(tags or ()),
        fields=all_fields,
        **attrs,
    )


def alert(
    title: str,
    text: str = "",
    level: str = "warning",
    channels: Iterable[str] | str | None = None,
    tags: Iterable[str] = (),
    fields: Mapping[str, Any] | None = None,
    **extra: Any,
) -> bool:
    """Send an alert now (``et.alert``). Never raises.

    Args:
        title: one line. text: the body. level: debug|info|warning|error|critical or an
        alias. channels: names (or types) of the channels to use; None routes by level and
        tags. tags: routing tags. fields: name -> value shown as a table.
        **extra: ``subtitle``, ``traceback``, ``mentions``, ``link``, ``dedup_key``,
            ``step``, ``source``; ``backends`` (old name of ``channels``); anything else is
            added to ``fields``.

    With an active run the message goes through the run's own dispatcher (the channels of
    its ``init(alert=...)`` configuration). A run that does not alert, because its rank is
    outside ``alerts.on_rank`` (one incident must not be delivered once per rank) or its
    alerts are disabled, sends nothing (logged once at info) and returns False. Without a
    run: the dispatcher of ``standalone_dispatcher()``, under the same rank rule: a process
    whose ``RANK`` (else ``LOCAL_RANK``) is outside the resolved ``alerts.on_rank`` (default
    0) sends nothing and returns False. (``et alert`` on the CLI does not consult the rank.)

    Returns:
        True when some channel took the message (with ``async_send: false``: when some
        channel delivered it); False when none did, the run does not alert, or something
        went wrong (logged once).
    """
    try:
        message = make_message(title, text, level, channels, tags, fields, **extra)
        target = _run_dispatcher()
        if isinstance(target, str):
            _warn_once(
                f"muted:{target}",
                "expr_tracker: et.alert() sends nothing: %s",
                target,
                level=logging.INFO,
            )
            return False
        if target is None:
            d = standalone_dispatcher()
            muted = _rank_muted(d)
            if muted is not None:
                _warn_once(
                    f"muted:{muted}",
                    "expr_tracker: et.alert() sends nothing: %s",
                    muted,
                    level=logging.INFO,
                )
                return False
        else:
            d = target
        return d.submit(message, direct=True).ok
    except Exception as exc:  # noqa: BLE001 - et.alert() never raises
        _warn_once(
            f"alert:{type(exc).__name__}",
            "expr_tracker: et.alert() could not send (%s: %s)",
            type(exc).__name__,
            str(exc)[:300],
        )
        return False
