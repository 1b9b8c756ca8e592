"""``et.alert``: a message sent now, through the active run's dispatcher or, without a
run, a process-wide one built from ``expr_tracker.spec.resolve()`` by the composition root
(``expr_tracker.assemble.delivery.standalone_dispatcher``, which api registers in the leaf
``_current`` as ``standalone_dispatcher``: this module takes no spec).

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

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from expr_tracker import _current
from expr_tracker._warn import Warner
from expr_tracker.alerts.delivery.message import AlertMessage, normalize_level

if TYPE_CHECKING:  # imported on use: a run without rules never loads the channels
    from expr_tracker.alerts.delivery.dispatcher import Dispatcher

__all__ = ["alert", "make_message", "rank_alerts"]

log = logging.getLogger("expr_tracker.alerts")

_MESSAGE_KEYS = ("subtitle", "traceback", "mentions", "link", "dedup_key", "step", "source")

#: once per cause (a muted rank, an unusable configuration) for the run-less path
_warner = Warner(log)


def _standalone_dispatcher() -> Dispatcher:
    """The run-less dispatcher, from the factory api registers in ``_current``."""
    factory = _current.standalone_dispatcher
    if factory is None:  # api not imported: nothing can resolve a configuration
        raise RuntimeError("no run-less alert configuration (expr_tracker.api not imported)")
    return factory()


def _run_dispatcher() -> Dispatcher | str | None:
    """Where a direct alert goes while a run is active: its dispatcher; a reason (str) when
    the run does not alert (no dispatcher: a rank outside ``alerts.on_rank`` or
    ``alerts.enabled: false``); None without a live run (none, finished, or a forked child
    of a run that alerts) or once its delivery is closed."""
    run = _current.run
    if run is None or getattr(run, "finished", False):
        return None
    if getattr(run, "forked", False) and getattr(run, "alerts_deferred", False):
        return None  # as a forked child of a run whose delivery was built at its start
    d = getattr(run, "dispatcher", None)
    if d is not None:
        from expr_tracker.alerts.delivery.dispatcher import Dispatcher

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
    run: the process-wide run-less dispatcher (``_current.standalone_dispatcher()``), under
    the same rank rule: a process
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
            d = _standalone_dispatcher()
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
