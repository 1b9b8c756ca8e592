"""The function whitelist of the alert language (docs/alerts.md "Functions").

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
engine counts per rule (docs/alerts.md "Three-valued logic").

Extreme values (values near the float limit, infinities, NaN) never make a function raise,
so a diverging run cannot disable the rule meant to catch it (``tests/alerts/test_alerts_extreme.py``
checks every function with hypothesis). Each fast path computes as usual and checks its
result; only a non-finite result takes the slow path, which gives:
  - NaN when a NaN went in (it propagates; ``isnan`` sees it, a comparison is UNKNOWN);
  - the right finite value when only an intermediate overflowed (``mean``, ``median``,
    ``ema``, ``zscore``, ``slope``, ``pct_change`` of values near 1.8e308 are computed on
    scaled values), or when squares underflow (``var``, ``std``, ``zscore`` of values
    below 1e-125 are scaled up first);
  - the infinity the value diverges to: ``sum``/``mean``/``ema``/``slope`` when every
    infinite term pulls the same way, ``var``/``std`` when an infinity sits beside another
    value, ``zscore`` with exactly one infinite value (it tends to the z-score of the
    window where that value is ±1 and the others 0: sqrt(n - 1) when it is the latest),
    an overflowing true result (``sum`` of two 1e308 is +inf);
  - UNKNOWN where the answer is undefined: ``inf - inf`` in any form (``mean`` of +inf
    and -inf, ``diff`` of the same infinity twice), ``var`` of one infinity repeated,
    ``zscore`` with several infinities (the limit depends on how fast each grew),
    ``stalled`` of one infinity repeated, ``pct_change`` from an infinity to an infinity.
A term of weight 0 (``ema`` with alpha 1, the middle point of ``slope``) ignores its
value, infinite or not.

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
from typing import cast

__all__ = ["FUNCTIONS", "TIME_BASED", "Signature"]


@dataclass(frozen=True, slots=True)
class Signature:
    """One accepted shape of a call.

    ``params``: kinds of the fixed parameters; ``variadic``: a kind repeated (at least
    ``min_args`` arguments in all); ``min_points``: the smallest point window that makes
    sense; ``needs``: extra per-value data a window function reads.
    """

    params: tuple[str, ...]
    returns: str
    impl: Callable[..., float | bool | None] | None
    doc: str
    variadic: str | None = None
    min_args: int = 0
    min_points: int = 1
    needs: str = "values"
    window_param: bool = False


_INF = math.inf
_NAN = math.nan
#: what a window holds besides finite values (``_kind``)
_FINITE, _POS, _NEG, _BOTH, _HAS_NAN = 0, 1, -1, 2, 3


def _nan_in(v: list[float]) -> bool:
    s = sum(v)
    if s - s == 0.0:  # a finite sum: no NaN, no infinity
        return False
    for x in v:
        if x != x:
            return True
    return False


def _kind(v: list[float]) -> int:
    """The slow path's view of a window: ``_HAS_NAN``; ``_POS``/``_NEG`` when its only
    infinities are +inf/-inf; ``_BOTH`` when it holds both; ``_FINITE`` otherwise."""
    pos = neg = False
    for x in v:
        if x != x:
            return _HAS_NAN
        if x == _INF:
            pos = True
        elif x == -_INF:
            neg = True
    if pos and neg:
        return _BOTH
    return _POS if pos else (_NEG if neg else _FINITE)


def _scale(v: list[float]) -> float:
    """A power of two near the largest magnitude of finite ``v`` (1 for all zeros): dividing
    by it brings every value into [-2, 2], where sums of values or squares cannot
    overflow."""
    top = max(map(abs, v))
    if top == 0.0:
        return 1.0
    return 2.0 ** (math.frexp(top)[1] - 1)


def _signed_infinity(sign: float) -> float:
    return _INF if sign > 0 else -_INF


def _weighted_special(v: list[float], w: list[float]) -> float | None:
    """``sum(w * v)`` for a window holding NaN or an infinity, or whose finite sum
    overflowed: NaN when it holds NaN; the infinity of the terms that diverge when they all
    diverge the same way (terms of weight 0 do not count: ``0 * x`` is 0 for every
    finite x), UNKNOWN when they pull both ways (``inf - inf``); for finite values the sum
    computed on scaled values, which overflows only when the true result does."""
    k = _kind(v)
    if k == _HAS_NAN:
        return _NAN
    if k == _FINITE:
        scale = _scale(v)
        return sum(wi * (x / scale) for wi, x in zip(w, v, strict=True)) * scale
    sign = 0.0
    for wi, x in zip(w, v, strict=True):
        if x - x != 0.0 and wi != 0.0:
            s = math.copysign(1.0, x) * math.copysign(1.0, wi)
            if sign and s != sign:
                return None
            sign = s
    if not sign:  # every infinity has weight 0: the finite terms decide
        return _weighted_special([x if x - x == 0.0 else 0.0 for x in v], w)
    return _signed_infinity(sign)


def _mean(v: list[float]) -> float | None:
    s = sum(v)
    if s - s == 0.0:
        return s / len(v)
    k = _kind(v)
    if k == _FINITE:  # finite values whose sum overflowed: the mean lies between them
        scale = _scale(v)
        r = sum(x / scale for x in v) / len(v) * scale
        return min(max(r, min(v)), max(v))  # rounding must not step outside (or to inf)
    if k == _HAS_NAN:
        return _NAN
    return None if k == _BOTH else _signed_infinity(k)


#: below this mean square, squares of the values lose precision (subnormal): scale them
_TINY_SQUARES = 1e-250
#: below this magnitude a weighted sum may have lost its terms to underflow
_TINY = 1e-290


def _var(v: list[float]) -> float | None:
    n = len(v)
    m = sum(v) / n
    ss: float = sum(map(mul, v, v)) / n
    var = ss - m * m
    if var - var != 0.0:  # NaN, an infinity, or an overflow: not the fast path
        return _var_special(v)
    if ss < _TINY_SQUARES:  # tiny values: their squares underflow
        if min(v) == max(v):
            return 0.0
        scale = _scale(v)
        return cast(float, _var([x / scale for x in v])) * scale * scale  # finite: never None
    if var <= 1e-9 * m * m:  # cancellation possible: recompute with two passes
        if min(v) == max(v):
            return 0.0
        d, md = _centred(v)
        e = [x - md for x in d]
        var = math.fsum(map(mul, e, e)) / n
    return var


def _centred(v: list[float]) -> tuple[list[float], float]:
    """``v`` shifted by its first value, and the mean of that: for values close together
    (where the one-pass variance cancels) the differences are exact (Sterbenz), so even a
    spread of one ulp keeps its size. var and zscore do not change under a shift."""
    c = v[0]
    d = [x - c for x in v]
    return d, math.fsum(d) / len(d)


def _var_special(v: list[float]) -> float | None:
    k = _kind(v)
    if k == _HAS_NAN:
        return _NAN
    if k != _FINITE:
        # an infinite value beside a finite one, or +inf beside -inf: the spread diverges;
        # only the same infinity repeated is undefined (inf - inf)
        return None if min(v) == max(v) else _INF
    scale = _scale(v)
    return cast(float, _var([x / scale for x in v])) * scale * scale  # inf when the true one is


def _std(v: list[float]) -> float | None:
    var = _var(v)
    if var is None or var != var:
        return var
    if 0.0 < var < _TINY_SQUARES:  # a variance this small lost digits: scale, then unscale
        scale = _scale(v)
        return math.sqrt(cast(float, _var([x / scale for x in v]))) * scale
    return math.sqrt(var)


def _median(v: list[float]) -> float | None:
    if _nan_in(v):
        return _NAN
    s = sorted(v)
    n = len(s)
    h = n // 2
    if n % 2:
        return s[h]
    mid = (s[h - 1] + s[h]) / 2.0
    if mid - mid == 0.0:
        return mid
    if s[h - 1] == -_INF and s[h] == _INF:
        return None  # halfway between -inf and +inf
    return s[h - 1] / 2.0 + s[h] / 2.0  # the sum overflowed (or an infinity: itself)


def _sum(v: list[float]) -> float | None:
    s = float(sum(v))
    if s == s:
        return s  # finite, or the infinity the values (or their overflow) give
    k = _kind(v)
    return _NAN if k == _HAS_NAN else None  # inf - inf


def _wmin(v: list[float]) -> float:
    return _NAN if _nan_in(v) else min(v)


def _wmax(v: list[float]) -> float:
    return _NAN if _nan_in(v) else max(v)


def _first(v: list[float]) -> float:
    return v[0]


def _last(v: list[float]) -> float:
    return v[-1]


def _count(v: list[float]) -> float:
    return float(len(v))


def _difference(a: float, b: float) -> float | None:
    """``b - a``, UNKNOWN for the same infinity twice (``inf - inf``)."""
    d = b - a
    if d != d and a == a and b == b:
        return None
    return d


def _diff(v: list[float]) -> float | None:
    if len(v) < 2:
        return None
    return _difference(v[0], v[-1])


def _rate(v: list[float], t: list[float]) -> float | None:
    if len(v) < 2:
        return None
    dt = t[-1] - t[0]
    if not dt > 0:
        return None
    d = _difference(v[0], v[-1])
    if d is None:
        return None
    r = d / dt
    return None if r != r and d == d else r


def _pct_change(v: list[float]) -> float | None:
    if len(v) < 2:
        return None
    a, b = v[0], v[-1]
    if a == 0:
        return None
    r = (b - a) / abs(a)
    if r - r == 0.0 or r != r and (a != a or b != b):
        return r  # finite, or NaN from a NaN value
    if a - a != 0.0:  # from an infinity: -1 (+1 from -inf) towards a finite value
        return None if b - b != 0.0 else -math.copysign(1.0, a)
    if b - b != 0.0:
        return _signed_infinity(math.copysign(1.0, b))
    return b / abs(a) - math.copysign(1.0, a)  # b - a overflowed: divide first


_SLOPE_WEIGHTS: dict[int, list[float]] = {}


def _slope(v: list[float], steps: list[int]) -> float | None:
    n = len(v)
    if n < 2:
        return None
    if steps[-1] - steps[0] == n - 1:  # consecutive steps: precomputed weights, one pass
        w = _SLOPE_WEIGHTS.get(n)
        if w is None:
            mx = (n - 1) / 2.0
            sxx = n * (n * n - 1) / 12.0
            w = _SLOPE_WEIGHTS[n] = [(i - mx) / sxx for i in range(n)]
        r: float = sum(map(mul, w, v))
        if r - r == 0.0:
            return r
        return _weighted_special(v, w)
    # general case: steps are ints, so these sums are exact and sxx has no cancellation
    sx = sum(steps)
    sxx = n * sum(map(mul, steps, steps)) - sx * sx
    if sxx == 0:
        return None
    total = sum(v)
    if total - total == 0.0:
        try:
            r = (n * math.fsum(map(mul, steps, v)) - sx * math.fsum(v)) / sxx
        except (OverflowError, ValueError):  # a product or partial sum overflowed: the
            r = _NAN  # weighted form below
        if r - r == 0.0:
            return r
    return _weighted_special(v, [(n * s - sx) / sxx for s in steps])


def _zscore(v: list[float]) -> float | None:
    n = len(v)
    if n < 2:
        return None
    m = sum(v) / n
    ss: float = sum(map(mul, v, v)) / n
    var = ss - m * m
    if var - var != 0.0:  # NaN, an infinity, or an overflow
        return _zscore_special(v)
    if ss < _TINY_SQUARES:  # tiny values: their squares underflow; z is scale free
        if min(v) == max(v):
            return None  # std 0
        scale = _scale(v)
        return _zscore([x / scale for x in v])
    if var <= 1e-9 * m * m:  # cancellation possible: exact checks
        if min(v) == max(v):
            return None  # std 0
        d, md = _centred(v)
        e = [x - md for x in d]
        var = math.fsum(map(mul, e, e)) / n
        if var <= 0.0:
            return None
        return e[-1] / math.sqrt(var)
    return (v[-1] - m) / math.sqrt(var)


def _zscore_special(v: list[float]) -> float | None:
    k = _kind(v)
    if k == _HAS_NAN:
        return _NAN
    if k == _FINITE:  # zscore does not change when every value is divided by one number
        scale = _scale(v)
        return _zscore([x / scale for x in v])
    infinite = [x for x in v if x - x != 0.0]
    if len(infinite) > 1:
        return None  # the limit depends on how fast each one grew: undefined
    # one value grows without bound: its z-score tends to that of the window in which it
    # is +-1 and every other value 0 (finite values vanish beside it)
    return _zscore([0.0 if x - x == 0.0 else math.copysign(1.0, x) for x in v])


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


def _ema(v: list[float], alpha: float | None) -> float | None:
    if alpha is None or alpha != alpha or not (0.0 < alpha <= 1.0):
        return None
    w = _ema_weights(len(v), alpha)
    r: float = sum(map(mul, w, v))
    if r - r != 0.0:
        return _weighted_special(v, w)
    if -_TINY < r < _TINY:  # products may have underflowed: scale up, stay within range
        scale = _scale(v)
        r = sum(map(mul, w, [x / scale for x in v])) * scale
        return min(max(r, min(v)), max(v))  # a weighted average lies between the values
    return r


def _increasing(v: list[float]) -> bool | None:
    if len(v) < 2 or _nan_in(v):
        return None
    return all(map(lt, v, v[1:]))


def _decreasing(v: list[float]) -> bool | None:
    if len(v) < 2 or _nan_in(v):
        return None
    return all(map(gt, v, v[1:]))


def _stalled(v: list[float], eps: float | None) -> bool | None:
    if eps is None or eps != eps or _nan_in(v):
        return None
    hi, lo = max(v), min(v)
    if hi == lo and hi - hi != 0.0:
        return None  # one infinity throughout: how far it moved is undefined
    return hi - lo <= eps


def _isnan(x: float | None) -> bool | None:
    return None if x is None else x != x


def _isinf(x: float | None) -> bool | None:
    return None if x is None else (x == math.inf or x == -math.inf)


def _abs(x: float) -> float:
    return abs(x)


def _log(x: float) -> float | None:
    if x != x:
        return x
    return math.log(x) if x > 0 else None


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _sqrt(x: float) -> float | None:
    if x != x:
        return x
    return math.sqrt(x) if x >= 0 else None


def _smin(*xs: float) -> float:
    for x in xs:
        if x != x:
            return _NAN
    return min(xs)


def _smax(*xs: float) -> float:
    for x in xs:
        if x != x:
            return _NAN
    return max(xs)


def _agg(
    impl: Callable[..., float | bool | None],
    doc: str,
    *,
    returns: str = "scalar",
    min_points: int = 1,
    needs: str = "values",
    extra: tuple[str, ...] = (),
) -> Signature:
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
    "skew": (
        Signature(
            ("name",),
            "scalar",
            None,
            "max / median across ranks of the metric at one step (rank 0, multi-rank runs)",
        ),
    ),
    "elapsed": (Signature((), "scalar", None, "seconds since the rules started"),),
    "baseline": (
        Signature(
            ("name",),
            "scalar",
            None,
            'q-quantile of the metric at this step across finished runs: baseline(m, runs="p/*", '
            "q=0.5, min_runs=1)",
        ),
    ),
    "abs": (Signature(("scalar",), "scalar", _abs, "absolute value"),),
    "log": (Signature(("scalar",), "scalar", _log, "natural logarithm (UNKNOWN for x <= 0)"),),
    "exp": (Signature(("scalar",), "scalar", _exp, "e ** x"),),
    "sqrt": (Signature(("scalar",), "scalar", _sqrt, "square root (UNKNOWN for x < 0)"),),
}

#: functions whose value changes with time alone: their rules run on the watchdog too
TIME_BASED = frozenset({"no_data", "age", "elapsed"})
