"""Severity before arrival order: the console channel is not rate-limited, error/critical
alerts never wait behind less severe ones, coalesce summaries keep each message's level,
title and text, and a full queue gives up its least severe message first."""

from __future__ import annotations

import threading
import time

import pytest

import expr_tracker as et
from expr_tracker.alerts.delivery import Dispatcher, Policy, TokenBucket
from expr_tracker.alerts.delivery.message import AlertMessage
from expr_tracker.assemble import build_dispatcher
from expr_tracker.testing import FakeClock, InMemoryChannel

NO_LIMIT = dict(rate_limit_per_minute=None, dedup_window=0.0, jitter=0.0)


def make(**policy):
    clock = FakeClock()
    records = []
    d = Dispatcher(clock=clock, sleep=clock.sleep, start=False, record=records.append)
    ch = InMemoryChannel("s")
    d.add_channel(ch, policy=Policy(**{**NO_LIMIT, **policy}))
    return d, ch, clock, records


def m(title, level="info", **kw):
    return AlertMessage(title, level=level, **kw)


# ---------------------------------------------------------------- (a) console policy


def test_console_fallback_is_not_rate_limited_but_keeps_dedup():
    d = build_dispatcher(None, start=False)
    policy = d.lanes["console"].policy
    assert policy.rate_limit_per_minute is None and policy.dedup_window == 300.0
    # a rate limit the configuration sets explicitly still applies
    d = build_dispatcher({"policy": {"rate_limit_per_minute": 7}}, start=False)
    assert d.lanes["console"].policy.rate_limit_per_minute == 7
    d = build_dispatcher({"policy": {"dedup_window": 5}}, start=False)
    assert d.lanes["console"].policy.rate_limit_per_minute is None
    assert d.lanes["console"].policy.dedup_window == 5


def test_configured_console_channel_unlimited_unless_its_policy_says():
    d = build_dispatcher(
        {
            "channels": [
                {"type": "console", "name": "c1"},
                {"type": "console", "name": "c2", "policy": {"rate_limit_per_minute": 3}},
                {"type": "memory", "name": "mem"},
            ]
        },
        start=False,
    )
    assert d.lanes["c1"].policy.rate_limit_per_minute is None
    assert d.lanes["c2"].policy.rate_limit_per_minute == 3
    assert d.lanes["mem"].policy.rate_limit_per_minute == 20  # remote-like: the default


def test_default_console_prints_critical_right_after_info_burst(capsys):
    """The issue's example: 5 INFO rules then a CRITICAL; the CRITICAL prints at once, not
    at finish() (before: the token bucket's burst of 5 held it 3 s or more)."""
    et.init(
        project="p",
        name="rl",
        alert_rules=[f"x > {i} => info: i{i}" for i in range(5)]
        + ["isnan(loss) => critical: LOSS IS NAN at {step}"],
    )
    et.log({"x": 10, "loss": 1})
    et.log({"loss": float("nan")})
    run = et.get_run()
    lane = run.dispatcher.lanes["console"]
    end = time.monotonic() + 2.0
    while time.monotonic() < end and lane.counts["sent"] < 6:
        time.sleep(0.01)
    assert lane.counts["sent"] == 6 and lane.counts["rate_limited"] == 0
    assert "LOSS IS NAN at 1" in capsys.readouterr().err
    et.finish()


# ---------------------------------------------------------------- (b) urgent first


def test_critical_is_not_coalesced_behind_info():
    d, ch, clock, records = make(rate_limit_per_minute=4.0, on_rate_limited="coalesce")  # burst 1
    for message in (m("i0"), m("i1"), m("boom", "critical")):  # arriving one by one
        d.submit(message)
        d.pump(advance=False)  # no time passes
    assert ch.titles == ["i0", "boom"]  # before: boom was coalesced with i1, 15 s later
    d.pump()
    # the critical borrowed a token: i1 waits for two (30 s at 4/min) and goes alone
    assert ch.titles == ["i0", "boom", "i1"] and clock.sleeps == pytest.approx([30.0])
    assert [r["delivered"] for r in records] == [True, True, True]


def test_urgent_borrowing_is_bounded_to_one_burst():
    d, ch, clock, _ = make(rate_limit_per_minute=4.0, on_rate_limited="coalesce")  # burst 1
    d.submit(m("i0"))
    d.pump(advance=False)
    for i in range(4):
        d.submit(m(f"c{i}", "critical"))
    d.pump(advance=False)
    assert ch.titles == ["i0", "c0"]  # a storm is still rate-limited past the borrowed burst
    d.pump()
    assert ch.titles[2] == "3 alerts held back by the rate limit"
    assert ch.messages[2].level == "critical"


def test_queue_mode_sends_most_severe_first():
    d, ch, clock, _ = make(rate_limit_per_minute=4.0, on_rate_limited="queue")
    d.submit(m("i0"))
    d.pump(advance=False)
    for i in (1, 2):
        d.submit(m(f"i{i}"))
    d.submit(m("w", "warning"))
    d.submit(m("e", "error"))
    d.pump()
    assert ch.titles == ["i0", "e", "w", "i1", "i2"]
    # e borrowed: w waits 30 s, then a token every 15 s
    assert clock.sleeps == pytest.approx([30.0, 15.0, 15.0])


def test_token_bucket_borrow():
    b = TokenBucket(4.0, now=0.0)  # capacity 1
    assert b.try_take(0.0) and not b.try_take(0.0)
    assert b.try_take(0.0, borrow=1.0) and not b.try_take(0.0, borrow=1.0)
    assert b.wait_time(0.0) == pytest.approx(30.0)
    assert b.wait_time(0.0, borrow=1.0) == pytest.approx(15.0)


def test_queue_mode_worker_waits_without_spinning():
    """A worker waiting for a token sleeps on its condition (before: it busy-looped)."""
    ch = InMemoryChannel("s")
    d = Dispatcher()
    lane = d.add_channel(
        ch, policy=Policy(**{**NO_LIMIT, "rate_limit_per_minute": 4.0, "on_rate_limited": "queue"})
    )
    calls = 0
    step = lane.step

    def counting_step():
        nonlocal calls
        calls += 1
        return step()

    lane.step = counting_step
    for i in range(3):
        d.submit(m(f"i{i}"))
    time.sleep(0.3)
    assert ch.titles == ["i0"] and calls < 20
    d.submit(m("late", "critical"))  # wakes the worker, goes ahead of i1 and i2
    end = time.monotonic() + 2.0
    while time.monotonic() < end and ch.titles != ["i0", "late"]:
        time.sleep(0.01)
    assert ch.titles == ["i0", "late"]
    d.close(0.1)


# ---------------------------------------------------------------- (c) summaries


def test_coalesce_summary_keeps_level_title_and_text():
    d, ch, _, _ = make(rate_limit_per_minute=4.0, on_rate_limited="coalesce")
    d.submit(m("first"))
    d.pump(advance=False)  # takes the only token
    d.submit(m("loss spike", "warning", text="loss 9.1\nat   step 12", step=12))
    d.submit(m("slow", text="x" * 500))
    d.submit(m("no text"))
    d.pump()
    summary = ch.messages[1]
    lines = summary.text.splitlines()
    assert lines[0] == "- [WARNING] loss spike (step 12): loss 9.1 at step 12"
    assert lines[1].startswith("- [INFO] slow: xxx") and lines[1].endswith("\u2026")
    assert len(lines[1]) == len("- [INFO] slow: ") + 160
    assert lines[2] == "- [INFO] no text"


def test_coalesce_summary_is_bounded():
    d, ch, _, _ = make(rate_limit_per_minute=4.0, on_rate_limited="coalesce")
    d.submit(m("first"))
    d.pump(advance=False)  # takes the only token
    for i in range(30):
        d.submit(m(f"w{i}", "warning" if i % 10 == 0 else "info", text="t" * 300))
    d.pump()
    lines = ch.messages[1].text.splitlines()
    assert [x.split(":")[0] for x in lines[:3]] == [f"- [WARNING] w{i}" for i in (0, 10, 20)]
    assert len(ch.messages[1].text) < 3000  # fits a Slack section
    assert lines[-1].startswith("... and ") and lines[-1].endswith(" info)")


# ---------------------------------------------------------------- full queue


def test_full_queue_drops_least_severe_first():
    d, ch, _, records = make(queue_size=2, on_queue_full="drop_oldest")
    d.submit(m("c", "critical"))
    d.submit(m("a"))
    d.submit(m("b"))  # full: the oldest info goes, not the critical
    d.submit(m("d", "debug"))  # less severe than everything queued: itself dropped
    d.pump()
    assert ch.titles == ["c", "b"]
    assert [r["title"] for r in records if not r["delivered"]] == ["a", "d"]

    d, ch, _, _ = make(queue_size=2, on_queue_full="drop_new")
    d.submit(m("a"))
    d.submit(m("b"))
    d.submit(m("c", "critical"))  # more severe than what is queued: the newest info goes
    d.submit(m("e"))  # drop_new among equals
    d.pump()
    assert ch.titles == ["c", "a"]


def test_concurrent_submit_loses_nothing():
    """Producers on several threads, mixed levels (out-of-order pops): nothing lost or
    doubled."""
    ch = InMemoryChannel("s")
    d = Dispatcher()
    d.add_channel(ch, policy=Policy(**{**NO_LIMIT, "queue_size": 10_000}))

    def produce(k):
        for i in range(200):
            d.submit(m(f"{k}-{i}", ("info", "error")[i % 2]))

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert d.flush(5.0)
    assert sorted(ch.titles) == sorted(f"{k}-{i}" for k in range(4) for i in range(200))
    d.close(1.0)
