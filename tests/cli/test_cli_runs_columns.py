"""`et runs --columns/--sort/--where/--archived`: the config keys that differ shown by
default, any column on request, the order and the filter of query/runselect.py, a bad
filter or column said with exit 2, the chosen values in the JSON records."""

from __future__ import annotations

import json

import pytest

import expr_tracker as et
from expr_tracker.cli.main import main


@pytest.fixture
def sweep(tmp_path):
    root = tmp_path / "runs"
    for name, lr, batch, loss, code in (
        ("a", 0.1, 32, 0.9, 0),
        ("b", 0.01, 64, 0.5, 0),
        ("c", 1e-4, 32, 0.7, 1),
    ):
        et.init(
            project="p", name=name, dir=str(root), config={"lr": lr, "batch": batch, "depth": 4}
        )
        et.log({"loss": loss})
        et.summary["best"] = 1 - loss
        et.finish(exit_code=code)
    return root


def rows(capsys, *argv):
    assert main(["runs", *argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_default_columns_are_the_config_keys_that_differ(sweep, capsys):
    assert main(["runs", str(sweep)]) == 0
    head = capsys.readouterr().out.splitlines()[0].split()
    assert head[head.index("active") + 1 : head.index("active") + 3] == ["lr", "batch"]
    assert "depth" not in head
    recs = rows(capsys, str(sweep))
    assert {r["run"]: r["columns"] for r in recs}["p/a"] == {"config.lr": 0.1, "config.batch": 32}
    assert recs[0]["config"] == {"lr": 1e-4, "batch": 32, "depth": 4}


def test_columns_sort_where(sweep, capsys):
    recs = rows(capsys, str(sweep), "--columns", "best,depth", "--sort=-best")
    assert [r["run"] for r in recs] == ["p/b", "p/c", "p/a"]
    assert recs[0]["columns"] == {"summary.best": 0.5, "config.depth": 4}
    recs = rows(capsys, str(sweep), "--sort", "-best")  # a value, not an option
    assert [r["run"] for r in recs] == ["p/b", "p/c", "p/a"]
    recs = rows(capsys, str(sweep), "--sort", "lr:desc", "--where", "lr > 1e-3")
    assert [r["run"] for r in recs] == ["p/a", "p/b"]
    recs = rows(capsys, str(sweep), "--where", "status = failed or batch = 64", "--sort", "run")
    assert [r["run"] for r in recs] == ["p/b", "p/c"]
    assert main(["runs", str(sweep), "--columns", "lr,summary.best", "--sort", "best"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[-4:] == ["lr", "best", "last", "values"]
    assert [line.split()[0] for line in out[1:]] == ["p/a", "p/c", "p/b"]
    assert main(["runs", str(sweep), "--columns="]) == 0
    assert "lr" not in capsys.readouterr().out.splitlines()[0]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--where", "lr >"], "--where 'lr >': it ends too early"),
        (["--where", "lr 3"], "at column 4"),
        (["--where", "lx > 1"], "close: lr"),
        (["--sort", "nope"], "--sort 'nope': no listed run has this column"),
        (["--columns", "lr,zzz"], "--columns 'zzz'"),
    ],
)
def test_bad_filter_order_or_column_exit_2(sweep, capsys, argv, words):
    assert main(["runs", str(sweep), *argv]) == 2
    err = capsys.readouterr().err
    assert words in err, err


def test_archived_runs_hidden_unless_asked(sweep, capsys):
    assert main(["runs", "archive", "a", "c", "--dir", str(sweep)]) == 0
    capsys.readouterr()
    assert [r["run"] for r in rows(capsys, str(sweep))] == ["p/b"]
    recs = rows(capsys, str(sweep), "--archived", "--sort", "run")
    assert [(r["run"], r["archived"]) for r in recs] == [
        ("p/a", True),
        ("p/b", False),
        ("p/c", True),
    ]
    assert main(["runs", "unarchive", "a", "--dir", str(sweep)]) == 0
    capsys.readouterr()
    assert [r["run"] for r in rows(capsys, str(sweep), "--sort", "run")] == ["p/a", "p/b"]
