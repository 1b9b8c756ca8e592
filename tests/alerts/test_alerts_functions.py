"""Golden values per function (one that fires and one that stays quiet), Kleene logic,
window semantics and registration errors."""

from __future__ import annotations

import math

import pytest

from expr_tracker.alerts import RuleError, compile_expr, parse_expr
from expr_tracker.alerts.testing import evaluate

nan, inf = math.nan, math.inf
Z = [1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 1.1, 0.9, 1.0, 1.05, 0.95]

# (condition, series, expected) — expected True fires, False/None stays quiet
GOLDEN = [
    ("mean(x[3]) == 2", {"x": [9, 1, 2, 3]}, True),
    ("mean(x[3]) > 2", {"x": [9, 1, 2, 3]}, False),
    ("std(x[2]) == 1", {"x": [5, 1, 3]}, True),  # population std of [1, 3]
    ("std(x[2]) > 1", {"x": [5, 1, 3]}, False),
    ("var(x[2]) == 1", {"x": [1, 3]}, True),
    ("median(x[4]) == 2.5", {"x": [4, 1, 2, 3]}, True),
    ("median(x[3]) == 2", {"x": [3, 1, 2]}, True),
    ("sum(x[3]) == 6", {"x": [1, 2, 3]}, True),
    ("sum(x[2]) == 6", {"x": [1, 2, 3]}, False),
    ("min(x[3]) == 1", {"x": [0, 3, 1, 2]}, True),
    ("max(x[3]) == 3", {"x": [9, 3, 1, 2]}, True),
    ("max(x[2]) == 3", {"x": [9, 3, 1, 2]}, False),
    ("min(a, b) == 1", {"a": [1], "b": [2]}, True),
    ("max(a, b, 5) == 5", {"a": [1], "b": [2]}, True),
    ("first(x[3]) == 3", {"x": [1, 3, 2, 1]}, True),
    ("last(x[3]) == 1", {"x": [1, 3, 2, 1]}, True),
    ("count(x[1h]) == 3", {"x": [1, 2, 3]}, True),
    ("count(x[2s]) == 3", {"x": [1, 2, 3, 4]}, True),  # times 1, 2, 3 within [1, 3]
    ("diff(x) == 5", {"x": [0, 1, 6]}, True),
    ("diff(x[3]) == 6", {"x": [0, 1, 6]}, True),
    ("diff(x) > 5", {"x": [0, 1, 6]}, False),
    ("rate(x[3]) == 3", {"x": [0, 1, 6]}, True),  # 6 over 2 s
    ("pct_change(x[2]) == -0.5", {"x": [4, 2]}, True),
    ("slope(x[3]) == 2", {"x": [1, 3, 5]}, True),
    ("slope(x[3]) > 2", {"x": [1, 3, 5]}, False),
    ("slope(x[3]) > 1.28 and slope(x[3]) < 1.29", {"x": [1, None, 3, 5], "y": [0] * 4}, True),
    ("zscore(x[12]) > 3", {"x": Z[:-1] + [9.0]}, True),
    ("zscore(x[12]) > 3", {"x": Z}, False),
    ("ema(x[3], 0.5) == 2.5", {"x": [1, 2, 3]}, False),  # 0.5*3 + 0.5*(0.5*2 + 0.5*1) = 2.25
    ("ema(x[3], 0.5) == 2.25", {"x": [1, 2, 3]}, True),
    ("increasing(x[3])", {"x": [1, 2, 3]}, True),
    ("increasing(x[3])", {"x": [1, 2, 2]}, False),
    ("decreasing(x[3])", {"x": [3, 2, 1]}, True),
    ("decreasing(x[3])", {"x": [3, 2, 2]}, False),
    ("stalled(x[3], 0.01)", {"x": [1, 1.001, 1.0]}, True),
    ("stalled(x[3], 0.01)", {"x": [1, 1.1, 1.0]}, False),
    ("isnan(x)", {"x": [1, nan]}, True),
    ("isnan(x)", {"x": [nan, 1]}, False),
    ("isinf(x)", {"x": [-inf]}, True),
    ("isinf(x)", {"x": [1e308]}, False),
    ("has(x)", {"x": [1]}, True),
    ("has(y)", {"x": [1]}, False),
    ("age(x) == 2", {"x": [1, None, None], "y": [0, 0, 0]}, True),
    ("step() == 4", {"x": [0] * 5}, True),
    ("elapsed() == 4", {"x": [0] * 5}, True),
    ("abs(x) == 2", {"x": [-2]}, True),
    ("log(x) == 0", {"x": [1]}, True),
    ("exp(x) == 1", {"x": [0]}, True),
    ("sqrt(x) == 3", {"x": [9]}, True),
    ("sqrt(x) == 3", {"x": [8]}, False),
    ("x % 3 == 1", {"x": [7]}, True),
    ("eval.acc > 0.5", {"eval/acc": [0.9]}, True),  # . -> / resolution
]


@pytest.mark.parametrize(("cond", "series", "expected"), GOLDEN)
def test_golden_values(cond, series, expected):
    assert evaluate(cond, series) is expected


# UNKNOWN (None): missing data, short windows, NaN, zero division, domain errors
UNKNOWNS = [
    ("mean(x[5]) > 0", {"x": [1, 2]}),  # short window
    ("y > 0", {"x": [1]}),  # never seen
    ("x > 0", {"x": [nan]}),  # NaN never fires a comparison
    ("x / y > 0", {"x": [1], "y": [0]}),  # zero division
    ("x % y > 0", {"x": [1], "y": [0]}),
    ("zscore(x[3]) > 0", {"x": [2, 2, 2]}),  # std 0
    ("log(x) > 0", {"x": [0]}),
    ("sqrt(x) > 0", {"x": [-1]}),
    ("pct_change(x[2]) > 0", {"x": [0, 1]}),
    ("mean(x[2s]) > 0", {"x": [1, None, None, None, None], "y": [0] * 5}),  # empty window
    ("age(x) > 0", {"y": [1]}),
    ("ema(x[2], 2) > 0", {"x": [1, 2]}),  # alpha out of range
    ("mean(x[3]) > 0", {"x": [1, nan, 2]}),
]


@pytest.mark.parametrize(("cond", "series"), UNKNOWNS)
def test_unknown(cond, series):
    assert evaluate(cond, series) is None


@pytest.mark.parametrize(
    ("cond", "expected"),
    [
        ("u and f", False),
        ("f and u", False),
        ("u and t", None),
        ("u or t", True),
        ("t or u", True),
        ("u or f", None),
        ("not u", None),
        ("not f", True),
        ("t and t", True),
    ],
)
def test_kleene(cond, expected):
    series = {"tt": [1.0], "ff": [0.0]}
    words = {"u": "(missing > 0)", "t": "(tt > 0)", "f": "(ff > 0)"}
    text = " ".join(words.get(w, w) for w in cond.split())
    assert evaluate(text, series) is expected


def test_points_window_counts_recorded_values_only():
    # x is absent on rows 1 and 3: x[3] is the last three values recorded, not rows
    assert evaluate("sum(x[3]) == 9", {"x": [1, None, 3, None, 5]}) is True


def test_duration_window_uses_row_time():
    # rows 10 s apart: x[15s] at t=40 holds values at t=30 and 40
    assert evaluate("sum(x[15s]) == 9", {"x": [1, 2, 3, 4, 5]}, interval=10.0) is True


def test_zscore_includes_the_latest_value():
    # with the latest included (population std), z <= sqrt(n - 1): 3 points reach 1.414
    assert evaluate("zscore(x[3]) > 1.41", {"x": [0, 0, 100]}) is True
    assert evaluate("zscore(x[3]) > 1.42", {"x": [0, 0, 100]}) is False


def test_bare_metric_as_condition_is_true_when_nonzero():
    assert evaluate("done", {"done": [True]}) is True
    assert evaluate("done", {"done": [False]}) is False


@pytest.mark.parametrize(
    ("cond", "match"),
    [
        ("mean(loss) > 1", "explicit window"),
        ("nosuch(loss) > 1", "unknown function 'nosuch'"),
        ("zscroe(loss[5]) > 1", "did you mean zscore"),
        ("abs(a, b) > 1", r"abs\(\) takes abs\(scalar\)"),
        ("loss[3] > 1", "must be the argument of a function"),
        ("diff(loss[1]) > 1", "at least 2 points"),
        ("mean(loss[5000]) > 1", "wider than alert_window=4096"),
        ("isnan(x) + 1 > 2", "needs a number, got a condition"),
        ("has(mean(x[2]))", "bare metric name"),
        ("no_data(x)", "duration literal"),
        ("min(x[3], 2) > 1", "two or more numbers"),
        ("mean(x[0]) > 1", "at least 1 points"),
    ],
)
def test_registration_errors(cond, match):
    with pytest.raises(RuleError, match=match):
        compile_expr(parse_expr(cond), text=cond)


def test_known_metrics_make_unknown_names_errors():
    node = parse_expr("lossx > 1 or eval.acc > 1")
    with pytest.raises(RuleError, match=r"unknown metric 'lossx' \(did you mean loss\?\)"):
        compile_expr(node, known_metrics={"loss", "eval/acc"})
    compile_expr(parse_expr("loss > 1 or eval.acc > 1"), known_metrics={"loss", "eval/acc"})


def test_window_cap_is_configurable():
    compile_expr(parse_expr("mean(x[5000]) > 1"), window=8192)
    with pytest.raises(RuleError):
        compile_expr(parse_expr("mean(x[20]) > 1"), window=10)
