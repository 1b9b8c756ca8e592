"""`et compare`: the table (literal text, fitted to the width, best marked, missing apart from
null), --format json/jsonl (NaN/inf as the run files write them), exit codes and messages,
and the real console script in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT

import expr_tracker as et
from expr_tracker.cli.main import main


@pytest.fixture
def two_runs(tmp_path):
    root = tmp_path / "runs"
    long = "x" * 300
    for name, lr, loss in (("a", 0.1, 0.5), ("b", 0.01, float("nan")), ("c", 0.2, 0.7)):
        et.init(
            project="p",
            name=name,
            dir=str(root),
            config={
                "lr": lr,
                "opt": {"name": "[red]adam[/red]" if name != "b" else "[bold]sgd"},
                "long": long + name,
                "x": None,
                **({"only_a": 1} if name == "a" else {}),
            },
        )
        for _ in range(3):
            et.log({"loss": loss, "val/acc": 0.5 + lr, "inf": float("-inf")})
        et.finish()
    return root


def test_table_prints_text_literally_fits_the_width_and_marks_the_best(two_runs, capsys):
    assert main(["compare", "a", "b", "c", "--dir", str(two_runs), "--width", "80"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert all(len(line) <= 80 for line in lines), out
    assert '"[red]adam[/red]"' in out  # markup never interpreted
    assert '"[bold]sgd"' in out
    assert "…" in next(line for line in lines if line.startswith("long"))
    only_a = next(line for line in lines if line.startswith("only_a"))
    assert only_a.split()[1:] == ["1", "(missing)", "(missing)"]
    assert "x " not in out.split("summary")[0].replace("(missing)", "")  # x equal: not shown
    loss = next(line for line in lines if line.startswith("loss (min)"))
    assert "0.5 *" in loss and "NaN" in loss  # NaN shown, never best
    acc = next(line for line in lines if line.startswith("val/acc (max)"))
    assert "0.7 *" in acc and "0.6 " in acc
    assert "-inf" in next(line for line in lines if line.startswith("inf"))
    assert "* best value" in out
    # --all shows equal keys; a null is null, not missing
    assert main(["compare", "a", "b", "--dir", str(two_runs), "--all", "--width", "100"]) == 0
    out = capsys.readouterr().out
    x = next(line for line in out.splitlines() if line.startswith("x "))
    assert x.split()[1:] == ["null", "null"]


def test_narrow_terminal_keeps_every_run_column(two_runs, capsys):
    assert main(["compare", "a", "b", "--dir", str(two_runs), "--width", "40"]) == 0
    out = capsys.readouterr().out
    assert all(len(line) <= 40 for line in out.splitlines()), out
    assert "p/a" in out and "p/b" in out


def test_json_is_strict_with_nan_and_inf_as_null_and_jsonl_is_one_line(two_runs, capsys):
    args = ["compare", "p/a", "p/b", "c", "--dir", str(two_runs)]
    assert main([*args, "--format", "json"]) == 0
    text = capsys.readouterr().out
    assert "NaN" not in text and "Infinity" not in text  # strict JSON: jq reads it
    doc = json.loads(text, parse_constant=lambda c: 1 / 0)
    assert [r["run"] for r in doc["runs"]] == ["p/a", "p/b", "p/c"]
    loss = next(r for r in doc["summary"] if r["metric"] == "loss")
    assert loss["values"][0] == 0.5 and loss["values"][1] is None and loss["best"] == [0]
    assert 1 not in loss["missing"]  # null for a NaN, yet the run has the key
    assert next(r for r in doc["config"] if r["key"] == "only_a")["missing"] == [1, 2]
    assert main([*args, "--format", "jsonl"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    assert json.dumps(json.loads(lines[0]), sort_keys=True) == json.dumps(doc, sort_keys=True)


def test_metrics_option_picks_globs(two_runs, capsys):
    args = ["compare", "a", "b", "--dir", str(two_runs), "--metrics", "val/*", "--format", "json"]
    assert main(args) == 0
    assert [r["metric"] for r in json.loads(capsys.readouterr().out)["summary"]] == ["val/acc"]


def test_errors_name_the_problem_and_exit_1_or_2(two_runs, capsys):
    d = str(two_runs)
    assert main(["compare", "a", "--dir", d]) == 2
    assert "at least two runs" in capsys.readouterr().err
    assert main(["compare", "a", "bb", "--dir", d]) == 1
    err = capsys.readouterr().err
    assert err.startswith("et compare: run 'bb'") and "close matches" in err
    assert main(["compare", "a", "p/a", "--dir", d]) == 1
    assert "same run" in capsys.readouterr().err
    assert main(["compare", "a", "b", "--dir", d, "--metrics", "nope"]) == 1
    assert "'nope'" in capsys.readouterr().err
    assert main(["compare", "a", "b", "--dir", d, "--stream", "../x"]) == 1
    assert "stream" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["compare", "a", "b", "--format", "yaml"])
    assert exc.value.code == 2


def test_the_console_script_in_a_fresh_process(two_runs):
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="80")
    p = subprocess.run(
        [sys.executable, "-m", "expr_tracker.cli.main", "compare", "a", "b"],
        cwd=two_runs.parent,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert "lr" in p.stdout and "0.01" in p.stdout and p.stderr == ""
    assert "\x1b[" not in p.stdout  # piped: no colour codes


def test_a_sweep_wider_than_the_terminal_continues_below_never_squeezed(tmp_path, capsys):
    """Six runs at 80 columns: the runs that do not fit go to another block below (with the
    key column), so every run's name, every value and the best marks are shown whole; the
    table was squeezed to headers all reading `sweep/l…`, `0.0003` as `0.00…` and the best
    `0.123456 *` cut to `0.123456…`."""
    root = tmp_path / "runs"
    lrs = (0.1, 0.03, 0.01, 0.003, 0.001, 0.0003)
    for lr in lrs:
        et.init(project="sweep", name=f"lr-{lr}-bs-64", config={"lr": lr}, dir=str(root))
        for s in range(3):
            et.log({"train/loss": 0.123456 / lr / (s + 1), "val/accuracy": 0.9 - lr})
        et.finish()
    names = [f"lr-{lr}-bs-64" for lr in lrs]
    assert main(["compare", *names, "--dir", str(root), "--width", "80"]) == 0
    out = capsys.readouterr().out
    assert all(len(line) <= 80 for line in out.splitlines()), out
    assert "…" not in out, out
    for lr, name in zip(lrs, names, strict=True):
        assert f"sweep/{name}" in out
        assert f" {lr} " in out
    assert "0.41152 *" in out  # best loss: lr 0.1, its last step
    assert "0.8997 *" in out  # best accuracy: lr 0.0003
    assert out.count("key ") == 3  # three blocks of two runs
    assert main(["compare", *names[:2], "--dir", str(root), "--width", "5"]) == 2
    assert "--width 5 is too narrow: give 20 or more" in capsys.readouterr().err


def test_a_huge_key_or_value_is_cut_in_one_pass(two_runs):
    """A config key of 200,000 characters (anyone's config.json): a cell was cut one
    character at a time, measuring the rest each time: 35 s for 100,000, minutes here."""
    a = two_runs / "p" / "a" / "config.json"
    cfg = json.loads(a.read_text())
    cfg["k" * 200_000] = "v" * 200_000
    a.write_text(json.dumps(cfg))
    p = subprocess.run(
        [sys.executable, "-m", "expr_tracker.cli.main", "compare", "--dir", str(two_runs)]
        + ["p/a", "p/b"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"},
    )
    assert p.returncode == 0, p.stderr
    assert "kkkk…" in p.stdout and "k" * 200 not in p.stdout
