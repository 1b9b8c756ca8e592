"""A series prepared for a chart: what ``et plot`` and ``et ui`` do between reading the
points and drawing them, written once.

- :func:`chart_points` cuts a series to a chart's width with :func:`~expr_tracker.history.
  downsample.m4` (per x bucket the first, last, lowest and highest finite point, and every
  NaN/±inf point) and sorts what it kept into finite points and non-finite ones, each with
  its kind (:func:`nonfinite_kind`: ``nan``, ``inf``, ``-inf``): the line breaks at a
  non-finite point, which a chart marks instead of dropping. :func:`kept_points` does the
  sorting alone, for points cut elsewhere (the dashboard's M4 in DuckDB) or not cut at all
  (a live page's new rows). The dashboard's series (``ui/series.py``) and ``et plot``'s
  views (:func:`series_view`) are both made from it.
- Smoothing (``et plot --smooth``, the dashboard's ``smooth=``) is
  :mod:`expr_tracker.history.smoothing`'s, on the raw series before any cut;
  :func:`drop_nonpositive` leaves out what a log axis cannot show, and
  :func:`column_xy` takes x and y from a :class:`~expr_tracker.history.columns.Column`
  (the step, or seconds since the run's first row).
- :class:`SeriesView` / :func:`series_view`: one series of one ``et plot`` chart with the
  totals its legend shows (``cli/plotrender.py`` draws it).

Pure functions over sequences; imports only ``history/downsample.py`` and
``history/smoothing.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from expr_tracker.history.downsample import bucket_index, m4
from expr_tracker.history.smoothing import Smoothing
from expr_tracker.history.smoothing import smooth as smooth_values

__all__ = [
    "ChartPoints",
    "SeriesView",
    "chart_points",
    "column_xy",
    "drop_nonpositive",
    "kept_points",
    "nonfinite_kind",
    "series_view",
]


def nonfinite_kind(y: float) -> str:
    """The kind of a value that is not a finite number: ``nan``, ``inf`` or ``-inf``."""
    return "nan" if y != y else ("inf" if y > 0 else "-inf")


@dataclass
class ChartPoints:
    """The points of a series kept for a chart, in input order: ``index`` (into the input),
    ``x``, and ``y`` (None where the value is not finite: the line breaks there);
    ``nonfinite`` holds, for each such point, its position in these lists and its kind."""

    index: list[int] = field(default_factory=list)
    x: list[float] = field(default_factory=list)
    y: list[float | None] = field(default_factory=list)
    nonfinite: list[tuple[int, str]] = field(default_factory=list)


def kept_points(xs: Sequence[Any], ys: Sequence[Any], idx: Iterable[int]) -> ChartPoints:
    """The points ``idx`` (ascending) of the series ``(xs[i], ys[i])`` as
    :class:`ChartPoints` (x and y as Python floats)."""
    out = ChartPoints()
    index, px, py, bad = out.index, out.x, out.y, out.nonfinite
    for i in idx:
        y = float(ys[i])
        index.append(i)
        px.append(float(xs[i]))
        if y - y == 0:
            py.append(y)
        else:  # NaN or ±inf: marked, and a gap in the line
            bad.append((len(py), nonfinite_kind(y)))
            py.append(None)
    return out


def chart_points(
    xs: Sequence[Any],
    ys: Sequence[Any],
    buckets: int,
    lo: float | None = None,
    hi: float | None = None,
) -> ChartPoints:
    """The series cut to ``buckets`` x buckets over ``[lo, hi]`` by
    :func:`~expr_tracker.history.downsample.m4` (same arguments and errors), as
    :class:`ChartPoints`."""
    return kept_points(xs, ys, m4(xs, ys, buckets, lo, hi) if len(xs) else ())


def drop_nonpositive(xs: Sequence[Any], ys: Sequence[Any]) -> tuple[Any, Any, int]:
    """``(xs, ys, dropped)`` without the finite values <= 0, which a log axis cannot show
    (NaN and ±inf are kept: a chart marks them); the inputs themselves when none is."""
    keep = [i for i, y in enumerate(ys) if not (y <= 0)]
    dropped = len(ys) - len(keep)
    if not dropped:
        return xs, ys, 0
    return [xs[i] for i in keep], [ys[i] for i in keep], dropped


def column_xy(col: Any, x_mode: str, t0: float | None) -> tuple[Any, Any, int]:
    """x and y sequences of a :class:`~expr_tracker.history.columns.Column` and the points
    left out: x is the step (``step``), or seconds since ``t0`` (``time``; points without
    a ``_time`` left out and counted)."""
    if x_mode == "step":
        return col.steps, col.values, 0
    base = t0 if t0 is not None else 0.0
    xs, ys = [], []
    for t, v in zip(col.times, col.values, strict=True):
        if t == t:
            xs.append(t - base)
            ys.append(v)
    return xs, ys, len(col) - len(xs)


@dataclass
class SeriesView:
    """What one series of one ``et plot`` chart draws: the downsampled finite points and
    the x of each non-finite point (a few per chart column), with totals for the legend."""

    label: str
    points: int = 0  # points of the series in the range (finite or not)
    xs: list[float] = field(default_factory=list)
    ys: list[float] = field(default_factory=list)
    marks: dict[str, list[float]] = field(default_factory=dict)  # nonfinite kind -> xs
    breaks: list[int] = field(default_factory=list)  # i: no line from xs[i - 1] to xs[i]
    counts: dict[str, int] = field(default_factory=dict)  # nonfinite kind -> total
    nonpositive: int = 0  # finite values <= 0 left out on a log axis
    skipped: int = 0  # values that are not numbers
    no_time: int = 0  # points without _time (--x time)
    last: float | None = None
    last_x: float = 0.0


def series_view(
    label: str,
    col: Any,
    *,
    x_mode: str,
    t0: float | None,
    buckets: int,
    lo: float,
    hi: float,
    smooth: Smoothing | None,
    log_y: bool,
    cut: tuple[ChartPoints, dict[str, int]] | None = None,
) -> SeriesView:
    """The :class:`SeriesView` of a column, cut to ``buckets`` columns over ``[lo, hi]``
    (:func:`chart_points`), smoothed (:func:`~expr_tracker.history.smoothing.smooth`, on
    every point, before the cut) when ``smooth`` is given. ``cut``: the points already cut
    (an overlay's, from the runs' summaries: ``history/pyramid.py``, one mark per kind and
    bucket) and the number of NaN/±inf points per kind in range, used instead."""
    view = SeriesView(label, skipped=col.skipped)
    xs, ys, view.no_time = column_xy(col, x_mode, t0)
    if len(ys):
        view.last, view.last_x = ys[-1], xs[-1]
    if smooth is not None:
        ys = smooth_values(ys, smooth)
    if log_y:
        xs, ys, view.nonpositive = drop_nonpositive(xs, ys)
    pts = chart_points(xs, ys, buckets, lo, hi) if cut is None else cut[0]
    kinds = dict(pts.nonfinite)
    seen: set[tuple[str, int]] = set()
    gap = False
    for j, x in enumerate(pts.x):
        y = pts.y[j]
        if y is not None:
            if gap and view.xs:
                view.breaks.append(len(view.xs))  # no line across a NaN/inf
            gap = False
            view.xs.append(x)
            view.ys.append(y)
            continue
        gap = True
        kind = kinds[j]
        view.counts[kind] = view.counts.get(kind, 0) + 1
        # a few marks per chart column: ``buckets`` is a bit less than the plot area's
        # cells, so one per bucket left some cells of a run of NaNs blank (as if finite)
        key = (kind, bucket_index(x, lo, hi, 4 * buckets))
        if key not in seen:
            seen.add(key)
            view.marks.setdefault(kind, []).append(x)
    view.points = len(xs)  # [lo, hi] is the range of every series of the chart
    if cut is not None:
        view.counts = {k: n for k, n in cut[1].items() if n}
    return view
