"""Delivery policy: the settings (``Policy``) and one small class per policy stage.

- ``TokenBucket``: the rate limit (``rate_limit_per_minute``; burst = a quarter minute's
  worth, at least 1), with borrowing for urgent messages and the drain's last take.
- ``Dedup``: fixed windows from a key's first occurrence; counts what it suppresses and
  hands back a ``"<title> (+N suppressed)"`` summary when a window ends.
- ``RetryRule``: which failures are tried again and after how long (backoff with jitter,
  or ``Retry-After``).

Each takes its settings in ``__init__`` and the time as an argument (``now``), so a test
drives it without a clock. The stages (``delivery.stages``: ``Deduplicate``, ``RateLimit``,
``Retry``) apply them to each message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from expr_tracker.alerts.delivery.channels.base import ATTEMPT_TIMEOUTS, DeliveryError
from expr_tracker.alerts.delivery.message import LEVELS, AlertMessage

__all__ = ["URGENT_LEVEL", "URGENT_RANK", "Dedup", "Policy", "RetryRule", "TokenBucket"]

#: messages at this level or above are urgent: never held behind less severe ones
URGENT_LEVEL = "error"
URGENT_RANK = LEVELS.index(URGENT_LEVEL)


@dataclass(frozen=True)
class Policy:
    """Delivery policy (plain, for the worker; built from ``PolicySpec`` by ``from_spec``).
    Defaults: the table of docs/channels.md "Policy". Durations in seconds.

    Severity rule of a rate-limited channel (``rate_limit_per_minute``): the queue drains
    most severe first; ``error`` and ``critical`` messages are never held behind less severe
    ones: they bypass the ``coalesce`` buffer and may borrow one extra burst of tokens (the
    bucket goes into debt that less severe messages wait out). Past that borrowed burst they
    are rate-limited too (``on_rate_limited``), still ahead of less severe messages. A
    ``coalesce`` summary lists each held message's level, title, step and text (shortened),
    most severe first, and carries the highest level held.

    ``timeout`` bounds one HTTP attempt in two phases (``channels.bounded_http.post_json``): connecting
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


class Dedup:
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


class RetryRule:
    """When a failed send is tried again, and after how long (``Policy``'s retry fields).

    ``gives_up(error, attempt)``: True when ``error`` (a ``DeliveryError`` after attempt
    number ``attempt``, 1-based) is final: an HTTP status outside ``retry_on_status``, a
    service error that says it is not retryable, or ``max_retries`` retries spent.
    ``delay(error, attempt, rnd)``: seconds before the next attempt: the jittered backoff, or
    the endpoint's ``Retry-After`` when ``respect_retry_after``.
    """

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def retryable(self, error: DeliveryError) -> bool:
        """An HTTP status (>= 300) is retryable when in ``retry_on_status``; anything else
        as the channel says (``error.retryable``)."""
        status = error.status
        if status is not None and status >= 300:
            return status in self.policy.retry_on_status
        return bool(error.retryable)

    def gives_up(self, error: DeliveryError, attempt: int) -> bool:
        return not self.retryable(error) or attempt > self.policy.max_retries

    def delay(self, error: DeliveryError, attempt: int, rnd: float) -> float:
        delay = self.policy.backoff(attempt, rnd)
        if self.policy.respect_retry_after and error.retry_after is not None:
            delay = max(0.0, float(error.retry_after))
        return delay
