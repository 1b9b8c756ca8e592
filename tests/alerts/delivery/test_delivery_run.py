"""Delivery inside a run: attach_delivery, et.alert, notify_on, alerts.jsonl, stats, drain."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from helpers import alert_records as records

import expr_tracker as et
from expr_tracker.alerts.delivery import alert
from expr_tracker.build.alerts import attach_delivery
from expr_tracker.testing import InMemoryChannel, WebhookServer, capture_alerts

pytestmark = pytest.mark.usefixtures("no_proxy")


def start(channels, **alerts):
    run = et.init(project="proj", name="r1")
    spec = {
        "channels": channels,
        "policy": {"rate_limit_per_minute": None, "backoff_initial": 0.01},
        **alerts,
    }
    d = attach_delivery(run, spec, run.dir / "alerts.jsonl")
    return run, d


def test_alert_uses_the_run_dispatcher_and_records_outcomes():
    run, d = start([{"type": "memory", "name": "mem"}])
    et.log({"loss": 1.0})
    with capture_alerts() as cap:
        assert alert("hello", "world", level="error", tags=["x"], lr=0.1)
    d.flush(5)
    mem = d.lanes["mem"].channel
    (msg,) = mem.messages
    assert msg.fields == {"lr": 0.1, "project": "proj", "run": "r1", "step": 1} and msg.step == 1
    assert cap.assert_alerted("hello", level="error") is msg and cap.routes == [["mem"]]
    assert et.info()["delivery"]["channels"]["mem"]["sent"] == 1
    et.finish()
    (rec,) = records(run)
    assert rec["kind"] == "delivery" and rec["delivered"] is True and rec["channel"] == "mem"


def test_notify_on_finish():
    run, d = start([{"type": "memory", "name": "mem"}], notify_on=["finish"])
    mem = d.lanes["mem"].channel
    et.log({"a": 1})
    et.finish()
    (msg,) = mem.messages
    assert (
        msg.title == "Run proj/r1 finished"
        and msg.level == "info"
        and msg.fields["status"] == "finished"
    )
    assert not d.lanes["mem"].alive


def test_notify_on_failure_carries_the_traceback():
    run, d = start([{"type": "memory", "name": "mem"}], notify_on=["failure"])
    mem = d.lanes["mem"].channel
    try:
        raise ValueError("diverged")
    except ValueError as exc:
        run.finish(exception=exc)
    (msg,) = mem.messages
    assert msg.title == "Run proj/r1 failed: ValueError" and msg.text == "diverged"
    assert msg.level == "error" and "ValueError: diverged" in msg.traceback


def test_alert_without_a_run_uses_the_environment(monkeypatch):
    with WebhookServer() as server:
        monkeypatch.setenv("ET_WEBHOOK_URL", server.url)
        from expr_tracker.alerts.delivery import direct as delivery

        assert alert("no run", level="info")
        d = delivery.standalone_dispatcher()
        d.flush(5)
        assert server.json()["title"] == "no run"
        d.close()


@pytest.fixture
def fresh_standalone(monkeypatch):
    """No configure_alert values and no cached standalone dispatcher; closes what the test
    built."""
    from expr_tracker import _current
    from expr_tracker.alerts.delivery import direct as delivery

    monkeypatch.setattr(_current, "configured_alert", {})
    monkeypatch.setattr(delivery, "_standalone", None)
    monkeypatch.setattr(delivery, "_standalone_inputs", None)
    yield delivery
    if delivery._standalone is not None:
        delivery._standalone[1].close(timeout=1)


def _callable_channel(name, sink):
    return {"type": "callable", "name": name, "options": {"fn": sink}}


NO_RATE_LIMIT = {"rate_limit_per_minute": None}


def test_alert_on_a_rank_that_does_not_alert_sends_nothing(monkeypatch, caplog, fresh_standalone):
    monkeypatch.setenv("RANK", "1")
    got = []
    et.configure_alert(channels=[_callable_channel("cb", got.append)], policy=NO_RATE_LIMIT)
    run = et.init(project="proj", name="r1")
    assert run.rank == 1 and run.dispatcher is None
    monkeypatch.setattr(
        fresh_standalone, "_warner", type(fresh_standalone._warner)(fresh_standalone.log)
    )
    with caplog.at_level("INFO", logger="expr_tracker.alerts"):
        assert et.alert("incident") is False
        assert et.alert("incident again") is False
    assert got == [] and fresh_standalone._standalone is None  # no fallback dispatcher
    muted = [r for r in caplog.records if "sends nothing" in r.getMessage()]
    assert len(muted) == 1 and muted[0].levelname == "INFO"
    assert "alerts.on_rank" in muted[0].getMessage()
    et.finish()


def test_alert_on_an_alerting_rank_uses_the_runs_own_configuration(monkeypatch, fresh_standalone):
    monkeypatch.setenv("RANK", "1")
    from_env, from_run = [], []
    et.configure_alert(channels=[_callable_channel("env", from_env.append)])
    run = et.init(
        project="proj",
        name="r1",
        alert={
            "on_rank": [0, 1],
            "channels": [_callable_channel("run", from_run.append)],
            "policy": NO_RATE_LIMIT,
        },
    )
    assert et.alert("hello", channels=["run"])
    run.dispatcher.flush(5)
    assert [m.title for m in from_run] == ["hello"] and from_env == []
    assert fresh_standalone._standalone is None
    et.finish()


def test_alert_with_alerts_disabled_for_the_run_sends_nothing(fresh_standalone):
    got = []
    et.configure_alert(channels=[_callable_channel("cb", got.append)])
    et.init(project="proj", name="r1", alert=False)
    assert et.alert("x") is False and got == []
    et.finish()


def test_runless_alert_honours_on_rank(monkeypatch, caplog, fresh_standalone):
    """No run: a process whose RANK is outside the resolved alerts.on_rank sends nothing
    (one incident is not delivered once per rank); a rank it lists does."""
    got = []
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(
        fresh_standalone, "_warner", type(fresh_standalone._warner)(fresh_standalone.log)
    )
    et.configure_alert(channels=[_callable_channel("cb", got.append)], policy=NO_RATE_LIMIT)
    with caplog.at_level("INFO", logger="expr_tracker.alerts"):
        assert et.alert("incident") is False
        assert et.alert("incident again", level="critical") is False
    muted = [r for r in caplog.records if "sends nothing" in r.getMessage()]
    assert len(muted) == 1 and "rank 1 does not alert (alerts.on_rank: 0)" in muted[0].getMessage()

    monkeypatch.delenv("RANK")
    monkeypatch.setenv("LOCAL_RANK", "2")  # RANK unset: LOCAL_RANK decides
    assert et.alert("still muted") is False
    monkeypatch.delenv("LOCAL_RANK")
    assert et.alert("rank 0")
    et.configure_alert(
        on_rank="all", channels=[_callable_channel("cb", got.append)], policy=NO_RATE_LIMIT
    )
    monkeypatch.setenv("RANK", "3")
    assert et.alert("every rank")
    fresh_standalone.standalone_dispatcher().flush(5)
    assert [m.title for m in got] == ["rank 0", "every rank"]


def test_cli_alert_does_not_consult_the_rank(monkeypatch, capsys):
    """`et alert` is a person's explicit action: RANK does not mute it (documented)."""
    from expr_tracker.cli.main import main

    monkeypatch.setenv("RANK", "1")
    with WebhookServer() as server:
        monkeypatch.setenv("ET_WEBHOOK_URL", server.url)
        assert main(["alert", "done", "--level", "info"]) == 0
        assert server.json()["title"] == "done"
    assert "webhook: delivered" in capsys.readouterr().out


def test_standalone_configuration_is_resolved_once_while_its_inputs_stay(
    monkeypatch, tmp_path, fresh_standalone
):
    import expr_tracker.spec as spec_pkg

    calls = []
    real = spec_pkg.resolve

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(spec_pkg, "resolve", counting)
    first, second = [], []
    et.configure_alert(channels=[_callable_channel("a", first.append)], policy=NO_RATE_LIMIT)
    calls.clear()  # configure_alert validates with resolve() too
    for i in range(3):
        assert alert(f"m{i}")
    assert len(calls) == 1
    d = fresh_standalone.standalone_dispatcher()
    assert len(calls) == 1
    d.flush(5)
    assert [m.title for m in first] == ["m0", "m1", "m2"]

    # a configure_alert change is picked up: a new dispatcher with the new channel
    et.configure_alert(channels=[_callable_channel("b", second.append)])
    calls.clear()
    assert alert("to b", channels=["b"])
    assert len(calls) == 1
    d2 = fresh_standalone.standalone_dispatcher()
    assert d2 is not d and d.closed and "b" in d2.lanes
    d2.flush(5)
    assert [m.title for m in second] == ["to b"]

    # so is an ET_ALERT_CONFIG file, and a change of its content
    path = tmp_path / "alerts.yaml"
    path.write_text("policy: {dedup_window: 1}\n")
    monkeypatch.setenv("ET_ALERT_CONFIG", str(path))
    d3 = fresh_standalone.standalone_dispatcher()
    assert len(calls) == 2 and d3.lanes["b"].policy.dedup_window == 1.0
    assert fresh_standalone.standalone_dispatcher() is d3 and len(calls) == 2
    path.write_text("policy: {dedup_window: 22}\n")
    d4 = fresh_standalone.standalone_dispatcher()
    assert len(calls) == 3 and d4.lanes["b"].policy.dedup_window == 22.0

    # and a variable a channel reads (url_env): unset -> the channel is off; set -> on
    et.configure_alert(channels=[{"type": "webhook", "name": "hook", "url_env": "MY_HOOK"}])
    monkeypatch.delenv("MY_HOOK", raising=False)
    d5 = fresh_standalone.standalone_dispatcher()
    assert "hook" not in d5.lanes
    monkeypatch.setenv("MY_HOOK", "http://127.0.0.1:9/hook")
    d6 = fresh_standalone.standalone_dispatcher()
    assert "hook" in d6.lanes and d5.closed


def test_alert_never_raises(monkeypatch):
    monkeypatch.setenv("ET_ALERT_CONFIG", "/nonexistent/alerts.yaml")
    assert alert("x") is False


def test_failed_delivery_recorded_undelivered():
    with WebhookServer([(500, "down")]) as server:
        run, d = start([{"type": "webhook", "url": server.url, "policy": {"max_retries": 1}}])
        alert("boom")
        et.finish()
    (rec,) = records(run)
    assert rec["delivered"] is False and rec["error"] == "HTTP 500: down" and rec["attempts"] == 2
    assert "T0KEN" not in json.dumps(rec)


@pytest.mark.slow
def test_hanging_channel_process_exits_within_deadline(tmp_path):
    """A subprocess whose channel hangs still exits; the message is recorded undelivered."""
    with WebhookServer(["hang"]) as server:
        script = textwrap.dedent(
            f"""
            import expr_tracker as et
            from expr_tracker.alerts.delivery import dispatcher as dispatch
            from expr_tracker.alerts.delivery import alert
            from expr_tracker.build.alerts import attach_delivery
            dispatch.DEFAULT_DRAIN_TIMEOUT = 0.5
            run = et.init(project="p", name="hang", dir={str(tmp_path)!r})
            spec = {{"channels": [{{"type": "webhook", "url": {server.url!r},
                     "policy": {{"timeout": 30}}}}]}}
            d = attach_delivery(run, spec, run.dir / "alerts.jsonl", drain_timeout=0.5)
            for i in range(3):
                et.log({{"x": i}})
            alert("stuck")
            # no et.finish(): the interpreter exit drains within the deadline
            """
        )
        proc = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
        )
    assert proc.returncode == 0, proc.stderr
    lines = (tmp_path / "p" / "hang" / "alerts.jsonl").read_text().splitlines()
    (rec,) = [json.loads(x) for x in lines]
    assert rec["delivered"] is False and "drain deadline" in rec["error"]
    assert "T0KEN" not in proc.stderr + proc.stdout


def test_close_deadline_on_fake_clock():
    from expr_tracker.alerts.delivery import Dispatcher, Policy
    from expr_tracker.alerts.delivery.channels import DeliveryError
    from expr_tracker.alerts.delivery.message import AlertMessage
    from expr_tracker.testing import FakeClock

    class Down(InMemoryChannel):
        def send(self, message, timeout):
            raise DeliveryError("HTTP 503", status=503)

    clock = FakeClock()
    recs = []
    d = Dispatcher(
        clock=clock, sleep=clock.sleep, start=False, record=recs.append, random=lambda: 0.5
    )
    d.add_channel(
        Down("down"),
        policy=Policy(max_retries=10, backoff_initial=1.0, jitter=0.0, rate_limit_per_minute=None),
    )
    d.submit(AlertMessage("a"))
    d.submit(AlertMessage("b"))
    d.close(timeout=5.0)
    assert clock.sleeps == [
        1.0,
        2.0,
        1.0,
    ]  # a: 4 s more would pass the 5 s deadline; b: 1 s, then 2 s would
    assert [r["title"] for r in recs] == ["a", "b"] and not any(r["delivered"] for r in recs)
    assert "drain deadline" in recs[0]["error"]


def test_info_stats_shape():
    run, d = start([{"type": "memory", "name": "mem"}])
    s = et.info()["delivery"]["channels"]["mem"]
    for key in ("sent", "failed", "suppressed", "dropped", "pending", "alive"):
        assert key in s
    assert s["alive"] is True


def test_notify_on_finish_of_a_resumed_run_gives_its_whole_duration():
    """A resumed run's finish message counts from the first attempt's start, as et runs
    does (docs/streams.md "Run identity"), not from this attempt's."""
    import time

    et.init(project="proj", name="r1")
    et.log({"a": 1})
    et.finish()
    time.sleep(1.0)
    run, d = start([{"type": "memory", "name": "mem"}], notify_on=["finish"])
    mem = d.lanes["mem"].channel
    et.log({"a": 2})
    et.finish()
    (msg,) = mem.messages
    assert msg.fields["duration_s"] >= 1.0
