"""AlertMessage: what a channel is handed, and the helpers channels share to render it.

Levels are the table of ``expr_tracker.units``: debug < info < warning < error < critical,
aliases warn/err/fatal/crit; ``AlertMessage.level`` is an :class:`~expr_tracker.units.AlertLevel`
(a ``str`` equal to the level's name, compared by severity).

``safe_format(template, values)`` fills ``{name}`` placeholders by literal key only (no
attribute or index access), for channel templates. Secret scrubbing (``redact_url``,
``scrub``) lives in ``delivery.scrub``. ``run_end_message(notify_on, ...)``: the built-in
``notify_on`` message of a run's end, from plain values.
"""

from __future__ import annotations

import hashlib
import time
import traceback as _traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from expr_tracker.alerts.template import render_template
from expr_tracker.history.values import format_value, json_safe
from expr_tracker.units import LEVELS, AlertLevel, level_rank, normalize_level

__all__ = [
    "LEVELS",
    "AlertMessage",
    "event_to_message",
    "level_rank",
    "normalize_level",
    "run_end_message",
    "safe_format",
]


@dataclass(slots=True)
class AlertMessage:
    """One alert to deliver.

    Attributes:
        title: one line.
        text: the body (plain text; channels escape it for HTML/markdown).
        level: an :class:`~expr_tracker.units.AlertLevel` (``et.AlertLevel``), made from the
            level or alias given in any case; it equals its name (``message.level ==
            "critical"``) and compares by severity (``message.level >= "error"``). An unknown
            level raises ``ValueError`` at construction.
        subtitle: a second line under the title ("" for none).
        traceback: formatted traceback text, for failure messages.
        fields: name -> value shown as a table; the dispatcher adds ``project``, ``run`` and
            ``step`` when it knows them.
        tags: routing tags (a channel with ``tags`` admits a message carrying one of them).
        mentions: user ids / phone numbers / e-mail addresses to mention where supported.
        link: a URL shown as a button or link.
        source: who raised it: ``"alert"`` (et.alert), ``"rule:<name>"``, ``"finish"``,
            ``"failure"``, ``"test"``, ``"summary"``.
        dedup_key: identity for duplicate suppression (default: level, title and text).
        timestamp: epoch seconds (display only).
        channels: channel names this message is restricted to (None: route by level/tags).
        step: the training step it refers to, or None.
        rule: the rule name, for rule alerts.
    """

    title: str
    text: str = ""
    level: AlertLevel = AlertLevel.WARNING
    subtitle: str = ""
    traceback: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    tags: tuple[str, ...] = ()
    mentions: tuple[str, ...] = ()
    link: str | None = None
    source: str = "alert"
    dedup_key: str | None = None
    timestamp: float = field(default_factory=time.time)
    channels: tuple[str, ...] | None = None
    step: int | None = None
    rule: str | None = None

    def __post_init__(self) -> None:
        self.level = AlertLevel.parse(self.level)  # ValueError naming the valid levels
        self.title = str(self.title)
        self.text = "" if self.text is None else str(self.text)
        self.tags = tuple(str(t) for t in (self.tags or ()))
        self.mentions = tuple(str(m) for m in (self.mentions or ()))
        if self.channels is not None:
            if isinstance(self.channels, str):
                self.channels = (self.channels,)
            self.channels = tuple(str(c) for c in self.channels)
        self.fields = dict(self.fields or {})

    @property
    def rank(self) -> int:
        """Severity: debug 0 ... critical 4."""
        return self.level.rank

    def key(self) -> str:
        """The dedup identity: ``dedup_key``, else a hash of level, title and text."""
        if self.dedup_key:
            return self.dedup_key
        raw = "\x1f".join((self.level.value, self.title, self.text)).encode("utf-8", "replace")
        return hashlib.sha1(raw).hexdigest()

    def copy(self, **changes: Any) -> AlertMessage:
        """A copy with ``changes`` applied (fields and tags copied)."""
        if "fields" not in changes:
            changes["fields"] = dict(self.fields)
        return replace(self, **changes)

    def values(self) -> dict[str, Any]:
        """Flat values for templates: every attribute plus each field by name
        (attributes win), ``tags``/``mentions`` joined with ", " and ``LEVEL`` upper-case."""
        out: dict[str, Any] = {}
        for key, value in self.fields.items():
            if value is None or isinstance(value, (bool, int, float, str)):
                out[str(key)] = value
        out.update(
            title=self.title,
            text=self.text,
            level=self.level.value,
            LEVEL=self.level.value.upper(),
            subtitle=self.subtitle,
            traceback=self.traceback or "",
            tags=", ".join(self.tags),
            mentions=", ".join(self.mentions),
            link=self.link or "",
            source=self.source,
            timestamp=self.timestamp,
            time=time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.timestamp)),
            step=self.step,
            rule=self.rule or "",
        )
        return out

    def plain_text(self, *, traceback_chars: int = 4000) -> str:
        """The whole message as plain text: level and title, subtitle, text, fields, tags,
        link and (the tail of) the traceback."""
        lines = [f"[{self.level.value.upper()}] {self.title}"]
        if self.subtitle:
            lines.append(self.subtitle)
        if self.text:
            lines.append(self.text)
        if self.fields:
            lines.append("")
            lines.extend(f"{k}: {format_value(v)}" for k, v in self.fields.items())
        if self.tags:
            lines.append("tags: " + ", ".join(self.tags))
        if self.link:
            lines.append(self.link)
        if self.traceback:
            lines.append("")
            lines.append(self.traceback[-traceback_chars:])
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of every attribute (the generic webhook's default body)."""
        return {
            "title": self.title,
            "text": self.text,
            "level": self.level.value,
            "subtitle": self.subtitle,
            "traceback": self.traceback,
            "fields": {str(k): _jsonable(v) for k, v in self.fields.items()},
            "tags": list(self.tags),
            "mentions": list(self.mentions),
            "link": self.link,
            "source": self.source,
            "dedup_key": self.dedup_key,
            "timestamp": self.timestamp,
            "step": self.step,
            "rule": self.rule,
        }


def _jsonable(value: Any) -> Any:
    """A field's value as strict JSON: NaN/±inf as ``"NaN"``/``"Infinity"``/``"-Infinity"``
    (the one non-finite helper, history/values.py), anything JSON cannot hold as its text."""
    if value is None or isinstance(value, (bool, int, str, float)):
        return json_safe(value, "string")
    return str(value)


def safe_format(template: str, values: Mapping[str, Any]) -> str:
    """:func:`~expr_tracker.alerts.template.render_template` with None reading as empty
    (a webhook body or a card shows nothing for a missing field)."""
    return render_template(template, values, none="")


def event_to_message(event: Any) -> AlertMessage:
    """An ``AlertMessage`` for a rule event: ``AlertEvent`` from ``alerts.engine``, or any
    object with ``rule`` (a name or an object with ``name``/``channels``/``tags``), ``level``,
    ``title``, ``message`` and ``step`` attributes (``kind``, ``metrics``, ``observed``,
    ``run_info``, ``episode``, ``fires`` optional).

    Dedup key: ``rule:<name>:<episode>:<kind>:<level>``, plus ``:<fires>`` for a level-mode
    ``repeat``. The rule's state machine (mode, ``cooldown``, ``max_fires``) already decides
    when it notifies, so the channel's ``dedup_window`` must not second-guess it: a new firing
    episode (fire -> resolve -> fire) and each level-mode repeat get a key of their own and
    are never suppressed as duplicates of earlier notifications (the rate limit still
    applies). An event without ``episode`` keeps ``rule:<name>:<kind>:<level>``."""
    rule = getattr(event, "rule", None)
    if isinstance(rule, str) or rule is None:
        rule_name = rule
        channels = getattr(event, "channels", None)
        tags = getattr(event, "tags", ()) or ()
    else:
        rule_name = getattr(rule, "name", None)
        channels = getattr(rule, "channels", None)
        tags = getattr(rule, "tags", ()) or ()
    level = getattr(event, "level", None) or getattr(rule, "level", None) or "warning"
    kind = getattr(event, "kind", None) or "firing"
    title = getattr(event, "title", None) or rule_name or "alert"
    fields_: dict[str, Any] = {}
    run_info = getattr(event, "run_info", None) or {}
    if isinstance(run_info, Mapping):
        for key in ("project", "run"):
            if run_info.get(key) is not None:
                fields_[key] = run_info[key]
    metrics = getattr(event, "metrics", None) or {}
    if isinstance(metrics, Mapping):
        fields_.update({str(k): v for k, v in metrics.items()})
    observed = getattr(event, "observed", "") or ""
    subtitle = f"{kind}: {observed}" if observed else ("" if kind == "firing" else kind)
    return AlertMessage(
        title=str(title),
        text=str(getattr(event, "message", "") or ""),
        level=AlertLevel.parse(str(level)),
        subtitle=subtitle,
        fields=fields_,
        tags=tuple(tags),
        source=f"rule:{rule_name}" if rule_name else "rule",
        dedup_key=_rule_dedup_key(event, rule_name, kind, level),
        channels=tuple(channels) if channels is not None else None,
        step=getattr(event, "step", None),
        rule=rule_name,
    )


def _rule_dedup_key(event: Any, rule_name: Any, kind: str, level: Any) -> str:
    episode = getattr(event, "episode", None)
    if episode is None:
        return f"rule:{rule_name}:{kind}:{level}"
    key = f"rule:{rule_name}:{episode}:{kind}:{level}"
    if kind == "repeat":
        key += f":{getattr(event, 'fires', None)}"
    return key


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
            level=AlertLevel.ERROR,
            traceback=text[-8000:] if "failure" in wanted else None,
            fields=fields,
            source="failure",
            dedup_key=f"run-end:{project}/{name}",
        )
    if "finish" not in wanted:
        return None
    return AlertMessage(
        title=f"Run {project}/{name} finished",
        level=AlertLevel.INFO,
        fields={"status": "finished", **fields},
        source="finish",
        dedup_key=f"run-end:{project}/{name}",
    )
