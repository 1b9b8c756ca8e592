"""Each delivery stage alone: no lane, no thread, no real time.

A stage is ``stage(item, now) -> Verdict``; these tests hand it an ``Item`` and read the
verdict (``PASS``, ``Hold``, ``Drop``/``Failed``) the lane would apply.
"""

from __future__ import annotations

from expr_tracker.alerts.delivery import AlertMessage, Policy
from expr_tracker.alerts.delivery.channels import DeliveryError, SendResult
from expr_tracker.alerts.delivery.policy import Dedup, RetryRule, TokenBucket
from expr_tracker.alerts.delivery.stages import (
    PASS,
    Deduplicate,
    Drop,
    Failed,
    Hold,
    Item,
    RateLimit,
    Retry,
    Ticket,
)
from expr_tracker.testing import FakeClock

COUNTS = ("retries", "rate_limited", "coalesced")


def item(title="disk full", level="warning", ticket=None):
    return Item(AlertMessage(title, level=level), ticket)


def test_deduplicate_passes_the_first_and_drops_a_repeat_without_a_record():
    stage = Deduplicate(Dedup(60.0))
    assert stage(item(), 0.0) is PASS
    verdict = stage(item(), 10.0)
    assert isinstance(verdict, Drop) and verdict.counter == "suppressed"
    assert verdict.record is False
    assert stage(item(), 61.0) is PASS  # the window has ended


def test_rate_limit_verdicts_per_mode():
    counts = dict.fromkeys(COUNTS, 0)
    queue = RateLimit(TokenBucket(4, 0.0), "queue", counts)  # a burst of 1, then 15 s a token
    assert queue(item("a"), 0.0) is PASS
    held = queue(item("b"), 0.0)
    assert isinstance(held, Hold) and not held.kept and held.wait == 15.0
    assert counts["rate_limited"] == 1 and queue.held == []  # the lane puts it back

    dropping = RateLimit(TokenBucket(4, 0.0), "drop", counts)
    dropping(item("a"), 0.0)
    dropped = dropping(item("b"), 0.0)
    assert isinstance(dropped, Drop) and dropped.detail == "dropped: rate limited"


def test_rate_limit_keeps_what_it_coalesces_and_releases_it_on_a_token():
    counts = dict.fromkeys(COUNTS, 0)
    stage = RateLimit(TokenBucket(4, 0.0), "coalesce", counts)
    assert stage(item("i0", "info"), 0.0) is PASS
    for title in ("i1", "i2"):
        verdict = stage(item(title, "info"), 0.0)
        assert isinstance(verdict, Hold) and verdict.kept
    assert stage(item("urgent", "critical"), 0.0) is PASS  # borrows a token
    assert stage.release(0.0) is None and stage.wait(0.0) == 30.0  # the debt, then a token
    summary = stage.release(30.0)
    assert summary is not None and summary.has_token and summary.coalesced == 2
    assert summary.message.title == "2 alerts held back by the rate limit"
    assert stage(summary, 30.0) is PASS  # it has its token: the stage lets it through
    assert counts == {"retries": 0, "rate_limited": 2, "coalesced": 2}


class Scripted:
    def __init__(self, *answers):
        self.answers = list(answers)
        self.sent = 0

    def send(self, message, timeout):
        self.sent += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return SendResult(status=200, body="ok")


def make_retry(channel, wait_until=None, **policy):
    clock = FakeClock()
    counts = dict.fromkeys(COUNTS, 0)

    def sleep_until(target):
        clock.sleep(target - clock())
        return True

    stage = Retry(
        channel,
        RetryRule(Policy(jitter=0.0, **policy)),
        timeout=5.0,
        clock=clock,
        random=lambda: 0.5,
        wait_until=wait_until or sleep_until,
        counts=counts,
    )
    return stage, clock, counts


def test_retry_owns_its_loop_and_passes_what_the_channel_took():
    down = DeliveryError("HTTP 503", status=503)
    ticket = Ticket(first_attempt=True)
    stage, clock, counts = make_retry(Scripted(down, down, "ok"), backoff_initial=1.0)
    it = item(ticket=ticket)
    assert stage(it, clock()) is PASS
    assert clock.sleeps == [1.0, 2.0] and counts["retries"] == 2
    assert it.attempts == 3 and it.status == 200 and it.answer.startswith("HTTP 200")
    assert ticket.delivered is False and "retrying in the background" in ticket.detail
    assert stage.last_status == 200 and not stage.sending


def test_retry_gives_up_on_a_final_status_or_when_the_lane_will_not_wait():
    stage, clock, _ = make_retry(Scripted(DeliveryError("HTTP 404", status=404, body="no")))
    verdict = stage(item(), clock())
    assert isinstance(verdict, Failed) and verdict.counter == "failed"
    assert (verdict.reason, verdict.detail, verdict.status) == ("HTTP 404", "HTTP 404: no", 404)
    assert clock.sleeps == []

    refused = DeliveryError("connection refused", retryable=True)
    stage, clock, counts = make_retry(Scripted(refused), wait_until=lambda target: False)
    verdict = stage(item(), clock())
    assert isinstance(verdict, Failed)
    assert verdict.detail == "connection refused (retry abandoned: drain deadline)"
    assert counts["retries"] == 1
