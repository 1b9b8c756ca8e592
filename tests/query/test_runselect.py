"""query/runselect.py: the filter language of the runs table (parsed by runfilter.lark,
errors with the column and an example), how it compares values (numbers, text, missing,
null, tags, globs), the order (descending, missing last) and the default columns (the
config keys that differ)."""

from __future__ import annotations

import math

import pytest

from expr_tracker.query.runselect import (
    AllOf,
    AnyOf,
    Comparison,
    Negate,
    RunFilterError,
    differing_config,
    parse_sort,
    parse_where,
    select_runs,
)

RUNS = [
    {
        "run": "p/a",
        "status": "failed",
        "tags": ["base", "x"],
        "config": {"lr": 0.01, "opt": "sgd", "seed": 1, "model.depth": 4},
        "summary": {"loss": 1.0},
    },
    {
        "run": "p/b",
        "status": "finished",
        "tags": [],
        "config": {"lr": 1e-4, "opt": "sgd", "seed": 2, "model.depth": 4},
        "summary": {"loss": 0.5},
    },
    {
        "run": "p/c",
        "status": "finished",
        "tags": ["x"],
        "config": {"lr": 0.1, "opt": "adam", "model.depth": 4, "note": "007"},
        "summary": {"loss": math.nan},
    },
]


def names(where=None, sort=None):
    return [r["run"] for r in select_runs(RUNS, where=where, sort=sort).runs]


def test_parse_tree_and_precedence():
    t = parse_where("lr > 1e-3 and status = failed or not (opt = sgd)")
    assert isinstance(t, AnyOf)
    assert t.parts[0] == AllOf(
        (Comparison("lr", ">", 0.001, "1e-3"), Comparison("status", "=", "failed", "failed"))
    )
    assert t.parts[1] == Negate(Comparison("opt", "=", "sgd", "sgd"))
    assert parse_where("  ") is None and parse_where(None) is None
    # quoted values are text; a keyword-like key prefix is a key; backquotes name any key
    assert parse_where('seed = "1"') == Comparison("seed", "=", "1", "1")
    assert parse_where("notes = x") == Comparison("notes", "=", "x", "x")
    assert parse_where("`not` != null") == Comparison("not", "!=", None, "null")
    assert parse_where("lr>=0.5") == Comparison("lr", ">=", 0.5, "0.5")


@pytest.mark.parametrize(
    "text, column, words",
    [
        ("lr >", None, "ends too early"),
        ("lr 3", 4, "an operator"),
        ("(lr = 3", None, "ends too early"),
        ("lr = 3 seed = 1", 8, "'and'"),
        ("and lr = 1", 5, "an operator"),
        ("lr = = 3", 6, "a value"),
    ],
)
def test_broken_filters_say_where_and_what(text, column, words):
    with pytest.raises(RunFilterError) as e:
        parse_where(text)
    assert e.value.field == "where" and e.value.text == text
    assert e.value.column == column
    assert words in str(e.value) and "lr > 1e-3 and status = failed" in str(e.value)


def test_comparisons():
    assert names("lr > 1e-3") == ["p/a", "p/c"]
    assert names("lr <= 1e-4") == ["p/b"]
    assert names("status = failed") == ["p/a"]
    assert names("status != failed") == ["p/b", "p/c"]
    assert names("opt ~ 'ad*'") == ["p/c"]
    # a run without the key matches no comparison, but = null and != null
    assert names("seed >= 0") == ["p/a", "p/b"]
    assert names("seed != 1") == ["p/b"]
    assert names("seed = null") == ["p/c"]
    assert names("seed != null") == ["p/a", "p/b"]
    # a number never compares with text, but = compares a text cell with the value as written
    assert names("opt > 1") == []
    assert names("note = 007") == ["p/c"]
    assert names("note = 7") == []
    # tags: one of them
    assert names("tags = x") == ["p/a", "p/c"]
    assert names("tags != x") == ["p/b"]
    # NaN equals nothing and is no bound
    assert names("summary.loss < 100") == ["p/a", "p/b"]
    assert names("not (opt = sgd) or seed = 2") == ["p/b", "p/c"]


def test_columns_resolve_and_unknown_ones_are_named():
    s = select_runs(RUNS, columns=["loss", "config.opt", "status"])
    assert s.columns == ["summary.loss", "config.opt", "status"]
    assert s.labels == ["loss", "opt", "status"]
    assert s.values(RUNS[0]) == {"summary.loss": 1.0, "config.opt": "sgd", "status": "failed"}
    with pytest.raises(RunFilterError) as e:
        select_runs(RUNS, where="lrr > 1")
    assert e.value.field == "where" and "close: lr" in str(e.value)
    with pytest.raises(RunFilterError) as e:
        select_runs(RUNS, sort="-nope")
    assert e.value.field == "sort"
    assert select_runs([], where="anything > 1", sort="x").runs == []


def test_order_descending_missing_last_and_kinds():
    assert names(sort="lr") == ["p/b", "p/a", "p/c"]
    assert names(sort="-lr") == ["p/c", "p/a", "p/b"]
    assert names(sort="lr:desc") == ["p/c", "p/a", "p/b"]
    assert names(sort="seed") == ["p/a", "p/b", "p/c"]
    assert names(sort="-seed") == ["p/b", "p/a", "p/c"]  # missing last either way
    assert names(sort="loss") == ["p/b", "p/a", "p/c"]  # NaN after the numbers
    assert names(sort="opt,-lr") == ["p/c", "p/a", "p/b"]
    assert [k.descending for k in parse_sort(["-a,b", "+c", "d:asc"])] == [
        True,
        False,
        False,
        False,
    ]
    with pytest.raises(RunFilterError):
        parse_sort("-")


def test_default_columns_are_the_config_keys_that_differ():
    assert differing_config(RUNS) == ["config.lr", "config.opt", "config.seed", "config.note"]
    assert differing_config(RUNS, limit=2) == ["config.lr", "config.opt"]
    assert differing_config(RUNS[:1]) == []
    # what differs among the runs kept
    s = select_runs(RUNS, where="opt = sgd")
    assert s.columns == ["config.lr", "config.seed"]


def test_differing_values_are_told_apart_by_kind():
    runs = [
        {"config": {"flag": True, "n": 1, "x": math.nan, "l": [1, 2]}},
        {"config": {"flag": 1, "n": 1, "x": math.nan, "l": [1, 2]}},
    ]
    assert differing_config(runs) == ["config.flag"]  # True is not 1; NaN is NaN
