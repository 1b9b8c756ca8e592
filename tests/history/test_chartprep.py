"""A series prepared for a chart (expr_tracker/history/chartprep.py), the one preparation
`et plot` and the dashboard share: the points M4 keeps, sorted into finite points and
NaN/±inf marks with their kind, and the two consumers drawing the same points."""

from __future__ import annotations

import json
import math

import pytest

from expr_tracker.history.chartprep import (
    chart_points,
    drop_nonpositive,
    kept_points,
    nonfinite_kind,
    series_view,
)
from expr_tracker.history.columns import read_columns
from expr_tracker.history.downsample import m4

NAN, INF = float("nan"), float("inf")


def test_kinds_of_values_that_are_not_numbers():
    assert [nonfinite_kind(v) for v in (NAN, INF, -INF)] == ["nan", "inf", "-inf"]


def test_kept_points_mark_each_non_finite_point_in_place():
    xs = [0, 1, 2, 3, 4]
    ys = [1.0, NAN, 2.0, INF, -INF]
    pts = kept_points(xs, ys, [0, 1, 3, 4])
    assert pts.index == [0, 1, 3, 4]
    assert pts.x == [0.0, 1.0, 3.0, 4.0] and all(type(x) is float for x in pts.x)
    assert pts.y == [1.0, None, None, None]
    assert pts.nonfinite == [(1, "nan"), (2, "inf"), (3, "-inf")]


def test_chart_points_keep_what_m4_keeps():
    xs = list(range(1000))
    ys = [math.sin(i / 10) for i in xs]
    ys[500] = 50.0
    ys[501] = NAN
    pts = chart_points(xs, ys, 20, 0, 999)
    assert pts.index == m4(xs, ys, 20, 0, 999)
    assert 50.0 in pts.y and pts.nonfinite == [(pts.index.index(501), "nan")]
    assert chart_points([], [], 20).index == []


def test_a_log_axis_leaves_out_what_it_cannot_show():
    xs, ys, n = drop_nonpositive([0, 1, 2, 3], [1.0, 0.0, NAN, -2.0])
    assert (xs, n) == ([0, 2], 2) and ys[0] == 1.0 and math.isnan(ys[1])
    same = [1.0, 2.0]
    assert drop_nonpositive([0, 1], same)[1] is same


def test_et_plot_and_the_dashboard_draw_the_same_points(tmp_path):
    pytest.importorskip("duckdb")
    from expr_tracker.ui.catalog import Catalog
    from expr_tracker.ui.series import series

    run = tmp_path / "runs" / "p" / "r"
    run.mkdir(parents=True)
    rows = [{"_step": i, "_time": 1000.0 + i, "x": math.cos(i / 30.0)} for i in range(3000)]
    rows[1234]["x"] = NAN
    rows[2000]["x"] = 9.0
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    col = read_columns(run / "metrics.jsonl", lambda n: n == "x").columns["x"]
    view = series_view(
        "r/x", col, x_mode="step", t0=None, buckets=60, lo=0.0, hi=2999.0, smooth=None,
        log_y=False,
    )  # fmt: skip
    (trace,) = series(Catalog(tmp_path / "runs", tmp_path / "c"), "p/r", "x", width=60)["traces"]
    finite = [(x, y) for x, y in zip(trace["x"], trace["y"], strict=True) if y is not None]
    assert finite == list(zip(view.xs, view.ys, strict=True))
    assert [p["x"] for p in trace["nonfinite"]] == view.marks["nan"] == [1234.0]
