"""Downsampling a series for a chart: M4 plus every non-finite point.

A chart ``W`` cells (or pixels) wide cannot show more than a few points per column, so a
series of a million steps is cut to what the columns can show without losing what the eye
looks for: the x range ``[lo, hi]`` is split into ``buckets`` equal-width buckets and, of
the points whose ``y`` is finite, each bucket keeps its first and last (by index) and its
minimum and maximum (the first of equal ones) — the M4 aggregation — so spikes survive.
Every point whose ``y`` is NaN or ±inf is kept as well: a chart marks them, it never drops
them. The result is a list of indices, ascending (the input order is kept), so a caller
can pick any column of the same rows (step, time, value).

Pure Python; numpy, when importable, is used for long series (the result is the same,
index for index). Imports nothing else from the project: ``et plot`` and the web UI share
it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["m4", "downsample", "bucket_index"]

#: from this many points on numpy (when installed) does the work
NUMPY_MIN = 20_000


def _bounds(xs: Sequence[float], lo: float | None, hi: float | None) -> tuple[float, float]:
    if lo is None:
        lo = float(min(xs))
    if hi is None:
        hi = float(max(xs))
    return float(lo), float(hi)


def bucket_index(x: float, lo: float, hi: float, buckets: int) -> int:
    """The bucket (0 .. ``buckets`` - 1) of ``x`` in ``[lo, hi]`` split into ``buckets``
    equal-width buckets (``hi`` itself falls in the last one; ``lo == hi``: bucket 0)."""
    width = hi - lo
    scale = buckets / width if width > 0 else 0.0
    b = int((float(x) - lo) * scale)
    return b if b < buckets else buckets - 1


def m4(
    xs: Sequence[float],
    ys: Sequence[float],
    buckets: int,
    lo: float | None = None,
    hi: float | None = None,
    *,
    use_numpy: bool | None = None,
) -> list[int]:
    """Indices (ascending) of the points to draw of the series ``(xs[i], ys[i])``.

    Args:
        xs: x of each point (steps, seconds); finite numbers, in any order (buckets are by
            value; a point's "first"/"last" is by index).
        ys: y of each point; NaN and ±inf allowed.
        buckets: number of equal-width x buckets over ``[lo, hi]`` (>= 1), e.g. the
            chart's width in cells.
        lo, hi: the x range to draw (default: the smallest and largest x); points outside
            it are left out (a zoomed chart asks for its range).
        use_numpy: force (True) or forbid (False) numpy; None: numpy for long series when
            it is installed.

    Returns:
        Per bucket at most four indices of finite points — the first, the last, the
        minimum and the maximum (the first of equal ones) — plus the index of every point
        in range whose ``y`` is not finite; ascending, each once. At most
        ``4 * buckets`` finite points.

    Raises:
        ValueError: ``xs`` and ``ys`` differ in length, ``buckets`` < 1, ``lo`` > ``hi``,
            or an x is not finite.
    """
    n = len(xs)
    if len(ys) != n:
        raise ValueError(f"xs and ys differ in length ({n} != {len(ys)})")
    if not isinstance(buckets, int) or buckets < 1:
        raise ValueError(f"buckets={buckets!r} is not valid: an int >= 1")
    if n == 0:
        return []
    lo, hi = _bounds(xs, lo, hi)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"the x range [{lo}, {hi}] is not finite (an x is NaN or inf)")
    if lo > hi:
        raise ValueError(f"lo={lo} > hi={hi}")
    if use_numpy is None:
        use_numpy = n >= NUMPY_MIN and _numpy() is not None
    if use_numpy:
        return _m4_numpy(xs, ys, buckets, lo, hi)
    return _m4_python(xs, ys, buckets, lo, hi)


def downsample(
    xs: Sequence[float],
    ys: Sequence[float],
    buckets: int,
    lo: float | None = None,
    hi: float | None = None,
) -> tuple[list[float], list[float]]:
    """``(xs, ys)`` of the points :func:`m4` keeps (same arguments and errors)."""
    idx = m4(xs, ys, buckets, lo, hi)
    return [xs[i] for i in idx], [ys[i] for i in idx]


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def _m4_python(
    xs: Sequence[float], ys: Sequence[float], buckets: int, lo: float, hi: float
) -> list[int]:
    width = hi - lo
    scale = buckets / width if width > 0 else 0.0
    top = buckets - 1
    first = [-1] * buckets
    last = [-1] * buckets
    imin = [-1] * buckets
    imax = [-1] * buckets
    vmin = [0.0] * buckets
    vmax = [0.0] * buckets
    keep: list[int] = []
    isfinite = math.isfinite
    for i in range(len(xs)):
        x = float(xs[i])
        if not isfinite(x):
            raise ValueError(f"xs[{i}] = {x!r} is not finite")
        if x < lo or x > hi:
            continue
        y = ys[i]
        if not isfinite(y):
            keep.append(i)
            continue
        b = int((x - lo) * scale)
        if b > top:
            b = top
        if first[b] < 0:
            first[b] = last[b] = imin[b] = imax[b] = i
            vmin[b] = vmax[b] = y
            continue
        last[b] = i
        if y < vmin[b]:
            vmin[b], imin[b] = y, i
        if y > vmax[b]:
            vmax[b], imax[b] = y, i
    out = set(keep)
    for b in range(buckets):
        if first[b] >= 0:
            out.update((first[b], last[b], imin[b], imax[b]))
    return sorted(out)


def _m4_numpy(
    xs: Sequence[float], ys: Sequence[float], buckets: int, lo: float, hi: float
) -> list[int]:
    np = _numpy()
    x = np.asarray(xs, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    bad = ~np.isfinite(x)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"xs[{i}] = {float(x[i])!r} is not finite")
    inr = (x >= lo) & (x <= hi)
    fin = np.isfinite(y)
    nonfinite = np.flatnonzero(inr & ~fin)
    sel = np.flatnonzero(inr & fin)
    if sel.size == 0:
        none_finite: list[int] = nonfinite.tolist()
        return none_finite
    width = hi - lo
    scale = buckets / width if width > 0 else 0.0
    b = ((x[sel] - lo) * scale).astype(np.int64)
    np.minimum(b, buckets - 1, out=b)
    if (b[1:] < b[:-1]).any():  # x not sorted: group by bucket, index order kept inside
        order = np.argsort(b, kind="stable")
        sel, b = sel[order], b[order]
    starts = np.flatnonzero(np.concatenate(([True], b[1:] != b[:-1])))
    ends = np.concatenate((starts[1:], [b.size]))
    counts = ends - starts
    yy = y[sel]
    parts = [sel[starts], sel[ends - 1], nonfinite]
    for reduce in (np.minimum, np.maximum):
        ext = reduce.reduceat(yy, starts)
        pos = np.flatnonzero(yy == np.repeat(ext, counts))
        parts.append(sel[pos[np.searchsorted(pos, starts)]])
    kept: list[int] = np.unique(np.concatenate(parts)).tolist()
    return kept
