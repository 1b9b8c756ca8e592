"""``async_send: false`` delivers rule alerts on the committing thread: the alert has reached
the channel when ``et.log`` returns (issue 12). Real HTTP on 127.0.0.1, the in-memory
channel, a callable channel; no sleeps, no polling."""

from __future__ import annotations

import json
import threading

import pytest

import expr_tracker as et
from expr_tracker import _current
from expr_tracker.alerts.delivery import AlertMessage
from expr_tracker.alerts.delivery.channels import ChannelConfigError
from expr_tracker.testing import InMemoryChannel, WebhookServer

pytestmark = pytest.mark.usefixtures("no_proxy")


@pytest.fixture(autouse=True)
def _no_configured_alert(monkeypatch):
    monkeypatch.setattr(_current, "configured_alert", {})


def _hook(url, **policy):
    return {"type": "webhook", "name": "hook", "url": url, "policy": policy}


def test_rule_alert_reaches_a_real_http_server_before_log_returns(tmp_path):
    with WebhookServer() as server:
        et.init(
            project="p",
            dir=str(tmp_path),
            alert={"channels": [_hook(server.url, async_send=False)]},
            alert_rules=["loss > 5 => error: loss is {loss}"],
        )
        et.log({"loss": 1.0})
        assert server.requests == []  # nothing fired yet
        et.log({"loss": 9.0})
        # no wait, no poll: the request was received before et.log returned
        assert len(server.requests) == 1
        assert server.json()["text"] == "loss is 9.0"
        assert et.info()["delivery"]["channels"]["hook"]["sent"] == 1
        et.finish()


def test_async_send_true_stays_queued_until_the_worker_sends(tmp_path):
    """The default does not wait: the committing thread returns while the send is held."""
    gate = threading.Event()
    sent: list[str] = []

    def slow(message):
        gate.wait(10)
        sent.append(message.title)

    et.init(
        project="p",
        dir=str(tmp_path),
        alert={"channels": [{"type": "callable", "name": "cb", "options": {"fn": slow}}]},
        alert_rules=["loss > 5 => error: high"],
    )
    et.log({"loss": 9.0})  # returns although the channel is blocked
    assert sent == []
    gate.set()
    et.finish()  # drains
    assert len(sent) == 1


def test_memory_channel_and_policy_on_the_channel_only(tmp_path):
    """`async_send: false` set on one channel's policy: that channel has the alert when
    et.log returns; the memory channel from expr_tracker.testing shows it."""
    et.init(
        project="p",
        dir=str(tmp_path),
        alert={
            "channels": {"mem": {"type": "memory", "policy": {"async_send": False}}},
        },
        alert_rules=[{"name": "spike", "condition": "loss > 5", "level": "critical"}],
    )
    mem = InMemoryChannel.get("mem")
    for loss in (1.0, 2.0, 7.0):
        et.log({"loss": loss})
    assert mem.titles == ["spike"]
    assert mem.messages[0].level == "critical" and mem.messages[0].step == 2
    et.finish()


def test_a_rate_limited_rule_alert_does_not_hold_the_committing_thread(tmp_path):
    """The wait is for a send, never for a token: with the bucket empty, the held alert
    ends the wait at once (and goes out later, in the coalesce summary at finish)."""
    calls: list[AlertMessage] = []
    policy = {"async_send": False, "rate_limit_per_minute": 1, "dedup_window": 0}
    et.init(
        project="p",
        dir=str(tmp_path),
        alert={
            "channels": [{"type": "callable", "name": "cb", "options": {"fn": calls.append}}],
            "policy": policy,
        },
        alert_rules=["a > 0 => warning: a", "b > 0 => warning: b", "c > 0 => warning: c"],
    )
    et.log({"a": 1})  # the bucket's one token
    assert [m.text for m in calls] == ["a"]
    et.log({"b": 1})  # held back: returns without the send
    et.log({"c": 1})
    assert [m.text for m in calls] == ["a"]
    et.finish()  # the drain sends what was held as one summary
    assert len(calls) == 2 and "b" in calls[1].text and "c" in calls[1].text


def test_a_failing_endpoint_is_waited_for_within_the_policy_and_never_raises(tmp_path):
    with WebhookServer([(400, "bad request")]) as server:
        et.init(
            project="p",
            dir=str(tmp_path),
            alert={"channels": [_hook(server.url, async_send=False, max_retries=0)]},
            alert_rules=["loss > 5 => error: high"],
        )
        assert et.log({"loss": 9.0}) == 0  # the training loop is not broken
        assert len(server.requests) == 1
        assert et.info()["delivery"]["channels"]["hook"]["failed"] == 1
        et.finish()


# ----------------------------------------------------------- the callable channel's `handler`


def test_callable_channel_takes_the_earlier_option_name_handler(tmp_path):
    got: list[str] = []
    et.init(
        project="p",
        dir=str(tmp_path),
        alert={
            "channels": [
                {
                    "type": "callable",
                    "name": "cb",
                    "options": {"handler": lambda m: got.append(m.title)},
                    "policy": {"async_send": False},
                }
            ]
        },
        alert_rules=[{"name": "nan", "condition": "isnan(loss)", "level": "error"}],
    )
    et.log({"loss": float("nan")})
    assert got == ["nan"]
    et.finish()


def test_callable_channel_with_fn_and_handler_is_a_clear_error(tmp_path):
    from expr_tracker.spec import SpecError

    both = {"type": "callable", "name": "cb", "options": {"fn": print, "handler": print}}
    with pytest.raises(SpecError) as info:
        et.init(project="p", dir=str(tmp_path), alert={"channels": [both]})
    text = str(info.value)
    assert "alerts.channels.cb.options.handler" in text or "options.handler" in text
    assert "`fn`" in text and "`handler`" in text and "not both" in text
    assert et.get_run() is None


def test_callable_channel_class_directly():
    from expr_tracker.alerts.delivery.channels.callable import CallableChannel

    got = []
    ch = CallableChannel("cb", options={"handler": got.append})
    ch.send(AlertMessage("t"), 1.0)
    assert [m.title for m in got] == ["t"]
    with pytest.raises(ChannelConfigError, match="not both"):
        CallableChannel("cb", options={"fn": got.append, "handler": got.append})
    with pytest.raises(ChannelConfigError, match="handler"):
        CallableChannel("cb", options={})
    with pytest.raises(ChannelConfigError, match="must be a callable"):
        CallableChannel("cb", options={"handler": "not callable"})


def test_the_committing_thread_waits_for_one_attempt_never_for_the_retries(tmp_path):
    """The first attempt fails; the retry is blocked inside the channel, yet et.log has
    returned (the wait is for one attempt); the retry delivers it in the background."""
    gate = threading.Event()
    attempts: list[str] = []
    retried: list[str] = []

    def flaky(message):
        attempts.append(message.title)
        if len(attempts) == 1:
            raise ConnectionError("endpoint restarting")
        gate.wait(10)
        retried.append(message.title)

    policy = {"async_send": False, "backoff_initial": 0, "jitter": 0.0, "max_retries": 2}
    run = et.init(
        project="p",
        dir=str(tmp_path),
        alert={
            "channels": [
                {"type": "callable", "name": "cb", "options": {"fn": flaky}, "policy": policy}
            ]
        },
        alert_rules=[{"name": "high", "condition": "loss > 5"}],
    )
    et.log({"loss": 9.0})  # returns after the failed first attempt
    assert attempts[:1] == ["high"]
    assert retried == []  # the retry had not completed: nobody waited for it
    gate.set()
    et.finish()
    assert attempts == ["high", "high"] and retried == ["high"]
    (outcome,) = [
        r for r in map(json.loads, (run.dir / "alerts.jsonl").read_text().splitlines())
        if r["kind"] == "delivery"
    ]  # fmt: skip
    assert outcome["delivered"] is True and outcome["attempts"] == 2
