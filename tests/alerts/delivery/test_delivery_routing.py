"""Routing by level, tags and channels; building from an AlertsSpec."""

from __future__ import annotations

import logging

import pytest

from expr_tracker.alerts.delivery import make_message
from expr_tracker.alerts.delivery.channels import ChannelConfigError
from expr_tracker.alerts.delivery.message import AlertMessage
from expr_tracker.assemble import build_dispatcher
from expr_tracker.testing import FakeClock, InMemoryChannel


def build(channels, **alerts):
    clock = FakeClock()
    spec = {
        "channels": channels,
        "policy": {"dedup_window": 0, "rate_limit_per_minute": None},
        **alerts,
    }
    d = build_dispatcher(spec, clock=clock, sleep=clock.sleep, start=False)
    return d


def sent(d, name):
    return d.lanes[name].channel.titles


def test_min_level_levels_and_tags():
    d = build(
        [
            {"type": "memory", "name": "all"},
            {"type": "memory", "name": "errors", "min_level": "err"},
            {"type": "memory", "name": "only_info", "levels": ["info"]},
            {"type": "memory", "name": "gpu", "tags": ["gpu"]},
        ]
    )
    d.submit(AlertMessage("w", level="warning"))
    d.submit(AlertMessage("c", level="critical"))
    d.submit(AlertMessage("i", level="info"))
    d.submit(AlertMessage("g", level="debug", tags=("gpu", "x")))
    d.pump()
    assert sent(d, "all") == ["c", "w", "i", "g"]  # queued ones go most severe first
    assert sent(d, "errors") == ["c"]
    assert sent(d, "only_info") == ["i"]
    assert sent(d, "gpu") == ["g"]


def test_explicit_channels_only_those_and_by_type(caplog):
    d = build(
        [
            {"type": "memory", "name": "a"},
            {"type": "memory", "name": "b", "tags": ["x"]},
            {"type": "memory", "name": "c", "min_level": "error"},
        ]
    )
    d.submit(AlertMessage("to-b", channels=("b",)))  # tags skipped when named explicitly
    d.submit(AlertMessage("to-c", channels=("c",)))  # level filter still applies
    d.submit(AlertMessage("by-type", channels=("memory",)))
    caplog.set_level(logging.WARNING)
    d.submit(AlertMessage("nowhere", channels=("zzz",)))
    d.pump()
    assert sent(d, "a") == ["by-type"]
    assert sent(d, "b") == ["to-b", "by-type"]
    assert sent(d, "c") == []
    assert "unknown channel 'zzz'" in caplog.text


def test_rule_event_routed_by_rule_channels_and_tags():
    from types import SimpleNamespace

    d = build([{"type": "memory", "name": "a"}, {"type": "memory", "name": "b", "tags": ["ops"]}])
    rule = SimpleNamespace(name="spike", channels=None, tags=("ops",), level="error")
    event = SimpleNamespace(
        rule=rule, level="error", title="spike!", message="loss 9", step=3, kind="firing"
    )
    assert d.notify(event)
    rule2 = SimpleNamespace(name="r2", channels=("a",), tags=())
    d.notify(SimpleNamespace(rule=rule2, level="warning", title="only a", message="", step=4))
    d.pump()
    assert sent(d, "a") == ["spike!", "only a"] and sent(d, "b") == ["spike!"]
    msg = d.lanes["b"].channel.messages[0]
    assert (msg.rule, msg.step, msg.source, msg.text) == ("spike", 3, "rule:spike", "loss 9")


def test_engine_event_shape():
    from expr_tracker.alerts import AlertEngine

    d = build([{"type": "memory", "name": "a"}])
    engine = AlertEngine(
        ["loss > 5 => error: loss is {loss}"],
        notify=d.notify,
        run_info={"project": "p", "run": "r"},
    )
    engine.on_step({"_step": 1, "_time": 1.0, "loss": 1.0})
    engine.on_step({"_step": 2, "_time": 2.0, "loss": 9.0})
    d.pump()
    (msg,) = d.lanes["a"].channel.messages
    assert msg.level == "error" and msg.step == 2 and msg.text == "loss is 9.0"
    assert msg.fields["project"] == "p" and msg.fields["loss"] == 9.0 and msg.rule


def test_no_channel_goes_to_console(capsys):
    d = build_dispatcher({}, start=False)
    assert list(d.lanes) == ["console"]
    d.submit(AlertMessage("hello", level="error"))
    d.pump()
    assert "hello" in capsys.readouterr().err


def test_disabled_and_env_less_channels_are_skipped(caplog):
    caplog.set_level(logging.INFO)
    d = build_dispatcher(
        {
            "channels": [
                {"type": "memory", "name": "off", "enabled": False},
                {"type": "slack", "name": "example", "url_env": "EXAMPLE_URL"},
                {"type": "memory", "name": "on"},
            ]
        },
        start=False,
        environ={},
    )
    assert list(d.lanes) == ["on"]
    assert d.skipped == {"off": "disabled", "example": "EXAMPLE_URL is not set"}
    assert "EXAMPLE_URL is not set" in caplog.text


def test_console_fallback_when_every_channel_is_off(capsys):
    d = build_dispatcher(
        {"channels": [{"type": "slack", "name": "example", "url_env": "EXAMPLE_URL"}]},
        start=False,
        environ={},
    )
    assert list(d.lanes) == ["console"]
    d.submit(AlertMessage("still seen", level="error"))
    d.pump()
    assert "still seen" in capsys.readouterr().err


def test_alerts_disabled_gives_no_channels():
    d = build_dispatcher({"enabled": False}, start=False)
    assert d.lanes == {} and not d.submit(AlertMessage("x")).ok


def test_configuration_errors_raise_before_threads():
    with pytest.raises(ChannelConfigError, match="unknown option"):
        build_dispatcher({"channels": [{"type": "memory", "options": {"bad": 1}}]})


def test_context_injected_into_fields():
    d = build_dispatcher(
        {"channels": [{"type": "memory"}]},
        start=False,
        context=lambda: {"project": "p", "run": "r", "step": 41},
    )
    d.submit(AlertMessage("x", fields={"run": "mine"}))
    d.pump()
    (msg,) = d.lanes["memory"].channel.messages
    assert msg.fields == {"run": "mine", "project": "p", "step": 41} and msg.step == 41


def test_make_message_extras_and_bad_level(caplog):
    msg = make_message("t", "x", "WARN", backends=["a"], tags="gpu", link="https://l", lr=0.1)
    assert (msg.level, msg.channels, msg.tags, msg.link, msg.fields) == (
        "warning",
        ("a",),
        ("gpu",),
        "https://l",
        {"lr": 0.1},
    )
    caplog.set_level(logging.WARNING)
    assert make_message("t", level="loud").level == "warning"
    assert "'loud' is not one of" in caplog.text


def test_level_aliases_and_order():
    assert AlertMessage("x", level="crit").level == "critical"
    assert AlertMessage("x", level="fatal").rank > AlertMessage("x", level="err").rank
    with pytest.raises(ValueError):
        AlertMessage("x", level="nope")


def test_register_backend_adds_a_type():
    from expr_tracker.alerts.delivery.channels import (
        channel_kinds,
        register_backend,
        register_channel,
    )

    class Pager(InMemoryChannel):
        kind = "pager"

    assert register_channel is register_backend
    register_backend("pager", Pager)
    d = build_dispatcher({"channels": [{"type": "pager"}]}, start=False)
    d.submit(AlertMessage("page"))
    d.pump()
    assert d.lanes["pager"].channel.titles == ["page"] and "pager" in channel_kinds()
    with pytest.raises(TypeError):
        register_backend("bad", object)
