"""One channel's lane: its routing filter, bounded severity-ordered queue, the stages run
on every message, its worker thread and counters.

A message popped from the queue (most severe first, first in first out within a level)
runs through the lane's stages (``delivery.stages``), a list run by a for-loop::

    stages = [Deduplicate(dedup), RateLimit(bucket, on_rate_limited), Retry(channel, rule)]

Each stage returns a verdict and the lane applies the first that is not ``PASS``: ``Hold``
(put the message back, or leave it with the stage that kept it, and look again later),
``Drop`` (count it, record it undelivered; ``Failed``, a send given up, is also warned about
and shown through the console fallback). A message every stage passed was sent: the lane
counts and records it. The module docstring of ``delivery.dispatcher`` gives the policy in
full.

Who owns what: the lane owns the queue, the dedup summaries waiting to go, the message the
worker holds (``_inflight``), the counters and the drain (closing, deadline, abort); the
stages own their policy state (``RateLimit`` the coalesce buffer, ``Retry`` the attempt
loop and the send in progress). Stages never see the lane: it hands them values
(``counts``) and callables (``Retry``'s ``wait_until`` is the lane's interruptible,
deadline-aware wait).

The lane takes its clock, sleep and randomness, and the callables it reports to (``record``
for outcomes, ``show`` for the console fallback, ``warn`` for failures), as plain values:
it knows nothing of the dispatcher, and a test drives it with a fake clock and no thread
(``step()``, then ``drain(deadline)`` and ``give_up(timeout)``).

One module on purpose: the queue, the worker loop, the verdicts and the drain are one
state machine under one lock (``_cond``); split apart, each part would reach into the
others' state.
"""

from __future__ import annotations

import logging
import random as _random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from expr_tracker.alerts.delivery.channels.base import ATTEMPT_TIMEOUTS
from expr_tracker.alerts.delivery.message import LEVELS, AlertMessage, normalize_level
from expr_tracker.alerts.delivery.policy import Dedup, Policy, RetryRule, TokenBucket
from expr_tracker.alerts.delivery.stages import (
    PASS,
    Deduplicate,
    Drop,
    Failed,
    Hold,
    Item,
    RateLimit,
    Retry,
    Stage,
    Verdict,
)

__all__ = ["EXIT", "Lane"]

log = logging.getLogger("expr_tracker.alerts")

#: what ``Lane.step`` returns once the lane is closed and drained
EXIT = -1.0


# ---------------------------------------------------------------------------- the lane


class Lane:
    """One channel: its routing filter, policy stages, bounded queue, worker and counters.

    Args:
        channel: anything with ``name`` and ``send(message, timeout)`` (``secrets()``,
            ``kind``, ``target`` and ``close()`` used when present).
        policy: the channel's ``Policy``.
        clock: monotonic seconds (rate limit, backoff, dedup windows, drain deadline).
        sleep: ``sleep(seconds)`` between retries and, without a thread, through waits;
            None: an interruptible wait on the lane's condition.
        random: ``random() -> float`` in [0, 1) for the backoff jitter.
        record: ``record(dict)`` for every outcome (``kind: "delivery"``); never raises
            into the lane when it is the dispatcher's.
        show: ``show(lane, item, why, final=True)``: the console fallback for an item not
            delivered (None: nothing is shown).
        warn: ``warn(lane, reason, detail)`` for a send failure (None: a log warning).
        enabled, min_level, levels, tags: the routing filter (``admits``).
    """

    def __init__(
        self,
        channel: Any,
        policy: Policy,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] | None = None,
        random: Callable[[], float] = _random.random,
        record: Callable[[dict], Any] | None = None,
        show: Callable[..., Any] | None = None,
        warn: Callable[[Lane, str, str], Any] | None = None,
        enabled: bool = True,
        min_level: str | None = None,
        levels: Iterable[str] | None = None,
        tags: Iterable[str] | None = None,
    ) -> None:
        self.channel = channel
        self.name = str(getattr(channel, "name", None) or type(channel).__name__)
        self.kind = str(getattr(channel, "kind", type(channel).__name__))
        self.policy = policy
        self.clock = clock
        self.sleep = sleep
        self.random = random
        self.record = record
        self.show = show
        self.warn = warn
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
        self._queue: deque[Item] = deque()
        self._ranks = [0] * len(LEVELS)  # queued items per level (severity-ordered pops)
        self._kicked = False  # put() since the worker last looked
        self._summaries: deque[Item] = deque()
        self._inflight: list[Item] = []  # the item the worker took, until its verdict applied
        self.counts = dict.fromkeys(
            ("sent", "failed", "suppressed", "dropped", "retries", "rate_limited", "coalesced"), 0
        )
        self.last_error: str | None = None
        self.bucket = TokenBucket(policy.rate_limit_per_minute, clock())
        self.dedup = Dedup(policy.dedup_window)
        self.rate_limit = RateLimit(self.bucket, policy.on_rate_limited, self.counts)
        self.retry = Retry(
            channel,
            RetryRule(policy),
            timeout=policy.timeout,
            clock=clock,
            random=random,
            wait_until=self._sleep_until,
            counts=self.counts,
            secrets=secrets,
            show=self._show_retrying,
        )
        self.stages: list[Stage] = [Deduplicate(self.dedup), self.rate_limit, self.retry]
        self.closing = False
        self._deadline: float | None = None
        self._abort = False
        self._abandoned = False
        self._giving_up: tuple[bool, list[Item], deque[Item], int] | None = None
        self._gave_up = False
        self._done = False
        self.thread: threading.Thread | None = None

    @property
    def held(self) -> list[Item]:
        """What the rate limit holds back (its coalesce buffer)."""
        return self.rate_limit.held

    @property
    def last_status(self) -> int | None:
        """The endpoint's last HTTP status (any attempt)."""
        return self.retry.last_status

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

    def put(self, item: Item, *, direct: bool) -> bool:
        """Enqueue ``item``; returns False when it was dropped (queue full / closed)."""
        dropped: list[tuple[Item, str]] = []
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

    def _victim(self, new: Item, *, newest: bool) -> Item | None:
        """With the lock held and the queue full: remove and return the queued message to
        drop for ``new`` (the oldest, or newest, of the least severe level queued), or None
        when ``new`` itself is the one to drop."""
        low = next(r for r, n in enumerate(self._ranks) if n)
        if new.rank < low or (newest and new.rank == low):
            return None
        order = range(len(self._queue) - 1, -1, -1) if newest else range(len(self._queue))
        index = next(i for i in order if self._queue[i].rank == low)
        return self._take_at(index)

    def _take_at(self, index: int) -> Item:
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

    def check_stuck(self, item: Item) -> None:
        """A send in flight longer than an attempt may last (``ATTEMPT_TIMEOUTS + 1`` times
        ``timeout``: a channel that ignores its timeout) holds every message queued behind
        it: show the one in flight and ``item`` (just queued) now (the console fallback)."""
        if not self.retry.sending or self.show is None:
            return
        age = self.clock() - self.retry.started
        if age <= (ATTEMPT_TIMEOUTS + 1) * self.policy.timeout:
            return
        with self._cond:
            stuck = [i for i in self._inflight if i is not item]
        for it in stuck:
            self.show(self, it, f"no answer for {age:.0f} s", final=False)
        self.show(self, item, f"queued behind a send with no answer for {age:.0f} s", final=False)

    # ---------------------------------------------------------------- worker side

    def _pop(self) -> Item | None:
        """The next message, now in flight: a dedup summary or the most severe queued
        message (the oldest of its level), whichever is more severe (the summary on a
        tie)."""
        with self._cond:
            top = self._top_rank()
            if self._summaries and self._summaries[0].rank >= top:
                item = self._summaries.popleft()
                self._inflight = [item]
                return item
            if top < 0:
                return None
            if self._queue[0].rank == top:
                item = self._take_at(0)
            else:
                item = self._take_at(next(i for i, q in enumerate(self._queue) if q.rank == top))
            self._inflight = [item]
            self._cond.notify_all()  # a blocked producer may continue
            return item

    def push_back(self, item: Item) -> None:
        """Return a held item to the front of its queue; it is no longer in flight."""
        with self._cond:
            self._inflight = []
            if item.summary:
                self._summaries.appendleft(item)
            else:
                self._queue.appendleft(item)
                self._ranks[item.rank] += 1

    def has_work(self) -> bool:
        return bool(self._queue or self._summaries or self.held or self.dedup.pending())

    def step(self) -> float | None:
        """Do one unit of work. Returns 0 when more may be done at once, seconds until the
        next timed event, None when idle, or ``EXIT`` when closed and drained."""
        if self._abort:
            return EXIT
        self._kicked = False
        now = self.clock()
        for summary in self.dedup.expired(now):
            with self._cond:
                self._summaries.append(Item(summary, summary=True))
        released = self.rate_limit.release(now)  # what it held back, now that a token came
        if released is not None:
            return self._run_stages(released, now)
        item = self._pop()
        if item is None:
            if self.closing:
                late = self.dedup.expired(now, everything=True)
                if late:
                    with self._cond:
                        self._summaries.extend(Item(m, summary=True) for m in late)
                    return 0.0
                # the drain is the last chance: what the rate limit held back goes out
                # now as one summary, on a borrowed token, rather than being lost
                released = self.rate_limit.release(now, last=True)
                if released is not None:
                    return self._run_stages(released, now)
                return EXIT
            waits = [w for w in (self.rate_limit.wait(now),) if w is not None]
            expiry = self.dedup.next_expiry()
            if expiry is not None:
                waits.append(max(0.0, expiry - now))
            return min(waits) if waits else None
        return self._run_stages(item, now)

    def _run_stages(self, item: Item, now: float) -> float:
        """Run ``item`` through the stages, in order, until one says other than ``PASS``;
        apply that verdict (``PASS`` from every stage: sent). Returns what ``step`` does."""
        with self._cond:  # a popped item is in flight already (taken under the same lock)
            self._inflight = [item]
        try:
            verdict: Verdict = PASS
            for stage in self.stages:
                verdict = stage(item, now)
                if verdict is not PASS:
                    break
            return self._apply(item, verdict)
        finally:
            with self._cond:
                self._inflight = []

    def _apply(self, item: Item, verdict: Verdict) -> float:
        """Do what ``verdict`` says with ``item``; returns what ``step`` does."""
        if isinstance(verdict, Hold):
            if not verdict.kept:
                self.push_back(item)
            for t in item.tickets:
                if t.first_attempt:
                    t.resolve(False, verdict.detail)
            return verdict.wait
        if isinstance(verdict, Failed):
            self._failed(item, verdict)
        elif isinstance(verdict, Drop):
            self.counts[verdict.counter] += 1
            if verdict.record:
                self._finish(item, False, verdict.detail)
            else:
                for t in item.tickets:
                    t.resolve(False, verdict.detail)
        elif verdict is not PASS:
            raise TypeError(f"a lane stage returned {verdict!r}, not PASS, Hold or Drop")
        elif not self._abandoned:  # PASS from every stage: the channel took it
            self.counts["sent"] += 1
            self._finish(
                item,
                True,
                item.answer,
                status=item.status,
                attempts=item.attempts,
                coalesced=item.coalesced,
            )
        return 0.0

    def _show_retrying(self, item: Item, why: str) -> None:
        """``Retry``'s ``show``: an attempt timed out and is retried."""
        if self.show is not None:
            self.show(self, item, why, final=False)

    def _sleep_until(self, target: float) -> bool:
        """Wait until ``target`` on the lane's clock; False when the drain deadline or an
        abort comes first (``Retry``'s ``wait_until``)."""
        while True:
            if self._abort:
                return False
            now = self.clock()
            remaining = target - now
            if remaining <= 0:
                return True
            if self.closing and self._deadline is not None and target > self._deadline:
                return False
            if self.sleep is not None:
                self.sleep(remaining)
            else:
                with self._cond:
                    if not self._abort:
                        self._cond.wait(remaining)

    def _failed(self, item: Item, failed: Failed) -> None:
        if self._abandoned:
            return
        detail = failed.detail
        self.counts["failed"] += 1
        self.last_error = detail
        if self.warn is not None:
            self.warn(self, failed.reason, detail)
        else:
            log.warning(
                "expr_tracker: alert channel %s (%s) failed: %s", self.name, self.kind, detail
            )
        if self.show is not None:
            self.show(self, item, detail)
        self._finish(
            item,
            False,
            detail,
            status=failed.status,
            attempts=item.attempts,
            coalesced=item.coalesced,
        )

    def _finish(
        self,
        item: Item,
        delivered: bool,
        detail: str,
        *,
        status: int | None = None,
        attempts: int = 0,
        coalesced: int = 0,
    ) -> None:
        for t in item.tickets:
            t.resolve(delivered, detail)
        if self.record is None:
            return
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
        self.record(record)

    # ---------------------------------------------------------------- thread

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name=f"et-alert-{self.name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while True:
                wait = self.step()
                if wait == EXIT:
                    break
                if wait is None or wait > 0:
                    with self._cond:
                        # new work since step() looked (a rate-limited item put back in the
                        # queue is not new work: waiting for its token must not spin)
                        if self._kicked or self._abort:
                            continue
                        if self.closing and wait is None:
                            continue
                        self._cond.wait(wait)
        except Exception:  # noqa: BLE001 - a worker bug must not kill the process
            log.exception("expr_tracker: alert worker %s stopped", self.name)
        finally:
            self._done = True
            with self._cond:
                self._cond.notify_all()

    # ---------------------------------------------------------------- drain

    def start_drain(self, deadline: float) -> None:
        """From now on nothing waits for a token and no retry passes ``deadline`` (lane
        clock); the worker exits once the queue is empty. Idempotent."""
        with self._cond:
            self.closing = True
            self._deadline = deadline
            self.rate_limit.draining = True
            self._cond.notify_all()

    def drain(self, deadline: float, *, wall_end: float | None = None) -> None:
        """Work off the queue until it is empty or ``deadline`` (lane clock) passes: with a
        worker thread, wait for it until ``wall_end`` (``time.monotonic()``; default: the
        deadline's distance from now); without one, do the work on this thread."""
        self.start_drain(deadline)
        if self.thread is not None:
            if wall_end is None:
                wall_end = time.monotonic() + max(0.0, deadline - self.clock())
            # not Thread.join: a join interrupted by Ctrl-C marks a running thread stopped
            # (CPython 3.11), and the resumed drain would give up at once
            with self._cond:  # the worker sets _done and notifies as it exits
                self._cond.wait_for(lambda: self._done, max(0.0, wall_end - time.monotonic()))
            return
        for _ in range(100_000):
            wait = self.step()
            if wait == EXIT or self.clock() > deadline:
                break
            if wait is None:
                break
            if wait > 0:
                if self.clock() + wait > deadline:
                    break
                self.sleep(wait)  # type: ignore[misc]
        self._done = True

    def give_up(self, timeout: float) -> int | None:
        """After ``drain``: abandon whatever is still queued or in flight (a hanging
        endpoint), recording each ``delivered: false`` with the reason and its attempts, and
        showing it through the console fallback. Returns how many were abandoned, or None
        when the lane had drained (``timeout``: the drain's, for the record's text)."""
        if self._giving_up is None:
            still = self.thread is not None and not self._done  # is_alive: see drain
            if not still and self.pending() == 0:
                self._done = True
                return None
            sending = self.retry.sending
            inflight, items = self.abandon("drain deadline")
            # resumable: an interrupted give_up, called again, records the rest
            self._giving_up = (sending, inflight, deque(items), len(items))
        sending, inflight, todo, count = self._giving_up
        while todo:
            item = todo[0]
            if item in inflight:
                why = (
                    "the endpoint had not answered"
                    if sending
                    else f"waiting to retry after {item.attempts} attempt(s)"
                )
            else:
                why = "still queued"
            detail = f"not delivered before the drain deadline ({timeout:g} s): {why}"
            if self.show is not None:
                self.show(self, item, detail)
            self._finish(item, False, detail, attempts=item.attempts, coalesced=item.coalesced)
            self.counts["failed"] += 1
            todo.popleft()
        if count and not self._gave_up:
            self._gave_up = True
            log.warning(
                "expr_tracker: %d alert(s) to channel %s not delivered before the "
                "drain deadline (%g s); recorded as undelivered",
                count,
                self.name,
                timeout,
            )
        return count

    def abandon(self, why: str) -> tuple[list[Item], list[Item]]:
        """Stop for good; return (the items in flight, everything not delivered)."""
        with self._cond:
            self._abort = True
            self._abandoned = True
            inflight = list(self._inflight)
            rest = list(self._summaries) + self.rate_limit.take_held() + list(self._queue)
            # an item put back (or kept by the rate limit) just before the worker let go of
            # it is in both lists: once is enough
            left = inflight + [i for i in rest if all(i is not f for f in inflight)]
            self._queue.clear()
            self._ranks = [0] * len(LEVELS)
            self._summaries.clear()
            self._cond.notify_all()
        return inflight, left

    def close_channel(self) -> None:
        """Close the channel (its connections); never raises."""
        try:
            self.channel.close()
        except Exception:  # noqa: BLE001
            pass

    # ---------------------------------------------------------------- reporting

    @property
    def alive(self) -> bool:
        if self._done or self._abandoned:
            return False
        return self.thread.is_alive() if self.thread is not None else not self.closing

    def pending(self) -> int:
        with self._cond:
            return len(self._queue) + len(self._summaries) + len(self.held) + len(self._inflight)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.kind, "target": _target(self.channel)}
        out.update(self.counts)
        out["pending"] = self.pending()
        out["alive"] = self.alive
        out["last_error"] = self.last_error
        out["last_status"] = self.last_status
        return out


def _target(channel: Any) -> str:
    try:
        return str(channel.target)
    except Exception:  # noqa: BLE001
        return getattr(channel, "kind", "?")
