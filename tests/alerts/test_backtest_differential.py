"""The vector backtest (alerts/backtest.py) gives the per-step engine's firing and recovery
steps: random rules and random series (NaN, ±inf, huge and tiny values, gaps, missing
times, non-consecutive steps) against ``alerts.testing.replay`` through ``AlertEngine``."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from expr_tracker.alerts import ast
from expr_tracker.alerts.backtest import (
    backtest_frame,
    frame_from_rows,
    rows_of,
    score_rules,
    state_steps,
)
from expr_tracker.alerts.testing import replay

METRICS = ("x", "y", "a.b")
VALUES = st.one_of(
    st.none(),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, 2.0, 1e308, -1e308, 1e-300]),
    st.floats(-4, 4, allow_nan=False).map(lambda v: round(v, 1)),
    st.floats(allow_nan=True, allow_infinity=True),
)
WINDOW_FUNCS = {
    "mean": 1,
    "std": 1,
    "var": 1,
    "median": 1,
    "sum": 1,
    "first": 1,
    "last": 1,
    "count": 1,
    "min": 1,
    "max": 1,
    "diff": 2,
    "rate": 2,
    "pct_change": 2,
    "slope": 2,
    "zscore": 2,
}
BOOL_WINDOW_FUNCS = {"increasing": 2, "decreasing": 2}
NUMBERS = st.sampled_from([0.0, 0.5, 1.0, -1.0, 2.0, 3.0, 1e-3]).map(ast.Number)


@st.composite
def windows(draw, min_points: int):
    name = draw(st.sampled_from(METRICS))
    size = draw(st.integers(min_points, 5))
    return ast.Window(name, size=size)


def scalars(depth: int = 2):
    leaf = st.one_of(
        NUMBERS,
        st.sampled_from(METRICS).map(ast.Name),
        st.sampled_from(sorted(WINDOW_FUNCS)).flatmap(
            lambda f: windows(WINDOW_FUNCS[f]).map(lambda w: ast.Call(f, (w,)))
        ),
        st.tuples(windows(1), st.sampled_from([0.3, 0.5, 1.0, 1.5, 0.0])).map(
            lambda t: ast.Call("ema", (t[0], ast.Number(t[1])))
        ),
        st.sampled_from(METRICS).map(lambda m: ast.Call("diff", (ast.Name(m),))),
        st.just(ast.Call("step")),
        st.just(ast.Call("elapsed")),
    )
    if depth == 0:
        return leaf
    sub = scalars(depth - 1)
    return st.one_of(
        leaf,
        st.tuples(st.sampled_from("+-*/%"), sub, sub).map(lambda t: ast.BinOp(*t)),
        sub.map(ast.Neg),
        st.tuples(st.sampled_from(["abs", "log", "exp", "sqrt"]), sub).map(
            lambda t: ast.Call(t[0], (t[1],))
        ),
        st.tuples(st.sampled_from(["min", "max"]), sub, sub).map(
            lambda t: ast.Call(t[0], (t[1], t[2]))
        ),
        # a parameter that is not a constant: the scalar function per row
        st.tuples(windows(1), sub).map(lambda t: ast.Call("ema", t)),
    )


def conditions(depth: int = 2):
    sub_scalar = scalars(1)
    leaf = st.one_of(
        st.tuples(st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), sub_scalar, sub_scalar).map(
            lambda t: ast.Compare(*t)
        ),
        sub_scalar.map(lambda s: ast.Call("isnan", (s,))),
        sub_scalar.map(lambda s: ast.Call("isinf", (s,))),
        st.sampled_from(METRICS).map(lambda m: ast.Call("has", (ast.Name(m),))),
        st.sampled_from(sorted(BOOL_WINDOW_FUNCS)).flatmap(
            lambda f: windows(2).map(lambda w: ast.Call(f, (w,)))
        ),
        st.tuples(windows(1), st.sampled_from([0.0, 0.5, 1.0])).map(
            lambda t: ast.Call("stalled", (t[0], ast.Number(t[1])))
        ),
        sub_scalar,  # a number used as a condition: true when non-zero
        # no vector form: these replay through the engine
        st.tuples(st.sampled_from(METRICS), st.sampled_from([2.0, 5.0])).map(
            lambda t: ast.Compare(
                ">", ast.Call("mean", (ast.Window(t[0], seconds=t[1]),)), ast.Number(0.5)
            )
        ),
        st.sampled_from(METRICS).map(
            lambda m: ast.Compare(">", ast.Call("age", (ast.Name(m),)), ast.Number(1.0))
        ),
    )
    if depth == 0:
        return leaf
    sub = conditions(depth - 1)
    return st.one_of(
        leaf,
        st.tuples(sub, sub).map(lambda t: ast.And(*t)),
        st.tuples(sub, sub).map(lambda t: ast.Or(*t)),
        sub.map(ast.Not),
    )


@st.composite
def run_rows(draw):
    n = draw(st.integers(0, 30))
    rows = []
    step = draw(st.integers(0, 3))
    t = 1000.0
    for _ in range(n):
        row: dict = {"_step": step}
        if draw(st.integers(0, 9)) > 0:  # now and then a row without a time
            row["_time"] = t
        for m in METRICS:
            if m == "a.b" and draw(st.booleans()):
                key = "a/b"  # the engine reads a.b as a/b when that is what was logged
            else:
                key = m
            v = draw(VALUES)
            if v is not None:
                row[key] = v
        rows.append(row)
        step += draw(st.sampled_from([1, 1, 1, 2]))
        t += draw(st.sampled_from([0.5, 1.0, 1.0, 3.0, 0.0]))
    return rows


def _steps(cap, name, kind):
    return [e.step for e in cap.events if e.rule.name == name and e.kind == kind]


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(
    conds=st.lists(conditions(), min_size=1, max_size=3),
    for_steps=st.lists(st.integers(1, 3), min_size=3, max_size=3),
    rows=run_rows(),
)
def test_backtest_equals_the_per_step_engine(conds, for_steps, rows):
    rules = [
        {"name": f"r{i}", "condition": c.to_source(), "for_steps": for_steps[i]}
        for i, c in enumerate(conds)
    ]
    expected = replay(rules, rows)
    got = backtest_frame(rules, frame_from_rows(rows))
    for i, trace in enumerate(got):
        name = f"r{i}"
        assert trace.firing == _steps(expected, name, "firing"), (rules[i], trace.engine)
        assert trace.resolved == _steps(expected, name, "resolved"), (rules[i], trace.engine)


def test_vector_and_replay_are_both_used_and_said():
    rows = [{"_step": i, "_time": float(i), "x": float(i % 4)} for i in range(20)]
    got = backtest_frame(
        ["mean(x[3]) > 1.5 => warn", "mean(x[3s]) > 1.2 => warn", "age(x) > 1 => warn"],
        frame_from_rows(rows),
    )
    assert [(t.engine, t.reason) for t in got] == [
        ("vector", None),
        ("replay", "duration window x[3s]"),
        ("replay", "age()"),
    ]
    assert got[0].firing == [3, 7, 11, 15, 19] and got[0].resolved == [5, 9, 13, 17]
    expected = replay(["mean(x[3s]) > 1.2 => warn"], rows)
    assert got[1].firing == [e.step for e in expected.events if e.kind == "firing"] != []


def test_a_run_logging_both_spellings_replays():
    """a.b and a/b both logged: which one the rule reads is settled at its first evaluation
    that reads it (after a short window's early return): the replay answers it."""
    rows = [{"_step": 0, "a/b": 5.0}, {"_step": 1, "x": 1.0, "a.b": 0.0}]
    rows += [{"_step": i, "x": 1.0} for i in range(2, 6)]
    rule = "ema(x[4], a.b) > 0 => warn"
    (trace,) = backtest_frame([rule], frame_from_rows(rows))
    assert (trace.engine, trace.reason) == ("replay", "both a.b and a/b logged")
    assert trace.firing == [e.step for e in replay([rule], rows).events if e.kind == "firing"]


def test_state_machine_for_steps_and_unknown():
    steps = np.arange(10)
    # True True UNKNOWN True False True True True False UNKNOWN
    result = np.array([1, 1, -1, 1, 0, 1, 1, 1, 0, -1], dtype=np.int8)
    assert state_steps(steps, result, 3) == ([3, 7], [4, 8])  # UNKNOWN keeps the streak
    assert state_steps(steps, result, 4) == ([], [])
    assert state_steps(steps, result, 1) == ([0, 5], [4, 8])


def test_rows_round_trip_and_text_is_not_recorded():
    rows = [
        {"_step": 0, "_time": 1.0, "x": 1, "s": "text"},
        {"_step": 1, "x": True, "y": None},
        {"_step": 2, "_time": 3.0, "x": math.nan},
    ]
    frame = frame_from_rows(rows)
    assert sorted(frame.columns) == ["x"]
    back = rows_of(frame)
    assert back[0] == {"_step": 0, "_time": 1.0, "x": 1.0} and back[1] == {"_step": 1, "x": 1.0}
    assert math.isnan(back[2]["x"])


def test_summary_scores_runs_by_label():
    from expr_tracker.alerts.backtest import RunOutcome

    rows_bad = [{"_step": i, "_time": float(i), "loss": 9.0 if i >= 6 else 1.0} for i in range(10)]
    rows_ok = [{"_step": i, "_time": float(i), "loss": 9.0 if i == 2 else 1.0} for i in range(10)]
    rule = "loss > 5 => error: high"
    outcomes = [
        RunOutcome("bad", True, 9, backtest_frame([rule], frame_from_rows(rows_bad))),
        RunOutcome("ok", False, 9, backtest_frame([rule], frame_from_rows(rows_ok))),
        RunOutcome("quiet", None, 9, backtest_frame([rule], frame_from_rows(rows_ok[:2]))),
    ]
    (r,) = score_rules(outcomes)
    assert (r["fired"], r["caught"], r["bad_runs"], r["false_positives"], r["fine_runs"]) == (
        2,
        1,
        1,
        1,
        1,
    )
    assert (r["lead_median"], r["lead_min"], r["first_step_median"]) == (3.0, 3, 4.0)
    assert r["per_run"][1] == {
        "run": "ok",
        "label": "fine",
        "last_step": 9,
        "firing": [2],
        "resolved": [3],
        "lead": None,
    }


@pytest.mark.parametrize("n", [1, 2, 5])
def test_compensated_sum_is_cpython_312s(n):
    """The 3.12+ branch (CPython's Neumaier sum) against the algorithm written out."""
    from expr_tracker.alerts.backtest import _neumaier_sum

    def reference(v):
        s, c = 0.0, 0.0
        for x in v:
            t = s + x
            c += (s - t) + x if abs(s) >= abs(x) else (x - t) + s
            s = t
        return s + c if c and math.isfinite(c) else s

    x = np.array([1e16, 1.0, -1e16, 3.0, 0.1, 0.2, 0.3, 1e-8, 5.0])
    got = _neumaier_sum(x, n)
    assert got.tolist() == [reference(x[i : i + n].tolist()) for i in range(len(x) - n + 1)]
