"""Every policy field, checked exactly on a fake clock (no threads, no sleeping)."""

from __future__ import annotations

import logging

import pytest

from expr_tracker.alerts.delivery import Dispatcher, Policy, TokenBucket, event_to_message
from expr_tracker.alerts.delivery.channels import DeliveryError
from expr_tracker.alerts.delivery.message import AlertMessage
from expr_tracker.testing import FakeClock, InMemoryChannel

NO_LIMIT = dict(rate_limit_per_minute=None, dedup_window=0.0, jitter=0.0)


class Scripted(InMemoryChannel):
    """Fails with the given DeliveryErrors in order, then succeeds."""

    kind = "scripted"

    def __init__(self, errors=(), name="s"):
        super().__init__(name)
        self.errors = list(errors)
        self.timeouts = []

    def send(self, message, timeout):
        self.timeouts.append(timeout)
        self.attempts += 1
        if self.errors:
            raise self.errors.pop(0)
        self.messages.append(message)
        return _ok()


def _ok():
    from expr_tracker.alerts.delivery.channels import SendResult

    return SendResult(200, "ok")


def make(channel, rnd=0.5, **policy):
    clock = FakeClock()
    records = []
    d = Dispatcher(
        clock=clock, sleep=clock.sleep, random=lambda: rnd, start=False, record=records.append
    )
    d.add_channel(channel, policy=Policy(**{**NO_LIMIT, **policy}))
    return d, clock, records


def m(title="t", **kw):
    return AlertMessage(title, **kw)


def test_exponential_backoff_capped():
    ch = Scripted([DeliveryError("HTTP 503", status=503)] * 5)
    d, clock, records = make(
        ch, max_retries=5, backoff_initial=0.5, backoff_factor=2.0, backoff_max=3.0
    )
    d.submit(m())
    d.pump()
    assert clock.sleeps == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert ch.titles == ["t"] and records[-1]["delivered"] and records[-1]["attempts"] == 6
    assert d.stats()["s"]["retries"] == 5


def test_jitter_spreads_the_wait():
    ch = Scripted([DeliveryError("HTTP 500", status=500)] * 2)
    d, clock, _ = make(ch, rnd=1.0, jitter=0.2, backoff_initial=1.0, backoff_factor=2.0)
    d.submit(m())
    d.pump()
    assert clock.sleeps == pytest.approx([1.2, 2.4])
    assert Policy(jitter=0.2, backoff_initial=1.0).backoff(1, 0.0) == pytest.approx(0.8)


def test_max_retries_then_failed_and_recorded():
    ch = Scripted([DeliveryError("HTTP 500", status=500, body="boom")] * 10)
    d, clock, records = make(ch, max_retries=2)
    d.submit(m())
    d.pump()
    assert ch.attempts == 3 and len(clock.sleeps) == 2
    (rec,) = records
    assert rec["kind"] == "delivery" and rec["delivered"] is False and rec["status"] == 500
    assert rec["error"] == "HTTP 500: boom"
    s = d.stats()["s"]
    assert (s["sent"], s["failed"], s["last_error"]) == (0, 1, "HTTP 500: boom")


def test_retry_on_status_is_the_set_retried():
    ch = Scripted([DeliveryError("HTTP 418", status=418), DeliveryError("HTTP 503", status=503)])
    d, clock, _ = make(ch, retry_on_status=[418])
    d.submit(m())
    d.pump()
    assert ch.attempts == 2 and ch.titles == []  # 418 retried, 503 not in the set: failed
    assert d.stats()["s"]["failed"] == 1


def test_non_retryable_error_fails_at_once():
    ch = Scripted([DeliveryError("service error 19021", retryable=False)])
    d, clock, _ = make(ch)
    d.submit(m())
    d.pump()
    assert ch.attempts == 1 and clock.sleeps == []


@pytest.mark.parametrize(("respect", "expected"), [(True, [7.0]), (False, [0.5])])
def test_respect_retry_after(respect, expected):
    ch = Scripted([DeliveryError("HTTP 429", status=429, retry_after=7.0)])
    d, clock, _ = make(ch, respect_retry_after=respect)
    d.submit(m())
    d.pump()
    assert clock.sleeps == expected and ch.titles == ["t"]


def test_timeout_is_passed_to_the_channel():
    ch = Scripted()
    d, _, _ = make(ch, timeout=2.5)
    d.submit(m())
    d.pump()
    assert ch.timeouts == [2.5]


def test_token_bucket():
    b = TokenBucket(60.0, now=0.0)  # one a second, burst 15
    assert b.capacity == 15
    assert sum(b.try_take(0.0) for _ in range(20)) == 15
    assert b.wait_time(0.0) == pytest.approx(1.0)
    assert b.try_take(1.0) and not b.try_take(1.0)
    assert TokenBucket(None, 0.0).try_take(0.0)


def test_rate_limited_drop():
    ch = Scripted()
    d, clock, records = make(ch, rate_limit_per_minute=4.0, on_rate_limited="drop")  # burst 1
    for i in range(3):
        d.submit(m(f"a{i}"))
    d.pump()
    assert ch.titles == ["a0"]
    s = d.stats()["s"]
    assert (s["rate_limited"], s["dropped"]) == (2, 2)
    assert [r["error"] for r in records if not r["delivered"]] == ["dropped: rate limited"] * 2


def test_rate_limited_queue_waits_for_tokens():
    ch = Scripted()
    d, clock, _ = make(ch, rate_limit_per_minute=4.0, on_rate_limited="queue")  # a token per 15 s
    for i in range(3):
        d.submit(m(f"a{i}"))
    d.pump()
    assert ch.titles == ["a0", "a1", "a2"]
    assert clock.sleeps == pytest.approx([15.0, 15.0])
    assert d.stats()["s"]["rate_limited"] == 2


def test_rate_limited_coalesce_folds_into_one_summary():
    ch = Scripted()
    d, clock, records = make(ch, rate_limit_per_minute=4.0, on_rate_limited="coalesce")
    d.submit(m("first"))
    for i in range(4):
        d.submit(m(f"held{i}", level="warning" if i == 2 else "info", tags=(f"t{i}",)))
    d.pump()
    assert len(ch.messages) == 2
    summary = ch.messages[1]
    assert summary.title == "4 alerts held back by the rate limit"
    assert summary.level == "warning" and summary.source == "summary"
    assert summary.text.splitlines() == [  # most severe first, then in arrival order
        "- [WARNING] held2",
        "- [INFO] held0",
        "- [INFO] held1",
        "- [INFO] held3",
    ]
    assert clock.sleeps == pytest.approx([15.0])
    assert records[-1]["coalesced"] == 4 and d.stats()["s"]["coalesced"] == 4


def test_dedup_suppresses_and_summarises_after_window():
    ch = Scripted()
    d, clock, _ = make(ch, dedup_window=60.0)
    for _ in range(4):
        d.submit(m("same", text="x"))
    d.pump(advance=False)
    assert ch.titles == ["same"] and d.stats()["s"]["suppressed"] == 3
    clock.advance(59.0)
    d.pump(advance=False)
    assert ch.titles == ["same"]
    clock.advance(1.0)
    d.pump(advance=False)
    assert ch.titles == ["same", "same (+3 suppressed)"]
    d.submit(m("same", text="x"))  # a new window
    d.pump(advance=False)
    assert ch.titles[-1] == "same"


def test_dedup_without_duplicates_sends_no_summary_and_key_override():
    ch = Scripted()
    d, clock, _ = make(ch, dedup_window=60.0)
    d.submit(m("a", dedup_key="k"))
    d.submit(m("b", dedup_key="k"))  # same key: a duplicate despite another title
    d.submit(m("c"))
    d.pump()
    assert ch.titles == ["a", "c", "b (+1 suppressed)"]


def test_dedup_window_zero_disables():
    ch = Scripted()
    d, _, _ = make(ch, dedup_window=0.0)
    for _ in range(3):
        d.submit(m("same"))
    d.pump()
    assert ch.titles == ["same"] * 3


def _rule_alerts(rule, xs, dt):
    """Engine -> dispatcher with the default dedup_window (300 s): commit x = each of ``xs``
    ``dt`` seconds apart; the titles and subtitles the channel got."""
    from expr_tracker.alerts import AlertEngine

    ch = Scripted()
    d, clock, _ = make(ch, dedup_window=300.0)
    eng = AlertEngine([rule], notify=d.notify, clock=clock)
    for i, x in enumerate(xs):
        eng.on_step({"_step": i, "_time": float(i), "x": x})
        d.pump(advance=False)
        clock.advance(dt)
    d.close()
    return [(msg.subtitle.split(":")[0], msg.title) for msg in ch.messages]


def test_dedup_does_not_override_level_mode_cooldown():
    rule = {"name": "hot", "condition": "x > 1", "mode": "level", "cooldown": 60}
    got = _rule_alerts(rule, [5, 5, 5, 5], dt=30.0)  # t = 0, 30, 60, 90: cooldown 60 s
    assert got == [("firing", "hot"), ("repeat", "hot")]
    got = _rule_alerts(rule, [5] * 5, dt=61.0)
    assert got == [("firing", "hot")] + [("repeat", "hot")] * 4


def test_dedup_does_not_swallow_a_new_firing_episode():
    rule = {"name": "hot", "condition": "x > 1", "notify_recovery": True}
    got = _rule_alerts(rule, [5, 0, 5, 5, 0, 5], dt=10.0)
    assert got == [
        ("firing", "hot"),
        ("resolved", "resolved: hot"),
        ("firing", "hot"),
        ("resolved", "resolved: hot"),
        ("firing", "hot"),
    ]


def test_rule_dedup_keys():
    from expr_tracker.alerts import AlertEngine

    events = []
    eng = AlertEngine(
        [{"name": "r", "condition": "x > 1", "mode": "level", "cooldown": 0}], notify=events.append
    )
    for i, x in enumerate([5, 5, 0, 5]):
        eng.on_step({"_step": i, "_time": float(i), "x": x})
    keys = [event_to_message(e).dedup_key for e in events]
    assert keys == [
        "rule:r:1:firing:warning",
        "rule:r:1:repeat:warning:2",
        "rule:r:2:firing:warning",
    ]

    class Foreign:  # an event object without episode: the old key
        rule, kind, level, title, message, step = "r", "firing", "error", "t", "", None

    assert event_to_message(Foreign()).dedup_key == "rule:r:firing:error"


def test_queue_full_drop_oldest():
    ch = Scripted()
    d, _, records = make(ch, queue_size=2, on_queue_full="drop_oldest")
    for i in range(4):
        d.submit(m(f"a{i}"))
    d.pump()
    assert ch.titles == ["a2", "a3"] and d.stats()["s"]["dropped"] == 2
    assert [r["title"] for r in records if not r["delivered"]] == ["a0", "a1"]


def test_queue_full_drop_new():
    ch = Scripted()
    d, _, _ = make(ch, queue_size=2, on_queue_full="drop_new")
    results = [d.submit(m(f"a{i}")).ok for i in range(4)]
    d.pump()
    assert ch.titles == ["a0", "a1"] and results == [True, True, False, False]


def test_queue_full_block_applies_to_direct_calls_only():
    ch = Scripted()
    d, _, _ = make(ch, queue_size=1, on_queue_full="block")
    d.submit(m("a0"))
    d.submit(m("a1"), direct=False)  # a rule alert never blocks: oldest dropped
    d.pump()
    assert ch.titles == ["a1"]


def test_block_waits_for_room_with_a_worker():
    import threading

    gate = threading.Event()

    class Slow(Scripted):
        def send(self, message, timeout):
            gate.wait(5)
            return super().send(message, timeout)

    ch = Slow()
    d = Dispatcher()
    d.add_channel(ch, policy=Policy(**NO_LIMIT, queue_size=1, on_queue_full="block", timeout=5.0))
    d.submit(m("a0"), direct=True)  # taken by the worker (blocked in send)
    import time as _t

    while d.lanes["s"].pending() and not d.lanes["s"]._inflight:
        _t.sleep(0.001)
    d.submit(m("a1"), direct=True)  # fills the queue
    threading.Timer(0.05, gate.set).start()
    assert d.submit(m("a2"), direct=True).ok  # blocks until the worker frees a slot
    d.close(5.0)
    assert ch.titles == ["a0", "a1", "a2"]


def test_async_send_false_makes_direct_calls_synchronous():
    ch = Scripted([DeliveryError("HTTP 500", status=500)])
    d, clock, _ = make(ch, async_send=False)
    result = d.submit(m("sync"), direct=True)
    assert result.delivered == {"s": True} and ch.titles == ["sync"]
    ch2 = Scripted([DeliveryError("HTTP 400", status=400)], name="s2")
    d2, _, _ = make(ch2, async_send=False)
    assert d2.submit(m("x"), direct=True).ok is False
    # rule alerts (direct=False) wait on async_send: false channels too (issue 12) ...
    d3, _, _ = make(Scripted(name="s3"), async_send=False)
    assert d3.submit(m("rule"), direct=False).delivered == {"s3": True}
    # ... unless told not to wait
    d4, _, _ = make(Scripted(name="s4"), async_send=False)
    assert d4.submit(m("rule"), direct=False, wait=False).delivered == {}


def test_fail_silently_logs_once_per_cause_else_every_time(caplog):
    caplog.set_level(logging.WARNING, logger="expr_tracker.alerts")
    ch = Scripted(
        [DeliveryError("HTTP 400", status=400)] * 3 + [DeliveryError("timed out", retryable=False)]
    )
    d, _, _ = make(ch)
    for i in range(4):
        d.submit(m(f"a{i}"))
    d.pump()
    failures = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(failures) == 2 and d.stats()["s"]["failed"] == 4
    caplog.clear()
    ch = Scripted([DeliveryError("HTTP 400", status=400)] * 3)
    d, _, _ = make(ch, fail_silently=False)
    for i in range(3):
        d.submit(m(f"a{i}"))
    d.pump()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 3


def test_policy_from_spec_and_effective_policy():
    from expr_tracker.spec.models import AlertsSpec, effective_policy

    spec = AlertsSpec.model_validate(
        {
            "policy": {"max_retries": 5},
            "channels": [{"type": "slack", "url": "https://x/y", "policy": {"timeout": "500ms"}}],
        }
    )
    p = Policy.from_spec(effective_policy(spec, spec.channels[0]))
    assert (p.max_retries, p.timeout, p.retry_on_status) == (
        5,
        0.5,
        frozenset({408, 429, 500, 502, 503, 504}),
    )
    assert Policy.from_spec(None) == Policy()
    with pytest.raises(ValueError, match="unknown policy"):
        Policy.from_spec({"nope": 1})
