"""Running sums for ``zscore(m[N])`` (docs/alerts.md "Cost"): O(1) per step instead of O(N).

``zscore_call(get, n, impl)`` is the closure ``compile_expr`` builds for ``zscore(m[N])``.
It keeps, per call site, the window's sums of ``x - K`` and ``(x - K)**2`` for a shift ``K``
near the window's mean (the shifted-data variance: no cancellation while ``K`` stays close),
and on each new value adds it and subtracts the one leaving the window. The result is
``(latest - mean) / sqrt(var)`` (population variance), the formula of ``functions._zscore``.

It answers from the sums only where the one-pass formula of ``functions._zscore`` (which the
sums replace) is itself accurate, so the two agree within about 1e-9 relative (checked by
``tests/alerts/test_alerts_running.py`` with hypothesis); everywhere else it calls ``impl``
(``_zscore``) on the window, exactly as before:

- a value that is NaN, infinite or above ``BOUND`` in magnitude is in the window (its
  square could overflow; ``_zscore`` has special rules for these);
- ``n * (mean**2 + var) > CONDITION * var``: ``_zscore``'s one-pass sums lose digits there
  (a variance tiny next to the mean), or its exact-check path applies;
- ``mean**2 + var`` is tiny (``_zscore`` rescales squares that underflow) or ``var <= 0``.

The sums are rebuilt from the window (O(N), plain sums of the shifted values, ``K`` the
window's mean) when they were never built, every ``max(N, 32)`` steps (rounding cannot
accumulate), when the shift drifted from the mean (``(mean - K)**2 > 16 var``), when more
than one value arrived since the last call (the rule was skipped), when the value leaving the
window was already trimmed from the series.

Interrupt safety: the state is one tuple, replaced whole by one store, so an interrupt leaves
the old state or the new one. It holds the count and the float object of the latest value it
included; a row the engine rolls back (an interrupted ``on_step``) removes that value, and a
different value at that position no longer matches by identity: the sums are rebuilt. The
same object re-appended (the same row retried) is the same window. A closure reads one
series for its life (``closures.series_cell`` keeps the one it found).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

__all__ = ["BOUND", "CONDITION", "zscore_call"]

#: values above this magnitude leave the window to ``_zscore`` (n squares stay finite)
BOUND = 1e150
#: ``n * (mean**2 + var) / var`` above this: ``_zscore``'s one-pass sums lose digits
CONDITION = 1e6
#: ``mean**2 + var`` below this: ``_zscore`` rescales (squares underflow)
TINY = 1e-240
_sqrt = math.sqrt


def _rebuild(v: list[float], n: int, count: int) -> tuple:
    """The state for the last ``n`` values of ``v`` (a series at ``count``)."""
    w = v[-n:]
    good = [x for x in w if -BOUND <= x <= BOUND]
    k = sum(good) / len(good) if good else 0.0
    d = [x - k for x in good]
    s2 = sum([x * x for x in d])
    # (count, latest value object, shift K, sum(x - K), sum((x - K)**2),
    #  values out of range in the window, steps left before the next rebuild, the largest
    #  sum((x - K)**2) since the rebuild: the scale of the rounding errors carried)
    return (count, v[-1], k, sum(d), s2, n - len(good), max(n, 32), s2)


def zscore_call(
    get: Callable[[Any], Any],
    n: int,
    impl: Callable[[list[float]], Any],
    cell: list | None = None,
    op: Callable[[float, float], bool] | None = None,
    c: float = 0.0,
):
    """The closure for ``zscore(m[n])`` (``n`` >= 2): ``fn(ctx) -> float | None``; None
    (UNKNOWN) before ``n`` values were recorded, and whatever ``impl`` (``_zscore``) gives
    where the sums do not answer. ``cell``: where ``get`` keeps the series it found
    (``closures.series_cell``). With ``op``: the closure for ``zscore(m[n]) <op> c``,
    True/False, None where the z-score is None or NaN. ``fn.with_compare(op, c)`` builds
    that one."""
    state: list[Any] = [None]
    every = max(n, 32)
    if cell is None:
        cell = [None]

    def slow(v: list[float]):
        r = impl(v[-n:])
        if op is None:
            return r
        return None if r is None or r != r else op(r, c)

    def zscore_running(ctx):
        s = cell[0]
        if s is None:
            s = get(ctx)
            if s is None:
                return None
        v = s.values
        size = len(v)
        if size < n:
            return None
        st = state[0]
        count = s.count
        if st is not None and (d := count - st[0]) <= 1:
            # one unpacking instead of seven subscripts (the steady state: one new value)
            _, last, k, s1, s2, bad, left, peak = st
            if d == 1 and left > 0 and size > n and v[-2] is last:
                x = v[-1]
                out = v[-1 - n]
                if -BOUND <= x <= BOUND:
                    dx = x - k
                    s1 += dx
                    s2 += dx * dx
                else:
                    bad += 1
                if -BOUND <= out <= BOUND:
                    dx = out - k
                    s1 -= dx
                    s2 -= dx * dx
                else:
                    bad -= 1
                if s2 > peak:
                    peak = s2
                state[0] = st = (count, x, k, s1, s2, bad, left - 1, peak)
            elif d != 0 or v[-1] is not last:
                state[0] = st = _rebuild(v, n, count)
                _, last, k, s1, s2, bad, left, peak = st
        else:
            state[0] = st = _rebuild(v, n, count)
            _, last, k, s1, s2, bad, left, peak = st
        if bad:  # NaN, an infinity or a huge value in the window: _zscore's rules
            return slow(v)
        md = s1 / n
        nvar = s2 - s1 * md
        # the sums answer when the variance is well above the rounding they carried and K
        # is near the mean; otherwise rebuilt once, and _zscore answers if still not
        if not (nvar > 1e-3 * peak and s1 * md <= 16.0 * nvar):
            if left == every or peak == 0.0:  # fresh, or nothing that could round
                return slow(v)
            state[0] = st = _rebuild(v, n, count)
            _, last, k, s1, s2, bad, left, peak = st
            md = s1 / n
            nvar = s2 - s1 * md
            if not (nvar > 1e-3 * peak and s1 * md <= 16.0 * nvar):
                return slow(v)
        var = nvar / n
        m = k + md
        sq = m * m + var
        if sq < TINY or n * sq > CONDITION * var:  # where _zscore takes another path
            return slow(v)
        z = (v[-1] - m) / _sqrt(var)
        return z if op is None else op(z, c)

    if op is None:
        zscore_running.with_compare = (  # type: ignore[attr-defined]
            lambda op2, c2: zscore_call(get, n, impl, cell, op2, c2)
        )
    return zscore_running
