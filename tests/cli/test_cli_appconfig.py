"""`et rules check`, `et config validate/show` and `et channels test --config` read a Hydra
app's own config file: its `tracker:` section (found by itself, or named by --package)."""

from __future__ import annotations

import json

from expr_tracker.cli.main import main

APP = """\
defaults:
  - _self_
  - optimizer: adam
lr: 0.1
tracker:
  project: demo
  alerts:
    rules:
      high: "loss > 4 => error: high"
      bad:
        condition: "nope(loss) > 1"
    channels:
      - {name: hook, type: slack, url_env: ET_TEST_UNSET_APP_HOOK}
"""


def app(tmp_path, text=APP):
    path = tmp_path / "app.yaml"
    path.write_text(text)
    return str(path)


def test_rules_check_reads_the_tracker_section_with_file_lines(tmp_path, capsys):
    path = app(tmp_path)
    assert main(["rules", "check", path, "--format", "json"]) == 1
    cap = capsys.readouterr()
    [result] = json.loads(cap.out)
    assert result["rules"] == 1  # 'high' compiled; 'bad' is the error
    assert [(e["line"], e["column"]) for e in result["errors"]] == [(11, 21)]
    assert "unknown function 'nope'" in result["errors"][0]["message"]
    assert "defaults list is not composed" in cap.err
    # the same with the section named; a missing one is an error naming what is there
    assert main(["rules", "check", path, "--package", "tracker"]) == 1
    assert f"{path}:11:21: unknown function 'nope'" in capsys.readouterr().out
    assert main(["rules", "check", path, "--package", "trackr"]) == 1
    out = capsys.readouterr().out
    assert "no section 'trackr'" in out and "tracker" in out


def test_config_validate_and_show_read_the_tracker_section(tmp_path, capsys):
    path = app(tmp_path)
    assert main(["config", "validate", path]) == 1
    out = capsys.readouterr().out
    assert f"{path}:11:21: alerts.rules.bad.condition: unknown function 'nope'" in out
    good = app(tmp_path, APP.replace('"nope(loss) > 1"', '"loss > 9"'))
    assert main(["config", "validate", good]) == 0
    assert "SUCCESS" in capsys.readouterr().out
    assert main(["config", "show", good, "--format", "json"]) == 0
    rows = {r["path"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["project"]["value"] == "demo"
    assert rows["project"]["location"] == f"{good}:6:3"  # the line in the app's file
    # an explicit dotted package: the alerts section alone
    assert (
        main(["config", "validate", good, "--package", "tracker.alerts", "--kind", "alerts"]) == 0
    )


def test_channels_test_config_reads_the_tracker_section(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ET_TEST_UNSET_APP_HOOK", raising=False)
    path = app(tmp_path)
    assert main(["channels", "test", "--config", path, "--format", "json"]) == 1
    [row] = json.loads(capsys.readouterr().out)
    assert row["channel"] == "hook" and row["off"] is True
