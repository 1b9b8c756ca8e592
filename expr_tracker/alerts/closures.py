"""The closures ``compile_expr`` builds (``alerts.evaluate``): metric lookup, fused
``metric <op> constant`` and ``f(metric)``, truthiness, Kleene-safe arithmetic and the calls of
scalar, window (``f(x[50])``) and duration-window (``f(x[5m])``) functions.

Each returns ``None`` (UNKNOWN) for a missing metric, a short window or a domain error; the
hot path is a chain of these plain calls (docs/architecture.md "The hot path").
"""

from __future__ import annotations

import math
from bisect import bisect_left

from expr_tracker.alerts import ast

__all__ = [
    "ARITH",
    "as_truthy",
    "duration_call",
    "fused_compare",
    "fused_isnan",
    "fused_latest_call",
    "series_cell",
    "series_getter",
    "points_call",
    "scalar_call",
]


def series_getter(name: str):
    return series_cell(name)[0]


def series_cell(name: str):
    """``(get, cell)``: ``get(ctx)`` finds the series of ``name`` (exact, else with ``.`` read
    as ``/``) and keeps it in ``cell[0]``, where a hot closure reads it without the call."""
    alt = name.replace(".", "/") if "." in name else None
    cell: list = [None]

    def get(ctx):
        s = cell[0]
        if s is not None:
            return s
        series = ctx.series
        s = series.get(name)
        if s is None and alt is not None:
            s = series.get(alt)
        if s is not None:
            cell[0] = s
        return s

    return get, cell


def fused_compare(name, op, right):
    """``metric <op> constant`` in one closure (the commonest rule shape)."""
    c = float(right.value if isinstance(right, ast.Number) else right.seconds)
    get = series_getter(name)

    def cmp_metric(ctx):
        s = get(ctx)
        if s is None:
            return None
        v = s.values
        if not v:
            return None
        a = v[-1]
        if a != a:
            return None
        return op(a, c)

    return cmp_metric


def fused_isnan(name):
    """``isnan(metric)`` in one closure: True/False of the latest value, None before one."""
    get, cell = series_cell(name)

    def isnan_latest(ctx):
        s = cell[0]
        if s is None:
            s = get(ctx)
            if s is None:
                return None
        v = s.values
        if not v:
            return None
        a = v[-1]
        return a != a

    return isnan_latest


def fused_latest_call(name, impl):
    """``f(metric)`` in one closure (``isnan(loss)``)."""
    get = series_getter(name)

    def call_latest(ctx):
        s = get(ctx)
        if s is None:
            return None
        v = s.values
        return impl(v[-1]) if v else None

    return call_latest


def as_truthy(fn):
    def truthy(ctx):
        a = fn(ctx)
        if a is None or a != a:
            return None
        return a != 0

    return truthy


# A NaN result from operands that are not NaN is inf - inf, inf * 0, inf / inf or inf % b:
# undefined, so UNKNOWN (a NaN operand still propagates, for isnan() to see).


def _arith_add(lf, rf):
    def add(ctx):
        a = lf(ctx)
        if a is None:
            return None
        b = rf(ctx)
        if b is None:
            return None
        r = a + b
        return None if r != r and a == a and b == b else r

    return add


def _arith_sub(lf, rf):
    def sub(ctx):
        a = lf(ctx)
        if a is None:
            return None
        b = rf(ctx)
        if b is None:
            return None
        r = a - b
        return None if r != r and a == a and b == b else r

    return sub


def _arith_mul(lf, rf):
    def mul(ctx):
        a = lf(ctx)
        if a is None:
            return None
        b = rf(ctx)
        if b is None:
            return None
        r = a * b
        return None if r != r and a == a and b == b else r

    return mul


def _arith_div(lf, rf):
    def div(ctx):
        a = lf(ctx)
        if a is None:
            return None
        b = rf(ctx)
        if b is None or b == 0:
            return None
        r = a / b
        return None if r != r and a == a and b == b else r

    return div


def _arith_mod(lf, rf):
    def mod(ctx):
        a = lf(ctx)
        if a is None:
            return None
        b = rf(ctx)
        if b is None or b == 0:
            return None
        if a != a or b != b:
            return math.nan
        if a - a != 0.0:
            return None  # inf % b: undefined
        r = a % b
        # a finite a modulo an infinite b is a itself, except that Python's floored modulo
        # turns a negative a modulo +inf (or a positive one modulo -inf) into an infinity
        return r if r - r == 0.0 else None

    return mod


ARITH = {"+": _arith_add, "-": _arith_sub, "*": _arith_mul, "/": _arith_div, "%": _arith_mod}


def scalar_call(impl, fns):
    if len(fns) == 1:
        (f,) = fns

        def call1(ctx):
            a = f(ctx)
            return None if a is None else impl(a)

        return call1

    def calln(ctx):
        args = []
        for f in fns:
            a = f(ctx)
            if a is None:
                return None
            args.append(a)
        return impl(*args)

    return calln


def points_call(get, n, impl, needs, extras):
    if needs == "values" and not extras:

        def window_call(ctx):
            s = get(ctx)
            if s is None:
                return None
            v = s.values
            if len(v) < n:
                return None
            return impl(v[-n:])

        return window_call

    if len(extras) == 1 and needs == "values":
        (ef,) = extras

        def window_call_1(ctx):
            s = get(ctx)
            if s is None:
                return None
            v = s.values
            if len(v) < n:
                return None
            return impl(v[-n:], ef(ctx))

        return window_call_1

    def window_call_x(ctx):
        s = get(ctx)
        if s is None:
            return None
        v = s.values
        if len(v) < n:
            return None
        args = [v[-n:]]
        if needs == "times":
            args.append(s.times[-n:])
        elif needs == "steps":
            args.append(s.steps[-n:])
        for f in extras:
            args.append(f(ctx))
        return impl(*args)

    return window_call_x


def duration_call(get, name, secs, impl, needs, extras):
    def duration_call(ctx):
        s = get(ctx)
        if s is None:
            return None
        times = s.times
        i = bisect_left(times, ctx.mono - secs)
        if i == 0 and s.dropped:
            ctx.truncated.add(name)
        v = s.values[i:]
        if not v:
            return None
        args = [v]
        if needs == "times":
            args.append(times[i:])
        elif needs == "steps":
            args.append(s.steps[i:])
        for f in extras:
            args.append(f(ctx))
        return impl(*args)

    return duration_call
