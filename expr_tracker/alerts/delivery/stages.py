"""What a lane runs on a message: the ``Item`` it carries (and the ``Ticket`` a waiting
caller holds), the verdicts, and the stages (docs/channels.md "Policy").

A stage is one small class: its settings and the state it owns in ``__init__``, the work in
``__call__(item, now) -> Verdict`` (``now``: the lane's clock when it took the message).
The verdict says what becomes of the message; the lane (``delivery.lane``) applies it:

- ``PASS``: on to the next stage; a message every stage passed has been sent;
- ``Hold(wait, detail)``: not now. The lane puts it back at the front of its queue and
  looks again in ``wait`` seconds, or, with ``kept``, the stage keeps it (the coalesce
  buffer) and hands it back later, folded into a summary;
- ``Drop(counter, detail)``: the message ends here, counted and recorded undelivered (a
  suppressed duplicate leaves no record); ``Failed``, a ``Drop``, is a send given up:
  also warned about and shown by the console fallback.

``Lane.stages`` is ``[Deduplicate(dedup), RateLimit(bucket, mode), Retry(channel, rule)]``,
read as Alertmanager's notifier reads: dedup, wait, retry (which sends). A stage counts
what it does itself (``retries``, ``rate_limited``, ``coalesced``, in the lane's ``counts``
handed to it); the lane counts and records each message's outcome. Nothing here imports
the lane: it is handed plain values and callables.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from expr_tracker.alerts.delivery.channels.base import DeliveryError, SendResult, excerpt
from expr_tracker.alerts.delivery.message import LEVELS, AlertMessage
from expr_tracker.alerts.delivery.policy import URGENT_RANK, Dedup, RetryRule, TokenBucket

__all__ = [
    "PASS",
    "Deduplicate",
    "Drop",
    "Failed",
    "Hold",
    "Item",
    "Pass",
    "RateLimit",
    "Retry",
    "Stage",
    "Ticket",
    "Verdict",
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
    """A message on one lane, with what the stages have learnt about it."""

    __slots__ = (
        "message",
        "tickets",
        "checked",
        "summary",
        "limited",
        "has_token",
        "rank",
        "attempts",
        "status",
        "answer",
        "coalesced",
        "on_console",
        "echoed",
    )

    def __init__(self, message: AlertMessage, ticket: Ticket | None = None, summary=False) -> None:
        self.message = message
        self.rank = message.rank
        self.tickets = [ticket] if ticket is not None else []
        self.checked = summary  # seen by Deduplicate (a summary is never a duplicate)
        self.summary = summary
        self.limited = False  # counted rate-limited once
        self.has_token = False  # RateLimit took its token already (what it held, released)
        self.attempts = 0  # sends started (the one in flight included)
        self.status: int | None = None  # the endpoint's status of the last attempt
        self.answer = ""  # what the endpoint answered when it took the message
        self.coalesced = 0  # messages a coalesce summary stands for
        self.on_console = False  # a console channel took the same message
        self.echoed = False  # shown by the console fallback already


# ---------------------------------------------------------------------------- verdicts


class Pass:
    """The message goes on to the next stage (``PASS``, the one instance)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "PASS"


PASS = Pass()


class Hold:
    """Not now: the lane may look again in ``wait`` seconds. ``kept``: the stage keeps the
    message (and hands it back later); otherwise the lane puts it back at the front of its
    queue. ``detail`` is what a caller waiting for the first attempt's outcome is told
    (the wait ends here: the message goes later, in the background)."""

    __slots__ = ("wait", "detail", "kept")

    def __init__(self, wait: float, detail: str, *, kept: bool = False) -> None:
        self.wait = wait
        self.detail = detail
        self.kept = kept

    def __repr__(self) -> str:
        return f"Hold({self.wait!r}, {self.detail!r}, kept={self.kept})"


class Drop:
    """The message ends here: ``counter`` is the lane counter to bump, ``detail`` the
    answer its waiters get and its record's error; ``record`` False for a message that
    leaves no delivery record (a suppressed duplicate: its window's summary stands for
    it). The one way to drop a message."""

    __slots__ = ("counter", "detail", "record")

    def __init__(self, counter: str, detail: str, *, record: bool = True) -> None:
        self.counter = counter
        self.detail = detail
        self.record = record

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.counter!r}, {self.detail!r})"


class Failed(Drop):
    """The send gave up (``failed``): ``reason`` the cause (warned about once per cause),
    ``detail`` the error recorded and shown by the console fallback, ``status`` the
    endpoint's last HTTP status."""

    __slots__ = ("reason", "status")

    def __init__(self, reason: str, detail: str, status: int | None = None) -> None:
        super().__init__("failed", detail)
        self.reason = reason
        self.status = status


Verdict = Pass | Hold | Drop
#: what ``Lane.stages`` holds: ``stage(item, now) -> Verdict``
Stage = Callable[[Item, float], Verdict]


# ---------------------------------------------------------------------------- stages


class Deduplicate:
    """Suppress a message whose key ``dedup`` saw within its window (``Drop``, no record);
    a message is checked once (a rate-limited one coming back is not a duplicate of
    itself). The lane sends the windows' ``(+N suppressed)`` summaries (``Dedup.expired``)."""

    def __init__(self, dedup: Dedup) -> None:
        self.dedup = dedup

    def __call__(self, item: Item, now: float) -> Verdict:
        if item.checked:
            return PASS
        item.checked = True
        if not self.dedup.admit(item.message, now):
            return Drop("suppressed", "suppressed duplicate", record=False)
        return PASS


class RateLimit:
    """Take a token from ``bucket`` or apply ``mode`` (``drop``, ``queue``, ``coalesce``);
    owns the coalesce buffer (``held``).

    Urgent messages (``URGENT_LEVEL`` and above) skip the coalesce buffer and may borrow a
    burst of tokens. ``draining`` (set by the lane's drain): ``queue`` holds like
    ``coalesce``, since no token would come in time. ``release(now)`` hands back what is
    held as one item once a token is there (at the drain, at once, on a borrowed token);
    ``counts``: the lane's counters (``rate_limited``, ``coalesced``)."""

    MODES = ("drop", "queue", "coalesce")
    HELD = "held back by the rate limit (sent when a token returns)"

    def __init__(self, bucket: TokenBucket, mode: str, counts: dict[str, int]) -> None:
        if mode not in self.MODES:
            raise ValueError("on_rate_limited must be drop, queue or coalesce")
        self.bucket = bucket
        self.mode = mode
        self.counts = counts
        self.held: list[Item] = []
        self.draining = False

    def __call__(self, item: Item, now: float) -> Verdict:
        if item.has_token:
            return PASS
        urgent = item.rank >= URGENT_RANK
        if self.held and self.mode == "coalesce" and not urgent:
            self.held.append(item)
            self.counts["rate_limited"] += 1
            return Hold(0.0, self.HELD, kept=True)
        borrow = self.bucket.capacity if urgent else 0.0
        if self.bucket.try_take(now, borrow):
            return PASS
        if not item.limited:
            item.limited = True
            self.counts["rate_limited"] += 1
        if self.mode == "drop":
            return Drop("dropped", "dropped: rate limited")
        if self.mode == "coalesce" or self.draining:
            self.held.append(item)
            return Hold(0.0, self.HELD, kept=True)
        return Hold(self.bucket.wait_time(now, borrow), self.HELD)

    def _borrow(self) -> float:
        """An urgent message held may borrow, like the urgent message it is."""
        return self.bucket.capacity if max(h.rank for h in self.held) >= URGENT_RANK else 0.0

    def wait(self, now: float) -> float | None:
        """Seconds until ``release`` has a token (None: nothing is held)."""
        if not self.held:
            return None
        return self.bucket.wait_time(now, self._borrow())

    def release(self, now: float, *, last: bool = False) -> Item | None:
        """What is held, as one item that has its token (a summary when more than one),
        once a token is there; with ``last`` (the drain, the last chance) at once, on a
        borrowed token. None: nothing is held, or no token yet."""
        if not self.held:
            return None
        if last:
            self.bucket.take_anyway(now)
        elif not self.bucket.try_take(now, self._borrow()):
            return None
        held, self.held = self.held, []
        if len(held) == 1:
            item = held[0]
        else:
            item = Item(_summary(held), summary=True)
            item.on_console = any(h.on_console for h in held)
            item.tickets = [t for h in held for t in h.tickets]
            item.coalesced = len(held)
            self.counts["coalesced"] += len(held)
        item.has_token = True
        return item

    def take_held(self) -> list[Item]:
        """Empty the buffer and return what it held (the lane abandoning its work)."""
        held, self.held = self.held, []
        return held


class Retry:
    """Send the message, and again while ``rule`` allows (Alertmanager's retry stage):
    attempts up to ``max_retries`` retries, waiting the jittered backoff or the endpoint's
    ``Retry-After`` between them. ``PASS`` when the channel took it (``item.status`` and
    ``item.answer`` say what it answered), else ``Failed``: a failure that is not retried,
    the retries spent, or a wait the lane refused (its drain deadline).

    Args:
        channel: anything with ``send(message, timeout)``.
        rule: the ``RetryRule`` (what is retried, after how long).
        timeout: passed to every ``send``.
        clock, random: monotonic seconds; ``random() -> float`` in [0, 1) for the jitter.
        wait_until: ``wait_until(t) -> bool``, the lane's wait until ``t`` on its clock;
            False when the lane will not wait that long (drain deadline, abandoned).
        counts: the lane's counters (``retries``).
        secrets: removed from every error and answer (``excerpt``).
        show: ``show(item, why)`` when an attempt times out and is retried: the first sign
            of a hanging endpoint, shown now rather than after every retry (None: nothing).

    ``sending`` and ``started``: a send is running now, since that clock time (the lane
    shows messages stuck behind a send that outlives its timeout); ``last_status``: the
    endpoint's last status (for stats).
    """

    def __init__(
        self,
        channel: Any,
        rule: RetryRule,
        *,
        timeout: float,
        clock: Callable[[], float],
        random: Callable[[], float],
        wait_until: Callable[[float], bool],
        counts: dict[str, int],
        secrets: tuple[str, ...] = (),
        show: Callable[[Item, str], Any] | None = None,
    ) -> None:
        self.channel = channel
        self.rule = rule
        self.timeout = timeout
        self.clock = clock
        self.random = random
        self.wait_until = wait_until
        self.counts = counts
        self.secrets = secrets
        self.show = show
        self.sending = False
        self.started = 0.0
        self.last_status: int | None = None

    def __call__(self, item: Item, now: float) -> Verdict:
        attempt = 0
        while True:
            attempt += 1
            item.attempts = attempt  # counted before the send: one in flight counts
            try:
                self.started = self.clock()
                self.sending = True
                try:
                    result = self.channel.send(item.message, self.timeout)
                finally:
                    self.sending = False
            except DeliveryError as exc:
                status = exc.status
                self.last_status = status
                reason = excerpt(exc.reason, self.secrets)
                if exc.body:
                    detail = f"{reason}: {excerpt(exc.body, self.secrets)}"
                else:
                    detail = reason
                if self.rule.gives_up(exc, attempt):
                    return Failed(reason, detail, status)
                if status is None and "timed out" in reason and self.show is not None:
                    self.show(item, f"{detail} after {self.timeout:g} s; retrying")
                delay = self.rule.delay(exc, attempt, self.random())
                self.counts["retries"] += 1
                for t in item.tickets:
                    if t.first_attempt:
                        t.resolve(False, f"{detail}; retrying in the background")
                if not self.wait_until(self.clock() + delay):
                    return Failed(reason, f"{detail} (retry abandoned: drain deadline)", status)
                continue
            except Exception as exc:  # noqa: BLE001 - a broken channel is a send failure
                reason = excerpt(f"{type(exc).__name__}: {exc}", self.secrets)
                return Failed(reason, reason)
            status = getattr(result, "status", None)
            self.last_status = status
            item.status = status
            if isinstance(result, SendResult):
                item.answer = excerpt(result.describe(), self.secrets)
            else:
                item.answer = "ok"
            return PASS


# ---------------------------------------------------------------------------- summaries


def _summary(held: list[Item]) -> AlertMessage:
    """The coalesce summary of ``held``: the highest level held, every tag, the text of
    ``summary_lines``."""
    messages = [h.message for h in held]
    top = max(messages, key=lambda m: m.rank)
    tags: list[str] = []
    for m in messages:
        tags.extend(t for t in m.tags if t not in tags)
    return AlertMessage(
        title=f"{len(messages)} alerts held back by the rate limit",
        text="\n".join(summary_lines(messages)),
        level=top.level,
        fields={k: v for k, v in top.fields.items() if k in ("project", "run", "step")},
        tags=tuple(tags),
        source="summary",
        step=top.step,
    )


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
