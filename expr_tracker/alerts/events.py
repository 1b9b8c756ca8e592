"""AlertEvent: one rule transition or notification, as the engine produces it and
``alerts.jsonl`` records it (a value object; the engine builds it in ``_event``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from expr_tracker.alerts.rules import AlertRule

__all__ = ["AlertEvent"]


@dataclass(frozen=True, slots=True)
class AlertEvent:
    """One rule transition or notification.

    ``kind``: pending | firing | repeat | resolved | cancelled | disabled | removed. ``state``:
    the rule state after it (ok | pending | firing | disabled | removed). ``step`` and ``time`` (epoch
    seconds) of the row evaluated (the wall clock on the watchdog). ``title``/``message``
    are rendered; ``metrics`` maps each metric the rule reads to its latest value;
    ``notify`` says whether channels should deliver it; ``run_info`` is the engine's.
    ``episode``: the rule's firing episode (1 for its first entry into FIRING; a ``resolved``
    event carries the episode it ends); ``fires``: the rule's notifications so far, this one
    included. Together they make each notification's dedup key unique (``event_to_message``).
    ``action``: the rule's action (``stop``/``prune``) on the ``firing`` event that takes it,
    else None (docs/alerts.md "Actions").
    """

    rule: AlertRule
    kind: str
    state: str
    level: str
    step: int | None
    time: float
    title: str
    message: str
    metrics: dict = field(default_factory=dict)
    observed: str = ""
    notify: bool = False
    run_info: Mapping = field(default_factory=dict)
    episode: int = 0
    fires: int = 0
    action: str | None = None

    @property
    def name(self) -> str:
        return self.rule.name  # type: ignore[return-value]

    def to_record(self) -> dict:
        """The ``alerts.jsonl`` record (``kind: "transition"``; ``action`` only on the event
        that takes one)."""
        out = {
            "kind": "transition",
            "rule": self.rule.name,
            "event": self.kind,
            "level": self.level,
            "state": self.state,
            "step": self.step,
            "time": self.time,
            "title": self.title,
            "message": self.message,
            "notify": self.notify,
            "metrics": self.metrics,
            "tags": list(self.rule.tags),
            "channels": list(self.rule.channels) if self.rule.channels is not None else None,
        }
        if self.action is not None:
            out["action"] = self.action
        return out
