"""The dashboard's overlay of many runs: one metric of N runs cut to a chart's width from
the runs' multi-resolution summaries (docs/ui.md "Overlays of many runs: exact at any
zoom").

:func:`overlay` answers ``/api/overlay``: per run and producer holding the metric, the
points to draw (per pixel the true first, minimum, maximum and last finite point, in step
order, and a marker per kind of non-finite value the pixel holds) and the per-pixel
summaries themselves (minimum, maximum, first, last, count, NaN, +inf and -inf counts), read
from the summaries kept in each producer's query cache
(:func:`expr_tracker.query.pyramids.metric_pyramid`): O(pixels) data per run whatever its
length, no extreme and no non-finite point dropped. x is the step; the compare page asks
``/api/series`` instead for another x axis or a smoothed series (smoothing is computed on
the raw series).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from expr_tracker.history import pyramid as pm
from expr_tracker.ui.errors import BadRequest, NotFound, Unreadable
from expr_tracker.ui.parts import PartsFrom, duckdb_cursor, producer_cache
from expr_tracker.ui.runs import producer_label
from expr_tracker.ui.series import MAX_WIDTH, check_range

if TYPE_CHECKING:
    from expr_tracker.ui.catalog import Catalog

__all__ = ["MAX_RUNS", "overlay"]

#: most runs one overlay may ask for
MAX_RUNS = 500


def _num(a: np.ndarray, empty: np.ndarray) -> list[Any]:
    return [None if e else float(v) for v, e in zip(a.tolist(), empty.tolist(), strict=True)]


def overlay(
    catalog: Catalog,
    run_ids: list[str],
    metric: str,
    *,
    width: int = 1000,
    lo: float | None = None,
    hi: float | None = None,
    pixels: bool = False,
) -> dict:
    """``metric`` of each run of ``run_ids`` over ``[lo, hi]`` (steps; default: from the
    first to the last step of any of them) in ``width`` pixels.

    Returns ``{"metric", "x": "step", "lo", "hi", "width", "runs": [{"run", "traces":
    [trace]}]}``; a trace is ``{"producer", "x", "y", "nonfinite", "total"}``: ``x``/``y``
    the points to draw (``x`` the step; ``y`` None at a non-finite marker, each listed in
    ``nonfinite`` as ``{"x", "step", "kind"}``), ``total`` the rows in range; with
    ``pixels`` also ``"pixels"``, the per-pixel summaries of the pixels holding a row: ``i`` (pixel
    number; pixel ``i`` covers ``[lo + i*(hi-lo)/width, lo + (i+1)*(hi-lo)/width)``, the last
    one also ``hi``), ``min``/``max``/``first``/``last`` (of the finite values; None when
    none), ``count`` (finite values), ``nan``/``pinf``/``ninf``. A run without the metric
    has no trace; a run whose file cannot be read has none either, and its ``"problem"``
    says why (the overlay of the other runs is still answered).

    Raises :class:`~expr_tracker.ui.errors.BadRequest` (no run, too many, one twice, a bad
    width or range), :class:`~expr_tracker.ui.errors.NotFound` (an unknown run, or no run
    has the metric), :class:`~expr_tracker.ui.errors.Unreadable` (every run asked unreadable).
    """
    if not run_ids:
        raise BadRequest("an overlay needs at least one run (run=...)")
    if len(run_ids) > MAX_RUNS:
        raise BadRequest(f"{len(run_ids)} runs asked: at most {MAX_RUNS}")
    if len(set(run_ids)) != len(run_ids):
        raise BadRequest("a run is given twice")
    if not 1 <= width <= MAX_WIDTH:
        raise BadRequest(f"width={width} is not valid: 1..{MAX_WIDTH}")
    if lo is not None and hi is not None:
        if lo > hi:
            raise BadRequest(f"lo={lo} > hi={hi}")
        check_range(lo, hi, width)
    from expr_tracker.query.pyramids import metric_pyramid

    found: list[tuple[str, str, pm.Pyramid, Any]] = []
    problems: dict[str, str] = {}  # one unreadable run is named, never fails the overlay
    con = duckdb_cursor()
    try:
        for rid in run_ids:
            for p in catalog.get(rid):
                try:
                    c = producer_cache(catalog, p, "metrics")
                except Unreadable as exc:
                    problems[rid] = str(exc)
                    continue
                if c is None:
                    continue

                def build(con: Any, distrust: bool, c: Any = c, p: Any = p) -> pm.Pyramid:
                    return metric_pyramid(
                        c,
                        p,
                        metric,
                        con,
                        PartsFrom(con, c),
                        root=catalog.root_real,
                        distrust=distrust,
                    )

                pyr = build(con, False)
                if pyr.n:
                    found.append((rid, producer_label(p), pyr, build))
    finally:
        con.close()
    if not found:
        if problems and len(problems) == len(run_ids):
            raise Unreadable("; ".join(problems.values()))
        raise NotFound(f"no run of {', '.join(map(repr, run_ids[:5]))} has a metric {metric!r}")
    a = float(min(f[2].xs[0] for f in found)) if lo is None else lo
    b = float(max(f[2].xs[-1] for f in found)) if hi is None else hi
    if a > b:  # one end given, past the other end of the runs' steps
        raise BadRequest(f"the x range [{a!r}, {b!r}] is empty: lo must be <= hi")
    check_range(a, b, width)
    answers = pm.query_many([f[2] for f in found], a, b, width)
    by_run: dict[str, list[dict]] = {rid: [] for rid in run_ids}
    for k, (rid, label, pyr, build) in enumerate(found):
        q = answers[k]
        try:
            pts = pm.pixel_points(pyr, q)
        except pm.PyramidError:  # a file whose numbers are not its rows: rebuilt
            con = duckdb_cursor()
            try:
                pyr = build(con, True)
            finally:
                con.close()
            q = pm.query_many([pyr], a, b, width)[0]
            pts = pm.pixel_points(pyr, q)
        by_run[rid].append(_trace(label, pyr, q, pts, pixels))
    return {
        "metric": metric,
        "x": "step",
        "lo": a,
        "hi": b,
        "width": width,
        "runs": [
            {
                "run": rid,
                "traces": by_run[rid],
                **({"problem": problems[rid]} if rid in problems else {}),
            }
            for rid in run_ids
        ],
    }


def _trace(label: str, pyr: pm.Pyramid, q: dict[str, np.ndarray], pts: Any, pixels: bool) -> dict:
    xs = pts.x
    out = {
        "producer": label,
        "x": xs,
        "y": pts.y,
        "nonfinite": [{"x": xs[j], "step": int(xs[j]), "kind": k} for j, k in pts.nonfinite],
        "total": int(q["stop"][-1] - q["start"][0]) if len(q["start"]) else 0,
    }
    if not pixels:
        return out
    held = np.flatnonzero(q["stop"] > q["start"])
    none = q["count"][held] == 0
    ys = np.asarray(pyr.ys)

    def at(rows: np.ndarray) -> list[Any]:
        return _num(ys[np.where(rows >= 0, rows, 0)], rows < 0)

    out["pixels"] = {
        "i": held.tolist(),
        "min": _num(q["min"][held], none),
        "max": _num(q["max"][held], none),
        "first": at(q["ifirst"][held]),
        "last": at(q["ilast"][held]),
        "count": q["count"][held].tolist(),
        "nan": q["nan"][held].tolist(),
        "pinf": q["pinf"][held].tolist(),
        "ninf": q["ninf"][held].tolist(),
    }
    return out
