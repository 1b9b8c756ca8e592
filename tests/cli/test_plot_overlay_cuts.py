"""`et plot`'s overlays of several runs are cut from the runs' summaries
(``history/pyramid.py``, as the dashboard's compare page): every bucket's true minimum and
maximum drawn, the NaN/±inf counted exactly, and the summaries extended, not rebuilt, as
``--follow`` reads more rows (rebuilt when a value was patched or the column re-sorted)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from expr_tracker.cli import plotrender
from expr_tracker.history.chartprep import series_view
from expr_tracker.history.columns import Column


def _column(ys, start=0) -> Column:
    c = Column("loss")
    for i, y in enumerate(ys, start):
        c.add(i, 1e9 + i, y)
    return c


def _src(col: Column):
    return SimpleNamespace(
        label="r", columns=SimpleNamespace(first_time=None), pyramids={}, col=col
    )


def _extremes(xs, ys, lo, hi, buckets):
    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    b = np.minimum(((xs - lo) * buckets / (hi - lo)).astype(int), buckets - 1)
    fin = np.isfinite(ys)
    return {
        int(k): (ys[(b == k) & fin].min(), ys[(b == k) & fin].max()) for k in set(b[fin].tolist())
    }


def test_each_bucket_keeps_its_true_extremes_and_counts():
    rng = np.random.default_rng(3)
    runs = []
    for k in range(3):
        ys = rng.standard_normal(5000 - 1000 * k)
        ys[1234 + k] = 50.0 + k
        ys[2000 + k] = math.nan
        ys[2500] = math.inf if k == 1 else ys[2500]
        runs.append(ys)
    srcs = [_src(_column(ys.tolist())) for ys in runs]
    cols = [(s, s.col) for s in srcs]
    buckets, lo, hi = 60, 0.0, 4999.0
    cuts = plotrender.overlay_cuts(cols, "loss", lo, hi, buckets)
    for (_s, col), cut, ys in zip(cols, cuts, runs, strict=True):
        v = series_view(
            "r/loss", col, x_mode="step", t0=None, buckets=buckets, lo=lo, hi=hi,
            smooth=None, log_y=False, cut=cut,
        )  # fmt: skip
        assert _extremes(v.xs, v.ys, lo, hi, buckets) == _extremes(
            np.arange(ys.size), ys, lo, hi, buckets
        )
        want = {"nan": 1, **({"inf": 1} if ys is runs[1] else {})}
        assert v.counts == want and v.points == ys.size


def test_follow_extends_the_summaries_and_rebuilds_when_values_change():
    col = _column([1.0, 2.0, 3.0])
    src = _src(col)
    p1 = plotrender._pyramid(src, "loss", col)
    for i, y in enumerate([4.0, -7.0, 5.0], 3):
        col.add(i, 0.0, y)
    p2 = plotrender._pyramid(src, "loss", col)
    assert p2 is p1 and p2.n == 6  # extended
    assert (
        plotrender.overlay_cuts([(src, col), (src, col)], "loss", 0, 5, 2)[0][0].y.count(-7.0) == 1
    )
    col.add(5, 0.0, 99.0)  # a patch line of the last step: its value replaced
    p3 = plotrender._pyramid(src, "loss", col)
    assert p3 is not p1 and float(p3.ys[-1]) == 99.0
    col.add(1, 0.0, -5.0)  # a later line of an earlier step: the column is re-sorted
    col.ordered()
    p4 = plotrender._pyramid(src, "loss", col)
    assert p4 is not p3 and float(p4.ys[1]) == -5.0 and p4.n == 6
