"""The dispatcher: routing, then per channel a bounded queue and one worker thread running
dedup -> token bucket -> send with retries. Training never waits on a channel.

    d = Dispatcher(record=alert_log.write, context=lambda: {"project": p, "run": r, "step": s})
    d.add_channel(slack_channel, policy=Policy(rate_limit_per_minute=20), min_level="error")
    d.submit(AlertMessage("loss spike", "loss 9.1", level="error"))   # returns at once
    d.stats()            # {"slack": {"sent": 1, "failed": 0, ...}}
    d.close(timeout=10)  # drain within a deadline; what is left is recorded undelivered

Per message and channel, on the channel's worker (timing lives here, a channel only sends:
docs/channels.md "Policy"):

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
Rule alerts from the training thread never block on a full queue (with ``async_send: false``
they wait for their own send, see ``notify``). Whatever the mode, the least severe
message goes first: the oldest (``drop_oldest``) or newest (``drop_new``) queued message of the
lowest level present is dropped when the new message is more severe than it; the new message
is dropped when nothing queued is less severe than it (``drop_new``) or everything queued is
more severe (``drop_oldest``).

Clocks: ``clock`` (monotonic seconds) drives rate limits, backoff, dedup windows and the drain
deadline; ``sleep`` replaces waiting between retries; ``start=False`` runs no threads and
``pump()`` does the work on the caller's thread, so tests check timing exactly.

Where it lives: the policy state in ``delivery.policy`` (``TokenBucket``, ``Dedup``,
``RetryRule``), the stages that apply it and their verdicts in ``delivery.stages``
(``Deduplicate``, ``RateLimit``, ``Retry``), the per-channel queue, worker and the for-loop
over the stages in ``delivery.lane``; this module routes, submits, reports, shows
undelivered alerts and closes the lanes (each through its ``drain(deadline)``).
"""

from __future__ import annotations

import atexit
import logging
import random as _random
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from expr_tracker._warn import Warner
from expr_tracker.alerts.delivery.channels.base import ATTEMPT_TIMEOUTS
from expr_tracker.alerts.delivery.lane import EXIT, Lane
from expr_tracker.alerts.delivery.message import AlertMessage, event_to_message
from expr_tracker.alerts.delivery.policy import URGENT_LEVEL, Policy, TokenBucket
from expr_tracker.alerts.delivery.stages import Item, Ticket

__all__ = [
    "DEFAULT_DRAIN_TIMEOUT",
    "URGENT_LEVEL",
    "Dispatcher",
    "Lane",
    "Policy",
    "Submission",
    "TokenBucket",
    "add_tap",
    "event_to_message",
    "print_undelivered",
    "remove_tap",
]

log = logging.getLogger("expr_tracker.alerts")

#: seconds ``close()`` waits for queues to drain by default
DEFAULT_DRAIN_TIMEOUT = 10.0


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
        self._warner = Warner(log)  # once per (channel, cause) when no ``warner`` is given
        #: configured channels that are off (not lanes): name -> why ("ET_X is not set")
        self.skipped: dict[str, str] = {}
        #: ranks whose run-less ``et.alert()`` calls this dispatcher delivers
        #: (``alerts.on_rank``; a dispatcher built by hand: every rank)
        self.on_rank: Any = "all"
        self._closed = False  # no message is taken any more (close() began)
        self._close_done = False  # close() completed
        #: (timeout, deadline on the lane clock, wall end, lanes given up -> abandoned)
        #: of the close in progress: an interrupted close() resumes with them
        self._closing: tuple[float, float, float, dict[str, int | None]] | None = None
        self.record_errors = 0
        self.fallback = print_undelivered if fallback == "stderr" else fallback
        #: id(message) -> message, for the messages the fallback showed (bounded)
        self._echoed: dict[int, AlertMessage] = {}
        if at_exit:
            ref = weakref.ref(self)

            def _drain() -> None:
                d = ref()
                if d is not None and not d._close_done:
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
            channel,
            policy or Policy(),
            clock=self.clock,
            sleep=self.sleep,
            random=self.random,
            record=self.record_outcome,
            show=self.show_undelivered,
            warn=self.warn_failure,
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
            if not matches:
                if wanted in self.skipped:
                    self._warner.warn(
                        ("unknown channel", wanted),
                        "expr_tracker: alert for channel %r, which is off: %s",
                        wanted,
                        self.skipped[wanted],
                    )
                else:
                    self._warner.warn(
                        ("unknown channel", wanted),
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
            direct: a direct ``et.alert()`` call (``on_queue_full: block`` applies); False
                for rule alerts from the committing thread (they never block on a full
                queue).
            wait: True waits for the outcome on every routed channel (bounded by each
                policy's longest send); None waits on the channels with ``async_send:
                false``; False never waits. That implicit wait, when not ``direct``, is
                for one attempt: it ends when the first attempt's outcome is known (a retry goes
                on in the background) or the rate limit holds the message back, and lasts
                at most ``ATTEMPT_TIMEOUTS * timeout + 1`` seconds per channel.
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
        waiting: list[tuple[Lane, Ticket]] = []
        on_console = any(lane.kind == "console" for lane in lanes)
        for lane in lanes:
            must_wait = wait if wait is not None else not lane.policy.async_send
            # a rule alert waiting on an async_send: false channel waits for one attempt
            ticket = Ticket(first_attempt=wait is None and not direct) if must_wait else None
            item = Item(message, ticket)
            item.on_console = on_console
            if lane.put(item, direct=direct):
                accepted.append(lane.name)
                lane.check_stuck(item)
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
                if ticket.first_attempt:  # one attempt (a rule alert on the training thread)
                    bound = ATTEMPT_TIMEOUTS * lane.policy.timeout + 1.0
                else:
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
        routed by the rule's ``channels`` and ``tags`` and queue it. Never raises and never
        blocks on a full queue; on a channel with ``async_send: false`` it waits (on the
        committing thread, or the watchdog's) for that channel's first attempt: until it
        sent it, the attempt failed (retries go on in the background), it dropped it or
        the rate limit held it back, at most ``ATTEMPT_TIMEOUTS * timeout + 1`` seconds.
        Returns whether some channel accepted it."""
        try:
            message = event_to_message(event)
        except Exception:  # noqa: BLE001
            log.warning("expr_tracker: cannot turn alert event %r into a message", event)
            return False
        return bool(self.submit(message, direct=False).accepted)

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
                if wait == EXIT or wait is None:
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

        Resumable: interrupted (Ctrl-C), a second call continues the drain within what is
        left of the first call's deadline, then records and shows what is undelivered.

        Returns:
            channel name -> messages recorded undelivered at the deadline.
        """
        with self._lock:
            if self._close_done:
                return {}
            self._closed = True
            if self._closing is None:
                timeout = self.drain_timeout if timeout is None else float(timeout)
                self._closing = (
                    timeout,
                    self.clock() + timeout,
                    time.monotonic() + timeout,
                    {},
                )
        timeout, deadline, end, given_up = self._closing
        lanes = [lane for lane in self.lanes.values() if lane.enabled]
        for lane in lanes:  # every lane stops waiting for tokens before any is waited on
            lane.start_drain(deadline)
        for lane in lanes:
            if lane.name not in given_up:
                lane.drain(deadline, wall_end=end)
        for lane in lanes:
            if lane.name not in given_up:
                given_up[lane.name] = lane.give_up(timeout)
        for lane in self.lanes.values():
            lane.close_channel()
        self._close_done = True
        return {name: n for name, n in given_up.items() if n is not None}

    @property
    def closed(self) -> bool:
        return self._closed

    # ---------------------------------------------------------------- reporting

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per channel: type, target (redacted), sent, failed, suppressed, dropped, retries,
        rate_limited, coalesced, pending, alive, last_error (scrubbed), last_status."""
        return {name: lane.stats() for name, lane in self.lanes.items()}

    def record_outcome(self, record: dict) -> None:
        """Hand a delivery outcome to ``record``; a failing ``record`` is counted
        (``record_errors``) and logged once, never raised into a lane."""
        if self.record is None:
            return
        try:
            self.record(record)
        except Exception:  # noqa: BLE001 - recording must not break delivery
            self.record_errors += 1
            if self.record_errors == 1:
                log.warning("expr_tracker: cannot record an alert delivery outcome", exc_info=True)

    def show_undelivered(self, lane: Lane, item: Item, why: str, *, final: bool = True) -> None:
        """Show ``item``, which ``lane`` did not deliver (yet: ``final`` False), through
        ``fallback`` once (see "Console fallback"): not on a console lane, not when a console
        channel took the message; a second channel failing it adds one line. Never raises."""
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

    def warn_failure(self, lane: Lane, reason: str, detail: str) -> None:
        """Log a send failure of ``lane``: once per (channel, cause) through ``warner`` or
        this module's logger; every time, as an error, with ``fail_silently: false``."""
        message = "expr_tracker: alert channel %s (%s) failed: %s"
        if not lane.policy.fail_silently:
            log.error(message, lane.name, lane.kind, detail)
            return
        key = (lane.name, reason)
        if self.warner is not None:
            self.warner.warn(("alert delivery",) + key, message, lane.name, lane.kind, detail)
            return
        self._warner.warn(
            key,
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
