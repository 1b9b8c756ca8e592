"""Rule functions and operators on extreme data (issue 10): values near the float limit,
mixed infinities and NaN never raise; the result is UNKNOWN (None), a bool, a finite float
or the mathematically right infinity, and NaN only when a NaN went in. A diverging run
must never disable the very rule meant to catch it."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from expr_tracker.alerts import AlertEngine
from expr_tracker.alerts.functions import FUNCTIONS
from expr_tracker.alerts.testing import EventCapture, evaluate

nan, inf = math.nan, math.inf
BIG = 1.7976931348623157e308  # the largest float

extreme = st.one_of(
    st.sampled_from([BIG, -BIG, 1e308, -1e308, 1e300, -1e300, 5e-324, -5e-324, 0.0, inf, -inf]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(allow_nan=True, allow_infinity=True),
)
windows = st.lists(extreme, min_size=1, max_size=9)

#: every signature with a plain implementation (the context functions read no values)
SIGNATURES = [
    (name, i, sig) for name, sigs in FUNCTIONS.items() for i, sig in enumerate(sigs) if sig.impl
]


def _has_nan(values) -> bool:
    return any(isinstance(x, float) and x != x for x in values)


def _check(result, inputs, what):
    assert result is None or isinstance(result, (bool, float)), (what, result)
    if isinstance(result, float) and result != result:
        assert _has_nan(inputs), f"{what}: NaN from {inputs!r} (no NaN went in)"


def _call(sig, v, steps, extra):
    if sig.variadic:
        return sig.impl(*v) if len(v) >= sig.min_args else None
    if not sig.window_param:
        return sig.impl(v[-1])
    args = [v]
    if sig.needs == "steps":
        args.append(steps)
    elif sig.needs == "times":
        args.append([float(s) for s in steps])
    args += [extra] * (len(sig.params) - 1)
    return sig.impl(*args)


@pytest.mark.parametrize(
    ("name", "index", "sig"), SIGNATURES, ids=[f"{n}-{i}" for n, i, _ in SIGNATURES]
)
@settings(max_examples=150, deadline=None)
@given(
    v=windows,
    gaps=st.lists(st.integers(1, 3), min_size=9, max_size=9),
    extra=st.one_of(extreme, st.sampled_from([0.5, 1.0, 0.01])),
)
def test_functions_never_raise_on_extreme_values(name, index, sig, v, gaps, extra):
    steps = [0]
    for g in gaps[: len(v) - 1]:
        steps.append(steps[-1] + g)  # consecutive and spaced steps both occur
    result = _call(sig, v, steps, extra)
    inputs = list(v) + ([extra] if sig.window_param and len(sig.params) > 1 else [])
    _check(result, inputs, f"{name}({v!r})")


@settings(max_examples=200, deadline=None)
@given(v=st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=2, max_size=9))
def test_bounded_results_stay_bounded_for_finite_values(v):
    """What must lie between the smallest and largest value does, whatever their size."""
    lo, hi = min(v), max(v)
    slack = max(abs(lo), abs(hi)) * 1e-12  # rounding, not overflow
    for name, r in (
        ("mean", FUNCTIONS["mean"][0].impl(v)),
        ("median", FUNCTIONS["median"][0].impl(v)),
        ("ema", FUNCTIONS["ema"][0].impl(v, 0.3)),
    ):
        assert math.isfinite(r) and lo - slack <= r <= hi + slack, (name, v, r)
    z = FUNCTIONS["zscore"][0].impl(v)
    assert z is None or abs(z) <= math.sqrt(len(v) - 1) + 1e-9, ("zscore", v, z)
    for name in ("std", "var"):
        r = FUNCTIONS[name][0].impl(v)
        assert r >= 0 and r == r, (name, v, r)


OPERATORS = ["+", "-", "*", "/", "%"]


@pytest.mark.parametrize("op", OPERATORS)
@settings(max_examples=150, deadline=None)
@given(a=extreme, b=extreme)
def test_operators_never_leak_nan_from_infinities(op, a, b):
    # isnan() sees a NaN result; it must come only from a NaN operand
    result = evaluate(f"isnan(a {op} b)", {"a": [a], "b": [b]})
    assert result in (True, False, None)
    if result is True:
        assert a != a or b != b, f"{a!r} {op} {b!r} gave NaN"
    for cond in (f"a {op} b > 0", f"-(a {op} b) < 0", f"a {op} b"):
        assert evaluate(cond, {"a": [a], "b": [b]}) in (True, False, None)


# golden values on extreme data: (condition, series, expected)
EXTREME_GOLDEN = [
    # the mean of finite values is finite, however large they are
    ("mean(x[2]) == 1.7976931348623157e308", {"x": [BIG, BIG]}, True),
    ("mean(x[3]) > 0", {"x": [BIG, BIG, -BIG]}, True),
    ("mean(x[2]) == 0", {"x": [BIG, -BIG]}, True),
    ("isinf(mean(x[2]))", {"x": [1, inf]}, True),
    ("mean(x[2]) > 0", {"x": [inf, -inf]}, None),  # inf - inf: undefined
    ("isinf(sum(x[2]))", {"x": [BIG, BIG]}, True),  # the true sum is beyond the range
    ("sum(x[2]) > 0", {"x": [inf, -inf]}, None),
    ("median(x[2]) == 1.7976931348623157e308", {"x": [BIG, BIG]}, True),
    ("median(x[2]) > 0", {"x": [-inf, inf]}, None),
    ("min(x[2]) < 0 and max(x[2]) > 0", {"x": [inf, -inf]}, True),  # not mistaken for NaN
    ("increasing(x[2])", {"x": [-inf, inf]}, True),
    # spread: finite values far apart have an infinite variance; inf beside finite too
    ("isinf(std(x[2]))", {"x": [BIG, -BIG]}, True),
    ("std(x[3]) == 0", {"x": [1e308, 1e308, 1e308]}, True),
    ("isinf(var(x[2]))", {"x": [1, inf]}, True),
    ("var(x[2]) > 0", {"x": [inf, inf]}, None),
    # zscore is scale free: huge values give the same z as small ones
    ("zscore(x[3]) > 1.41 and zscore(x[3]) < 1.42", {"x": [0, 0, BIG]}, True),
    ("zscore(x[3]) > 1.41 and zscore(x[3]) < 1.42", {"x": [1e308, 1e308, -1e308]}, False),
    ("zscore(x[3]) < -1.41 and zscore(x[3]) > -1.42", {"x": [1e308, 1e308, -1e308]}, True),
    # one value diverging: its z-score tends to sqrt(n - 1), so a spike rule fires on inf
    ("zscore(x[5]) > 1.99 and zscore(x[5]) < 2.01", {"x": [1, 2, 3, 4, inf]}, True),
    ("zscore(x[5]) > 0", {"x": [1, 2, 3, inf, inf]}, None),  # two: depends on the rates
    ("slope(x[3]) == 1e308", {"x": [-1e308, 0, 1e308]}, True),
    ("isinf(slope(x[3])) and slope(x[3]) > 0", {"x": [1, 2, inf]}, True),
    ("slope(x[3]) == 1", {"x": [1, inf, 3]}, True),  # the middle value has weight 0
    ("slope(x[3]) > 0", {"x": [inf, 2, inf]}, None),
    ("ema(x[2], 1) == 5", {"x": [inf, 5]}, True),  # weight 0 for the old value
    ("ema(x[2], 0.5) == 1.7976931348623157e308", {"x": [BIG, BIG]}, True),
    ("ema(x[2], 0.5) > 0", {"x": [inf, -inf]}, None),
    ("diff(x) > 0", {"x": [inf, inf]}, None),
    ("isinf(diff(x))", {"x": [-inf, inf]}, True),
    ("pct_change(x[2]) == 2", {"x": [-BIG, BIG]}, True),  # BIG - -BIG overflows; the ratio not
    ("pct_change(x[2]) == -2", {"x": [BIG, -BIG]}, True),
    ("pct_change(x[2]) == -1", {"x": [inf, 5]}, True),
    ("stalled(x[2], 0.1)", {"x": [inf, inf]}, None),
    ("stalled(x[2], 0.1)", {"x": [BIG, -BIG]}, False),
    ("rate(x[2]) > 0", {"x": [inf, inf]}, None),
    # operators
    ("x - y > 0", {"x": [inf], "y": [inf]}, None),
    ("x + y > 0", {"x": [inf], "y": [-inf]}, None),
    ("x * y > 0", {"x": [inf], "y": [0]}, None),
    ("x / y > 0", {"x": [inf], "y": [inf]}, None),
    ("x % y > 0", {"x": [inf], "y": [3]}, None),
    ("x % y == 5", {"x": [5], "y": [inf]}, True),
    ("x % y > 0", {"x": [-5], "y": [inf]}, None),
    ("x * 2 > 1e308", {"x": [BIG]}, True),  # overflow is +inf, the right infinity
]


@pytest.mark.parametrize(("cond", "series", "expected"), EXTREME_GOLDEN)
def test_extreme_golden_values(cond, series, expected):
    assert evaluate(cond, series) is expected


def test_pct_change_of_finite_extremes_is_right():
    impl = FUNCTIONS["pct_change"][0].impl
    assert impl([-BIG, BIG]) == 2.0  # (BIG - -BIG) overflows; the ratio does not
    assert impl([BIG, -BIG]) == -2.0


def test_a_diverging_run_keeps_every_rule_enabled():
    """Values near the float limit, both infinities and NaN, step after step: no rule of
    the library raises, so none is disabled, and the divergence rules fire."""
    rules = [
        f"{cond} => error"
        for cond in (
            "mean(loss[5]) > 10",
            "std(loss[5]) > 10",
            "var(loss[5]) > 10",
            "zscore(loss[5]) > 1.5",
            "slope(loss[5]) > 0",
            "ema(loss[5], 0.5) > 10",
            "median(loss[4]) > 10",
            "pct_change(loss[3]) > 1",
            "rate(loss[3]) > 0",
            "diff(loss[3]) > 0",
            "sum(loss[5]) > 10",
            "stalled(loss[5], 1e-9)",
            "isnan(loss) or isinf(loss)",
        )
    ]
    capture = EventCapture()
    errors = []
    engine = AlertEngine(rules, record=capture, on_error=lambda r, e: errors.append((r, e)))
    values = [1.0, 2.0, 1e300, 1e308, BIG, BIG, -BIG, inf, -inf, inf, nan, BIG, 10**400]
    for step, value in enumerate(values * 3):
        engine.on_step({"_step": step, "_time": float(step), "loss": value})
    assert errors == []
    stats = engine.stats()["rules"]
    assert not any(s["disabled"] or s["errors"] for s in stats.values()), stats
    fired = {e.rule.name.split(" [")[0] for e in capture.fired()}
    assert {"isnan(loss) or isinf(loss)", "mean(loss[5]) > 10", "zscore(loss[5]) > 1.5"} <= fired


def test_builder_numbers_beyond_the_float_range_compare_as_infinities():
    from expr_tracker.alerts import M, make_rule

    rule = make_rule(M.loss > 10**400)
    assert rule.source == "loss > 1e999"
    assert evaluate(rule.condition, {"loss": [BIG]}) is False
    assert evaluate(rule.condition, {"loss": [inf]}) is False
    assert evaluate(M.loss > -(10**400), {"loss": [-BIG]}) is True


@pytest.mark.parametrize(
    ("name", "args", "expected"),
    [
        ("mean", ([BIG, BIG, BIG],), BIG),  # scaled, and never rounded past the largest value
        ("zscore", ([0.0, 4.3e-160],), 1.0),  # squares underflow: scaled up first
        ("zscore", ([1.0, 1.0, 1.0 - 2**-53],), -math.sqrt(2)),  # a spread of one ulp
        ("zscore", ([BIG, BIG, 1.7976931348623153e308],), -math.sqrt(2)),
        ("std", ([0.0, 2e-160],), 1e-160),
        ("ema", ([5e-324, 5e-324, 5e-324], 0.3), 5e-324),  # weights times values underflow
    ],
)
def test_precision_at_the_ends_of_the_float_range(name, args, expected):
    assert FUNCTIONS[name][0].impl(*args) == pytest.approx(expected, rel=1e-9, abs=0)
