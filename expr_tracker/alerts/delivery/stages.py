"""What a lane runs on a message: the ``Item`` it carries (and the ``Ticket`` a waiting
caller holds), the policy stages, and the text of a coalesce summary.

Each stage is one small class: its settings in ``__init__``, the work in
``__call__(lane, item, now)``. A stage lets the message pass by returning, drops it by
raising ``Drop`` (the one way to drop a message), or holds it back by raising ``Hold``.
``Lane.stages`` is ``[Deduplicate(dedup), RateLimit(bucket, mode), Send()]``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from expr_tracker.alerts.delivery.message import LEVELS, AlertMessage
from expr_tracker.alerts.delivery.policy import URGENT_RANK, Dedup, TokenBucket

if TYPE_CHECKING:
    from expr_tracker.alerts.delivery.lane import Lane

__all__ = [
    "Deduplicate",
    "Drop",
    "Hold",
    "Item",
    "RateLimit",
    "Send",
    "Ticket",
    "summary_lines",
]

#: a coalesce summary lists at most this many messages, each text cut to _SUMMARY_TEXT
#: characters, and stops adding lines past _SUMMARY_CHARS (Slack's section limit is 3000)
_SUMMARY_LINES = 20
_SUMMARY_TEXT = 160
_SUMMARY_CHARS = 2500


class Ticket:
    """A caller waiting for a message's outcome on one channel.

    ``first_attempt``: the wait ends at the first attempt's outcome, or when the rate limit
    holds the message back, instead of lasting until the message is sent or given up: a
    rule alert's wait on the committing thread (``async_send: false``) is for one send,
    never for a token or a retry (retries and held messages go out later, in the
    background)."""

    __slots__ = ("event", "delivered", "detail", "first_attempt")

    def __init__(self, *, first_attempt: bool = False) -> None:
        self.event = threading.Event()
        self.delivered: bool | None = None
        self.detail = ""
        self.first_attempt = first_attempt

    def resolve(self, delivered: bool, detail: str) -> None:
        if not self.event.is_set():
            self.delivered = delivered
            self.detail = detail
            self.event.set()


class Item:
    """A message on one lane, with what the lane has learnt about it."""

    __slots__ = (
        "message",
        "tickets",
        "checked",
        "summary",
        "limited",
        "rank",
        "attempts",
        "coalesced",
        "on_console",
        "echoed",
    )

    def __init__(self, message: AlertMessage, ticket: Ticket | None = None, summary=False) -> None:
        self.message = message
        self.rank = message.rank
        self.tickets = [ticket] if ticket is not None else []
        self.checked = summary
        self.summary = summary
        self.limited = False
        self.attempts = 0  # sends started (the one in flight included)
        self.coalesced = 0  # messages a coalesce summary stands for
        self.on_console = False  # a console channel took the same message
        self.echoed = False  # shown by the console fallback already


class Drop(Exception):
    """A stage drops the message: ``counter`` is the lane counter to bump, ``detail`` the
    answer its waiters get; ``record`` False for a message that leaves no delivery record
    (a suppressed duplicate: its window's summary stands for it)."""

    def __init__(self, counter: str, detail: str, *, record: bool = True) -> None:
        super().__init__(detail)
        self.counter = counter
        self.detail = detail
        self.record = record


class Hold(Exception):
    """A stage holds the message back; the lane may work again in ``wait`` seconds."""

    def __init__(self, wait: float = 0.0) -> None:
        super().__init__(wait)
        self.wait = wait


class Deduplicate:
    """Suppress a message whose key ``dedup`` saw within its window (``Drop``); a message
    is checked once (a rate-limited one coming back is not a duplicate of itself)."""

    def __init__(self, dedup: Dedup) -> None:
        self.dedup = dedup

    def __call__(self, lane: Lane, item: Item, now: float) -> None:
        if item.checked:
            return
        item.checked = True
        if not self.dedup.admit(item.message, now):
            raise Drop("suppressed", "suppressed duplicate", record=False)


class RateLimit:
    """Take a token from ``bucket`` or apply ``mode`` (``drop``, ``queue``, ``coalesce``).

    Urgent messages (``URGENT_LEVEL`` and above) skip the coalesce buffer and may borrow a
    burst of tokens. While the lane drains, ``queue`` holds like ``coalesce`` (no token
    would come in time; what is held goes as one summary on a borrowed token)."""

    MODES = ("drop", "queue", "coalesce")

    def __init__(self, bucket: TokenBucket, mode: str) -> None:
        if mode not in self.MODES:
            raise ValueError("on_rate_limited must be drop, queue or coalesce")
        self.bucket = bucket
        self.mode = mode

    def __call__(self, lane: Lane, item: Item, now: float) -> None:
        urgent = item.rank >= URGENT_RANK
        if lane.held and self.mode == "coalesce" and not urgent:
            lane.held.append(item)
            lane.counts["rate_limited"] += 1
            raise Hold(0.0)
        borrow = self.bucket.capacity if urgent else 0.0
        if self.bucket.try_take(now, borrow):
            return
        if not item.limited:
            item.limited = True
            lane.counts["rate_limited"] += 1
        if self.mode == "drop":
            raise Drop("dropped", "dropped: rate limited")
        if self.mode == "coalesce" or lane.closing:
            lane.held.append(item)
            raise Hold(0.0)
        wait = self.bucket.wait_time(now, borrow)
        lane.push_back(item)
        raise Hold(wait)


class Send:
    """Send the message with retries (``Lane.deliver``, under the lane's ``Retry``)."""

    def __call__(self, lane: Lane, item: Item, now: float) -> None:
        lane.deliver(item)


def _shorten(text: str, limit: int) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: max(0, limit - 1)].rstrip() + "\u2026"


def summary_lines(messages: list[AlertMessage]) -> list[str]:
    """The text of a coalesce summary: one line per message, most severe first (in arrival
    order within a level): ``- [LEVEL] title (step N): text``, title cut to 100 characters and
    text to ``_SUMMARY_TEXT``; at most ``_SUMMARY_LINES`` lines and about ``_SUMMARY_CHARS``
    characters, then ``... and N more (levels)``."""
    ordered = sorted(messages, key=lambda m: -m.rank)  # stable: arrival order within a level
    lines: list[str] = []
    size = 0
    for m in ordered:
        line = f"- [{m.level.upper()}] {_shorten(m.title, 100)}"
        if m.step is not None:
            line += f" (step {m.step})"
        if m.text and m.text.strip():
            line += f": {_shorten(m.text, _SUMMARY_TEXT)}"
        if len(lines) >= _SUMMARY_LINES or (lines and size + len(line) + 1 > _SUMMARY_CHARS):
            break
        lines.append(line)
        size += len(line) + 1
    rest = ordered[len(lines) :]
    if rest:
        counts = {lvl: sum(1 for m in rest if m.level == lvl) for lvl in reversed(LEVELS)}
        detail = ", ".join(f"{n} {lvl}" for lvl, n in counts.items() if n)
        lines.append(f"... and {len(rest)} more ({detail})")
    return lines
