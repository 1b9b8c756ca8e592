"""The ``M`` rule builder: operands (str lifted to a metric, numbers, TypeError for the
rest), windows (int points, float seconds, duration strings), ``str()`` of expressions
and rules (docs/alerts.md "Three front ends, one tree")."""

from __future__ import annotations

import datetime
import math

import numpy as np
import pytest

from expr_tracker.alerts import AlertRule, M, RuleError, make_rule, parse_expr
from expr_tracker.alerts.builder import call


@pytest.mark.parametrize(
    ("built", "text"),
    [
        (M.loss > "val_loss", "loss > val_loss"),
        ("val_loss" < M.loss, "loss > val_loss"),  # Python reflects the comparison
        (M("train/loss") - "train/ema" > 1, "train/loss - train/ema > 1"),
        ("a b" + M.x > 0, '"a b" + x > 0'),
        (M.x * "scale" % 3 > 0, "x * scale % 3 > 0"),
        ((M.a > 1) & "flag", "a > 1 and flag"),
        ((M.a > 1) | "flag", "a > 1 or flag"),
        ("flag" | (M.a > 1), "flag or a > 1"),
        (call("max", "a", "b") > 1, "max(a, b) > 1"),
        (M.loss > np.float32(0.5), "loss > 0.5"),
        (M.loss > np.int64(3), "loss > 3"),
    ],
)
def test_a_str_operand_is_a_metric(built, text):
    assert built.node == parse_expr(text)
    assert str(built) == text


def test_m_is_callable_like_indexing():
    assert (M("loss") > 1).node == (M["loss"] > 1).node == (M.loss > 1).node
    assert (M("eval/acc")[20].mean() < 0.5).node == parse_expr("mean(eval/acc[20]) < 0.5")


@pytest.mark.parametrize(
    ("key", "text"),
    [
        (2.5, "mean(loss[2500ms]) > 1"),
        (2.5, "mean(loss[2.5s]) > 1"),
        (30.0, "mean(loss[30s]) > 1"),
        (90.0, "mean(loss[90s]) > 1"),
        (300.0, "mean(loss[5m]) > 1"),
        (0.25, "mean(loss[250ms]) > 1"),
        (255.069, "mean(loss[255.069s]) > 1"),
        (datetime.timedelta(minutes=5), "mean(loss[5m]) > 1"),
        (np.float64(1.5), "mean(loss[1.5s]) > 1"),
        (30, "mean(loss[30]) > 1"),
        (np.int32(30), "mean(loss[30]) > 1"),
        ("30s", "mean(loss[30s]) > 1"),
        ("30", "mean(loss[30]) > 1"),
    ],
)
def test_a_float_window_is_seconds_an_int_window_is_points(key, text):
    built = M("loss")[key].mean() > 1
    assert built.node == parse_expr(text)
    window = built.node.left.args[0]
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        assert (window.size, window.seconds) == (int(key), None)
    elif not isinstance(key, str):
        seconds = key.total_seconds() if isinstance(key, datetime.timedelta) else float(key)
        assert (window.size, window.seconds) == (None, seconds)
    # the rendering reads back as the same window, to the bit
    assert parse_expr(str(built)) == built.node


def test_a_float_window_rule_evaluates_over_seconds():
    from expr_tracker.alerts.testing import replay, rows_from_series

    rule = make_rule(M("loss")[2.5].count() > 2, level="error", name="three")
    assert rule.condition == parse_expr("count(loss[2500ms]) > 2")
    assert str(rule) == "count(loss[2500ms]) > 2 => error"
    loss = {"loss": [1.0] * 6}
    # one value a second: the last 2.5 s hold three values from the third row on
    fired = replay([rule], rows_from_series(loss, interval=1.0)).fired()
    assert [e.step for e in fired] == [2]
    # one value every 2 s: never more than two values in 2.5 s, however many points
    assert replay([rule], rows_from_series(loss, interval=2.0)).fired() == []
    # an int is points: three points are there from the third row, whatever the time
    points = make_rule(M("loss")[3].count() > 2, level="error", name="points")
    assert [e.step for e in replay([points], rows_from_series(loss, interval=2.0)).fired()] == [2]


@pytest.mark.parametrize("key", [0.0, -1.5, math.inf, math.nan, 1e-9])
def test_a_float_window_without_a_duration_raises_rule_error(key):
    with pytest.raises(RuleError, match="duration"):
        M.loss[key]


@pytest.mark.parametrize("key", [None, True, [3], (1, 2), b"30s", 1j])
def test_a_window_of_another_type_raises_type_error(key):
    with pytest.raises(TypeError, match="a window is a number of points"):
        M.loss[key]


@pytest.mark.parametrize(
    "operand", [None, True, False, np.bool_(True), [1], {"a": 1}, b"loss", object(), 1j]
)
def test_a_bad_operand_raises_type_error(operand):
    with pytest.raises(TypeError, match="alert expression") as info:
        M.loss > operand  # noqa: B015
    assert type(operand).__name__ in str(info.value)
    assert "metric name (str)" in str(info.value)  # what is valid
    for build in (
        lambda: M.loss + operand,
        lambda: operand - M.loss,
        lambda: M.loss == operand,  # never falls back to identity (False)
        lambda: (M.loss > 1) & operand,
        lambda: call("max", M.loss, operand),
    ):
        with pytest.raises(TypeError):
            build()


def test_bad_metric_names():
    with pytest.raises(TypeError, match="a metric name is a str"):
        M[3]
    with pytest.raises(TypeError, match="a metric name is a str"):
        M(None)
    with pytest.raises(RuleError, match="non-empty"):
        M("")
    with pytest.raises(RuleError, match="non-empty"):
        M.loss > ""  # noqa: B015


def test_str_of_an_expression_and_a_rule_has_the_fewest_parentheses():
    built = ((M.a > 1) & (M.b < 2)) | ~(M.c + 1 > (M.d - (M.e - 2)))
    assert str(built) == "a > 1 and b < 2 or not c + 1 > d - (e - 2)"
    assert repr(built) == f"Expr({built})"
    assert parse_expr(str(built)) == built.node
    rule = make_rule(built, level="crit", message="a: {a}")
    assert str(rule) == f"{built} => critical: a: {{a}}"
    again = AlertRule.parse(str(rule))
    assert (again.condition, again.level, again.message) == (
        rule.condition,
        rule.level,
        rule.message,
    )
    # a rule built in Python is shown (and auto-named) with the fewest parentheses too
    assert rule.source == str(built)
    assert rule.name.startswith(f"{built} [critical#")
    assert str(make_rule("(loss > 1)")) == "loss > 1 => warning"
