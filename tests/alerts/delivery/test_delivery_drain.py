"""The drain at finish: what the rate limit held back goes out as one summary; what is truly
undelivered is recorded with the real reason and the attempts made (the one in flight too)."""

from __future__ import annotations

import json
import threading
import time

import pytest
from helpers import alert_records as records

import expr_tracker as et
from expr_tracker.alerts.delivery import Dispatcher, Policy
from expr_tracker.alerts.delivery.message import AlertMessage
from expr_tracker.testing import FakeClock, InMemoryChannel, WebhookServer

pytestmark = pytest.mark.usefixtures("no_proxy")


def _storm(server, **policy):
    run = et.init(
        project="proj",
        name="r1",
        alert={
            "channels": [
                {
                    "type": "webhook",
                    "name": "wh",
                    "url": server.url,
                    "policy": {"rate_limit_per_minute": 4, **policy},
                }
            ]
        },
    )
    # the urgent two first, so that whenever the worker wakes they take the one token and
    # the one borrowed: the eight warnings are then held back by the rate limit
    assert et.alert("broken", level="error")
    assert et.alert("on fire", level="critical")
    for i in range(8):
        assert et.alert(f"warn {i}", text=f"detail {i}", level="warning")
    return run


def test_finish_folds_held_alerts_into_one_summary_over_http():
    with WebhookServer() as server:
        run = _storm(server)
        stats = run.dispatcher.stats
        t0 = time.monotonic()
        et.finish()
        elapsed = time.monotonic() - t0
        bodies = [server.json(i) for i in range(len(server.requests))]
    titles = [b["title"] for b in bodies]
    assert sorted(titles[:2]) == ["broken", "on fire"]
    assert titles[2:] == ["8 alerts held back by the rate limit"]
    summary = bodies[2]
    assert summary["level"] == "warning"
    assert summary["text"].splitlines() == [
        f"- [WARNING] warn {i} (step 0): detail {i}" for i in range(8)
    ]
    assert elapsed < 5.0  # a borrowed token: no waiting 15 s for the bucket to refill
    recs = records(run)
    assert len(recs) == 3 and all(r["delivered"] for r in recs)
    assert recs[2]["title"] == titles[2] and recs[2]["coalesced"] == 8
    assert recs[2]["attempts"] == 1
    assert not any("drain deadline" in str(r.get("error")) for r in recs)
    s = stats()["wh"]
    assert s["coalesced"] == 8 and s["sent"] == 3 and s["failed"] == 0


def test_drain_summary_send_failure_is_recorded_as_such():
    # the urgent two go through; the summary at drain meets a 404
    with WebhookServer([(200, "ok"), (200, "ok"), (404, "no such hook")]) as server:
        run = _storm(server, max_retries=0)
        et.finish()
        assert len(server.requests) == 3
    (rec,) = [r for r in records(run) if not r["delivered"]]
    assert rec["coalesced"] == 8 and rec["attempts"] == 1
    assert rec["error"] == "HTTP 404: no such hook" and rec["status"] == 404


def test_queue_mode_drain_sends_the_rest_as_a_summary_without_waiting():
    clock = FakeClock()
    recs = []
    ch = InMemoryChannel("q")
    d = Dispatcher(clock=clock, sleep=clock.sleep, start=False, record=recs.append)
    d.add_channel(
        ch,
        policy=Policy(rate_limit_per_minute=4.0, on_rate_limited="queue", dedup_window=0.0),
    )
    for i in range(3):
        d.submit(AlertMessage(f"q{i}"))
    assert d.close(timeout=10.0) == {}
    assert ch.titles == ["q0", "2 alerts held back by the rate limit"]
    assert clock.sleeps == []  # 15 s to the next token: the drain does not wait for it
    assert [r["delivered"] for r in recs] == [True, True] and recs[1]["coalesced"] == 2


def test_drop_mode_at_drain_says_rate_limited():
    clock = FakeClock()
    recs = []
    d = Dispatcher(clock=clock, sleep=clock.sleep, start=False, record=recs.append)
    d.add_channel(
        InMemoryChannel("x"),
        policy=Policy(rate_limit_per_minute=4.0, on_rate_limited="drop", dedup_window=0.0),
    )
    d.submit(AlertMessage("a"))
    d.submit(AlertMessage("b"))
    d.close(timeout=10.0)
    assert [(r["title"], r["delivered"], r["error"]) for r in recs] == [
        ("a", True, None),
        ("b", False, "dropped: rate limited"),
    ]


def test_attempt_in_flight_at_the_deadline_is_counted():
    with WebhookServer(["hang"]) as server:
        from expr_tracker.alerts.delivery.channels import create_channel

        recs = []
        d = Dispatcher(record=recs.append)
        ch = create_channel({"type": "webhook", "name": "stuck", "url": server.url})
        d.add_channel(ch, policy=Policy(timeout=30.0, rate_limit_per_minute=None))
        d.submit(AlertMessage("stuck", level="error"))
        d.submit(AlertMessage("behind"))
        end = time.monotonic() + 5.0
        while not server.requests and time.monotonic() < end:
            time.sleep(0.01)
        t0 = time.monotonic()
        assert d.close(timeout=0.3) == {"stuck": 2}
        assert time.monotonic() - t0 < 3.0
    by_title = {r["title"]: r for r in recs}
    assert by_title["stuck"]["attempts"] == 1 and not by_title["stuck"]["delivered"]
    assert by_title["stuck"]["error"] == (
        "not delivered before the drain deadline (0.3 s): the endpoint had not answered"
    )
    assert by_title["behind"]["attempts"] == 0
    assert by_title["behind"]["error"].endswith("still queued")
    assert "T0KEN" not in json.dumps(recs)


def test_retrying_message_abandoned_at_the_deadline_keeps_its_attempts():
    """A send that failed once and hangs on its retry: two attempts, the second in flight."""
    release = threading.Event()

    class FlakyThenHang(InMemoryChannel):
        def send(self, message, timeout):
            self.attempts += 1
            if self.attempts == 1:
                from expr_tracker.alerts.delivery.channels import DeliveryError

                raise DeliveryError("HTTP 503", status=503)
            release.wait(10)
            raise AssertionError("unreachable in this test")

    recs = []
    d = Dispatcher(record=recs.append)
    ch = FlakyThenHang("f")
    d.add_channel(ch, policy=Policy(backoff_initial=0.01, jitter=0.0, rate_limit_per_minute=None))
    d.submit(AlertMessage("m"))
    end = time.monotonic() + 5.0
    while ch.attempts < 2 and time.monotonic() < end:
        time.sleep(0.01)
    d.close(timeout=0.2)
    release.set()
    (rec,) = recs
    assert rec["attempts"] == 2 and "had not answered" in rec["error"]
