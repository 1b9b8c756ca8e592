"""SpecError formatting and validate_file (et config validate / et rules check)."""

from __future__ import annotations

import pickle

import pytest
from pydantic import SecretStr

from expr_tracker.errors import ExprTrackerError
from expr_tracker.spec import SpecError, SpecIssue, validate_file
from expr_tracker.spec.errors import describe_source, display_value, join_path, suggest


def test_issue_format_with_value_source_and_suggestion():
    issue = SpecIssue(
        "history.buffer.size", "must be an integer >= 1", -1, source="file:conf/x.yaml"
    )
    assert issue.format() == (
        "history.buffer.size: -1 is not valid: must be an integer >= 1 (from file conf/x.yaml)"
    )
    unknown = SpecIssue(
        "history.buffer.szie", "unknown key", suggestion="did you mean `size`?", source="init"
    )
    assert str(unknown) == (
        "history.buffer.szie: unknown key; did you mean `size`? (from et.init() keyword arguments)"
    )


def test_issue_format_with_location_leads_with_file_line_column():
    issue = SpecIssue(
        "alerts.rules.nan.level",
        "must be one of ...",
        "loud",
        source="file:a.yaml",
        location=("a.yaml", 3, 7),
    )
    assert (
        issue.format()
        == "a.yaml:3:7: alerts.rules.nan.level: 'loud' is not valid: must be one of ..."
    )


def test_spec_error_lists_every_issue_one_per_line():
    issues = [SpecIssue(f"p{i}", "bad", i) for i in range(3)]
    err = SpecError(issues)
    assert isinstance(err, ValueError) and isinstance(err, ExprTrackerError)
    lines = str(err).splitlines()
    assert lines[0] == "invalid run spec (3 problems):"
    assert lines[1:] == [f"  p{i}: {i} is not valid: bad" for i in range(3)]
    assert err.issues == issues


def test_single_issue_is_one_line_and_error_pickles():
    err = SpecError([SpecIssue("a", "is required")])
    assert str(err) == "a: is required"
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == str(err) and again.issues[0].path == "a"


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("alerts.channels.slack.url", "https://hooks/SECRET"),
        ("config.api_key", "SECRET"),
        ("options.password", "SECRET"),
        ("x.token", 12345),
        ("anything", SecretStr("SECRET")),
        ("anything", "https://hooks/SECRET"),
        ("anything", {"webhook": "SECRET", "nested": [{"Token": "SECRET"}]}),
    ],
)
def test_display_value_redacts(path, value):
    shown = display_value(path, value)
    assert "SECRET" not in shown and "12345" not in shown
    assert "***" in shown


def test_display_value_truncates_long_values():
    assert len(display_value("x", "a" * 500)) <= 80


def test_join_path():
    assert join_path("", "history") == "history"
    assert join_path("history", "buffer") == "history.buffer"
    assert join_path("backends", 0) == "backends[0]"
    assert join_path("alerts.rules", "x > 1") == 'alerts.rules["x > 1"]'


def test_suggest():
    assert suggest("szie", ["size", "interval"]) == "did you mean `size`?"
    assert suggest("zzzz", ["size", "interval"]) is None


def test_describe_source():
    assert (
        describe_source("env:ET_SLACK_WEBHOOK_URL") == "environment variable ET_SLACK_WEBHOOK_URL"
    )
    assert describe_source("ET_CONFIG:/a.yaml") == "ET_CONFIG file /a.yaml"
    assert describe_source("ET_ALERT_CONFIG:/a.yaml") == "ET_ALERT_CONFIG file /a.yaml"
    assert describe_source("configure_alert") == "et.configure_alert()"


# --- validate_file ----------------------------------------------------------------------------


def test_validate_file_valid_run_and_alerts(tmp_path):
    run = tmp_path / "run.yaml"
    run.write_text("project: p\nhistory:\n  buffer:\n    size: 10\n")
    assert validate_file(run) == []
    alerts = tmp_path / "alerts.yaml"
    alerts.write_text("rules:\n  nan:\n    condition: isnan(loss)\n    level: error\n")
    assert validate_file(alerts, kind="alerts") == []


def test_validate_file_reports_file_line_column(tmp_path):
    run = tmp_path / "run.yaml"
    run.write_text(
        "# yaml-language-server: $schema=schemas/run-spec.schema.json\n"
        "project: p\n"
        "history:\n"
        "  buffer:\n"
        "    size: 0\n"
        "    intervall: 1s\n"
        "alerts:\n"
        "  rules:\n"
        "    - name: spike\n"
        "      condition: zscore(loss[50]) > 4\n"
        "      for_steps: 0\n"
        "    - 'loss > 1 => error: high'\n"
    )
    issues = validate_file(run)
    where = {i.path: i.location for i in issues}
    f = str(run)
    assert where == {
        "history.buffer.size": (f, 5, 5),
        "history.buffer.intervall": (f, 6, 5),
        "alerts.rules.spike.for_steps": (f, 11, 7),
    }
    lines = [i.format() for i in issues]
    assert f"{f}:6:5: history.buffer.intervall: unknown key; did you mean `interval`?" in lines
    assert all(i.source == f"file:{f}" for i in issues)


def test_validate_alerts_file_paths_are_under_alerts(tmp_path):
    alerts = tmp_path / "alerts.yaml"
    alerts.write_text("policy:\n  timeout: never\nchannels:\n  - type: slack\n    levels: [loud]\n")
    issues = validate_file(alerts, kind="alerts")
    where = {i.path: i.location for i in issues}
    f = str(alerts)
    assert where["alerts.policy.timeout"] == (f, 2, 3)
    assert where["alerts.channels.slack.levels[0]"][0] == f


def test_validate_file_alerts_wrapped_form(tmp_path):
    alerts = tmp_path / "alerts.yaml"
    alerts.write_text("alerts:\n  on_rank: everyone\n")
    (issue,) = validate_file(alerts, kind="alerts")
    assert issue.path == "alerts.on_rank"
    assert issue.location == (str(alerts), 2, 3)
    assert "'all'" in issue.message


def test_validate_file_reports_unreadable_files(tmp_path):
    (issue,) = validate_file(tmp_path / "missing.yaml")
    assert "file not found" in issue.message
    bad = tmp_path / "bad.json"
    bad.write_text('{"project": }')
    (issue,) = validate_file(bad)
    assert "invalid JSON" in issue.message and issue.location[1:] == (1, 13)
    with pytest.raises(ValueError):
        validate_file(bad, kind="bogus")


def test_unquoted_one_line_rule_in_yaml_gets_a_hint(tmp_path):
    run = tmp_path / "run.yaml"
    run.write_text("alerts:\n  rules:\n    - loss > 1 => error: high\n")
    (issue,) = validate_file(run)
    assert issue.path == "alerts.rules[0]"
    assert issue.location == (str(run), 3, 7)
    assert "quote it" in issue.message and "loss > 1 => error: high" in issue.message


def test_validate_json_file_has_locations(tmp_path):
    f = tmp_path / "run.json"
    f.write_text('{\n  "history": {\n    "buffer": {"size": 0}\n  }\n}\n')
    (issue,) = validate_file(f)
    assert issue.path == "history.buffer.size"
    assert issue.location == (str(f), 3, 16)


def test_issue_of_the_root_shows_no_placeholder():
    issue = SpecIssue("", "duplicate key 'a'", location=("a.yaml", 4, 5))
    assert issue.format() == "a.yaml:4:5: duplicate key 'a'"
    assert SpecIssue("", "file not found: x.yaml").format() == "file not found: x.yaml"
