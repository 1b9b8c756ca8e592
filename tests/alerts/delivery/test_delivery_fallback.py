"""Console fallback (issue 10): when a channel fails for good or hangs, the alert's text still
reaches the console (stderr), once, marked as undelivered on that channel. Real HTTP
servers on 127.0.0.1: one answering 500, one that never answers."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from helpers import alert_records as records

import expr_tracker as et
from expr_tracker.alerts.delivery import Dispatcher, Policy, alert
from expr_tracker.alerts.delivery.message import AlertMessage
from expr_tracker.testing import InMemoryChannel, WebhookServer

TEXT = "loss went to 9.7e12 at step 41"  # unique: counted in stderr


pytestmark = pytest.mark.usefixtures("no_proxy")


def start(tmp_path, channels, **policy):
    return et.init(
        project="p",
        name="fallback",
        dir=str(tmp_path),
        alert={
            "channels": channels,
            "policy": {"rate_limit_per_minute": None, "backoff_initial": 0.01, **policy},
        },
    )


def test_failing_channel_shows_the_alert_on_stderr_once(tmp_path, capfd):
    with WebhookServer([(500, "down")]) as server:
        run = start(
            tmp_path, [{"type": "webhook", "name": "hook", "url": server.url}], max_retries=1
        )
        et.log({"loss": 1.0})
        assert alert("loss diverged", TEXT, level="error")
        et.finish()
    err = capfd.readouterr().err
    assert err.count(TEXT) == 1, err
    assert "alert NOT DELIVERED to channel 'hook' (webhook): HTTP 500: down" in err
    assert "loss diverged" in err and "T0KEN" not in err
    (rec,) = records(run)
    assert rec["delivered"] is False and rec["fallback"] == "console"


def test_rule_alert_on_a_failing_channel_reaches_stderr(tmp_path, capfd):
    with WebhookServer([(500, "down")]) as server:
        et.init(
            project="p",
            name="rule",
            dir=str(tmp_path),
            alert={
                "channels": [{"type": "webhook", "name": "hook", "url": server.url}],
                "policy": {"max_retries": 0},
            },
            alert_rules=["loss > 5 => error: " + TEXT],
        )
        for loss in (1.0, 9.0):
            et.log({"loss": loss})
        et.finish()
    err = capfd.readouterr().err
    assert err.count(TEXT) == 1 and "NOT DELIVERED to channel 'hook'" in err, err


def test_hanging_channel_shows_the_alert_at_the_first_timeout(tmp_path, capfd):
    """An attempt that times out is the first sign of a hang: the alert is shown then (not
    after every retry), and not again when the retries time out too."""
    with WebhookServer(["hang"]) as server:
        run = start(
            tmp_path,
            [{"type": "webhook", "name": "hook", "url": server.url}],
            timeout=0.3,
            max_retries=2,
        )
        alert("stuck", TEXT, level="critical")
        et.finish()
    err = capfd.readouterr().err
    assert err.count(TEXT) == 1, err
    assert "alert not yet delivered to channel 'hook' (webhook): timed out after 0.3 s" in err
    (rec,) = records(run)
    assert rec["delivered"] is False and rec["attempts"] == 3 and rec["fallback"] == "console"


def test_endpoint_hanging_past_the_drain_deadline(tmp_path):
    """A send longer than the drain deadline (timeout 30 s, deadline 0.5 s): the process
    still exits, and the abandoned alert is on stderr once."""
    with WebhookServer(["hang"]) as server:
        script = textwrap.dedent(
            f"""
            import expr_tracker as et
            from expr_tracker.alerts.delivery import dispatcher as dispatch
            from expr_tracker.alerts.delivery import alert
            from expr_tracker.assemble.delivery import attach_delivery
            run = et.init(project="p", name="hang", dir={str(tmp_path)!r})
            spec = {{"channels": [{{"type": "webhook", "name": "hook", "url": {server.url!r},
                     "policy": {{"timeout": 30}}}}]}}
            d = attach_delivery(run, spec, run.dir / "alerts.jsonl", drain_timeout=0.5)
            alert("stuck", {TEXT!r})
            et.finish()
            """
        )
        proc = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
        )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count(TEXT) == 1, proc.stderr
    assert "NOT DELIVERED to channel 'hook' (webhook): not delivered before the drain" in (
        " ".join(proc.stderr.split())
    )


def test_no_fallback_when_a_console_channel_took_the_alert(tmp_path, capfd):
    with WebhookServer([(500, "down")]) as server:
        start(
            tmp_path,
            [{"type": "webhook", "name": "hook", "url": server.url}, {"type": "console"}],
            max_retries=0,
        )
        alert("loss diverged", TEXT, level="error")
        et.finish()
    err = capfd.readouterr().err
    assert err.count(TEXT) == 1 and "NOT DELIVERED" not in err, err


def test_two_failing_channels_show_the_text_once_and_name_both(tmp_path, capfd):
    with WebhookServer([(500, "down")]) as a, WebhookServer([(404, "gone")]) as b:
        start(
            tmp_path,
            [
                {"type": "webhook", "name": "one", "url": a.url},
                {"type": "webhook", "name": "two", "url": b.url},
            ],
            max_retries=0,
        )
        alert("loss diverged", TEXT, level="error")
        et.finish()
    err = " ".join(capfd.readouterr().err.split())
    assert err.count(TEXT) == 1, err
    assert "NOT DELIVERED to channel" in err and "also NOT DELIVERED to channel" in err


def test_delivered_after_a_retry_shows_nothing(capfd):
    shown = []
    d = Dispatcher(start=False, sleep=lambda s: None, fallback=lambda *a, **k: shown.append(a))
    d.add_channel(
        InMemoryChannel("mem", options={"fail_times": 1, "status": 503}),
        policy=Policy(rate_limit_per_minute=None, backoff_initial=0.0),
    )
    d.submit(AlertMessage("t", TEXT))
    d.close()
    assert shown == [] and TEXT not in capfd.readouterr().err


def test_fallback_is_injectable_and_can_be_turned_off(capfd):
    shown = []

    def keep(message, channel, kind, why, *, again=False, final=True):
        shown.append((message.text, channel, kind, why, again, final))

    for fallback in (keep, None):
        d = Dispatcher(start=False, sleep=lambda s: None, fallback=fallback)
        d.add_channel(
            InMemoryChannel("mem", options={"fail_times": 5, "status": 400}),
            policy=Policy(rate_limit_per_minute=None),
        )
        d.submit(AlertMessage("t", TEXT))
        d.close()
    assert shown == [(TEXT, "mem", "memory", "HTTP 400", False, True)]
    assert TEXT not in capfd.readouterr().err


@pytest.mark.slow
def test_et_alert_on_the_command_line_prints_outcomes_not_the_fallback(monkeypatch, capfd):
    from expr_tracker.cli.main import main

    with WebhookServer([(500, "down")]) as server:
        monkeypatch.setenv("ET_WEBHOOK_URL", server.url)
        assert main(["alert", TEXT, "--level", "error"]) == 1
    out, err = capfd.readouterr()
    assert "webhook: FAILED: HTTP 500: down" in out
    assert "NOT DELIVERED" not in err and TEXT not in err


def test_a_channel_that_ignores_its_timeout_shows_what_waits_behind_it():
    """A custom channel whose send never returns: once it has run longer than an attempt
    may, the next alert shows both (on a fake clock: nothing waits for real time)."""
    import threading

    from expr_tracker.testing import FakeClock

    release = threading.Event()
    started = threading.Event()

    class Stuck(InMemoryChannel):
        def send(self, message, timeout):
            started.set()
            release.wait(30)
            return super().send(message, timeout)

    shown = []
    clock = FakeClock()
    d = Dispatcher(clock=clock, fallback=lambda m, *a, **k: shown.append((m.title, a, k)))
    d.add_channel(Stuck("stuck"), policy=Policy(rate_limit_per_minute=None, timeout=1.0))
    d.submit(AlertMessage("first", TEXT))
    assert started.wait(10)
    d.submit(AlertMessage("second"))  # not stuck yet: 0 s in flight
    assert shown == []
    clock.advance(5.0)  # more than (2 + 1) x timeout
    d.submit(AlertMessage("third"))
    assert [(t, a[0], k["final"]) for t, a, k in shown] == [
        ("first", "stuck", False),
        ("third", "stuck", False),
    ]
    assert shown[0][1][2] == "no answer for 5 s"
    assert shown[1][1][2] == "queued behind a send with no answer for 5 s"
    release.set()
    d.close(5)
    assert [t for t, *_ in shown] == ["first", "third"]  # delivered later: nothing more
