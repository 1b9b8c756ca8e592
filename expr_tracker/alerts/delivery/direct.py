"""``et.alert``: a message sent now, through the active run's dispatcher or, without a
run, a process-wide one built from ``expr_tracker.spec.resolve()``.

- ``alert(title, text="", level="warning", channels=None, tags=(), fields=None, **extra)``:
  never raises. With an active run it goes through the run's own dispatcher (its
  ``init(alert=...)`` configuration); on a run that does not alert (a rank outside
  ``alerts.on_rank``, or ``alerts.enabled: false``) it sends nothing and returns False.
  Without a run it uses one built from ``expr_tracker.spec.resolve()`` (environment,
  ``ET_ALERT_CONFIG``, ``ET_CONFIG``, ``configure_alert``), cached on those inputs, and
  honours that configuration's ``alerts.on_rank`` against ``RANK`` / ``LOCAL_RANK``.
- ``make_message(...)``: the ``AlertMessage`` ``alert()`` sends (also ``et alert``).
- ``rank_alerts(on_rank, rank)``: whether a rank delivers.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from expr_tracker import _current
from expr_tracker._warn import Warner
from expr_tracker.alerts.delivery.dispatcher import Dispatcher
from expr_tracker.alerts.delivery.message import AlertMessage, normalize_level
from expr_tracker.alerts.delivery.wiring import build_dispatcher

__all__ = ["alert", "make_message", "rank_alerts", "standalone_dispatcher"]

log = logging.getLogger("expr_tracker.alerts")

_MESSAGE_KEYS = ("subtitle", "traceback", "mentions", "link", "dedup_key", "step", "source")

_standalone: tuple[Any, Dispatcher] | None = None
#: what the standalone dispatcher was resolved from: (configure_alert values, environment
#: and file inputs, names of the variables its channels read, their values)
_standalone_inputs: tuple[Any, Any, tuple[str, ...], tuple[Any, ...]] | None = None
_standalone_lock = threading.Lock()
#: once per cause (a muted rank, an unusable configuration) for the run-less path
_warner = Warner(log)
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


def _run_dispatcher() -> Dispatcher | str | None:
    """Where a direct alert goes while a run is active: its dispatcher; a reason (str) when
    the run does not alert (no dispatcher: a rank outside ``alerts.on_rank`` or
    ``alerts.enabled: false``); None without a live run (none, finished, or a forked child
    of a run that alerts) or once its delivery is closed."""
    run = _current.run
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
    from expr_tracker.alerts.delivery.message import LEVELS

    if lvl not in LEVELS:
        _warner.warn(
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
            _warner.warn(
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
                _warner.warn(
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
        _warner.warn(
            f"alert:{type(exc).__name__}",
            "expr_tracker: et.alert() could not send (%s: %s)",
            type(exc).__name__,
            str(exc)[:300],
        )
        return False
