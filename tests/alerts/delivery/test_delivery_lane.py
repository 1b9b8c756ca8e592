"""One lane driven alone: no dispatcher, no thread, no real time.

The lane takes its clock, sleep and randomness as plain values; here a FakeClock (whose
``sleep`` only moves it) and a fixed ``random``, so every wait the policy asks for is
checked exactly and nothing ever sleeps for real (``time.sleep`` raises).
"""

from __future__ import annotations

import time

import pytest

from expr_tracker.alerts.delivery import AlertMessage, Lane, Policy
from expr_tracker.alerts.delivery.channels import DeliveryError, SendResult
from expr_tracker.alerts.delivery.lane import EXIT
from expr_tracker.alerts.delivery.stages import (
    PASS,
    Deduplicate,
    Drop,
    Item,
    RateLimit,
    Retry,
    Ticket,
)
from expr_tracker.testing import FakeClock

QUIET = {"rate_limit_per_minute": None, "dedup_window": 0.0}


class Scripted:
    """A channel answering from ``script`` in order (the last answer repeated): "ok", or a
    ``DeliveryError`` to raise."""

    kind = "scripted"

    def __init__(self, *script):
        self.name = "s"
        self.script = list(script) or ["ok"]
        self.sent: list[tuple[str, float]] = []

    def send(self, message, timeout):
        answer = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        self.sent.append((message.title, timeout))
        if isinstance(answer, Exception):
            raise answer
        return SendResult(status=200, body="ok")

    def secrets(self):
        return ("T0KEN-s3cr3t",)


@pytest.fixture(autouse=True)
def no_real_sleep(monkeypatch):
    def refuse(seconds):
        raise AssertionError(f"the lane slept for real ({seconds} s)")

    monkeypatch.setattr(time, "sleep", refuse)


def make_lane(channel, rnd=0.5, **policy):
    clock = FakeClock()
    out = {"records": [], "shown": [], "warned": []}
    lane = Lane(
        channel,
        Policy.from_spec(None, **{**QUIET, **policy}),
        clock=clock,
        sleep=clock.sleep,
        random=lambda: rnd,
        record=out["records"].append,
        show=lambda lane, item, why, final=True: out["shown"].append((item.message.title, why)),
        warn=lambda lane, reason, detail: out["warned"].append(reason),
    )
    return lane, clock, out


def run(lane, clock, until=None):
    """Step the lane to idle, sleeping (fake) through its waits; stop at ``until``."""
    for _ in range(1000):
        wait = lane.step()
        if wait is None or wait == EXIT:
            return
        if wait > 0:
            if not lane.has_work() or (until is not None and clock() + wait > until):
                return
            clock.sleep(wait)
    raise AssertionError("the lane never went idle")


def test_the_lane_reads_as_its_stages():
    lane, _, _ = make_lane(Scripted())
    assert [type(s) for s in lane.stages] == [Deduplicate, RateLimit, Retry]
    assert lane.thread is None and lane.alive


def test_retries_wait_the_jittered_backoff_on_the_lane_clock():
    down = DeliveryError("HTTP 503", status=503)
    channel = Scripted(down, down, "ok")
    lane, clock, out = make_lane(
        channel, rnd=1.0, backoff_initial=1.0, backoff_factor=2.0, jitter=0.5, max_retries=3
    )
    lane.put(Item(AlertMessage("disk full", level="error")), direct=False)
    run(lane, clock)
    # rnd 1.0 is the top of the jitter band: 1 * 1.5, then 2 * 1.5
    assert clock.sleeps == [1.5, 3.0]
    assert len(channel.sent) == 3
    (rec,) = out["records"]
    assert rec["delivered"] is True and rec["attempts"] == 3 and rec["status"] == 200
    assert lane.counts["retries"] == 2 and lane.counts["sent"] == 1
    assert out["shown"] == [] and out["warned"] == []


def test_retry_after_wins_over_the_backoff_and_a_final_status_fails_at_once():
    channel = Scripted(DeliveryError("HTTP 429", status=429, retry_after=7), "ok")
    lane, clock, out = make_lane(channel)
    lane.put(Item(AlertMessage("slow down")), direct=False)
    run(lane, clock)
    assert clock.sleeps == [7.0] and out["records"][0]["delivered"] is True

    channel = Scripted(DeliveryError("HTTP 404", status=404, body="no hook T0KEN-s3cr3t"))
    lane, clock, out = make_lane(channel)
    ticket = Ticket()
    lane.put(Item(AlertMessage("gone"), ticket), direct=False)
    run(lane, clock)
    assert clock.sleeps == [] and len(channel.sent) == 1
    (rec,) = out["records"]
    assert rec["delivered"] is False and rec["attempts"] == 1
    assert "T0KEN" not in rec["error"] and rec["error"].startswith("HTTP 404")
    assert ticket.delivered is False and out["warned"] == ["HTTP 404"]
    assert out["shown"] == [("gone", rec["error"])]  # the console fallback, once


def test_dedup_suppresses_within_the_window_then_sends_one_summary():
    channel = Scripted()
    lane, clock, out = make_lane(channel, dedup_window=60.0)
    for _ in range(3):
        lane.put(Item(AlertMessage("nan loss")), direct=False)
    run(lane, clock, until=clock() + 30)
    assert [t for t, _ in channel.sent] == ["nan loss"] and clock.sleeps == []
    assert lane.counts["suppressed"] == 2 and len(out["records"]) == 1
    clock.advance(61)  # the window (60 s from the first occurrence) has ended
    run(lane, clock)
    assert [t for t, _ in channel.sent] == ["nan loss", "nan loss (+2 suppressed)"]


def test_rate_limit_coalesces_and_an_urgent_message_borrows_a_token():
    channel = Scripted()
    # 4 a minute: a burst of 1, then one token every 15 s
    lane, clock, out = make_lane(channel, rate_limit_per_minute=4, on_rate_limited="coalesce")
    lane.put(Item(AlertMessage("info 0", level="info")), direct=False)
    run(lane, clock, until=clock())  # spends the only token
    for i in (1, 2):
        lane.put(Item(AlertMessage(f"info {i}", level="info")), direct=False)
    lane.put(Item(AlertMessage("critical", level="critical")), direct=False)
    run(lane, clock, until=clock() + 1)
    # the critical one goes first, on a borrowed token; the infos are held back
    assert [t for t, _ in channel.sent] == ["info 0", "critical"]
    assert lane.counts["rate_limited"] == 2 and len(lane.held) == 2
    run(lane, clock)
    # the debt (-1) and the next token: 2 tokens at 15 s each
    assert clock.sleeps == [30.0]
    assert channel.sent[-1][0] == "2 alerts held back by the rate limit"
    assert lane.counts["coalesced"] == 2 and lane.counts["sent"] == 3
    (summary,) = [r for r in out["records"] if r.get("coalesced")]
    assert summary["coalesced"] == 2 and summary["delivered"] is True


def test_a_stage_drops_a_message_with_a_drop_verdict():
    class NoDebug:
        def __call__(self, item, now):
            if item.message.level == "debug":
                return Drop("dropped", "dropped: debug is not sent here")
            return PASS

    channel = Scripted()
    lane, clock, out = make_lane(channel)
    lane.stages.insert(0, NoDebug())
    lane.put(Item(AlertMessage("chatty", level="debug")), direct=False)
    lane.put(Item(AlertMessage("real", level="warning")), direct=False)
    run(lane, clock)
    assert [t for t, _ in channel.sent] == ["real"]
    assert lane.counts["dropped"] == 1
    dropped = [r for r in out["records"] if not r["delivered"]]
    assert dropped[0]["title"] == "chatty" and dropped[0]["error"].startswith("dropped: debug")


def test_drain_gives_up_a_retry_past_the_deadline_and_records_what_is_left():
    down = DeliveryError("connection refused", retryable=True)
    channel = Scripted(down)
    lane, clock, out = make_lane(channel, backoff_initial=5.0, max_retries=5, jitter=0.0)
    lane.put(Item(AlertMessage("first")), direct=False)
    lane.put(Item(AlertMessage("second")), direct=False)
    deadline = clock() + 12.0
    lane.drain(deadline)
    # each message: 5 s, then a 10 s wait would pass the deadline: that retry is abandoned
    assert clock.sleeps == [5.0, 5.0] and clock() <= deadline
    assert lane.give_up(12.0) is None  # nothing left: both ended before the deadline
    errors = {r["title"]: r["error"] for r in out["records"]}
    assert set(errors) == {"first", "second"}
    assert all(e.endswith("(retry abandoned: drain deadline)") for e in errors.values())
    assert lane.counts["retries"] == 4 and lane.counts["failed"] == 2
    assert not lane.alive and lane.step() == EXIT


def test_give_up_records_what_is_still_queued_at_the_deadline():
    channel = Scripted()
    lane, clock, out = make_lane(channel, rate_limit_per_minute=1, on_rate_limited="queue")
    for i in range(3):
        lane.put(Item(AlertMessage(f"m{i}", level="warning")), direct=False)
    run(lane, clock, until=clock())  # one token: m0 goes, the rest wait for tokens
    assert [t for t, _ in channel.sent] == ["m0"]
    lane.start_drain(clock())  # a deadline already reached
    assert lane.give_up(0.0) == 2
    left = [r for r in out["records"] if not r["delivered"]]
    assert [r["title"] for r in left] == ["m1", "m2"]
    assert all("still queued" in r["error"] for r in left)
    assert [t for t, _ in out["shown"]] == ["m1", "m2"]
