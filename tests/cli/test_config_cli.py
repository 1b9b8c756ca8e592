"""et config validate / show / reference."""

from __future__ import annotations

import io
import json

import pytest
from helpers import ROOT
from rich.console import Console

from expr_tracker.cli.config import parse_overrides, render_table, show_rows
from expr_tracker.cli.main import main

BAD = """\
project: p
history:
  buffer:
    szie: 3
    size: -1
alerts:
  rules:
    r1: {condition: "loss > 1", level: bogus}
"""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in ("ET_CONFIG", "ET_ALERT_CONFIG", "ET_SLACK_WEBHOOK_URL", "WEBHOOK_URL"):
        monkeypatch.delenv(var, raising=False)


def test_validate_reports_file_line_column_and_path(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    good = tmp_path / "good.yaml"
    good.write_text("history:\n  buffer:\n    size: 10\n")
    assert main(["config", "validate", str(good), str(bad)]) == 1
    out = capsys.readouterr().out
    assert f"SUCCESS: {good}" in out
    assert f"FAILED: {bad}" in out
    assert f"{bad}:5:5: history.buffer.size: -1 is not valid: must be an integer >= 1" in out
    assert f"{bad}:4:5: history.buffer.szie: unknown key; did you mean `size`?" in out
    assert f"{bad}:8:" in out and "alerts.rules.r1.level" in out


def test_validate_exit_zero_and_alerts_kind(tmp_path, capsys):
    rules = tmp_path / "alerts.yaml"
    rules.write_text("rules:\n  nan:\n    condition: isnan(loss)\n    level: error\n")
    assert main(["config", "validate", str(rules)]) == 0
    assert "SUCCESS" in capsys.readouterr().out
    assert main(["config", "validate", "--kind", "run", str(rules)]) == 1


def test_validate_missing_file(tmp_path, capsys):
    assert main(["config", "validate", str(tmp_path / "nope.yaml")]) == 1
    assert "file not found" in capsys.readouterr().out


def test_validate_shipped_group_files(capsys):
    conf = ROOT / "expr_tracker" / "conf" / "tracker"
    files = [str(p) for p in sorted(conf.rglob("*.yaml")) if p.name != "timeline.yaml"]
    assert main(["config", "validate", *files]) == 0, capsys.readouterr().out


def test_show_sources_and_redaction(tmp_path, monkeypatch):
    spec = tmp_path / "run.yaml"
    spec.write_text(
        "project: p\nalerts:\n  channels:\n    - type: slack\n      url: https://hooks/secret-x\n"
    )
    base = tmp_path / "base.yaml"
    base.write_text("history:\n  cache:\n    rows: 10\n")
    monkeypatch.setenv("ET_CONFIG", str(base))
    monkeypatch.setenv("ET_LARK_WEBHOOK_URL", "https://lark/hook-y")
    rows = {p: (v, s, w) for p, v, s, w in show_rows(str(spec), ["history.buffer.size=7"])}
    assert rows["project"] == ("p", "file", f"{spec}:1:1")
    assert rows["history.buffer.size"][:2] == (7, "override")
    assert rows["history.cache.rows"][:2] == (10, "ET_CONFIG")
    assert rows["history.buffer.interval"] == (1.0, "default", "")
    assert rows["alerts.channels.slack.url"][0] == "***"
    assert rows["alerts.channels.lark.url"][:2] == ("***", "env ET_LARK_WEBHOOK_URL")
    buf = io.StringIO()
    Console(file=buf, width=200).print(render_table(list(show_rows(str(spec), []))))
    text = buf.getvalue()
    assert "secret-x" not in text and "hook-y" not in text and "***" in text


def test_show_cli_json_and_errors(tmp_path, capsys):
    assert main(["config", "show", "--format", "json", "--overrides", "buffer_size=3"]) == 0
    data = {r["path"]: r for r in json.loads(capsys.readouterr().out)}
    assert data["history.buffer.size"]["value"] == 3
    assert data["history.buffer.size"]["source"] == "override"
    assert main(["config", "show", "--overrides", "nonsense"]) == 2
    assert main(["config", "show", "--overrides", "history.buffer.size=-1"]) == 1
    assert "history.buffer.size" in capsys.readouterr().err
    assert main(["config", "show", "--width", "120"]) == 0
    assert "history.buffer.size" in capsys.readouterr().out


def test_parse_overrides():
    assert parse_overrides(["a.b.c=1", "a.b.d=null", "x=[1, 2]", "s=hi"]) == {
        "a": {"b": {"c": 1, "d": None}},
        "x": [1, 2],
        "s": "hi",
    }
    with pytest.raises(ValueError):
        parse_overrides(["=3"])


def test_configuration_reference_is_fresh(capsys):
    path = ROOT / "docs" / "configuration.md"
    assert main(["config", "reference", "-o", str(path), "--check"]) == 0, (
        "docs/configuration.md is stale: run `et config reference -o docs/configuration.md`"
    )


def test_reference_covers_every_field():
    from expr_tracker.spec import BufferSpec, HistorySpec, PolicySpec, RuleSpec, RunSpec
    from expr_tracker.spec.reference import reference_markdown

    text = reference_markdown()
    for name in RunSpec.model_fields:
        assert f"| `{name}` |" in text
    for name in HistorySpec.model_fields:
        assert f"`history.{name}`" in text
    for name in BufferSpec.model_fields:
        assert f"`spans.buffer.{name}`" in text
    for name in PolicySpec.model_fields:
        assert f"`alerts.policy.{name}`" in text
    for name in RuleSpec.model_fields:
        assert f"| `{name}` |" in text


def test_reference_check_stale(tmp_path, capsys):
    out = tmp_path / "c.md"
    out.write_text("old")
    assert main(["config", "reference", "-o", str(out), "--check"]) == 1
    assert main(["config", "reference", "-o", str(out)]) == 0
    assert main(["config", "reference", "-o", str(out), "--check"]) == 0


def test_validate_compiles_rules_like_rules_check(tmp_path, capsys):
    f = tmp_path / "run.yaml"
    f.write_text(
        'history:\n  alert_window: 100\nalerts:\n  rules:\n    bad: {condition: "zscore(loss[50]) > "}\n'
        "    wide:\n      condition: mean(loss[500]) > 1\n    lvl: {condition: loss > 1, level: bogus}\n"
    )
    assert main(["config", "validate", str(f)]) == 1
    out = capsys.readouterr().out
    assert f"{f}:5:41: alerts.rules.bad.condition: syntax error" in out
    assert f"{f}:7:18: alerts.rules.wide.condition: window loss[500] is wider than" in out
    assert out.count("alerts.rules.lvl.level") == 1  # reported once, by the spec validation
    alerts = tmp_path / "alerts.yaml"
    alerts.write_text("rules:\n  - name: n\n    condition: nope(loss) > 1\n")
    assert main(["config", "validate", str(alerts)]) == 1
    out = capsys.readouterr().out
    assert f"{alerts}:3:16: alerts.rules.n.condition: unknown function 'nope'" in out
    toml = tmp_path / "a.toml"
    toml.write_text('[alerts.rules.bad]\ncondition = "loss >"\n')
    assert main(["config", "validate", str(toml)]) == 1
    assert "alerts.rules.bad.condition: syntax error" in capsys.readouterr().out


def test_validate_messages_have_no_placeholder(tmp_path, capsys):
    dup = tmp_path / "dup.yaml"
    dup.write_text("project: p\nhistory:\n  buffer: {size: 1}\n  buffer: {size: 2}\n")
    missing = tmp_path / "nonexist.yaml"
    assert main(["config", "validate", str(dup), str(missing)]) == 1
    out = capsys.readouterr().out
    assert "<spec>" not in out
    assert f"{dup}:4:3: history.buffer: duplicate key 'buffer'" in out
    assert f"  {missing}: file not found" in out and "(from file" not in out


@pytest.mark.parametrize("form", ["mapping", "list"])
def test_validate_bool_channel_name_points_at_the_entry(tmp_path, capsys, form):
    f = tmp_path / "ch.yaml"
    if form == "mapping":
        f.write_text("alerts:\n  channels:\n    c1: {type: console}\n    off: {type: console}\n")
        where = f"{f}:4:5: alerts.channels[1].name"
    else:
        f.write_text("alerts:\n  channels:\n    - type: console\n      name: on\n")
        where = f"{f}:4:7: alerts.channels[0].name"
    assert main(["config", "validate", str(f)]) == 1
    out = capsys.readouterr().out
    assert where in out
    assert "YAML reads off/on/yes/no as booleans: quote the name" in out


def test_show_locations_only_for_values_from_that_file(tmp_path, monkeypatch, capsys):
    alerts = tmp_path / "ac.yaml"
    alerts.write_text("alerts:\n  watchdog_interval: 2\n  channels:\n    - type: console\n")
    spec = tmp_path / "run.yaml"
    spec.write_text("history:\n  buffer:\n    size: 10\n")
    monkeypatch.setenv("ET_ALERT_CONFIG", str(alerts))
    monkeypatch.setenv("ET_SLACK_WEBHOOK_URL", "https://hooks/secret-x")
    rows = {p: (v, s, w) for p, v, s, w in show_rows(str(spec), ["history.buffer.interval=3"])}
    assert rows["alerts.channels.slack.url"] == ("***", "env ET_SLACK_WEBHOOK_URL", "")
    assert rows["alerts.channels.console.type"] == ("console", "ET_ALERT_CONFIG", f"{alerts}:4:7")
    assert rows["history.buffer.interval"] == (3.0, "override", "")
    assert rows["history.buffer.size"] == (10, "file", f"{spec}:3:5")
    toml = tmp_path / "ac.toml"
    toml.write_text("[alerts]\nwatchdog_interval = 2\n")
    monkeypatch.setenv("ET_ALERT_CONFIG", str(toml))
    rows = {p: (v, s, w) for p, v, s, w in show_rows(None, [])}
    assert rows["alerts.watchdog_interval"] == (2.0, "ET_ALERT_CONFIG", str(toml))  # one format
    assert main(["config", "show", str(spec), "--overrides", "history.buffer.size=-1"]) == 1
    err = capsys.readouterr().err
    assert "history.buffer.size: -1 is not valid" in err and "(from override)" in err
    assert "et.init" not in err and f"{spec}:" not in err
    assert main(["config", "show", "--overrides", "histroy.buffer.size=1"]) == 1
    err = capsys.readouterr().err
    assert "unknown override key" in err and "did you mean `history`?" in err
