"""``et.AlertConfig`` / ``et.ChannelConfig`` / ``et.WebhookPolicy``: the alerts section's
validated models, built in Python and handed to ``et.configure_alert`` / ``et.init(alert=)``;
each stands for the fields set on it (unset defaults leave lower sources alone)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

import expr_tracker as et
from expr_tracker import _current
from expr_tracker.spec import SpecError
from expr_tracker.spec.alerting import AlertsSpec, ChannelSpec, PolicySpec
from expr_tracker.spec.plain import alerts_data
from expr_tracker.testing import InMemoryChannel


@pytest.fixture(autouse=True)
def _no_configured_alert(monkeypatch):
    monkeypatch.setattr(_current, "configured_alert", {})


def test_the_public_names_are_the_spec_models():
    assert et.AlertConfig is AlertsSpec
    assert et.ChannelConfig is ChannelSpec
    assert et.WebhookPolicy is PolicySpec


def test_models_validate_at_construction_naming_the_field():
    with pytest.raises(ValidationError, match="rate_limit_per_minute"):
        et.WebhookPolicy(rate_limit_per_minute=-1)
    with pytest.raises(ValidationError, match="on_rate_limited"):
        et.WebhookPolicy(on_rate_limited="later")
    with pytest.raises(ValidationError, match="min_level"):
        et.ChannelConfig(type="slack", min_level="loud")
    with pytest.raises(ValidationError, match="unique"):
        et.AlertConfig(channels=[et.ChannelConfig(type="slack"), et.ChannelConfig(type="slack")])
    policy = et.WebhookPolicy(timeout="2s", dedup_window="5m")
    assert policy.timeout == 2.0 and policy.dedup_window == 300.0
    assert et.ChannelConfig(type="webhook").name == "webhook"  # name defaults to type


def test_alerts_data_keeps_only_what_was_set_and_the_secret():
    cfg = et.AlertConfig(
        channels=[
            et.ChannelConfig(
                type="webhook",
                name="hook",
                url="http://127.0.0.1:9/hook/T0KEN",
                policy=et.WebhookPolicy(max_retries=0),
            )
        ],
        policy=et.WebhookPolicy(timeout=2),
    )
    data = alerts_data(cfg)
    assert data["policy"] == {"timeout": 2.0}
    (hook,) = data["channels"]
    assert hook["policy"] == {"max_retries": 0}
    assert hook["url"].get_secret_value() == "http://127.0.0.1:9/hook/T0KEN"
    assert "T0KEN" not in repr(cfg)  # the models hide it
    assert sorted(dict(cfg)) == ["channels", "policy"]  # **cfg passes what was set


def test_configure_alert_with_a_config_object_positionally_or_unpacked(tmp_path):
    cfg = et.AlertConfig(
        channels=[
            et.ChannelConfig(
                type="memory", name="mem", min_level=et.AlertLevel.ERROR,
                policy=et.WebhookPolicy(async_send=False),
            )
        ],
        rules=[et.AlertRule(name="spike", condition="loss > 5", level="error")],
    )  # fmt: skip
    for call in (lambda: et.configure_alert(cfg), lambda: et.configure_alert(**cfg)):
        _current.configured_alert = {}
        call()
        run = et.init(project="p", dir=str(tmp_path))
        assert [r.name for r in et.list_alert_rules()] == ["spike"]
        et.log({"loss": 9.0})
        assert InMemoryChannel.get("mem").titles == ["spike"]
        et.finish()
        assert run.spec.alerts.channels[0].policy.async_send is False


def test_keywords_win_over_the_config_object_and_calls_merge(tmp_path):
    cfg = et.AlertConfig(policy=et.WebhookPolicy(timeout=2, max_retries=1))
    et.configure_alert(cfg, policy={"max_retries": 5})
    et.configure_alert(policy=et.WebhookPolicy(jitter=0.0))
    run = et.init(project="p", dir=str(tmp_path))
    policy = run.spec.alerts.policy
    assert (policy.timeout, policy.max_retries, policy.jitter) == (2.0, 5, 0.0)
    et.finish()


def test_unset_defaults_do_not_override_a_lower_source(tmp_path, monkeypatch):
    (tmp_path / "alerts.yaml").write_text("alerts:\n  policy:\n    rate_limit_per_minute: 3\n")
    monkeypatch.setenv("ET_ALERT_CONFIG", str(tmp_path / "alerts.yaml"))
    et.configure_alert(et.AlertConfig(policy=et.WebhookPolicy(timeout=1)))
    run = et.init(project="p", dir=str(tmp_path))
    assert run.spec.alerts.policy.rate_limit_per_minute == 3  # not the model's default 20
    assert run.spec.alerts.policy.timeout == 1.0
    assert run.resolved.source_of("alerts.policy.timeout") == "configure_alert"
    et.finish()


def test_init_alert_takes_a_config_object(tmp_path):
    hook = et.ChannelConfig(type="memory", name="mem", policy=et.WebhookPolicy(async_send=False))
    run = et.init(
        project="p",
        dir=str(tmp_path),
        alert=et.AlertConfig(channels=[hook], rules=["loss > 5 => error: high"]),
    )
    et.log({"loss": 9.0})
    assert InMemoryChannel.get("mem").titles == [et.list_alert_rules()[0].name]
    assert run.spec.alerts.channels[0].name == "mem"
    et.finish()


def test_channel_options_are_checked_when_configured_naming_the_path():
    bad = et.ChannelConfig(type="callable", name="cb", options={"handlr": print})
    with pytest.raises(SpecError) as info:
        et.configure_alert(channels=[bad])
    text = str(info.value)
    assert "alerts.channels" in text and "handlr" in text and "handler" in text
    assert _current.configured_alert == {}  # nothing kept


def test_configure_alert_rejects_another_type():
    with pytest.raises(TypeError, match="et.AlertConfig or a mapping"):
        et.configure_alert(["not", "a", "config"])
