"""The dashboard's charts: one metric of a run cut to a chart's width, and a live page's
new points.

:func:`series` reads the metric's rows per producer from the columnar cache with DuckDB
(``ui/parts.py``) and cuts them to ``width`` buckets over ``[lo, hi]`` with M4: up to
``sql_min`` points in Python (:func:`expr_tracker.history.chartprep.chart_points`, the
preparation ``et plot`` uses too), more by the same M4 in DuckDB (the rows never leave it;
first and last by step, a tie for min or max may pick another of the equal points).
:func:`new_points` answers a live page's poll with the rows past the steps it has.

With ``smooth`` (:mod:`expr_tracker.history.smoothing`: ``ema:W``, ``mean:N``) the whole
raw series is read, smoothed point by point, and then both the raw and the smoothed series
are cut by M4 (:func:`smoothed_trace`): the smoothing never sees downsampled points and a
zoom does not restart it at the zoom's edge.

Non-finite numbers cannot travel in JSON: a trace carries ``y`` with ``None`` there and
lists the point in ``nonfinite`` as ``{"x", "step", "kind": "nan"|"inf"|"-inf"}``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from expr_tracker.history.chartprep import ChartPoints, chart_points, kept_points
from expr_tracker.history.smoothing import Smoothing
from expr_tracker.history.smoothing import smooth as smooth_values
from expr_tracker.query.catalog import Producer
from expr_tracker.query.views import sql_literal
from expr_tracker.ui.errors import BadRequest, NotFound
from expr_tracker.ui.parts import duckdb_cursor, metric_names, metrics_sql
from expr_tracker.ui.runs import producer_label

if TYPE_CHECKING:
    from expr_tracker.ui.catalog import Catalog

__all__ = ["MAX_NEW_ROWS", "MAX_WIDTH", "check_range", "new_points", "parse_float", "series"]

#: most chart buckets a request may ask for (``width``)
MAX_WIDTH = 4000
#: a live poll returning more new rows than this tells the page to reload the charts
MAX_NEW_ROWS = 20_000


def _xsql(x: str) -> tuple[str, str]:
    """(x expression, extra join) for the x axis ``x``."""
    if x == "step":
        return "m.step::DOUBLE", ""
    if x == "time":
        return "m.time", ""
    if x == "relative":  # seconds since the producer's first row
        return "(m.time - (SELECT min(time) FROM src))", ""
    return "s.value", (
        f" JOIN (SELECT step, value FROM src WHERE metric = {sql_literal(x)}) s ON s.step = m.step"
    )


def parse_float(name: str, v: str | None) -> float | None:
    """The query parameter ``name``'s value ``v`` as a finite float (None: not given);
    :class:`~expr_tracker.ui.errors.BadRequest` else."""
    if v is None or v == "":
        return None
    try:
        f = float(v)
    except ValueError:
        raise BadRequest(f"{name}={v!r} is not a number") from None
    if not math.isfinite(f):
        raise BadRequest(f"{name}={v!r} is not a finite number")
    return f


def check_range(lo: float, hi: float, width: int) -> None:
    """BadRequest when ``[lo, hi]`` cannot be cut into ``width`` buckets with finite
    numbers: ``hi - lo`` overflows (``lo=-1e308&hi=1e308``: a point's offset from ``lo``
    may too) or ``width / (hi - lo)`` does (``lo=0&hi=5e-324``: an infinite scale)."""
    span = hi - lo
    if not math.isfinite(span):
        raise BadRequest(
            f"the x range [{lo!r}, {hi!r}] is wider than a float holds: ask a narrower lo/hi"
        )
    if span > 0 and not math.isfinite(width / span):
        raise BadRequest(
            f"the x range [{lo!r}, {hi!r}] is too narrow to cut into {width} buckets: "
            "ask a wider lo/hi"
        )


def series(
    catalog: Catalog,
    run_id: str,
    metric: str,
    *,
    x: str = "step",
    width: int = 1000,
    lo: float | None = None,
    hi: float | None = None,
    sql_min: int = 100_000,
    producer: str | None = None,
    smooth: Smoothing | None = None,
) -> dict:
    """One metric of a run, one trace per producer holding it, downsampled to ``width``
    buckets over ``[lo, hi]`` (default: all of it).

    Returns ``{"metric", "x", "traces": [{"producer", "x", "y", "step", "nonfinite",
    "total"}]}``: ``total`` counts the points in range before downsampling; ``x`` is the
    step, epoch seconds (``time``) or the step metric's value. Up to ``sql_min`` points are
    cut by :func:`expr_tracker.history.downsample.m4`; more by the same M4 in DuckDB (the
    rows never leave it; first and last by step, a tie for min or max may pick another of
    the equal points). ``producer``: only that producer's trace (its label: ``main``,
    ``system/rank8`` ...; the run page's System section draws one node per chart).
    ``smooth``: each trace also has ``smooth`` (``{"x", "y", "step"}``: the smoothed
    series, computed on every raw point, then cut the same way; :func:`smoothed_trace`)
    and the answer names it (``"smooth": "ema:0.9"``).
    """
    if not 1 <= width <= MAX_WIDTH:
        raise BadRequest(f"width={width} is not valid: 1..{MAX_WIDTH}")
    if lo is not None and hi is not None and lo > hi:
        raise BadRequest(f"lo={lo} > hi={hi}")
    if lo is not None and hi is not None:
        check_range(lo, hi, width)
    prods = catalog.get(run_id)
    con = duckdb_cursor()
    traces = []
    try:
        for p in prods:
            if producer is not None and producer_label(p) != producer:
                continue
            sql = metrics_sql(con, catalog, p)
            if sql is None:
                continue
            xexpr, join = _xsql(x)
            where = [f"m.metric = {sql_literal(metric)}", "m.value IS NOT NULL"]
            where.append(f"{xexpr} IS NOT NULL AND isfinite({xexpr})")
            if smooth is not None:
                every = (
                    f"WITH src AS ({sql}) SELECT {xexpr} AS x, m.value AS y, m.step AS step "
                    f"FROM src m{join} WHERE {' AND '.join(where)} ORDER BY step"
                )
                tr = smoothed_trace(p, con.execute(every).fetchnumpy(), smooth, width, lo, hi)
                if tr is not None:
                    traces.append(tr)
                continue
            if lo is not None:
                where.append(f"{xexpr} >= {lo!r}")
            if hi is not None:
                where.append(f"{xexpr} <= {hi!r}")
            sel = (
                f"WITH src AS ({sql}) SELECT {xexpr} AS x, m.value AS y, m.step AS step "
                f"FROM src m{join} WHERE {' AND '.join(where)}"
            )
            pts = f"WITH pts AS ({sel}) "
            n, xmin, xmax = con.execute(f"{pts}SELECT count(*), min(x), max(x) FROM pts").fetchone()
            if n == 0:
                continue
            a = float(xmin) if lo is None else lo
            b = float(xmax) if hi is None else hi
            check_range(a, b, width)
            if n <= sql_min:
                cols = con.execute(f"{pts}SELECT x, y, step FROM pts ORDER BY step").fetchnumpy()
                xs, ys, steps = cols["x"], cols["y"], cols["step"]
                kept = chart_points(xs, ys, width, lo, hi)
            else:
                cols = _m4_sql(con, pts, width, a, b)
                xs, ys, steps = cols["x"], cols["y"], cols["step"]
                kept = kept_points(xs, ys, range(len(xs)))
            traces.append(_trace(p, kept, steps, int(n)))
    finally:
        con.close()
    if not traces and metric not in metric_names(catalog, prods):
        raise NotFound(f"run {run_id!r} has no metric {metric!r}")
    out = {"metric": metric, "x": x, "traces": traces}
    if smooth is not None:
        out["smooth"] = smooth.text
    return out


def smoothed_trace(
    p: Producer, cols: dict, how: Smoothing, width: int, lo: float | None, hi: float | None
) -> dict | None:
    """One producer's trace from all its points (``cols``: numpy ``x``, ``y``, ``step``
    ordered by step) with ``how`` applied to the whole series before both it and the raw
    series are cut to ``width`` buckets over ``[lo, hi]`` (None: all); ``total`` counts the
    points in range. None when no point is in range."""
    xs, ys, steps = cols["x"], cols["y"], cols["step"]
    inr = (xs >= (xs.min() if lo is None else lo)) & (xs <= (xs.max() if hi is None else hi))
    total = int(inr.sum()) if len(xs) else 0
    if total == 0:
        return None
    a = float(xs[inr].min()) if lo is None else lo
    b = float(xs[inr].max()) if hi is None else hi
    check_range(a, b, width)
    tr = _trace(p, chart_points(xs, ys, width, a, b), steps, total)
    sm = chart_points(xs, smooth_values(ys, how), width, a, b)
    tr["smooth"] = {"x": sm.x, "y": sm.y, "step": [int(steps[i]) for i in sm.index]}
    return tr


def _m4_sql(con: Any, pts: str, width: int, lo: float, hi: float) -> dict:
    """M4 of the rows of the CTE ``pts`` (x, y, step; ``pts`` is its ``WITH`` clause) over
    ``[lo, hi]`` in ``width`` buckets, bucketed as
    :func:`~expr_tracker.history.downsample.m4` does, plus every non-finite ``y``, in one
    scan; ``{"x", "y", "step"}`` lists ordered by step."""
    scale = width / (hi - lo) if hi > lo else 0.0
    bucket = f"LEAST(CAST(floor((x - {lo!r}) * {scale!r}) AS BIGINT), {width - 1})"
    row = "{'x': x, 'y': y, 's': step}"
    fin = "FILTER (WHERE isfinite(y))"
    q = (
        f"{pts}SELECT arg_min({row}, step) {fin}, arg_max({row}, step) {fin}, "
        f"arg_min({row}, y) {fin}, arg_max({row}, y) {fin}, "
        f"list({row}) FILTER (WHERE NOT isfinite(y)) "
        f"FROM pts WHERE x BETWEEN {lo!r} AND {hi!r} GROUP BY {bucket}"
    )
    keep: dict[int, tuple[float, float]] = {}
    for first, last, lo_pt, hi_pt, bad in con.execute(q).fetchall():
        for pt in (first, last, lo_pt, hi_pt, *(bad or ())):
            if pt is not None:
                keep[pt["s"]] = (pt["x"], pt["y"])
    steps = sorted(keep)
    return {"x": [keep[st][0] for st in steps], "y": [keep[st][1] for st in steps], "step": steps}


def _trace(p: Producer, pts: ChartPoints, steps: Any, total: int) -> dict:
    """One producer's trace of a chart: the kept points (``y`` None where the value is not
    finite: a gap in the line) and each non-finite point in ``nonfinite``."""
    step = [int(steps[i]) for i in pts.index]
    return {
        "producer": producer_label(p),
        "x": pts.x,
        "y": pts.y,
        "step": step,
        "nonfinite": [{"x": pts.x[j], "step": step[j], "kind": k} for j, k in pts.nonfinite],
        "total": total,
    }


def new_points(
    catalog: Catalog,
    run_id: str,
    after: int,
    x: str = "step",
    since: dict[str, int] | None = None,
    skip_streams: tuple[str, ...] = (),
) -> dict:
    """Rows of every metric with a step above ``after`` (a live page's poll), per metric
    and producer: ``{"max_step", "max_steps", "reset", "metrics": {metric: [trace]}}``.
    ``since`` maps a producer label to its own last step (a rank or stream that lags the
    others, or a stream that stopped, is asked from where it is, not from the run's
    highest step); producers not in it use ``after``. ``max_steps``: each producer's
    highest step (as far as read). ``reset``: more than :data:`MAX_NEW_ROWS` new rows
    (the page reloads its charts instead; ``max_steps`` are then the producers' last
    steps, so the next poll asks only for what comes after the reload). Rows whose x is
    not finite (a NaN step metric) are left out, as :func:`series` leaves them out.
    ``skip_streams``: producers of these streams are not read (the run page's poll leaves
    out ``system``, whose step is the wall time and whose section reloads on its own)."""
    prods = [p for p in catalog.get(run_id) if p.stream not in skip_streams]
    since = since or {}
    con = duckdb_cursor()
    out: dict[str, list[dict]] = {}
    max_steps: dict[str, int] = {}
    reset = False
    try:
        for p in prods:
            sql = metrics_sql(con, catalog, p)
            if sql is None:
                continue
            label = producer_label(p)
            start = int(since.get(label, after))
            max_steps[label] = start
            xexpr, join = _xsql(x)
            q = (
                f"WITH src AS ({sql}) SELECT m.metric AS metric, {xexpr} AS x, m.value AS y, "
                f"m.step AS step FROM src m{join} WHERE m.step > {start} "
                f"AND m.value IS NOT NULL AND {xexpr} IS NOT NULL AND isfinite({xexpr}) "
                f"ORDER BY m.metric, m.step LIMIT {MAX_NEW_ROWS + 1}"
            )
            rows = con.execute(q).fetchall()
            if len(rows) > MAX_NEW_ROWS:
                reset = True
                break
            by: dict[str, list[tuple]] = {}
            for r in rows:
                by.setdefault(r[0], []).append(r)
                max_steps[label] = max(max_steps[label], int(r[3]))
            for m, rs in by.items():
                xs = [r[1] for r in rs]
                ys = [r[2] for r in rs]
                steps = [r[3] for r in rs]
                kept = kept_points(xs, ys, range(len(rs)))
                out.setdefault(m, []).append(_trace(p, kept, steps, len(rs)))
        if reset:  # the page reloads everything: the next poll starts at each one's end
            out = {}
            for p in prods:
                sql = metrics_sql(con, catalog, p)
                if sql is None:
                    continue
                (top,) = con.execute(f"SELECT max(step) FROM ({sql})").fetchone()
                if top is not None:
                    max_steps[producer_label(p)] = int(top)
    finally:
        con.close()
    status = catalog.row(run_id, prods)["status"]  # FileNotFoundError: deleted
    max_step = max([after, *max_steps.values()])
    return {
        "max_step": max_step,
        "max_steps": max_steps,
        "reset": reset,
        "metrics": out,
        "status": status,
    }
