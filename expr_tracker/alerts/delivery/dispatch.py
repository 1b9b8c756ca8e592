"""The dispatcher: routing, then per channel a bounded queue and one worker thread running
dedup -> token bucket -> send with retries. Training never waits on a channel.

    d = Dispatcher(record=alert_log.write, context=lambda: {"project": p, "run": r, "step": s})
    d.add_channel(slack_channel, policy=Policy(rate_limit_per_minute=20), min_level="error")
    d.submit(AlertMessage("loss spike", "loss 9.1", level="error"))   # returns at once
    d.stats()            # {"slack": {"sent": 1, "failed": 0, ...}}
    d.close(timeout=10)  # drain within a deadline; what is left is recorded undelivered

Per message and channel, on the channel's worker (STYLE.md 6: timing lives here, a channel
only sends):

0. **severity order**: a channel's queue is drained most severe first, first in first out
   within a level, so a critical alert never waits behind info alerts queued before it.
1. **dedup**: a message whose ``key()`` was seen within ``dedup_window`` seconds is
   suppressed and counted; when the window expires, a copy of the last duplicate titled
   ``"<title> (+N suppressed)"`` is sent. Dedup runs before the token bucket so duplicates
   never spend the rate budget.
2. **token bucket** (``rate_limit_per_minute``; burst = a quarter minute's worth, at least 1):
   without a token, ``drop`` drops the message, ``queue`` holds it (and everything less
   severe behind it) until a token returns, ``coalesce`` folds every message held back into
   one summary (each message's level, title, step and text, shortened) sent when a token
   returns. **Urgent messages** (``error`` and ``critical``, ``URGENT_LEVEL``) are never held
   behind less severe ones: they skip the coalesce buffer and, with the bucket empty, borrow
   up to one more burst (``capacity``) of tokens, which the less severe messages then wait to
   be repaid. Only an urgent storm beyond that borrowed burst is rate-limited, and still goes
   ahead of everything less severe. At the drain (``close()``) nothing waits for a token:
   what is held back (``coalesce`` or ``queue``) goes as one summary on a borrowed token.
3. **send** with up to ``max_retries`` retries: a network error, a retryable service error, or
   an HTTP status in ``retry_on_status`` is retried after ``backoff_initial * factor**n`` (at
   most ``backoff_max``) spread by ``jitter``, or after ``Retry-After`` when
   ``respect_retry_after``. Other statuses fail at once.

Only send failures are swallowed: counted, logged once per (channel, cause) — every time with
``fail_silently: false`` — and recorded as ``{"kind": "delivery", "delivered": false, ...}``.

**Console fallback**: an alert is never lost silently. When a channel gives up on a message
(a failure that is not retried, retries spent), when an attempt times out (the first sign of
a hanging endpoint: the message is shown at once rather than after every retry), when a
message is queued behind a send that has run longer than an attempt may (a channel ignoring
its timeout: the one in flight is shown too), or when the drain deadline abandons it,
``fallback`` (default ``print_undelivered``: stderr) shows the alert's text once, marked
undelivered on that channel; a second channel failing the same message adds one line. Not
when a console channel took the message too (its text is on the terminal already). The
delivery record then says ``"fallback": "console"``.
Every outcome is recorded; error texts and answers are ``channels.base.excerpt``s: secrets
removed first, one line, at most 200 characters.

Queues hold ``queue_size`` messages; when full, ``on_queue_full`` drops the oldest, drops the
new one, or (``block``, direct ``et.alert()`` calls only, at most ``timeout`` seconds) waits.
Rule alerts from the training thread never block. Whatever the mode, the least severe
message goes first: the oldest (``drop_oldest``) or newest (``drop_new``) queued message of the
lowest level present is dropped when the new message is more severe than it; the new message
is dropped when nothing queued is less severe than it (``drop_new``) or everything queued is
more severe (``drop_oldest``).

Clocks: ``clock`` (monotonic seconds) drives rate limits, backoff, dedup windows and the drain
deadline; ``sleep`` replaces waiting between retries; ``start=False`` runs no threads and
``pump()`` does the work on the caller's thread, so tests check timing exactly.
"""

from __future__ import annotations

import atexit
import logging
import random as _random
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from expr_tracker.alerts.delivery.channels.base import (
    ATTEMPT_TIMEOUTS,
    DeliveryError,
    SendResult,
    excerpt,
)
from expr_tracker.alerts.delivery.message import LEVELS, AlertMessage, normalize_level

__all__ = [
    "DEFAULT_DRAIN_TIMEOUT",
    "URGENT_LEVEL",
    "Dispatcher",
    "Lane",
    "Policy",
    "Submission",
    "TokenBucket",
    "add_tap",
    "print_undelivered",
    "remove_tap",
]

log = logging.getLogger("expr_tracker.alerts")

#: seconds ``close()`` waits for queues to drain by default
DEFAULT_DRAIN_TIMEOUT = 10.0
_EXIT = -1.0
#: messages at this level or above are urgent: never held behind less severe ones
URGENT_LEVEL = "error"
_URGENT_RANK = LEVELS.index(URGENT_LEVEL)
#: a coalesce summary lists at most this many messages, each text cut to _SUMMARY_TEXT
#: characters, and stops adding lines past _SUMMARY_CHARS (Slack's section limit is 3000)
_SUMMARY_LINES = 20
_SUMMARY_TEXT = 160
_SUMMARY_CHARS = 2500


@dataclass(frozen=True)
class Policy:
    """Delivery policy (plain, for the worker; built from ``PolicySpec`` by ``from_spec``).
    Defaults: DESIGN.md "Delivery policy defaults". Durations in seconds.

    Severity rule of a rate-limited channel (``rate_limit_per_minute``): the queue drains
    most severe first; ``error`` and ``critical`` messages are never held behind less severe
    ones: they bypass the ``coalesce`` buffer and may borrow one extra burst of tokens (the
    bucket goes into debt that less severe messages wait out). Past that borrowed burst they
    are rate-limited too (``on_rate_limited``), still ahead of less severe messages. A
    ``coalesce`` summary lists each held message's level, title, step and text (shortened),
    most severe first, and carries the highest level held.

    ``timeout`` bounds one HTTP attempt in two phases (``channels.base.post_json``): connecting
    (TCP to every address, TLS handshake) within ``timeout``, then sending the
    request and reading the answer within ``timeout`` however slowly bytes arrive, so an
    attempt lasts at most ``2 * timeout`` plus DNS resolution.
    """

    async_send: bool = True
    timeout: float = 10.0
    max_retries: int = 3
    backoff_initial: float = 0.5
    backoff_factor: float = 2.0
    backoff_max: float = 30.0
    jitter: float = 0.1
    retry_on_status: frozenset[int] = frozenset({408, 429, 500, 502, 503, 504})
    respect_retry_after: bool = True
    rate_limit_per_minute: float | None = 20.0
    on_rate_limited: str = "coalesce"
    dedup_window: float = 300.0
    queue_size: int = 1000
    on_queue_full: str = "drop_oldest"
    fail_silently: bool = True

    @classmethod
    def from_spec(cls, spec: Any = None, **overrides: Any) -> Policy:
        """From a ``PolicySpec``, a mapping of its fields, or None (defaults), then
        ``overrides``. Raises ``ValueError`` for an unknown field or mode."""
        values: dict[str, Any] = {}
        if spec is not None:
            data = spec if isinstance(spec, Mapping) else spec.model_dump()
            values.update(
                {k: v for k, v in data.items() if v is not None or k == "rate_limit_per_minute"}
            )
        values.update(overrides)
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"unknown policy field(s): {', '.join(unknown)}")
        if "retry_on_status" in values:
            values["retry_on_status"] = frozenset(int(s) for s in values["retry_on_status"])
        policy = cls(**values)
        if policy.on_rate_limited not in ("drop", "queue", "coalesce"):
            raise ValueError("on_rate_limited must be drop, queue or coalesce")
        if policy.on_queue_full not in ("drop_oldest", "drop_new", "block"):
            raise ValueError("on_queue_full must be drop_oldest, drop_new or block")
        if policy.queue_size < 1:
            raise ValueError("queue_size must be >= 1")
        return policy

    def backoff(self, attempt: int, rnd: float = 0.5) -> float:
        """Seconds before retry number ``attempt`` (1-based): ``initial * factor**(attempt-1)``
        capped at ``backoff_max``, spread by ``jitter`` (``rnd`` in [0, 1); 0.5 = no spread)."""
        base = min(self.backoff_max, self.backoff_initial * self.backoff_factor ** (attempt - 1))
        return max(0.0, min(self.backoff_max, base * (1.0 + self.jitter * (2.0 * rnd - 1.0))))

    def max_send_seconds(self) -> float:
        """Upper bound of one message's send with every retry (no Retry-After beyond
        ``backoff_max``)."""
        waits = sum(self.backoff(i, 1.0) for i in range(1, self.max_retries + 1))
        if self.respect_retry_after:
            waits = max(waits, self.backoff_max * self.max_retries)
        return ATTEMPT_TIMEOUTS * self.timeout * (self.max_retries + 1) + waits


class TokenBucket:
    """``rate_per_minute`` tokens a minute, holding at most ``capacity`` (default: a quarter
    minute's worth, at least 1). ``None`` rate: unlimited."""

    def __init__(
        self, rate_per_minute: float | None, now: float, capacity: float | None = None
    ) -> None:
        self.rate = None if rate_per_minute is None else float(rate_per_minute) / 60.0
        if capacity is None:
            capacity = 1.0 if self.rate is None else max(1.0, float(rate_per_minute) / 4.0)
        self.capacity = float(capacity)
        self.tokens = self.capacity
        self.last = now

    def _refill(self, now: float) -> None:
        if now > self.last:
            self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)
        self.last = max(self.last, now)

    def try_take(self, now: float, borrow: float = 0.0) -> bool:
        """Take a token if one is available at ``now``. ``borrow``: how far below empty the
        bucket may go for this take (urgent messages borrow up to ``capacity``); a bucket in
        debt gives nothing to takes that may not borrow until it is repaid."""
        if self.rate is None:
            return True
        self._refill(now)
        if self.tokens + borrow >= 1.0 - 1e-9:
            self.tokens -= 1.0
            if abs(self.tokens) < 1e-9:
                self.tokens = 0.0
            return True
        return False

    def take_anyway(self, now: float) -> None:
        """Take a token whether or not one is available (the bucket may go into debt):
        the drain's last message, which cannot wait for the bucket to refill."""
        if self.rate is None:
            return
        self._refill(now)
        self.tokens -= 1.0

    def wait_time(self, now: float, borrow: float = 0.0) -> float:
        """Seconds until a take (with ``borrow``) succeeds (0 when one would now)."""
        if self.rate is None:
            return 0.0
        self._refill(now)
        return max(0.0, (1.0 - self.tokens - borrow) / self.rate)


class _Dedup:
    """Fixed windows from the first occurrence of each key; counts suppressed duplicates."""

    def __init__(self, window: float) -> None:
        self.window = float(window)
        self.entries: dict[str, list[Any]] = {}  # key -> [expires, suppressed, last message]

    def admit(self, message: AlertMessage, now: float) -> bool:
        if self.window <= 0:
            return True
        key = message.key()
        entry = self.entries.get(key)
        if entry is not None and now < entry[0]:
            entry[1] += 1
            entry[2] = message
            return False
        self.entries[key] = [now + self.window, 0, message]
        return True

    def expired(self, now: float, everything: bool = False) -> list[AlertMessage]:
        """Summaries of windows that ended (all windows with ``everything``)."""
        out = []
        for key in [k for k, e in self.entries.items() if everything or now >= e[0]]:
            _, count, message = self.entries.pop(key)
            if count:
                out.append(
                    message.copy(
                        title=f"{message.title} (+{count} suppressed)",
                        source="summary",
                        dedup_key=None,
                    )
                )
        return out

    def next_expiry(self) -> float | None:
        pending = [e[0] for e in self.entries.values() if e[1]]
        return min(pending) if pending else None

    def pending(self) -> int:
        return sum(1 for e in self.entries.values() if e[1])


class _Ticket:
    """A caller waiting for a message's outcome on one channel."""

    __slots__ = ("event", "delivered", "detail")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.delivered: bool | None = None
        self.detail = ""

    def resolve(self, delivered: bool, detail: str) -> None:
        if not self.event.is_set():
            self.delivered = delivered
            self.detail = detail
            self.event.set()


class _Item:
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

    def __init__(self, message: AlertMessage, ticket: _Ticket | None = None, summary=False) -> None:
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


@dataclass
class Submission:
    """What ``Dispatcher.submit`` did with one message.

    Attributes:
        routed: names of the channels that admit it (level, tags, ``channels``).
        accepted: those whose queue took it.
        delivered: channel -> outcome, for the channels waited on (``wait`` or a direct call
            with ``async_send: false``); ``detail`` holds each answer or error.
    """

    routed: list[str]
    accepted: list[str]
    delivered: dict[str, bool]
    detail: dict[str, str]

    @property
    def ok(self) -> bool:
        """Delivered somewhere (when waited on), else accepted somewhere."""
        if self.delivered:
            return any(self.delivered.values())
        return bool(self.accepted)


class Lane:
    """One channel: its routing filter, policy, bounded queue, worker and counters."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        channel: Any,
        policy: Policy,
        *,
        enabled: bool = True,
        min_level: str | None = None,
        levels: Iterable[str] | None = None,
        tags: Iterable[str] | None = None,
    ) -> None:
        self.d = dispatcher
        self.channel = channel
        self.name = str(getattr(channel, "name", None) or type(channel).__name__)
        self.kind = str(getattr(channel, "kind", type(channel).__name__))
        self.policy = policy
        self.enabled = bool(enabled)
        self.min_rank = LEVELS.index(normalize_level(min_level)) if min_level else None
        self.levels = frozenset(normalize_level(v) for v in levels) if levels else None
        self.tags = frozenset(tags) if tags else None
        try:
            secrets = tuple(channel.secrets())
        except Exception:  # noqa: BLE001 - a foreign channel without secrets()
            secrets = ()
        self.secrets = secrets
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[_Item] = deque()
        self._ranks = [0] * len(LEVELS)  # queued items per level (severity-ordered pops)
        self._kicked = False  # put() since the worker last looked
        self._summaries: deque[_Item] = deque()
        self._held: list[_Item] = []  # coalesce buffer
        self._inflight: list[_Item] = []
        self._sending = False  # channel.send() running now
        self._send_started = 0.0  # dispatcher clock when that send began
        now = dispatcher.clock()
        self._bucket = TokenBucket(policy.rate_limit_per_minute, now)
        self._dedup = _Dedup(policy.dedup_window)
        self._closing = False
        self._deadline: float | None = None
        self._abort = False
        self._abandoned = False
        self._done = False
        self.thread: threading.Thread | None = None
        self.counts = dict.fromkeys(
            ("sent", "failed", "suppressed", "dropped", "retries", "rate_limited", "coalesced"), 0
        )
        self.last_error: str | None = None
        self.last_status: int | None = None

    # ---------------------------------------------------------------- routing

    def admits(self, message: AlertMessage, explicit: bool = False) -> bool:
        """Level filter (``levels`` allowlist, else ``min_level``) and tags filter (skipped
        when the message named this channel explicitly)."""
        if not self.enabled:
            return False
        if self.levels is not None:
            if message.level not in self.levels:
                return False
        elif self.min_rank is not None and message.rank < self.min_rank:
            return False
        if self.tags is not None and not explicit:
            return bool(self.tags.intersection(message.tags))
        return True

    # ---------------------------------------------------------------- producer side

    def put(self, item: _Item, *, direct: bool) -> bool:
        """Enqueue ``item``; returns False when it was dropped (queue full / closed)."""
        dropped: list[tuple[_Item, str]] = []
        accepted = True
        with self._cond:
            if self._done or self._abandoned:
                dropped.append((item, "dispatcher closed"))
                accepted = False
            else:
                if len(self._queue) >= self.policy.queue_size:
                    mode = self.policy.on_queue_full
                    if mode == "block" and direct and self.thread is not None:
                        end = time.monotonic() + self.policy.timeout
                        while len(self._queue) >= self.policy.queue_size and not self._done:
                            left = end - time.monotonic()
                            if left <= 0:
                                break
                            self._cond.wait(left)
                        mode = "drop_new"
                    elif mode == "block":
                        mode = "drop_oldest"
                    if len(self._queue) >= self.policy.queue_size:
                        victim = self._victim(item, newest=mode == "drop_new")
                        if victim is None:
                            dropped.append((item, "dropped: queue full"))
                            accepted = False
                        else:
                            why = "newest" if mode == "drop_new" else "oldest"
                            dropped.append((victim, f"dropped: queue full ({why} least severe)"))
                if accepted:
                    self._queue.append(item)
                    self._ranks[item.rank] += 1
                    self._kicked = True
                    self._cond.notify_all()
        for old, why in dropped:
            self.counts["dropped"] += 1
            self._finish(old, False, why)
        return accepted

    def _victim(self, new: _Item, *, newest: bool) -> _Item | None:
        """With the lock held and the queue full: remove and return the queued message to
        drop for ``new`` (the oldest, or newest, of the least severe level queued), or None
        when ``new`` itself is the one to drop."""
        low = next(r for r, n in enumerate(self._ranks) if n)
        if new.rank < low or (newest and new.rank == low):
            return None
        order = range(len(self._queue) - 1, -1, -1) if newest else range(len(self._queue))
        index = next(i for i in order if self._queue[i].rank == low)
        return self._take_at(index)

    def _take_at(self, index: int) -> _Item:
        """With the lock held: remove and return queue item ``index``."""
        if index == 0:
            item = self._queue.popleft()
        else:
            item = self._queue[index]
            del self._queue[index]
        self._ranks[item.rank] -= 1
        return item

    def _top_rank(self) -> int:
        """With the lock held: the highest level queued (-1 when empty)."""
        for rank in range(len(self._ranks) - 1, -1, -1):
            if self._ranks[rank]:
                return rank
        return -1

    # ---------------------------------------------------------------- worker side

    def _pop(self) -> _Item | None:
        """The next message: a dedup summary or the most severe queued message (the oldest
        of its level), whichever is more severe (the summary on a tie)."""
        with self._cond:
            top = self._top_rank()
            if self._summaries and self._summaries[0].rank >= top:
                return self._summaries.popleft()
            if top < 0:
                return None
            if self._queue[0].rank == top:
                item = self._take_at(0)
            else:
                item = self._take_at(next(i for i, q in enumerate(self._queue) if q.rank == top))
            self._cond.notify_all()  # a blocked producer may continue
            return item

    def _push_back(self, item: _Item) -> None:
        """Return a rate-limited item to the front of its queue."""
        with self._cond:
            if item.summary:
                self._summaries.appendleft(item)
            else:
                self._queue.appendleft(item)
                self._ranks[item.rank] += 1

    def has_work(self) -> bool:
        return bool(self._queue or self._summaries or self._held or self._dedup.pending())

    def step(self) -> float | None:
        """Do one unit of work. Returns 0 when more may be done at once, seconds until the
        next timed event, None when idle, or ``_EXIT`` when closed and drained."""
        if self._abort:
            return _EXIT
        self._kicked = False
        now = self.d.clock()
        for summary in self._dedup.expired(now):
            with self._cond:
                self._summaries.append(_Item(summary, summary=True))
        p = self.policy
        wait_held: float | None = None
        if self._held:
            urgent_held = max(h.rank for h in self._held) >= _URGENT_RANK
            if self._bucket.try_take(now, self._bucket.capacity if urgent_held else 0.0):
                self._send_held()
                return 0.0
            wait_held = self._bucket.wait_time(now, self._bucket.capacity if urgent_held else 0.0)
        item = self._pop()
        if item is None:
            if self._closing:
                late = self._dedup.expired(now, everything=True)
                if late:
                    with self._cond:
                        self._summaries.extend(_Item(m, summary=True) for m in late)
                    return 0.0
                if self._held:
                    # the drain is the last chance: what the rate limit held back goes out
                    # now as one summary, on a borrowed token, rather than being lost
                    self._bucket.take_anyway(now)
                    self._send_held()
                    return 0.0
                return _EXIT
            waits = [w for w in (wait_held,) if w is not None]
            expiry = self._dedup.next_expiry()
            if expiry is not None:
                waits.append(max(0.0, expiry - now))
            return min(waits) if waits else None
        if not item.checked:
            item.checked = True
            if not self._dedup.admit(item.message, now):
                self.counts["suppressed"] += 1
                for t in item.tickets:
                    t.resolve(False, "suppressed duplicate")
                return 0.0
        urgent = item.rank >= _URGENT_RANK
        if self._held and p.on_rate_limited == "coalesce" and not urgent:
            self._held.append(item)
            self.counts["rate_limited"] += 1
            return 0.0
        if not self._bucket.try_take(now, self._bucket.capacity if urgent else 0.0):
            if not item.limited:
                item.limited = True
                self.counts["rate_limited"] += 1
            if p.on_rate_limited == "drop":
                self.counts["dropped"] += 1
                self._finish(item, False, "dropped: rate limited")
                return 0.0
            if p.on_rate_limited == "coalesce" or self._closing:
                # queue mode while draining: no token will come in time, so the message
                # joins the drain summary (sent on a borrowed token once the queue is empty)
                self._held.append(item)
                return 0.0
            wait = self._bucket.wait_time(now, self._bucket.capacity if urgent else 0.0)
            self._push_back(item)
            return wait
        self._deliver(item)
        return 0.0

    def _past_deadline(self, t: float) -> bool:
        return self._deadline is not None and t > self._deadline

    def _send_held(self) -> None:
        held, self._held = self._held, []
        if len(held) == 1:
            self._deliver(held[0])
            return
        messages = [h.message for h in held]
        top = max(messages, key=lambda m: m.rank)
        lines = _summary_lines(messages)
        tags: list[str] = []
        for m in messages:
            tags.extend(t for t in m.tags if t not in tags)
        summary = AlertMessage(
            title=f"{len(messages)} alerts held back by the rate limit",
            text="\n".join(lines),
            level=top.level,
            fields={k: v for k, v in top.fields.items() if k in ("project", "run", "step")},
            tags=tuple(tags),
            source="summary",
            step=top.step,
        )
        item = _Item(summary, summary=True)
        item.on_console = any(h.on_console for h in held)
        item.tickets = [t for h in held for t in h.tickets]
        item.coalesced = len(held)
        self.counts["coalesced"] += len(held)
        self._deliver(item, coalesced=len(held))

    def _sleep_until(self, target: float) -> bool:
        """Wait until ``target`` on the dispatcher clock; False when the drain deadline or an
        abort comes first."""
        while True:
            if self._abort:
                return False
            now = self.d.clock()
            remaining = target - now
            if remaining <= 0:
                return True
            if self._closing and self._past_deadline(target):
                return False
            if self.d.sleep is not None:
                self.d.sleep(remaining)
            else:
                with self._cond:
                    if not self._abort:
                        self._cond.wait(remaining)

    def _deliver(self, item: _Item, coalesced: int = 0) -> None:
        p = self.policy
        message = item.message
        attempt = 0
        with self._cond:
            self._inflight = [item]
        try:
            while True:
                attempt += 1
                item.attempts = attempt  # counted before the send: one in flight counts
                try:
                    self._send_started = self.d.clock()
                    self._sending = True
                    try:
                        result = self.channel.send(message, p.timeout)
                    finally:
                        self._sending = False
                except DeliveryError as exc:
                    status = exc.status
                    self.last_status = status
                    if status is not None and status >= 300:
                        retryable = status in p.retry_on_status
                    else:
                        retryable = exc.retryable
                    reason = excerpt(exc.reason, self.secrets)
                    if exc.body:
                        detail = f"{reason}: {excerpt(exc.body, self.secrets)}"
                    else:
                        detail = reason
                    if not retryable or attempt > p.max_retries:
                        self._failed(item, reason, detail, status, attempt, coalesced)
                        return
                    if status is None and "timed out" in reason:
                        # the first sign of a hanging endpoint: show the alert now, not
                        # after every retry has timed out as well
                        self.d._fallback(
                            self, item, f"{detail} after {p.timeout:g} s; retrying", final=False
                        )
                    delay = p.backoff(attempt, self.d.random())
                    if p.respect_retry_after and exc.retry_after is not None:
                        delay = max(0.0, float(exc.retry_after))
                    self.counts["retries"] += 1
                    if not self._sleep_until(self.d.clock() + delay):
                        self._failed(
                            item,
                            reason,
                            f"{detail} (gave up: drain deadline)",
                            status,
                            attempt,
                            coalesced,
                        )
                        return
                    continue
                except Exception as exc:  # noqa: BLE001 - a broken channel is a send failure
                    reason = excerpt(f"{type(exc).__name__}: {exc}", self.secrets)
                    self._failed(item, reason, reason, None, attempt, coalesced)
                    return
                status = getattr(result, "status", None)
                self.last_status = status
                if isinstance(result, SendResult):
                    detail = excerpt(result.describe(), self.secrets)
                else:
                    detail = "ok"
                if self._abandoned:
                    return
                self.counts["sent"] += 1
                self._finish(
                    item, True, detail, status=status, attempts=attempt, coalesced=coalesced
                )
                return
        finally:
            with self._cond:
                self._inflight = []

    def _failed(self, item, reason, detail, status, attempts, coalesced) -> None:  # noqa: ANN001
        if self._abandoned:
            return
        self.counts["failed"] += 1
        self.last_error = detail
        self.d._warn_failure(self, reason, detail)
        self.d._fallback(self, item, detail)
        self._finish(item, False, detail, status=status, attempts=attempts, coalesced=coalesced)

    def _finish(
        self,
        item: _Item,
        delivered: bool,
        detail: str,
        *,
        status: int | None = None,
        attempts: int = 0,
        coalesced: int = 0,
    ) -> None:
        for t in item.tickets:
            t.resolve(delivered, detail)
        m = item.message
        record = {
            "kind": "delivery",
            "time": time.time(),
            "channel": self.name,
            "type": self.kind,
            "rule": m.rule,
            "source": m.source,
            "level": m.level,
            "step": m.step,
            "title": m.title,
            "delivered": delivered,
            "error": None if delivered else detail,
            "status": status,
            "attempts": attempts,
        }
        if delivered:
            record["answer"] = detail
        if coalesced:
            record["coalesced"] = coalesced
        if item.echoed:
            record["fallback"] = "console"
        self.d._record(record)

    # ---------------------------------------------------------------- thread

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name=f"et-alert-{self.name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while True:
                wait = self.step()
                if wait == _EXIT:
                    break
                if wait is None or wait > 0:
                    with self._cond:
                        # new work since step() looked (a rate-limited item put back in the
                        # queue is not new work: waiting for its token must not spin)
                        if self._kicked or self._abort:
                            continue
                        if self._closing and wait is None:
                            continue
                        self._cond.wait(wait)
        except Exception:  # noqa: BLE001 - a worker bug must not kill the process
            log.exception("expr_tracker: alert worker %s stopped", self.name)
        finally:
            self._done = True
            with self._cond:
                self._cond.notify_all()

    @property
    def alive(self) -> bool:
        if self._done or self._abandoned:
            return False
        return self.thread.is_alive() if self.thread is not None else not self._closing

    def pending(self) -> int:
        with self._cond:
            return len(self._queue) + len(self._summaries) + len(self._held) + len(self._inflight)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.kind, "target": _target(self.channel)}
        out.update(self.counts)
        out["pending"] = self.pending()
        out["alive"] = self.alive
        out["last_error"] = self.last_error
        out["last_status"] = self.last_status
        return out

    def abandon(self, why: str) -> tuple[list[_Item], list[_Item]]:
        """Stop for good; return (the items in flight, everything not delivered)."""
        with self._cond:
            self._abort = True
            self._abandoned = True
            inflight = list(self._inflight)
            left = inflight + list(self._summaries) + self._held + list(self._queue)
            self._queue.clear()
            self._ranks = [0] * len(LEVELS)
            self._summaries.clear()
            self._held = []
            self._cond.notify_all()
        return inflight, left


def _shorten(text: str, limit: int) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: max(0, limit - 1)].rstrip() + "\u2026"


def _summary_lines(messages: list[AlertMessage]) -> list[str]:
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


def _target(channel: Any) -> str:
    try:
        return str(channel.target)
    except Exception:  # noqa: BLE001
        return getattr(channel, "kind", "?")


#: observers of every submitted message (``expr_tracker.testing.capture_alerts``)
_TAPS: list[Callable[[AlertMessage, list[str]], None]] = []


def add_tap(fn: Callable[[AlertMessage, list[str]], None]) -> None:
    """Call ``fn(message, routed_channel_names)`` for every message any dispatcher takes."""
    _TAPS.append(fn)


def remove_tap(fn: Callable[[AlertMessage, list[str]], None]) -> None:
    try:
        _TAPS.remove(fn)
    except ValueError:
        pass


class Dispatcher:
    """Routes alert messages to channels, one queue and worker per channel.

    Args:
        record: ``record(dict)`` called with every delivery outcome (``kind: "delivery"``),
            e.g. ``AlertLog.write``; None to record nothing.
        context: ``context() -> dict`` with ``project``/``run``/``step``, merged into each
            message's fields (never overriding) and its ``step`` when unset.
        clock: monotonic seconds (rate limits, backoff, dedup windows, drain deadline).
        sleep: ``sleep(seconds)`` between retries / for ``pump()``; default: a wait the
            dispatcher can interrupt (threads) or ``time.sleep`` (``start=False``).
        random: ``random() -> float`` in [0, 1) for jitter.
        start: start a worker thread per channel (False: call ``pump()``).
        drain_timeout: default deadline of ``close()``, seconds.
        warner: an object with ``warn(key, message, *args)`` (``Warner``) for once-per-cause
            logging; default: this module's logger, once per (channel, cause).
        at_exit: drain at interpreter exit (for dispatchers not closed by a run).
        fallback: ``fallback(message, channel, kind, why, again=False, final=True)`` shows an
            alert a channel failed to deliver (module docstring, "Console fallback");
            ``"stderr"`` (default): ``print_undelivered``; None shows nothing.
    """

    def __init__(
        self,
        *,
        record: Callable[[dict], Any] | None = None,
        context: Callable[[], Mapping[str, Any]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] | None = None,
        random: Callable[[], float] = _random.random,
        start: bool = True,
        drain_timeout: float = DEFAULT_DRAIN_TIMEOUT,
        warner: Any = None,
        at_exit: bool = False,
        fallback: Callable[..., Any] | None | str = "stderr",
    ) -> None:
        self.record = record
        self.context = context
        self.clock = clock
        self.sleep = sleep if sleep is not None else (None if start else time.sleep)
        self.random = random
        self.threaded = bool(start)
        self.drain_timeout = float(drain_timeout)
        self.warner = warner
        self.lanes: dict[str, Lane] = {}
        self._lock = threading.Lock()
        self._warned: set[tuple[str, str]] = set()
        self._unknown: set[str] = set()
        #: configured channels that are off (not lanes): name -> why ("ET_X is not set")
        self.skipped: dict[str, str] = {}
        #: ranks whose run-less ``et.alert()`` calls this dispatcher delivers
        #: (``alerts.on_rank``; a dispatcher built by hand: every rank)
        self.on_rank: Any = "all"
        self._closed = False
        self.record_errors = 0
        self.fallback = print_undelivered if fallback == "stderr" else fallback
        #: id(message) -> message, for the messages the fallback showed (bounded)
        self._echoed: dict[int, AlertMessage] = {}
        if at_exit:
            ref = weakref.ref(self)

            def _drain() -> None:
                d = ref()
                if d is not None and not d._closed:
                    d.close()

            atexit.register(_drain)

    # ---------------------------------------------------------------- set-up

    def add_channel(
        self,
        channel: Any,
        *,
        policy: Policy | None = None,
        enabled: bool = True,
        min_level: str | None = None,
        levels: Iterable[str] | None = None,
        tags: Iterable[str] | None = None,
    ) -> Lane:
        """Add a channel (anything with ``name`` and ``send(message, timeout)``).

        Raises:
            ValueError: a channel of that name exists, or the dispatcher is closed.
        """
        lane = Lane(
            self,
            channel,
            policy or Policy(),
            enabled=enabled,
            min_level=min_level,
            levels=levels,
            tags=tags,
        )
        with self._lock:
            if self._closed:
                raise ValueError("the dispatcher is closed")
            if lane.name in self.lanes:
                raise ValueError(f"a channel named {lane.name!r} already exists")
            self.lanes[lane.name] = lane
        if self.threaded and lane.enabled:
            lane.start()
        return lane

    @property
    def channels(self) -> list[Any]:
        return [lane.channel for lane in self.lanes.values()]

    # ---------------------------------------------------------------- routing

    def route(self, message: AlertMessage) -> list[Lane]:
        """The lanes ``message`` goes to: those named in ``message.channels`` (by name, else
        by type) that admit its level; else every lane admitting its level and tags."""
        lanes = list(self.lanes.values())
        if message.channels is None:
            return [lane for lane in lanes if lane.admits(message)]
        out: list[Lane] = []
        for wanted in message.channels:
            matches = [lane for lane in lanes if lane.name == wanted]
            if not matches:
                matches = [lane for lane in lanes if lane.kind == wanted]
            if not matches and wanted not in self._unknown:
                self._unknown.add(wanted)
                if wanted in self.skipped:
                    log.warning(
                        "expr_tracker: alert for channel %r, which is off: %s",
                        wanted,
                        self.skipped[wanted],
                    )
                else:
                    log.warning(
                        "expr_tracker: alert for unknown channel %r (configured: %s)",
                        wanted,
                        ", ".join(list(self.lanes) + list(self.skipped)) or "none",
                    )
            out.extend(m for m in matches if m not in out and m.admits(message, explicit=True))
        return out

    # ---------------------------------------------------------------- submit

    def submit(
        self, message: AlertMessage, *, direct: bool = False, wait: bool | None = None
    ) -> Submission:
        """Route ``message`` and enqueue it on each admitting channel. Never raises for a
        delivery problem.

        Args:
            direct: a direct ``et.alert()`` call (``on_queue_full: block`` and
                ``async_send: false`` apply); False for rule alerts from the training thread.
            wait: True waits for the outcome on every routed channel (bounded by each
                policy's longest send); None waits only where ``direct`` and
                ``async_send: false``; False never waits.
        """
        self._inject(message)
        lanes = self.route(message)
        names = [lane.name for lane in lanes]
        for tap in list(_TAPS):
            try:
                tap(message, names)
            except Exception:  # noqa: BLE001 - an observer must not break delivery
                log.debug("alert tap failed", exc_info=True)
        accepted: list[str] = []
        waiting: list[tuple[Lane, _Ticket]] = []
        on_console = any(lane.kind == "console" for lane in lanes)
        for lane in lanes:
            must_wait = wait if wait is not None else (direct and not lane.policy.async_send)
            ticket = _Ticket() if must_wait else None
            item = _Item(message, ticket)
            item.on_console = on_console
            if lane.put(item, direct=direct):
                accepted.append(lane.name)
                self._check_stuck(lane, item)
                if ticket is not None:
                    waiting.append((lane, ticket))
            elif ticket is not None:
                waiting.append((lane, ticket))
        delivered: dict[str, bool] = {}
        detail: dict[str, str] = {}
        if waiting:
            if not self.threaded:
                self.pump()
            for lane, ticket in waiting:
                bound = lane.policy.max_send_seconds() + 1.0
                ticket.event.wait(bound)
                delivered[lane.name] = bool(ticket.delivered)
                detail[lane.name] = ticket.detail or "no answer before the wait ended"
        return Submission(names, accepted, delivered, detail)

    def _inject(self, message: AlertMessage) -> None:
        if self.context is None:
            return
        try:
            ctx = self.context() or {}
        except Exception:  # noqa: BLE001 - context is best effort
            return
        for key, value in ctx.items():
            if value is not None:
                message.fields.setdefault(key, value)
        if message.step is None and ctx.get("step") is not None:
            message.step = ctx["step"]
        if message.step is not None:
            message.fields["step"] = message.step

    def notify(self, event: Any) -> bool:
        """Adapter for ``AlertEngine(notify=...)``: turn a rule event into an ``AlertMessage``
        routed by the rule's ``channels`` and ``tags`` and queue it (never blocks, never
        raises). Returns whether some channel accepted it."""
        try:
            message = event_to_message(event)
        except Exception:  # noqa: BLE001
            log.warning("expr_tracker: cannot turn alert event %r into a message", event)
            return False
        return bool(self.submit(message, direct=False, wait=False).accepted)

    # ---------------------------------------------------------------- no threads

    def pump(self, *, advance: bool = True, max_steps: int = 100_000) -> None:
        """Do the pending work on this thread (``start=False``). With ``advance``, call
        ``sleep`` through waits (rate limits, dedup windows) while work remains, so a fake
        clock runs everything to completion; otherwise stop at the first wait."""
        for lane in list(self.lanes.values()):
            if not lane.enabled:
                continue
            for _ in range(max_steps):
                wait = lane.step()
                if wait == _EXIT or wait is None:
                    break
                if wait > 0:
                    if not advance or not lane.has_work():
                        break
                    self.sleep(wait)  # type: ignore[misc]

    # ---------------------------------------------------------------- finish

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queue is empty (threads) or pump (no threads). Returns True when
        nothing is pending."""
        if not self.threaded:
            self.pump()
            return all(lane.pending() == 0 for lane in self.lanes.values())
        end = time.monotonic() + (self.drain_timeout if timeout is None else timeout)
        while time.monotonic() < end:
            if all(lane.pending() == 0 for lane in self.lanes.values()):
                return True
            time.sleep(0.005)
        return False

    def close(self, timeout: float | None = None) -> dict[str, int]:
        """Drain every queue within ``timeout`` seconds (default ``drain_timeout``), then stop.

        Pending dedup summaries are sent. Messages the rate limit holds back (``coalesce``,
        and ``queue``: no token would come in time) are folded into one summary sent at once
        on a borrowed token (the drain is the last chance, it does not wait for the bucket);
        ``drop`` drops them as usual. Retries that would pass the deadline give up. Whatever
        is still queued or in flight at the deadline (a hanging endpoint) is recorded
        ``delivered: false`` with the reason (no answer in flight / waiting to retry / still
        queued) and its ``attempts`` (the one in flight counted), and abandoned; worker
        threads are daemons, so a dead endpoint never holds the process. Idempotent.

        Returns:
            channel name -> messages recorded undelivered at the deadline.
        """
        with self._lock:
            if self._closed:
                return {}
            self._closed = True
        timeout = self.drain_timeout if timeout is None else float(timeout)
        deadline = self.clock() + timeout
        lanes = [lane for lane in self.lanes.values() if lane.enabled]
        for lane in lanes:
            with lane._cond:
                lane._closing = True
                lane._deadline = deadline
                lane._cond.notify_all()
        if self.threaded:
            end = time.monotonic() + timeout
            for lane in lanes:
                if lane.thread is not None:
                    lane.thread.join(max(0.0, end - time.monotonic()))
        else:
            for lane in lanes:
                for _ in range(100_000):
                    wait = lane.step()
                    if wait == _EXIT or self.clock() > deadline:
                        break
                    if wait is None:
                        break
                    if wait > 0:
                        if self.clock() + wait > deadline:
                            break
                        self.sleep(wait)  # type: ignore[misc]
                lane._done = True
        left_over: dict[str, int] = {}
        for lane in lanes:
            still = lane.thread is not None and lane.thread.is_alive()
            if not still and lane.pending() == 0:
                lane._done = True
                continue
            sending = lane._sending
            inflight, items = lane.abandon("drain deadline")
            left_over[lane.name] = len(items)
            for item in items:
                lane.counts["failed"] += 1
                if item in inflight:
                    why = (
                        "the endpoint had not answered"
                        if sending
                        else f"waiting to retry after {item.attempts} attempt(s)"
                    )
                else:
                    why = "still queued"
                detail = f"not delivered before the drain deadline ({timeout:g} s): {why}"
                self._fallback(lane, item, detail)
                lane._finish(
                    item,
                    False,
                    detail,
                    attempts=item.attempts,
                    coalesced=item.coalesced,
                )
            if items:
                log.warning(
                    "expr_tracker: %d alert(s) to channel %s not delivered before the "
                    "drain deadline (%g s); recorded as undelivered",
                    len(items),
                    lane.name,
                    timeout,
                )
        for lane in self.lanes.values():
            try:
                lane.channel.close()
            except Exception:  # noqa: BLE001
                pass
        return left_over

    @property
    def closed(self) -> bool:
        return self._closed

    # ---------------------------------------------------------------- reporting

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per channel: type, target (redacted), sent, failed, suppressed, dropped, retries,
        rate_limited, coalesced, pending, alive, last_error (scrubbed), last_status."""
        return {name: lane.stats() for name, lane in self.lanes.items()}

    def _record(self, record: dict) -> None:
        if self.record is None:
            return
        try:
            self.record(record)
        except Exception:  # noqa: BLE001 - recording must not break delivery
            self.record_errors += 1
            if self.record_errors == 1:
                log.warning("expr_tracker: cannot record an alert delivery outcome", exc_info=True)

    def _check_stuck(self, lane: Lane, item: _Item) -> None:
        """A send in flight longer than an attempt may last (``ATTEMPT_TIMEOUTS + 1`` times
        ``timeout``: a channel that ignores its timeout) holds every message queued behind
        it: show the one in flight and the new one now (see "Console fallback")."""
        if not lane._sending or self.fallback is None:
            return
        age = self.clock() - lane._send_started
        if age <= (ATTEMPT_TIMEOUTS + 1) * lane.policy.timeout:
            return
        with lane._cond:
            stuck = [i for i in lane._inflight if i is not item]
        for it in stuck:
            self._fallback(lane, it, f"no answer for {age:.0f} s", final=False)
        self._fallback(
            lane, item, f"queued behind a send with no answer for {age:.0f} s", final=False
        )

    def _fallback(self, lane: Lane, item: _Item, why: str, *, final: bool = True) -> None:
        """Show ``item`` through ``fallback`` once (see "Console fallback"); never raises."""
        if self.fallback is None or lane.kind == "console":
            return
        message = item.message
        with self._lock:
            if item.echoed or item.on_console:
                return
            item.echoed = True
            key = id(message)
            again = self._echoed.get(key) is message  # another channel showed it already
            if not again:
                self._echoed[key] = message  # held, so its id is not reused meanwhile
                while len(self._echoed) > 256:
                    del self._echoed[next(iter(self._echoed))]
        try:
            self.fallback(message, lane.name, lane.kind, why, again=again, final=final)
        except Exception:  # noqa: BLE001 - showing it is best effort
            log.debug("alert console fallback failed", exc_info=True)

    def _warn_failure(self, lane: Lane, reason: str, detail: str) -> None:
        message = "expr_tracker: alert channel %s (%s) failed: %s"
        if not lane.policy.fail_silently:
            log.error(message, lane.name, lane.kind, detail)
            return
        key = (lane.name, reason)
        if self.warner is not None:
            self.warner.warn(("alert delivery",) + key, message, lane.name, lane.kind, detail)
            return
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        log.warning(
            message + " (further failures of this cause are counted, not logged)",
            lane.name,
            lane.kind,
            detail,
        )

    def __repr__(self) -> str:
        return f"Dispatcher(channels={list(self.lanes)!r}, closed={self._closed})"


def print_undelivered(
    message: AlertMessage,
    channel: str,
    kind: str,
    why: str,
    *,
    again: bool = False,
    final: bool = True,
) -> None:
    """The default console fallback: the alert on stderr (as the console channel shows it),
    under a line saying which channel did not deliver it and why (``why`` is already
    scrubbed of secrets). ``final`` False: an attempt timed out and the channel is still
    retrying. ``again``: the alert was shown for another channel; only one line is added."""
    import sys

    from rich.console import Console

    from expr_tracker.alerts.delivery.channels.console import render_console

    console = Console(file=sys.stderr, highlight=False, soft_wrap=True)
    where = f"channel {channel!r} ({kind})"
    if again:
        step = f" (step {message.step})" if message.step is not None else ""
        state = "NOT DELIVERED" if final else "not yet delivered"
        console.print(
            f"expr_tracker: alert {message.title!r}{step} also {state} to {where}: {why}",
            markup=False,
            style="yellow",
        )
        return
    if final:
        head = f"expr_tracker: alert NOT DELIVERED to {where}: {why}; shown here instead:"
    else:
        head = f"expr_tracker: alert not yet delivered to {where}: {why}; shown here meanwhile:"
    console.print(head, markup=False, style="yellow")
    console.print(render_console(message))


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
        level=str(level),
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
