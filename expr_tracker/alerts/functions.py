"""The function whitelist of the alert language (spec/design.txt C.3).

``FUNCTIONS`` maps a name to one or more ``Signature`` entries. A signature lists the kind
of each parameter and what the call returns; ``evaluate.compile_expr`` checks every call
against it when a rule is registered (unknown function, arity, argument kind, window size),
so nothing is looked up or checked per evaluation.

Parameter kinds:
  ``window``    ``m[N]`` or ``m[30s]`` (``diff`` also takes a bare name, read as ``m[2]``)
  ``name``      a bare metric name (``has(m)``, ``age(m)``)
  ``scalar``    any numeric expression (a bare metric is its latest value)
  ``duration``  a duration literal (``no_data(5m)``) or a number of seconds
Returns ``scalar`` (a float, possibly NaN) or ``bool``.

Implementations receive plain Python floats and lists and return a float, a bool, or
``None`` (UNKNOWN) for domain problems: too few values, zero std, zero division, log of a
non-positive number. They never raise for those; anything they do raise is a bug that the
engine counts per rule (DESIGN.md "Rules").

Window functions get the window's values oldest first; those marked ``needs="times"`` or
``needs="steps"`` also get the matching times or steps. Times are the engine's time base:
the monotonic commit time in a live run, the recorded ``_time`` in a replay (never the
wall clock, which can jump).
Variance and std are population statistics (ddof = 0), the convention of Prometheus'
``stddev_over_time``; ``slope`` is the least-squares slope per step; ``rate`` is per second.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from operator import gt, lt, mul

__all__ = ["FUNCTIONS", "TIME_BASED", "Signature", "describe"]


@dataclass(frozen=True, slots=True)
class Signature:
    """One accepted shape of a call.

    ``params``: kinds of the fixed parameters; ``variadic``: a kind repeated (at least
    ``min_args`` arguments in all); ``min_points``: the smallest point window that makes
    sense; ``needs``: extra per-value data a window function reads.
    """

    params: tuple[str, ...]
    returns: str
    impl: Callable | None
    doc: str
    variadic: str | None = None
    min_args: int = 0
    min_points: int = 1
    needs: str = "values"
    window_param: bool = False


def _nan_in(v: list[float]) -> bool:
    s = sum(v)
    return s != s


def _mean(v):
    return sum(v) / len(v)


def _var(v):
    n = len(v)
    m = sum(v) / n
    if m != m:
        return m
    var = sum(map(mul, v, v)) / n - m * m
    if var <= 1e-9 * m * m:  # cancellation possible: recompute with two passes
        if min(v) == max(v):
            return 0.0
        d = [x - m for x in v]
        var = math.fsum(map(mul, d, d)) / n
    return var


def _std(v):
    var = _var(v)
    return math.sqrt(var) if var == var else var


def _median(v):
    if _nan_in(v):
        return math.nan
    s = sorted(v)
    n = len(s)
    h = n // 2
    return s[h] if n % 2 else (s[h - 1] + s[h]) / 2.0


def _sum(v):
    return float(sum(v))


def _wmin(v):
    return math.nan if _nan_in(v) else min(v)


def _wmax(v):
    return math.nan if _nan_in(v) else max(v)


def _first(v):
    return v[0]


def _last(v):
    return v[-1]


def _count(v):
    return float(len(v))


def _diff(v):
    if len(v) < 2:
        return None
    return v[-1] - v[0]


def _rate(v, t):
    if len(v) < 2:
        return None
    dt = t[-1] - t[0]
    if dt <= 0:
        return None
    return (v[-1] - v[0]) / dt


def _pct_change(v):
    if len(v) < 2 or v[0] == 0:
        return None
    return (v[-1] - v[0]) / abs(v[0])


_SLOPE_WEIGHTS: dict[int, list[float]] = {}


def _slope(v, steps):
    n = len(v)
    if n < 2:
        return None
    if steps[-1] - steps[0] == n - 1:  # consecutive steps: precomputed weights, one pass
        w = _SLOPE_WEIGHTS.get(n)
        if w is None:
            mx = (n - 1) / 2.0
            sxx = n * (n * n - 1) / 12.0
            w = _SLOPE_WEIGHTS[n] = [(i - mx) / sxx for i in range(n)]
        return sum(map(mul, w, v))
    # general case: steps are ints, so these sums are exact and sxx has no cancellation
    sx = sum(steps)
    sxx = n * sum(map(mul, steps, steps)) - sx * sx
    if sxx == 0:
        return None
    sxy = n * math.fsum(map(mul, steps, v)) - sx * math.fsum(v)
    return sxy / sxx


def _zscore(v):
    n = len(v)
    if n < 2:
        return None
    m = sum(v) / n
    if m != m:
        return m
    var = sum(map(mul, v, v)) / n - m * m
    if var <= 1e-9 * m * m:  # cancellation possible: exact checks
        if min(v) == max(v):
            return None  # std 0
        d = [x - m for x in v]
        var = math.fsum(map(mul, d, d)) / n
        if var <= 0.0:
            return None
    return (v[-1] - m) / math.sqrt(var)


_EMA_WEIGHTS: dict[tuple[int, float], list[float]] = {}


def _ema_weights(n: int, alpha: float) -> list[float]:
    # e = (1-a)^(n-1) x0 + sum_k a (1-a)^(n-1-k) x_k  (k >= 1): the recursion unrolled
    w = _EMA_WEIGHTS.get((n, alpha))
    if w is None:
        keep = 1.0 - alpha
        w = [keep ** (n - 1)] + [alpha * keep ** (n - 1 - k) for k in range(1, n)]
        if len(_EMA_WEIGHTS) > 256:
            _EMA_WEIGHTS.clear()
        _EMA_WEIGHTS[(n, alpha)] = w
    return w


def _ema(v, alpha):
    if alpha is None or alpha != alpha or not (0.0 < alpha <= 1.0):
        return None
    return sum(map(mul, _ema_weights(len(v), alpha), v))


def _increasing(v):
    if len(v) < 2 or _nan_in(v):
        return None
    return all(map(lt, v, v[1:]))


def _decreasing(v):
    if len(v) < 2 or _nan_in(v):
        return None
    return all(map(gt, v, v[1:]))


def _stalled(v, eps):
    if eps is None or eps != eps or _nan_in(v):
        return None
    return max(v) - min(v) <= eps


def _isnan(x):
    return None if x is None else x != x


def _isinf(x):
    return None if x is None else (x == math.inf or x == -math.inf)


def _abs(x):
    return abs(x)


def _log(x):
    if x != x:
        return x
    return math.log(x) if x > 0 else None


def _exp(x):
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _sqrt(x):
    if x != x:
        return x
    return math.sqrt(x) if x >= 0 else None


def _smin(*xs):
    for x in xs:
        if x != x:
            return math.nan
    return min(xs)


def _smax(*xs):
    for x in xs:
        if x != x:
            return math.nan
    return max(xs)


def _agg(impl, doc, *, returns="scalar", min_points=1, needs="values", extra=()):
    return Signature(
        ("window", *extra),
        returns,
        impl,
        doc,
        min_points=min_points,
        needs=needs,
        window_param=True,
    )


#: name -> accepted signatures (tried in order; the first whose kinds fit wins)
FUNCTIONS: dict[str, tuple[Signature, ...]] = {
    "mean": (_agg(_mean, "mean of the window"),),
    "std": (_agg(_std, "population standard deviation of the window"),),
    "var": (_agg(_var, "population variance of the window"),),
    "median": (_agg(_median, "median of the window"),),
    "sum": (_agg(_sum, "sum of the window"),),
    "first": (_agg(_first, "oldest value of the window"),),
    "last": (_agg(_last, "latest value of the window"),),
    "count": (_agg(_count, "number of values in the window"),),
    "min": (
        _agg(_wmin, "smallest value of the window (rolling minimum)"),
        Signature((), "scalar", _smin, "smallest of two or more numbers", "scalar", 2),
    ),
    "max": (
        _agg(_wmax, "largest value of the window (rolling maximum)"),
        Signature((), "scalar", _smax, "largest of two or more numbers", "scalar", 2),
    ),
    "diff": (_agg(_diff, "last - first of the window; diff(m) is diff(m[2])", min_points=2),),
    "rate": (_agg(_rate, "(last - first) per second of row time", min_points=2, needs="times"),),
    "pct_change": (_agg(_pct_change, "(last - first) / |first|", min_points=2),),
    "slope": (_agg(_slope, "least-squares slope per step", min_points=2, needs="steps"),),
    "zscore": (
        _agg(_zscore, "(latest - mean) / std of the window (latest included)", min_points=2),
    ),
    "ema": (_agg(_ema, "exponential moving average, alpha in (0, 1]", extra=("scalar",)),),
    "increasing": (
        _agg(_increasing, "every value above the one before", returns="bool", min_points=2),
    ),
    "decreasing": (
        _agg(_decreasing, "every value below the one before", returns="bool", min_points=2),
    ),
    "stalled": (
        _agg(_stalled, "max - min of the window <= eps", returns="bool", extra=("scalar",)),
    ),
    "isnan": (Signature(("scalar",), "bool", _isnan, "the value is NaN"),),
    "isinf": (Signature(("scalar",), "bool", _isinf, "the value is +inf or -inf"),),
    "has": (Signature(("name",), "bool", None, "the metric was recorded at least once"),),
    "age": (Signature(("name",), "scalar", None, "seconds since the metric was last recorded"),),
    "no_data": (Signature(("duration",), "bool", None, "no step committed for this long"),),
    "step": (Signature((), "scalar", None, "the latest committed step"),),
    "elapsed": (Signature((), "scalar", None, "seconds since the rules started"),),
    "abs": (Signature(("scalar",), "scalar", _abs, "absolute value"),),
    "log": (Signature(("scalar",), "scalar", _log, "natural logarithm (UNKNOWN for x <= 0)"),),
    "exp": (Signature(("scalar",), "scalar", _exp, "e ** x"),),
    "sqrt": (Signature(("scalar",), "scalar", _sqrt, "square root (UNKNOWN for x < 0)"),),
}

#: functions whose value changes with time alone: their rules run on the watchdog too
TIME_BASED = frozenset({"no_data", "age", "elapsed"})


def describe() -> list[tuple[str, str, str]]:
    """``(name, call shape, doc)`` for every signature, for docs and ``et rules explain``."""
    out = []
    for name, sigs in FUNCTIONS.items():
        for sig in sigs:
            params = list(sig.params)
            if sig.variadic:
                params += [sig.variadic] * max(sig.min_args - len(params), 1) + ["..."]
            out.append((name, f"{name}({', '.join(params)}) -> {sig.returns}", sig.doc))
    return out
