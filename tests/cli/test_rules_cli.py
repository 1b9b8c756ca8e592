"""`et rules explain | check | test`: output, file:line:column, exit codes."""

from __future__ import annotations

import json

import pytest

from expr_tracker.alerts.unittests import expand_series
from expr_tracker.cli.main import main
from expr_tracker.cli.rules import read_metrics


def et(capsys, *argv):
    code = main(["rules", *argv])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_explain(capsys):
    code, out = et(capsys, "explain", "zscore(loss[50]) > 4 => error: spike")
    assert code == 0
    assert "condition:  zscore(loss[50]) > 4\n" in out and "loss (last 50 values)" in out
    code, out = et(capsys, "explain", "isnan(loss) => crit", "--format", "json")
    info = json.loads(out)
    assert (code, info["level"], info["functions"], info["metrics"]) == (
        0,
        "critical",
        ["isnan"],
        {"loss": 1},
    )
    code, out = et(capsys, "explain", "loss >")
    assert code == 1 and "missing operand" in out and "^" in out


def test_explain_shows_numbers_as_written(capsys):
    rule = "loss > 50 and mean(x[5]) < 1e-3 or y == 0.5 or z > -2.50 => error: hi"
    code, out = et(capsys, "explain", rule)
    assert code == 0
    cond = "loss > 50 and mean(x[5]) < 1e-3 or y == 0.5 or z > -2.50"
    assert f"condition:  {cond}\n" in out
    code, out = et(capsys, "explain", "loss > 50", "--format", "json")
    info = json.loads(out)
    assert info["condition"] == "loss > 50" and info["name"].startswith("loss > 50 [")


@pytest.mark.parametrize(
    ("rule", "shown"),
    [
        ("((a > 1) and (b < 2)) => warn", "a > 1 and b < 2"),
        ("(a > 1 or b > 1) and c < 2 => warn", "(a > 1 or b > 1) and c < 2"),
        ("not (a > 1 and b > 1) => warn", "not (a > 1 and b > 1)"),
        ("x - (y - z) > 0 => warn", "x - (y - z) > 0"),
        ("(x - y) - z > 0 => warn", "x - y - z > 0"),
    ],
)
def test_explain_prints_the_fewest_parentheses(capsys, rule, shown):
    code, out = et(capsys, "explain", rule)
    assert code == 0 and f"condition:  {shown}\n" in out
    code, out = et(capsys, "explain", rule, "--format", "json")
    assert json.loads(out)["condition"] == shown
    # what explain prints is a condition that explains the same way
    code, again = et(capsys, "explain", shown, "--format", "json")
    assert code == 0 and json.loads(again)["condition"] == shown


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


GOOD = """\
alerts:
  rules:
    - name: nan
      condition: isnan(loss)
      level: critical
    - name: spike
      condition: zscore(loss[50]) > 4
"""


def test_check_success_and_exit_codes(tmp_path, capsys):
    f = write(tmp_path, "ok.yaml", GOOD)
    code, out = et(capsys, "check", f)
    assert code == 0 and "SUCCESS: 2 rules found" in out
    lint = write(tmp_path, "lint.yaml", "rules:\n  - zscore(loss[5]) > 3\n")
    code, out = et(capsys, "check", lint)
    assert code == 0 and "WARNING" in out and "FAILED" not in out
    code, _ = et(capsys, "check", lint, "--lint-fatal")
    assert code == 3


def test_check_errors_carry_file_line_column(tmp_path, capsys):
    bad = write(
        tmp_path,
        "bad.yaml",
        "rules:\n  a: loss >\n  b:\n    condition: nope(x)\n  c: x > 1\n"
        "  dup: {name: c, condition: y > 1}\n",
    )
    code, out = et(capsys, "check", bad)
    assert code == 1 and "FAILED" in out
    assert f"{bad}:2:12: syntax error" in out  # "loss >" starts at column 6: caret past it
    assert f"{bad}:4:16: unknown function 'nope'" in out
    assert "duplicate rule name 'c'" in out
    code, out = et(capsys, "check", bad, "--format", "json")
    data = json.loads(out)  # one document: an array, one result per file (exit code: 1)
    assert code == 1 and [f["status"] for f in data] == ["FAILED"]


def test_check_yaml_error_and_missing_file(tmp_path, capsys):
    f = write(tmp_path, "broken.yaml", "rules: [\n")
    code, out = et(capsys, "check", f, str(tmp_path / "none.yaml"))
    assert code == 1 and "invalid YAML" in out and "cannot read" in out


def test_check_validates_channels_via_spec(tmp_path, capsys):
    pytest.importorskip("expr_tracker.spec.models")
    f = write(tmp_path, "ch.yaml", GOOD + "  channels:\n    - type: slack\n      bogus: 1\n")
    code, out = et(capsys, "check", f)
    assert code == 1 and "bogus" in out and f"{f}:10:" in out


def test_check_with_run_rejects_unknown_metrics(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"_step": 0, "_time": 1.0, "los": 1.0}\n')
    f = write(tmp_path, "ok.yaml", GOOD)
    code, out = et(capsys, "check", f, "--run", str(run))
    assert code == 1 and "unknown metric 'loss' (did you mean los?)" in out


def make_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lines = []
    for i in range(20):
        loss = "NaN" if i == 12 else str(1.0 + 0.01 * (i % 3))
        lines.append(f'{{"_step": {i}, "_time": {1000 + i}, "loss": {loss}}}')
    lines.append('{"_step": 5, "acc": 0.5}')  # a patch line merges into step 5
    (run / "metrics.jsonl").write_text("\n".join(lines) + '\n{"_step": 20, "lo')  # torn
    return run


def test_read_metrics_tolerates_nan_patches_and_a_torn_line(tmp_path):
    rows = read_metrics(str(make_run(tmp_path)))
    assert len(rows) == 20 and rows[5]["acc"] == 0.5 and rows[12]["loss"] != rows[12]["loss"]


def test_replay_prints_each_firing(tmp_path, capsys):
    run = make_run(tmp_path)
    code, out = et(capsys, "test", "isnan(loss) => critical: nan at {step}", "--run", str(run))
    assert code == 0 and "step 12: [critical]" in out and "nan at 12" in out
    code, out = et(capsys, "test", "isnan(loss)", "--run", str(run), "-n", "5")
    assert code == 0 and "0 firing(s) over 5 steps" in out
    code, out = et(capsys, "test", "isnan(los)", "--run", str(run))
    assert code == 1 and "did you mean loss" in out
    code, _ = et(capsys, "test", "isnan(loss)")
    assert code == 2


@pytest.mark.parametrize(
    ("text", "values"),
    [
        ("1 1 9", [1, 1, 9]),
        ("0+1x3", [0, 1, 2, 3]),
        ("5x2", [5, 5, 5]),
        ("1-1x2", [1, 0, -1]),
        ("_ 1 _x2", [None, 1, None, None]),
        ("inf -inf", [float("inf"), float("-inf")]),
    ],
)
def test_expand_series(text, values):
    assert expand_series(text) == values


def test_expand_series_nan_and_errors():
    (v,) = expand_series("nan")
    assert v != v
    with pytest.raises(ValueError):
        expand_series("1 two")


UNIT = """\
rules:
  spike: "zscore(loss[20]) > 3 => error: spike"
  nan: "isnan(loss) => critical: nan"
interval: 10s
tests:
  - name: spike fires
    input_series:
      loss: "1 1.1 0.9 1 1.05 0.95 1 1.1 0.9 1 1.05 0.95 1 1.1 0.9 1 1.05 0.95 1 9"
    expected_alerts:
      - {rule: spike, steps: [19]}
      - {rule: nan, steps: []}
  - name: nan fires
    input_series:
      loss: "1 _ nan 0+1x2"
    expected_alerts:
      - {rule: nan, steps: [STEP]}
"""


def test_unit_tests_pass_and_fail_with_a_diff(tmp_path, capsys):
    ok = write(tmp_path, "t_ok.yaml", UNIT.replace("STEP", "2"))
    code, out = et(capsys, "test", ok)
    assert code == 0 and "SUCCESS: 2 tests passed" in out
    bad = write(tmp_path, "t_bad.yaml", UNIT.replace("STEP", "3"))
    code, out = et(capsys, "test", bad)
    assert code == 1
    assert "- expected firing at step 3" in out and "+ got firing at step 2" in out


def test_unit_tests_with_rule_files(tmp_path, capsys):
    write(tmp_path, "alerts.yaml", GOOD)
    t = write(
        tmp_path,
        "t.yaml",
        "rule_files: [alerts.yaml]\ntests:\n  - input_series: {loss: '1 nan'}\n"
        "    expected_alerts: [{rule: nan, steps: [1]}, {rule: spike, steps: []}]\n",
    )
    code, out = et(capsys, "test", t)
    assert code == 0, out


def test_check_reports_duplicate_mapping_keys(tmp_path, capsys):
    f = write(
        tmp_path,
        "dup.yaml",
        "alerts:\n  rules:\n    a: {condition: loss > 1}\n    a: {condition: loss > 2}\n"
        "    b:\n      condition: x > 1\n      level: error\n      level: info\n",
    )
    code, out = et(capsys, "check", f)
    assert code == 1 and "SUCCESS" not in out
    assert f"{f}:4:5: duplicate rule name 'a' (first at line 3)" in out
    assert f"{f}:8:7: duplicate key 'level' (first at line 7, column 7)" in out


BAD_FIELDS = """\
alerts:
  rules:
    - name: typo
      condition: loss > 1
      levle: error
    - name: slow
      condition: loss > 1
      cooldown: 5 minutes
    - name: many
      condition: mean(loss[5000]) > 1
      for_steps: -1
      cooldown: 5 minutes
"""


def test_check_points_at_the_field_and_reports_every_error(tmp_path, capsys):
    f = write(tmp_path, "bad.yaml", BAD_FIELDS)
    code, out = et(capsys, "check", f)
    assert code == 1
    assert f"{f}:5:7: unknown rule field 'levle' (did you mean 'level'?)" in out
    assert f"{f}:8:17: cooldown: '5 minutes' is not a duration" in out
    assert f"{f}:10:18: window loss[5000] is wider than alert_window=4096" in out
    assert f"{f}:11:18: for_steps must be >= 1, got -1" in out
    assert f"{f}:12:17: cooldown: '5 minutes' is not a duration" in out
    assert out.count(f"{f}:") == 5


def test_check_window_follows_history_alert_window(tmp_path, capsys):
    rules = "alerts:\n  rules:\n    big: {condition: 'mean(loss[5000]) > 1'}\n"
    f = write(tmp_path, "spec.yaml", "history:\n  alert_window: 8192\n" + rules)
    code, out = et(capsys, "check", f)
    assert code == 0, out
    f = write(tmp_path, "small.yaml", "history:\n  alert_window: 100\n" + rules)
    code, out = et(capsys, "check", f)
    assert code == 1 and "alert_window=100; raise history.alert_window" in out
    assert "alerts.window" not in out
    f = write(tmp_path, "old.yaml", rules + "  window: 8192\n")
    code, out = et(capsys, "check", f)
    assert code == 1 and "alert_window=4096" in out
    assert f"{f}:4:11: window: there is no alerts.window: set history.alert_window" in out


def test_unit_tests_missing_rule_file_is_an_error(tmp_path, capsys):
    write(tmp_path, "alerts.yaml", GOOD)
    t = write(
        tmp_path,
        "t.yaml",
        "rule_files: [alert.yaml]\ntests:\n  - input_series: {loss: '1 nan'}\n"
        "    expected_alerts: [{rule: nan, steps: [1]}]\n",
    )
    code, out = et(capsys, "test", t)
    assert code == 1, out
    assert f"{t}:1:14: rule_files[0]: cannot read alert.yaml: file not found" in out
    assert "nan'" not in out.split("file not found", 1)[1]  # never read as a rule


def test_unit_tests_reject_unknown_keys_with_suggestions(tmp_path, capsys):
    write(tmp_path, "alerts.yaml", GOOD)
    t = write(
        tmp_path,
        "t.yaml",
        "rule_files: [alerts.yaml]\ntests:\n  - input_series: {loss: '1 nan'}\n"
        "    expected_alert: [{rule: nan, steps: [1]}]\n"
        "    extra_field: 1\n"
        "  - input_series: {loss: '1 nan'}\n"
        "    expected_alerts: [{rule: nan, steps: [1], level: critical}, {rule: nann}]\n",
    )
    code, out = et(capsys, "test", t)
    assert code == 1 and "SUCCESS" not in out
    assert (
        f"{t}:4:5: unknown key 'expected_alert' in a test (did you mean 'expected_alerts'?)" in out
    )
    assert f"{t}:5:5: unknown key 'extra_field' in a test;" in out
    assert f"{t}:7:47: unknown key 'level' in an expected alert;" in out
    assert f"{t}:7:72: no rule named 'nann' (did you mean 'nan'?)" in out


def test_unit_test_file_model_names_the_field(tmp_path, capsys):
    # UnitTestFile (alerts/unittests.py) validates what the located checks leave: a series
    # that is not a mapping is an error at its place naming the field, and nothing runs
    write(tmp_path, "alerts.yaml", GOOD)
    t = write(
        tmp_path,
        "t.yaml",
        "rule_files: [alerts.yaml]\ntests:\n  - input_series: [1, 2]\n"
        "    expected_alerts: [{rule: nan, steps: []}]\n",
    )
    code, out = et(capsys, "test", t)
    assert code == 1 and "SUCCESS" not in out
    assert f"{t}:3:19: tests[0].input_series: Input should be a valid dictionary" in out


def test_unit_test_without_expectations_warns(tmp_path, capsys):
    write(tmp_path, "alerts.yaml", GOOD)
    t = write(
        tmp_path,
        "t.yaml",
        "rule_files: [alerts.yaml]\ntests:\n  - name: checks nothing\n"
        "    input_series: {loss: '1 nan'}\n"
        "  - input_series: {loss: '1 nan'}\n    expected_alerts: [{rule: nan, steps: [1]}]\n",
    )
    code, out = et(capsys, "test", t)
    assert code == 0, out  # still runs, as promtool does; warnings never fail `test`
    assert "SUCCESS: 2 tests passed" in out
    assert f"{t}:3:5: WARNING: checks nothing: no expected_alerts" in out
    assert "FAILED" not in out


def test_unit_tests_inline_rules_checked_with_locations(tmp_path, capsys):
    t = write(
        tmp_path,
        "t.yaml",
        "rules:\n  spike: 'zscore(loss[5]) > '\ntests:\n  - input_series: {loss: '1'}\n"
        "    expected_alerts: [{rule: spike, steps: []}]\n",
    )
    code, out = et(capsys, "test", t)
    assert code == 1 and f"{t}:2:" in out and "missing operand" in out


def test_test_nonexistent_file_says_so(tmp_path, capsys):
    missing = str(tmp_path / "nonexist.yaml")
    code, out = et(capsys, "test", missing)
    assert code == 2 and f"{missing}: no such file" in out and "--run" not in out
    code, out = et(capsys, "test", missing, "--run", str(make_run(tmp_path)))
    assert code == 2 and "no such file" in out


def test_check_locates_bool_channel_names_with_a_hint(tmp_path, capsys):
    f = write(
        tmp_path,
        "ch.yaml",
        "rules: {a: 'loss > 1'}\nchannels:\n  c1: {type: console}\n  off: {type: console}\n",
    )
    code, out = et(capsys, "check", f)
    assert code == 1 and f"{f}:4:" in out and "quote it" in out
