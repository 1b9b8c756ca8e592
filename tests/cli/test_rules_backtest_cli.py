"""`et rules backtest RULES DIR`: runs written by the tracker, read through the Parquet cache,
scored against their status or a label column; table and JSON output; exit codes."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import expr_tracker as et
from expr_tracker.alerts.backtest import backtest_frame, frame_from_rows
from expr_tracker.alerts.testing import replay
from expr_tracker.cli.main import main
from expr_tracker.cli.rules import read_metrics
from expr_tracker.query.runseries import iter_series, labelled_runs, run_label

RULES = """\
rules:
  spike: "zscore(loss[5]) > 1.5 => error: loss spike"
  nan: "isnan(loss) => critical: NaN"
  high:
    condition: loss > 3
    for_steps: 2
  slow_acc: "mean(eval.acc[30s]) > 0.9 => info: good"
"""


def _run(root, name, *, diverge_at=None, exit_code=0, summary=None):
    et.init(project="p", name=name, dir=str(root))
    for i in range(40):
        loss = 1.0 / (i + 1)
        if diverge_at is not None and i >= diverge_at:
            loss = 2.0 ** (i - diverge_at)
        if diverge_at is not None and i == 38:
            loss = math.nan
        row = {"loss": loss}
        if i % 5 == 0:
            row["eval/acc"] = 0.5 + 0.01 * i
            row["note"] = "text is not a number"
        et.log(row)
    for k, v in (summary or {}).items():
        et.summary[k] = v
    et.finish(exit_code=exit_code)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bt") / "runs"
    _run(root, "ok1", summary={"diverged": False})
    _run(root, "ok2", summary={"diverged": True})  # the label column disagrees with status
    _run(root, "bad1", diverge_at=30, exit_code=1, summary={"diverged": True})
    _run(root, "bad2", diverge_at=20, exit_code=1)
    rules = root.parent / "rules.yaml"
    rules.write_text(RULES)
    return root, rules


def et_cli(capsys, *argv):
    code = main(["rules", "backtest", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_report_per_rule(runs, capsys):
    root, rules = runs
    code, out, err = et_cli(capsys, str(rules), str(root), "--format", "json")
    assert code == 0, err
    report = {r["rule"]: r for r in json.loads(out)}
    assert list(report) == ["spike", "nan", "high", "slow_acc"]
    high = report["high"]
    assert (high["engine"], high["runs"], high["bad_runs"], high["fine_runs"]) == (
        "vector",
        4,
        2,
        2,
    )
    per_run = {r["run"]: r for r in high["per_run"]}
    # loss = 2 ** (i - d) > 3 from i = d + 2; for_steps 2: fires one step later
    assert per_run["p/bad1"]["firing"] == [33] and per_run["p/bad1"]["lead"] == 39 - 33
    # the NaN at step 38 is UNKNOWN: it neither resolves nor fires
    assert per_run["p/bad2"]["firing"] == [23] and per_run["p/bad2"]["resolved"] == []
    assert (high["caught"], high["false_positives"], high["lead_median"]) == (2, 0, 11.0)
    nan = report["nan"]
    assert [r["firing"] for r in nan["per_run"]] == [[38], [38], [], []]  # sorted by name
    assert report["slow_acc"]["engine"] == "replay"
    assert report["slow_acc"]["reason"] == "duration window eval.acc[30s]"


def test_label_column_and_table(runs, capsys):
    root, rules = runs
    code, out, _ = et_cli(capsys, str(rules), str(root), "--label", "diverged", "--format", "json")
    report = {r["rule"]: r for r in json.loads(out)}
    high = report["high"]
    # bad2 has no summary.diverged: unlabelled; ok2 is labelled bad by the column
    assert (code, high["bad_runs"], high["fine_runs"], high["caught"]) == (0, 2, 1, 1)
    assert [r["label"] for r in high["per_run"]] == ["bad", None, "fine", "bad"]
    code, out, _ = et_cli(capsys, str(rules), str(root))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "rule",
        "engine",
        "fired",
        "caught",
        "false",
        "pos",
        "first",
        "step",
        "lead",
    ]
    assert lines[3].split()[:5] == ["high", "vector", "2/4", "2/2", "0/2"]
    assert "replay: slow_acc ran through the per-step engine" in out
    assert out.rstrip().endswith("4 runs: 2 bad, 2 fine, 0 unlabelled (--label status)")


def test_usage_errors(runs, capsys, tmp_path):
    root, rules = runs
    code, _, err = et_cli(capsys, str(rules), str(root), "--label", "nonesuch")
    assert code == 2 and "--label 'nonesuch'" in err
    code, _, err = et_cli(capsys, str(rules), str(tmp_path / "missing"))
    assert code == 2 and "no run directory" in err
    code, _, err = et_cli(capsys, str(tmp_path / "none.yaml"), str(root))
    assert code == 2 and "no such file" in err
    code, out, _ = et_cli(capsys, "mean(loss[3] > 1", str(root))
    assert code == 1 and "FAILED" in out


def test_cache_series_give_the_engine_answer(runs):
    """The columns read from the Parquet cache, backtested, equal a replay of the rows the
    history reader gives (the path of `et rules test --run`)."""
    root, rules = runs
    from expr_tracker.alerts.rulefiles import rules_from

    rule_list = rules_from(str(rules))
    found = labelled_runs(root)
    for run in iter_series(found, ["loss", "eval.acc", "eval/acc"]):
        got = backtest_frame(rule_list, frame_from_rows_of(run))
        expected = replay(rule_list, read_metrics(str(run.path)))
        for trace in got:
            name = trace.rule.name
            assert trace.firing == [
                e.step for e in expected.events if e.rule.name == name and e.kind == "firing"
            ]
            assert trace.resolved == [
                e.step for e in expected.events if e.rule.name == name and e.kind == "resolved"
            ]


def frame_from_rows_of(run):
    from expr_tracker.alerts.backtest import Frame

    return Frame(run.steps, run.times, run.columns)


@pytest.mark.parametrize(
    ("value", "label"),
    [
        (True, True),
        (0, False),
        (2.5, True),
        ("Diverged", True),
        ("ok", False),
        ("?", None),
        (None, None),
        (math.nan, None),
    ],
)
def test_label_values(value, label):
    assert run_label(value) is label


def test_frame_from_rows_is_what_the_cache_gives(runs):
    root, _ = runs
    run = next(iter_series(labelled_runs(root)[:1], ["loss", "note"]))
    rows = read_metrics(str(run.path))
    frame = frame_from_rows(rows)
    assert run.steps.tolist() == frame.steps.tolist()
    assert "note" not in run.columns  # text is never recorded
    present, values = run.columns["loss"]
    assert present.all()
    np.testing.assert_array_equal(values, frame.columns["loss"][1])  # NaN at step 38 too


def test_patch_lines_are_merged_as_the_history_reader_merges_them(tmp_path):
    """A step written in two lines (an open row flushed, then patched): DuckDB keeps the
    later line per metric, as read_history does; text in the later line wins too."""
    run = tmp_path / "runs" / "p" / "patched"
    run.mkdir(parents=True)
    lines = [f'{{"_step": {i}, "_time": {100 + i}, "loss": {i % 3}}}' for i in range(12)]
    lines.insert(6, '{"_step": 4, "_time": 104.5, "loss": 9, "acc": 1}')  # patches step 4
    lines.insert(9, '{"_step": 6, "loss": "oops"}')  # a string: step 6 records no loss
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    rules = ["loss > 1.5 => warn", "has(acc) and loss >= 0 => warn"]
    (found,) = labelled_runs(tmp_path / "runs")
    assert found.label is None  # no run.json: status unknown, unlabelled
    series = next(iter_series([found], ["loss", "acc"]))
    assert series.steps.tolist() == list(range(12))
    assert series.times.tolist()[4] == 104.5
    assert series.columns["loss"][0].tolist()[6] is False
    got = backtest_frame(rules, frame_from_rows_of(series))
    expected = replay(rules, read_metrics(str(run)))
    for trace in got:
        name = trace.rule.name
        want = [e.step for e in expected.events if e.rule.name == name and e.kind == "firing"]
        assert trace.firing == want != []
