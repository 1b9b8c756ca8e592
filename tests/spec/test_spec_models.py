"""The run spec models: defaults, validation, levels, policies, JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from expr_tracker.spec.models import (
    LEVELS,
    AlertsSpec,
    ChannelSpec,
    PluginSpec,
    PolicySpec,
    RuleSpec,
    RunSpec,
    effective_policy,
    level_rank,
    normalize_level,
)

MiB = 1024**2


def test_every_default():
    s = RunSpec()
    assert (s.project, s.name, s.dir, s.run_dir, s.group, s.notes, s.stream) == (
        "default",
        None,
        "./runs",
        None,
        None,
        None,
        None,
    )
    assert (s.tags, s.resume, s.config, s.backends) == ([], "allow", {}, [])

    h = s.history
    assert h.step_policy == "monotonic"
    assert h.max_open_seconds == 60.0
    assert h.rank_aware is True
    assert (h.cache.bytes, h.cache.rows) == (1024**3, 2_000_000)
    assert (h.buffer.size, h.buffer.interval, h.buffer.max_seconds) == (50, 1.0, 5.0)
    assert h.buffer.max_pending_records == 100_000
    assert h.alert_window == 4096

    sp = s.spans
    assert (sp.enabled, sp.metrics, sp.count, sp.print, sp.async_write) == (
        True,
        True,
        False,
        None,
        True,
    )
    assert sp.plugins == []
    assert (sp.buffer.size, sp.buffer.interval, sp.buffer.max_seconds) == (50, 1.0, 5.0)
    assert (sp.max_record_bytes, sp.max_pending_bytes) == (8 * MiB, 64 * MiB)

    a = s.alerts
    assert (a.enabled, a.on_rank, a.watchdog_interval) == (True, 0, 30.0)
    assert (a.channels, a.rules, a.notify_on) == ([], [], [])

    p = a.policy
    assert p.async_send is True
    assert p.timeout == 10.0
    assert p.max_retries == 3
    assert (p.backoff_initial, p.backoff_factor, p.backoff_max, p.jitter) == (0.5, 2.0, 30.0, 0.1)
    assert p.retry_on_status == [408, 429, 500, 502, 503, 504]
    assert p.respect_retry_after is True
    assert p.rate_limit_per_minute == 20.0
    assert p.on_rate_limited == "coalesce"
    assert p.dedup_window == 300.0
    assert p.queue_size == 1000
    assert p.on_queue_full == "drop_oldest"
    assert p.fail_silently is True


def test_rule_and_channel_defaults():
    r = RuleSpec(condition="loss > 1")
    assert (r.name, r.level, r.title, r.message, r.mode, r.for_steps) == (
        None,
        None,  # the rule's default: warning, or error for a rule with an action
        None,
        None,
        "edge",
        1,
    )
    assert (r.cooldown, r.max_fires, r.notify_recovery, r.channels, r.tags, r.enabled) == (
        300.0,
        None,
        False,
        None,
        [],
        True,
    )
    c = ChannelSpec(type="slack")
    assert c.name == "slack"
    assert (c.url, c.url_env, c.secret, c.enabled, c.min_level, c.levels, c.tags) == (
        None,
        None,
        None,
        True,
        None,
        None,
        None,
    )
    assert c.options == {}


def test_models_are_frozen():
    s = RunSpec()
    with pytest.raises(ValidationError):
        s.project = "x"
    with pytest.raises(ValidationError):
        s.history.buffer.size = 3


def test_units_in_fields():
    s = RunSpec.model_validate(
        {
            "history": {"cache": {"bytes": "64MiB"}, "buffer": {"interval": "500ms"}},
            "spans": {"max_record_bytes": "1MiB"},
            "alerts": {"watchdog_interval": "1m", "policy": {"timeout": "2s"}},
        }
    )
    assert s.history.cache.bytes == 64 * MiB
    assert s.history.buffer.interval == 0.5
    assert s.spans.max_record_bytes == MiB
    assert s.alerts.watchdog_interval == 60.0
    assert s.alerts.policy.timeout == 2.0


@pytest.mark.parametrize(
    ("section", "key"), [("history", "max_open_seconds"), ("buffer", "max_seconds")]
)
def test_optional_durations_disable_with_none(section, key):
    data = (
        {"history": {key: None}} if section == "history" else {"history": {"buffer": {key: None}}}
    )
    s = RunSpec.model_validate(data)
    owner = s.history if section == "history" else s.history.buffer
    assert getattr(owner, key) is None


@pytest.mark.parametrize(
    "data",
    [
        {"projetc": "x"},
        {"history": {"buffer": {"szie": 3}}},
        {"alerts": {"policy": {"timeoot": 3}}},
        {"alerts": {"channels": [{"type": "slack", "ulr": "x"}]}},
        {"alerts": {"rules": [{"condition": "a > 1", "levle": "error"}]}},
        {"spans": {"plugins": [{"type": "cpu", "opts": {}}]}},
    ],
)
def test_extra_keys_are_forbidden_everywhere(data):
    with pytest.raises(ValidationError) as info:
        RunSpec.model_validate(data)
    assert info.value.errors()[0]["type"] == "extra_forbidden"


@pytest.mark.parametrize("stream", ["../x", "a/b", "..", ".", "", "a.b", "a b", "x\\y", "é"])
def test_stream_rejects_anything_that_could_escape(stream):
    with pytest.raises(ValidationError):
        RunSpec(stream=stream)


@pytest.mark.parametrize("stream", ["worker", "data-1", "rank_0", "A9"])
def test_stream_accepts_plain_names(stream):
    assert RunSpec(stream=stream).stream == stream


@pytest.mark.parametrize("name", ["a/b", "..", ".", "", " x", "x\n", "a\\b"])
def test_name_and_project_must_be_filesystem_safe(name):
    with pytest.raises(ValidationError):
        RunSpec(name=name)
    with pytest.raises(ValidationError):
        RunSpec(project=name)


def test_name_allows_hydra_style_names():
    assert RunSpec(name="lr=0.1,bs=32").name == "lr=0.1,bs=32"


def test_dir_accepts_paths():
    s = RunSpec(dir=Path("/tmp/runs"), run_dir=Path("out"))
    assert (s.dir, s.run_dir) == ("/tmp/runs", "out")


def test_levels_and_aliases():
    assert LEVELS == ("debug", "info", "warning", "error", "critical")
    assert [level_rank(x) for x in LEVELS] == [0, 1, 2, 3, 4]
    assert level_rank("WARN") == level_rank("warning")
    assert level_rank("err") == 3
    assert level_rank("fatal") == level_rank("crit") == 4
    assert normalize_level("Crit") == "critical"
    with pytest.raises(ValueError, match="alert level"):
        level_rank("loud")
    assert RuleSpec(condition="x", level="WARN").level == "warning"
    c = ChannelSpec(type="slack", min_level="Err", levels=["fatal", "info"])
    assert (c.min_level, c.levels) == ("error", ["critical", "info"])
    with pytest.raises(ValidationError):
        RuleSpec(condition="x", level="loud")


def test_rule_condition_alias_expr():
    assert RuleSpec.model_validate({"expr": "a > 1"}).condition == "a > 1"
    assert RuleSpec.model_validate({"condition": "a > 1"}).condition == "a > 1"
    with pytest.raises(ValidationError):
        RuleSpec.model_validate({"level": "error"})
    with pytest.raises(ValidationError):
        RuleSpec.model_validate({"condition": ""})
    with pytest.raises(ValidationError):
        RuleSpec.model_validate({"condition": "x", "for_steps": 0})


def test_rules_as_strings_stay_strings():
    a = AlertsSpec(rules=["zscore(loss[50]) > 4 => error: spike", {"condition": "x > 1"}])
    assert a.rules[0] == "zscore(loss[50]) > 4 => error: spike"
    assert isinstance(a.rules[1], RuleSpec)


def test_rules_and_channels_in_mapping_form():
    a = AlertsSpec.model_validate(
        {
            "rules": {
                "nan_guard": {"condition": "isnan(loss)", "level": "error"},
                "spike": "zscore(loss[50]) > 4 => error: spike",
                "removed": None,
            },
            "channels": {"team": {"type": "slack", "url": "https://x"}, "ops": {"type": "slack"}},
        }
    )
    assert [r.name for r in a.rules] == ["nan_guard", "spike"]
    # a string entry is the one-line form, split into its fields (et.init, et rules check
    # and spec.json agree on it)
    assert a.rules[1].condition == "zscore(loss[50]) > 4"
    assert (a.rules[1].level, a.rules[1].message) == ("error", "spike")
    assert [(c.name, c.type) for c in a.channels] == [("team", "slack"), ("ops", "slack")]


def test_duplicate_channel_names_rejected():
    with pytest.raises(ValidationError, match="unique"):
        AlertsSpec(channels=[{"type": "slack"}, {"type": "slack"}])
    AlertsSpec(channels=[{"type": "slack"}, {"type": "slack", "name": "second"}])


@pytest.mark.parametrize("on_rank", [0, 3, [0, 1], "all"])
def test_on_rank_valid(on_rank):
    assert AlertsSpec(on_rank=on_rank).on_rank == on_rank


@pytest.mark.parametrize("on_rank", [-1, "some", [0, "x"], True, 1.5])
def test_on_rank_invalid(on_rank):
    with pytest.raises(ValidationError, match="rank"):
        AlertsSpec(on_rank=on_rank)


def test_notify_on():
    assert AlertsSpec(notify_on=["finish", "failure"]).notify_on == ["finish", "failure"]
    with pytest.raises(ValidationError):
        AlertsSpec(notify_on=["crash"])


def test_channel_type_any_identifier_and_secrets_hidden():
    c = ChannelSpec(type="my_pager", url="https://hooks/SECRET", secret="s3cr3t")
    assert c.url.get_secret_value() == "https://hooks/SECRET"
    assert "SECRET" not in repr(c) and "s3cr3t" not in repr(c)
    with pytest.raises(ValidationError):
        ChannelSpec(type="")
    with pytest.raises(ValidationError):
        ChannelSpec(type="not a name")


def test_effective_policy_merges_channel_overrides():
    alerts = AlertsSpec(policy={"timeout": 5, "max_retries": 1})
    plain = ChannelSpec(type="slack")
    assert effective_policy(alerts, plain) == alerts.policy
    tuned = ChannelSpec(
        type="lark", policy={"max_retries": 7, "rate_limit_per_minute": None, "dedup_window": "1m"}
    )
    p = effective_policy(alerts, tuned)
    assert isinstance(p, PolicySpec)
    assert (p.timeout, p.max_retries, p.rate_limit_per_minute, p.dedup_window) == (
        5.0,
        7,
        None,
        60.0,
    )
    assert tuned.policy.model_dump() == {
        "max_retries": 7,
        "rate_limit_per_minute": None,
        "dedup_window": 60.0,
    }


def test_channel_policy_overrides_are_validated():
    with pytest.raises(ValidationError):
        ChannelSpec(type="slack", policy={"max_retries": -1})
    with pytest.raises(ValidationError):
        ChannelSpec(type="slack", policy={"timeout": None})
    with pytest.raises(ValidationError):
        ChannelSpec(type="slack", policy={"on_queue_full": "explode"})


@pytest.mark.parametrize(
    "policy",
    [
        {"jitter": 1.5},
        {"backoff_factor": 0.5},
        {"retry_on_status": [42]},
        {"rate_limit_per_minute": 0},
        {"on_rate_limited": "ignore"},
        {"queue_size": 0},
    ],
)
def test_policy_bounds(policy):
    with pytest.raises(ValidationError):
        PolicySpec.model_validate(policy)


def test_span_print_forms():
    for ok in (None, True, False, "stdout", "stderr", "logging", "logger:train", print):
        assert RunSpec.model_validate({"spans": {"print": ok}}).spans.print is ok
    for bad in ("loud", "logger:", 3):
        with pytest.raises(ValidationError):
            RunSpec.model_validate({"spans": {"print": bad}})


class _Plugin:
    def start(self, span):
        pass

    def end(self, span):
        return {}


def test_span_plugins_specs_names_and_objects():
    obj = _Plugin()

    def fn(span):
        return {}

    s = RunSpec.model_validate(
        {"spans": {"plugins": [{"type": "cpu_time", "options": {"a": 1}}, "gpu_stats", obj, fn]}}
    )
    assert s.spans.plugins[0] == PluginSpec(type="cpu_time", options={"a": 1})
    assert s.spans.plugins[1] == PluginSpec(type="gpu_stats")
    assert s.spans.plugins[2] is obj and s.spans.plugins[3] is fn
    for bad in (3, None, object()):
        with pytest.raises(ValidationError):
            RunSpec.model_validate({"spans": {"plugins": [bad]}})


def test_backends_and_config():
    s = RunSpec(backends=["wandb", {"type": "trackio", "project": "p"}], config={"lr": 0.1})
    assert s.backends[1]["type"] == "trackio"
    assert s.config == {"lr": 0.1}


def test_config_accepts_omegaconf_and_namespaces():
    import argparse

    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"lr": 0.1, "opt": {"lr": "${lr}"}})
    assert RunSpec(config=cfg).config == {"lr": 0.1, "opt": {"lr": 0.1}}
    assert RunSpec(config=argparse.Namespace(a=1)).config == {"a": 1}
    broken = OmegaConf.create({"x": "${nope}"})
    with pytest.warns(UserWarning, match="interpolation"):
        assert RunSpec(config=broken).config == {"x": "${nope}"}


def test_json_schema_works_and_is_json():
    schema = RunSpec.model_json_schema()
    text = json.dumps(schema)
    assert "PluginSpec" in text and "RuleSpec" in text and "PolicyOverrides" in text
    spans = schema["$defs"]["SpansSpec"]["properties"]
    assert "print" in spans and "plugins" in spans
    rule = schema["$defs"]["RuleSpec"]["properties"]
    assert "condition" in rule
    assert RunSpec.model_json_schema(mode="serialization")
    assert AlertsSpec.model_json_schema()


def test_watchdog_interval_down_to_10ms_and_documented():
    """The watchdog's minimum interval is 10 ms (base code: 0.1 s, and undocumented in
    docs/configuration.md)."""
    from expr_tracker.spec import SpecError, resolve

    for ok in ("10ms", "50ms", 0.01):
        assert resolve({"alerts": {"watchdog_interval": ok}}, environ={}).spec.alerts
    with pytest.raises(SpecError, match=r"at least 0\.01 s \(10ms\)"):
        resolve({"alerts": {"watchdog_interval": "5ms"}}, environ={})
    reference = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    (line,) = [x for x in reference.splitlines() if x.startswith("| `alerts.watchdog_interval`")]
    assert "at least 10ms" in line
