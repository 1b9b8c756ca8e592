"""resolve(): every source, precedence, provenance, DictConfig, redaction, validate_file."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from omegaconf import OmegaConf

from expr_tracker.spec import (
    KEYWORDS,
    ResolvedSpec,
    RuleSpec,
    RunSpec,
    SpecError,
    kwargs_to_dict,
    load_yaml,
    resolve,
)

SLACK = "https://hooks.slack.com/services/T000/B000/SECRETSLACK"
LARK = "https://open.feishu.cn/open-apis/bot/v2/hook/SECRETLARK"


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


# --- the sources, one by one --------------------------------------------------------------


def test_no_sources_gives_defaults_and_a_timestamp_name():
    r = resolve(environ={})
    assert isinstance(r, ResolvedSpec)
    assert r.spec.project == "default"
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", r.spec.name)
    assert set(r.sources.values()) == {"default"}
    assert r.sources["history.buffer.size"] == "default"
    assert r.sources["name"] == "default"


@pytest.mark.parametrize(
    ("variable", "channel_type"),
    [
        ("ET_LARK_WEBHOOK_URL", "lark"),
        ("WEBHOOK_URL", "lark"),
        ("ET_SLACK_WEBHOOK_URL", "slack"),
        ("ET_DINGTALK_WEBHOOK_URL", "dingtalk"),
        ("ET_WECOM_WEBHOOK_URL", "wecom"),
        ("ET_WEBHOOK_URL", "webhook"),
    ],
)
def test_each_webhook_variable_makes_one_channel(variable, channel_type):
    r = resolve(environ={variable: "https://example.invalid/hook"})
    (channel,) = r.spec.alerts.channels
    assert (channel.type, channel.name) == (channel_type, channel_type)
    assert channel.url.get_secret_value() == "https://example.invalid/hook"
    assert r.sources[f"alerts.channels.{channel_type}.url"] == f"env:{variable}"


def test_new_lark_variable_beats_legacy_and_empty_values_ignored():
    r = resolve(
        environ={
            "WEBHOOK_URL": "https://old",
            "ET_LARK_WEBHOOK_URL": LARK,
            "ET_SLACK_WEBHOOK_URL": "",
        }
    )
    (channel,) = r.spec.alerts.channels
    assert channel.url.get_secret_value() == LARK
    assert r.sources["alerts.channels.lark.url"] == "env:ET_LARK_WEBHOOK_URL"


@pytest.mark.parametrize("wrapped", [False, True])
@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".json", ".toml"])
def test_alert_config_file_formats(tmp_path, suffix, wrapped):
    section = {"watchdog_interval": "10s", "rules": [{"name": "nan", "condition": "isnan(loss)"}]}
    data = {"alerts": section} if wrapped else section
    path = tmp_path / f"alerts{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(data))
    elif suffix == ".toml":
        prefix = "alerts." if wrapped else ""
        path.write_text(
            ("[alerts]\n" if wrapped else "")
            + 'watchdog_interval = "10s"\n'
            + f'[[{prefix}rules]]\nname = "nan"\ncondition = "isnan(loss)"\n'
        )
    else:
        path.write_text(yaml.safe_dump(data))
    r = resolve(environ={"ET_ALERT_CONFIG": str(path)})
    assert r.spec.alerts.watchdog_interval == 10.0
    assert r.spec.alerts.rules[0].name == "nan"
    assert r.sources["alerts.watchdog_interval"] == f"ET_ALERT_CONFIG:{path}"
    assert r.sources["alerts.rules.nan.condition"] == f"ET_ALERT_CONFIG:{path}"


def test_alert_config_with_alerts_key_and_others_is_an_error(tmp_path):
    path = write(tmp_path / "a.yaml", "alerts: {}\nhistory: {}\n")
    with pytest.raises(SpecError, match="history"):
        resolve(environ={"ET_ALERT_CONFIG": path})


def test_config_file_is_a_whole_run_spec(tmp_path):
    path = write(tmp_path / "run.yaml", "project: p\nhistory:\n  buffer:\n    size: 9\n")
    r = resolve(environ={"ET_CONFIG": path})
    assert (r.spec.project, r.spec.history.buffer.size) == ("p", 9)
    assert r.sources["project"] == f"ET_CONFIG:{path}"
    assert r.locations["history.buffer.size"] == (path, 4, 5)


def test_configure_alert_values_are_the_alerts_section():
    r = resolve(configure_alert={"on_rank": "all", "policy": {"timeout": "3s"}}, environ={})
    assert (r.spec.alerts.on_rank, r.spec.alerts.policy.timeout) == ("all", 3.0)
    assert r.sources["alerts.policy.timeout"] == "configure_alert"


def test_spec_as_path_dict_runspec(tmp_path):
    path = write(tmp_path / "s.yaml", "project: from_file\n")
    r = resolve(path, environ={})
    assert r.spec.project == "from_file" and r.sources["project"] == f"file:{path}"
    r = resolve(tmp_path / "s.yaml", environ={})
    assert r.spec.project == "from_file"
    r = resolve({"project": "from_dict"}, environ={})
    assert r.spec.project == "from_dict" and r.sources["project"] == "spec"
    r = resolve(RunSpec(project="from_model"), environ={})
    assert r.spec.project == "from_model" and r.sources["project"] == "spec"
    assert r.sources["dir"] == "default"


def test_spec_of_another_type_is_an_error():
    with pytest.raises(SpecError, match="spec must be"):
        resolve(42, environ={})


def test_dictconfig_interpolations_are_resolved():
    cfg = OmegaConf.create(
        {
            "exp": "mnist",
            "size": 32,
            "tracker": {"project": "${exp}", "history": {"buffer": {"size": "${size}"}}},
        }
    )
    r = resolve(cfg.tracker, environ={})
    assert (r.spec.project, r.spec.history.buffer.size) == ("mnist", 32)
    assert r.sources["project"] == "spec"


def test_dictconfig_broken_interpolation_and_missing_value_named_by_config_key():
    cfg = OmegaConf.create(
        {"tracker": {"project": "${nope}", "history": {"buffer": {"size": "???"}}}}
    )
    with pytest.raises(SpecError) as info:
        resolve(cfg.tracker, environ={})
    err = info.value
    assert [i.path for i in err.issues] == ["project", "history.buffer.size"]
    assert [i.config_key for i in err.issues] == ["tracker.project", "tracker.history.buffer.size"]
    text = str(err)
    assert "interpolation '${nope}' could not be resolved" in text
    assert "tracker.history.buffer.size" in text and "missing" in text


def test_dictconfig_validation_error_names_config_key():
    cfg = OmegaConf.create({"tracker": {"history": {"buffer": {"size": 0}}}})
    with pytest.raises(SpecError) as info:
        resolve(cfg.tracker, environ={})
    (issue,) = info.value.issues
    assert issue.config_key == "tracker.history.buffer.size"
    assert "tracker.history.buffer.size" in str(info.value)


# --- keyword arguments ----------------------------------------------------------------------


def test_keyword_table_maps_every_flat_name():
    expected = {
        "cache_bytes": "history.cache.bytes",
        "cache_rows": "history.cache.rows",
        "max_open_seconds": "history.max_open_seconds",
        "step_policy": "history.step_policy",
        "rank_aware": "history.rank_aware",
        "buffer_size": "history.buffer.size",
        "buffer_interval": "history.buffer.interval",
        "max_buffer_seconds": "history.buffer.max_seconds",
        "max_pending_records": "history.buffer.max_pending_records",
        "alert_window": "history.alert_window",
        "spans": "spans.enabled",
        "span_metrics": "spans.metrics",
        "span_count": "spans.count",
        "span_print_fn": "spans.print",
        "span_async_write": "spans.async_write",
        "span_plugins": "spans.plugins",
        "span_buffer_size": "spans.buffer.size",
        "span_buffer_interval": "spans.buffer.interval",
        "span_max_buffer_seconds": "spans.buffer.max_seconds",
        "max_record_bytes": "spans.max_record_bytes",
        "max_pending_bytes": "spans.max_pending_bytes",
        "alert": "alerts",
        "alert_rules": "alerts.rules",
        "alert_on_rank": "alerts.on_rank",
        "watchdog_interval": "alerts.watchdog_interval",
        "notify_on": "alerts.notify_on",
        "system": "system.enabled",
        "system_interval": "system.interval",
        "system_gpu": "system.gpu",
        "sync": "sync.url",
        "sync_interval": "sync.interval",
    }
    assert KEYWORDS == expected


def test_every_flat_keyword_lands_on_its_path():
    def plugin(span):
        return {}

    kwargs = {
        "cache_bytes": "2MiB",
        "cache_rows": 10,
        "max_open_seconds": None,
        "step_policy": "allow",
        "rank_aware": False,
        "buffer_size": 7,
        "buffer_interval": "250ms",
        "max_buffer_seconds": 2,
        "max_pending_records": 11,
        "alert_window": 64,
        "spans": False,
        "span_metrics": False,
        "span_count": True,
        "span_print_fn": print,
        "span_async_write": False,
        "span_plugins": [plugin],
        "span_buffer_size": 3,
        "span_buffer_interval": "2s",
        "span_max_buffer_seconds": None,
        "max_record_bytes": "1KiB",
        "max_pending_bytes": "1MiB",
        "alert": {"policy": {"timeout": 1}},
        "alert_rules": ["loss > 1 => error: high"],
        "alert_on_rank": [0, 1],
        "watchdog_interval": "5s",
        "notify_on": ["failure"],
        "system": False,
        "system_interval": "30s",
        "system_gpu": False,
        "sync": "s3://team-bucket/runs",
        "sync_interval": "2m",
        "project": "p",
        "name": "n",
        "dir": "d",
        "run_dir": "rd",
        "group": "g",
        "tags": ["t"],
        "notes": "no",
        "stream": "s",
        "resume": "must",
        "config": {"lr": 1},
        "backends": ["wandb"],
    }
    r = resolve(kwargs=kwargs, environ={})
    s = r.spec
    h, sp, a = s.history, s.spans, s.alerts
    assert (h.cache.bytes, h.cache.rows, h.max_open_seconds, h.step_policy, h.rank_aware) == (
        2 * 1024**2,
        10,
        None,
        "allow",
        False,
    )
    assert (h.buffer.size, h.buffer.interval, h.buffer.max_seconds) == (7, 0.25, 2.0)
    assert (h.buffer.max_pending_records, h.alert_window) == (11, 64)
    assert (sp.enabled, sp.metrics, sp.count, sp.print, sp.async_write) == (
        False,
        False,
        True,
        print,
        False,
    )
    assert sp.plugins == [plugin]
    assert (sp.buffer.size, sp.buffer.interval, sp.buffer.max_seconds) == (3, 2.0, None)
    assert (sp.max_record_bytes, sp.max_pending_bytes) == (1024, 1024**2)
    assert (a.policy.timeout, a.rules, a.on_rank, a.watchdog_interval, a.notify_on) == (
        1.0,
        ["loss > 1 => error: high"],
        [0, 1],
        5.0,
        ["failure"],
    )
    assert (s.project, s.name, s.dir, s.run_dir, s.group, s.tags, s.notes) == (
        "p",
        "n",
        "d",
        "rd",
        "g",
        ["t"],
        "no",
    )
    assert (s.stream, s.resume, s.config, s.backends) == ("s", "must", {"lr": 1}, ["wandb"])
    assert (s.system.enabled, s.system.interval, s.system.gpu) == (False, 30.0, False)
    assert (s.sync.url, s.sync.interval) == ("s3://team-bucket/runs", 120.0)
    assert r.sources["history.buffer.size"] == "init"
    assert r.sources["spans.print"] == "init"


def test_keyword_shorthands():
    assert kwargs_to_dict({"spans": {"count": True}}) == {"spans": {"count": True}}
    assert kwargs_to_dict({"alert": False}) == {"alerts": {"enabled": False}}
    assert kwargs_to_dict({"system": {"interval": "1s"}}) == {"system": {"interval": "1s"}}
    assert kwargs_to_dict({"system": False}) == {"system": {"enabled": False}}
    assert kwargs_to_dict({"sync": "file:///t"}) == {"sync": {"url": "file:///t"}}
    assert kwargs_to_dict({"sync": {"interval": "1s"}}) == {"sync": {"interval": "1s"}}
    assert kwargs_to_dict({"alert_rules": "x > 1"}) == {"alerts": {"rules": ["x > 1"]}}
    # a flat keyword beats the same value inside the section-wide argument
    d = kwargs_to_dict({"alert_on_rank": 1, "alert": {"on_rank": 2, "enabled": True}})
    assert d == {"alerts": {"on_rank": 1, "enabled": True}}


def test_alert_rules_keyword_merges_with_alert_rules_by_name():
    r = resolve(
        kwargs={
            "alert": {"rules": {"a": {"condition": "x > 1"}}},
            "alert_rules": [{"name": "a", "level": "error"}, "y > 2"],
        },
        environ={},
    )
    assert r.spec.alerts.rules == [RuleSpec(name="a", condition="x > 1", level="error"), "y > 2"]


def test_unknown_keywords_listed_with_close_matches():
    with pytest.raises(SpecError) as info:
        resolve(kwargs={"bufer_size": 1, "span_cuont": True, "zzz": 1}, environ={})
    issues = {i.path: i for i in info.value.issues}
    assert set(issues) == {"bufer_size", "span_cuont", "zzz"}
    assert "`buffer_size`" in issues["bufer_size"].suggestion
    assert "`span_count`" in issues["span_cuont"].suggestion
    assert issues["zzz"].suggestion is None
    assert "did you mean `span_count`" in str(info.value)


# --- precedence ---------------------------------------------------------------------------


def test_precedence_of_every_source(tmp_path):
    """defaults < env < ET_ALERT_CONFIG < ET_CONFIG < configure_alert < spec < init keywords."""
    alert_file = write(
        tmp_path / "alerts.yaml",
        "channels:\n  - type: slack\n    min_level: info\n"
        "watchdog_interval: 1s\non_rank: 1\npolicy:\n  timeout: 1\n  max_retries: 1\n"
        "  queue_size: 1\n  jitter: 0.01\n",
    )
    run_file = write(
        tmp_path / "run.yaml",
        "project: from_et_config\nnotes: et_config\n"
        "alerts:\n  on_rank: 2\n  policy:\n    timeout: 2\n    max_retries: 2\n    queue_size: 2\n",
    )
    spec_file = write(
        tmp_path / "spec.yaml",
        "project: from_spec\nalerts:\n  policy:\n    max_retries: 4\n",
    )
    environ = {
        "ET_SLACK_WEBHOOK_URL": SLACK,
        "ET_ALERT_CONFIG": alert_file,
        "ET_CONFIG": run_file,
    }
    r = resolve(
        spec_file,
        kwargs={"alert": {"policy": {"max_retries": 5}}, "group": "g"},
        configure_alert={"policy": {"queue_size": 3, "max_retries": 3}},
        environ=environ,
    )
    a = r.spec.alerts
    assert a.channels[0].url.get_secret_value() == SLACK  # env
    assert a.channels[0].min_level == "info"  # ET_ALERT_CONFIG adds to the env channel
    assert a.watchdog_interval == 1.0  # only ET_ALERT_CONFIG set it
    assert a.policy.jitter == 0.01
    assert a.on_rank == 2  # ET_CONFIG beats ET_ALERT_CONFIG
    assert a.policy.timeout == 2.0
    assert a.policy.queue_size == 3  # configure_alert beats ET_CONFIG
    assert r.spec.project == "from_spec"  # spec beats ET_CONFIG
    assert r.spec.notes == "et_config"
    assert a.policy.max_retries == 5  # init beats everything
    assert r.sources["alerts.channels.slack.url"] == "env:ET_SLACK_WEBHOOK_URL"
    assert r.sources["alerts.channels.slack.min_level"] == f"ET_ALERT_CONFIG:{alert_file}"
    assert r.sources["alerts.policy.jitter"] == f"ET_ALERT_CONFIG:{alert_file}"
    assert r.sources["alerts.on_rank"] == f"ET_CONFIG:{run_file}"
    assert r.sources["alerts.policy.queue_size"] == "configure_alert"
    assert r.sources["project"] == f"file:{spec_file}"
    assert r.sources["alerts.policy.max_retries"] == "init"
    assert r.sources["group"] == "init"
    assert r.sources["alerts.policy.backoff_max"] == "default"
    assert r.source_of("alerts.policy") == "default" or r.source_of("alerts.policy")
    assert r.locations["project"] == (spec_file, 1, 1)
    assert r.locations["alerts.channels.slack.min_level"] == (alert_file, 3, 5)


def test_environ_defaults_to_os_environ(monkeypatch, tmp_path):
    monkeypatch.setenv("ET_CONFIG", write(tmp_path / "r.yaml", "project: from_env\n"))
    assert resolve().spec.project == "from_env"


# --- errors -----------------------------------------------------------------------------------


def test_errors_of_every_source_listed_together(tmp_path):
    alert_file = write(tmp_path / "alerts.yaml", "policy:\n  timeout: forever\n")
    run_file = write(tmp_path / "run.yaml", "history:\n  buffer:\n    size: -1\n")
    with pytest.raises(SpecError) as info:
        resolve(
            {"spans": {"max_record_bytes": "huge"}},
            kwargs={"stream": "../x", "nonsense": 1},
            environ={"ET_ALERT_CONFIG": alert_file, "ET_CONFIG": run_file},
        )
    err = info.value
    by_path = {i.path: i for i in err.issues}
    # an unknown keyword stops the init layer, the other layers still validate
    assert set(by_path) == {
        "nonsense",
        "alerts.policy.timeout",
        "history.buffer.size",
        "spans.max_record_bytes",
    }
    assert by_path["alerts.policy.timeout"].source == f"ET_ALERT_CONFIG:{alert_file}"
    assert by_path["alerts.policy.timeout"].location == (alert_file, 2, 3)
    assert by_path["history.buffer.size"].source == f"ET_CONFIG:{run_file}"
    assert by_path["spans.max_record_bytes"].source == "spec"
    lines = str(err).splitlines()
    assert len(lines) == 1 + 4
    assert any("from the spec given to et.init()" in line for line in lines)


def test_bad_value_message_names_source_and_what_is_valid(tmp_path):
    path = write(tmp_path / "x.yaml", "history:\n  buffer:\n    size: -1\n")
    with pytest.raises(SpecError) as info:
        resolve(path, environ={})
    assert str(info.value) == (
        f"{path}:3:5: history.buffer.size: -1 is not valid: must be an integer >= 1"
    )
    with pytest.raises(SpecError) as info:
        resolve({"history": {"buffer": {"size": -1}}}, environ={})
    assert str(info.value) == (
        "history.buffer.size: -1 is not valid: must be an integer >= 1 "
        "(from the spec given to et.init())"
    )


def test_unknown_keys_get_suggestions_with_locations(tmp_path):
    path = write(
        tmp_path / "x.yaml",
        "history:\n  bufer:\n    size: 3\nalerts:\n  rules:\n    nan:\n      condition: x\n      levle: error\n",
    )
    with pytest.raises(SpecError) as info:
        resolve(path, environ={})
    by_path = {i.path: i for i in info.value.issues}
    assert by_path["history.bufer"].suggestion == "did you mean `buffer`?"
    assert by_path["history.bufer"].location == (path, 2, 3)
    assert by_path["alerts.rules.nan.levle"].suggestion == "did you mean `level`?"
    assert by_path["alerts.rules.nan.levle"].location == (path, 8, 7)
    assert f"{path}:8:7: alerts.rules.nan.levle: unknown key; did you mean `level`?" in str(
        info.value
    )


def test_unknown_key_without_close_match_lists_valid_keys():
    with pytest.raises(SpecError) as info:
        resolve({"history": {"buffer": {"qqqqq": 1}}}, environ={})
    (issue,) = info.value.issues
    assert issue.suggestion is None
    assert "max_pending_records" in issue.message and "size" in issue.message


def test_union_values_get_one_line():
    with pytest.raises(SpecError) as info:
        resolve({"backends": [3]}, environ={})
    (issue,) = info.value.issues
    assert issue.path == "backends[0]"
    assert "string" in issue.message and "mapping" in issue.message


def test_duplicate_channels_in_one_source_reported():
    with pytest.raises(SpecError, match="unique"):
        resolve({"alerts": {"channels": [{"type": "slack"}, {"type": "slack"}]}}, environ={})


def test_yaml_syntax_error_has_location(tmp_path):
    path = write(tmp_path / "bad.yaml", "history:\n  buffer: [1,\n")
    with pytest.raises(SpecError) as info:
        resolve(path, environ={})
    (issue,) = info.value.issues
    assert issue.location is not None and issue.location[0] == path
    assert "invalid YAML" in issue.message


@pytest.mark.parametrize("text, at", [("project: p\nname: a\x00b\n", (2, 8)), ("\x00", (1, 1))])
def test_a_nul_byte_is_reported_at_line_and_column(tmp_path, text, at):
    """PyYAML's reader gives only a character position (base code: "in "<unicode
    string>", position 18", no location): line:column like every other spec error, and
    the same for et rules check and et rules test."""
    from expr_tracker.alerts.rulefiles import check_rules_file
    from expr_tracker.alerts.unittests import run_unit_tests

    path = write(tmp_path / "nul.yaml", text)
    with pytest.raises(SpecError) as info:
        resolve(path, environ={})
    (issue,) = info.value.issues
    assert issue.location == (path, *at)
    assert issue.message == (
        "invalid YAML: unacceptable character #x0000: special characters are not allowed"
    )
    assert str(info.value).startswith(f"{path}:{at[0]}:{at[1]}: invalid YAML")
    (error,) = check_rules_file(path)["errors"]
    assert (error["line"], error["column"]) == at and "position" not in error["message"]
    errors, _, _ = run_unit_tests(tmp_path / "nul.yaml")
    assert errors == [f"{path}:{at[0]}:{at[1]}: {issue.message}"]


def test_missing_file_is_reported(tmp_path):
    with pytest.raises(SpecError, match="file not found"):
        resolve(environ={"ET_CONFIG": str(tmp_path / "nope.yaml")})


def test_top_level_must_be_a_mapping(tmp_path):
    path = write(tmp_path / "list.yaml", "- 1\n- 2\n")
    with pytest.raises(SpecError, match="must be a mapping"):
        resolve(path, environ={})


def test_load_yaml_is_safe(tmp_path):
    path = write(tmp_path / "evil.yaml", "x: !!python/object/apply:os.system ['echo hi']\n")
    with pytest.raises(yaml.YAMLError):
        load_yaml(path)
    with pytest.raises(SpecError, match="invalid YAML"):
        resolve(path, environ={})


# --- secrets ----------------------------------------------------------------------------------


def test_redacted_hides_every_secret_and_renders_objects():
    class Plugin:
        def end(self, span):
            return {}

        def __repr__(self):
            return "Plugin()"

    r = resolve(
        {
            "config": {"lr": 0.1, "api_key": "SECRETKEY", "nested": {"db_password": "SECRETPW"}},
            # wandb.init takes its key in settings (an unknown init keyword is an error)
            "backends": [{"type": "wandb", "settings": {"api_key": "SECRETTOKEN"}}],
            "backend_kwargs": {"trackio": {"webhook_url": "https://SECRETHOOK"}},
            "alerts": {
                "channels": [
                    {
                        "type": "email",
                        "secret": "SECRETSIGN",
                        "url_env": "MY_URL",
                        "options": {"host": "smtp", "password": "SECRETSMTP", "Webhook": "x"},
                    }
                ]
            },
            "spans": {"plugins": [{"type": "p", "options": {"token": "SECRETPLUGIN"}}, Plugin()]},
        },
        kwargs={"span_print_fn": print},
        environ={"ET_SLACK_WEBHOOK_URL": SLACK},
    )
    red = r.redacted()
    text = json.dumps(red)  # JSON-able
    assert "SECRET" not in text
    channels = {c["name"]: c for c in red["alerts"]["channels"]}
    assert channels["slack"]["url"] == "***"
    assert channels["email"]["secret"] == "***"
    assert channels["email"]["url_env"] == "MY_URL"
    assert channels["email"]["options"] == {"host": "smtp", "password": "***", "Webhook": "***"}
    assert red["config"] == {"lr": 0.1, "api_key": "***", "nested": {"db_password": "***"}}
    assert red["backends"] == [{"type": "wandb", "settings": {"api_key": "***"}}]
    assert red["backend_kwargs"] == {"trackio": {"webhook_url": "***"}}
    assert red["spans"]["plugins"][0] == {"type": "p", "options": {"token": "***"}}
    assert red["spans"]["plugins"][1] == "Plugin()"
    assert red["spans"]["print"] == repr(print)
    rows = {path: (value, source) for path, value, source, _ in r.rows()}
    assert rows["alerts.channels.slack.url"] == ("***", "env:ET_SLACK_WEBHOOK_URL")


def test_secrets_never_in_spec_error(tmp_path):
    path = write(
        tmp_path / "x.yaml",
        "alerts:\n  channels:\n    - type: slack\n      url: " + SLACK + "\n      min_level: loud\n"
        "    - url: " + LARK + "\n      webhok_url: " + LARK + "\n",
    )
    with pytest.raises(SpecError) as info:
        resolve(
            path,
            kwargs={"config": {"token": 3}},
            environ={"ET_LARK_WEBHOOK_URL": "not a url SECRETENV", "ET_WEBHOOK_URL": "x"},
            configure_alert={
                "channels": [{"type": "webhook", "url": 42, "secret": ["SECRETSIGN"]}]
            },
        )
    text = str(info.value)
    assert "SECRET" not in text
    assert "min_level" in text and "webhok_url" in text and "type" in text
    for issue in info.value.issues:
        assert "SECRET" not in issue.format()


def test_locations_of_unnamed_rules_follow_merged_positions(tmp_path):
    path = write(
        tmp_path / "s.yaml",
        "alerts:\n  rules:\n    - condition: ok > 1\n    - condition: x\n      for_steps: 0\n",
    )
    with pytest.raises(SpecError) as info:
        resolve(path, configure_alert={"rules": [{"condition": "first"}]}, environ={})
    (issue,) = info.value.issues
    assert issue.path == "alerts.rules[2].for_steps"
    assert issue.location == (path, 5, 7)
    assert issue.source == f"file:{path}"


def test_config_omegaconf_broken_interpolation_stays_literal_with_warning():
    cfg = OmegaConf.create({"lr": 0.1, "x": "${nope}", "y": "${lr}", "l": [1, "${lr}"]})
    with pytest.warns(UserWarning, match="config.x"):
        r = resolve(kwargs={"config": cfg}, environ={})
    assert r.spec.config == {"lr": 0.1, "x": "${nope}", "y": 0.1, "l": [1, 0.1]}


def test_spec_dictconfig_config_section_is_lenient_but_the_rest_strict():
    cfg = OmegaConf.create({"tracker": {"config": {"a": "${nope}"}, "project": "${nope}"}})
    with pytest.warns(UserWarning, match="config.a"):
        with pytest.raises(SpecError) as info:
            resolve(cfg.tracker, environ={})
    assert [i.path for i in info.value.issues] == ["project"]
    cfg = OmegaConf.create({"tracker": {"config": {"a": "${nope}", "b": 2}}})
    with pytest.warns(UserWarning):
        assert resolve(cfg.tracker, environ={}).spec.config == {"a": "${nope}", "b": 2}


def test_dictconfig_nested_inside_a_dict_spec():
    inner = OmegaConf.create({"size": 5, "interval": "${size}"})
    r = resolve({"history": {"buffer": inner}}, environ={})
    assert (r.spec.history.buffer.size, r.spec.history.buffer.interval) == (5, 5.0)


# --- duplicate keys -------------------------------------------------------------------------


def test_duplicate_keys_are_reported_with_line_and_column(tmp_path):
    from expr_tracker.spec import validate_file
    from expr_tracker.spec.yaml import DuplicateKeyError

    text = (
        "alerts:\n"
        "  rules:\n"
        "    a: {condition: loss > 1}\n"
        "    a: {condition: loss > 2}\n"
        "history:\n"
        "  alert_window: 10\n"
        "  alert_window: 20\n"
    )
    path = write(tmp_path / "dup.yaml", text)
    with pytest.raises(DuplicateKeyError, match=r"duplicate key 'a' \(first at line 3, column 5\)"):
        load_yaml(path)
    issues = validate_file(path)
    assert [(i.location[1:], "duplicate key" in i.message) for i in issues] == [
        ((4, 5), True),
        ((7, 3), True),
    ]
    with pytest.raises(SpecError, match="duplicate key 'alert_window'"):
        resolve(path, environ={})
    json_path = write(tmp_path / "dup.json", '{"project": "a",\n "project": "b"}')
    assert [i.location[1:] for i in validate_file(json_path)] == [(2, 2)]


def test_merge_keys_may_override_without_being_duplicates(tmp_path):
    text = "base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  x: 3\n"
    assert load_yaml(write(tmp_path / "m.yaml", text))["other"] == {"x": 3, "y": 2}


def test_header_values_and_auth_like_keys_are_redacted():
    r = resolve(
        kwargs={
            "alert": {
                "channels": [
                    {
                        "type": "webhook",
                        "name": "hdr",
                        "url": "http://127.0.0.1:9/x",
                        "options": {
                            "headers": {"Authorization": "Bearer SECRETHDR", "X-Plain": "V1"},
                            "x-api-key": "SECRETKEY2",
                            "body": {"text": "{title}"},
                        },
                    }
                ]
            }
        },
        environ={},
    )
    text = json.dumps(r.redacted())
    assert "SECRETHDR" not in text and "SECRETKEY2" not in text and "V1" not in text
    assert "{title}" in text
    assert "SECRETHDR" not in str(r.rows())


def test_duplicate_keys_and_root_problems_name_their_path(tmp_path):
    from expr_tracker.spec import validate_file

    text = "alerts:\n  channels:\n    - type: console\n      enabled: true\n      enabled: false\n"
    path = write(tmp_path / "dup.yaml", text)
    (issue,) = validate_file(path)
    assert issue.path == "alerts.channels.console.enabled"
    assert issue.format().startswith(f"{path}:5:7: alerts.channels.console.enabled: duplicate")
    (missing,) = validate_file(tmp_path / "nonexist.yaml")
    assert "<spec>" not in missing.format() and missing.format().startswith("file not found")


def test_bool_channel_name_in_mapping_form_located_at_its_entry(tmp_path):
    path = write(tmp_path / "ch.yaml", "alerts:\n  channels:\n    a: {type: console}\n    no: {}\n")
    with pytest.raises(SpecError) as info:
        resolve(path, environ={})
    text = str(info.value)
    assert f"{path}:4:5: alerts.channels[1].name: False is not valid: must be a string" in text
    assert "YAML reads off/on/yes/no as booleans: quote the name" in text


def test_errors_of_keyword_values_are_not_located_in_a_file(tmp_path):
    path = write(tmp_path / "run.yaml", "history:\n  buffer:\n    interval: 1\n")
    with pytest.raises(SpecError) as info:
        resolve(path, kwargs={"buffer_size": -1}, environ={})
    (issue,) = info.value.issues
    assert (issue.path, issue.source, issue.location) == ("history.buffer.size", "init", None)
