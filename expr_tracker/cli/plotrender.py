"""The charts of ``et plot``, drawn in the terminal by plotext.

:func:`render_frame` draws one chart per metric with every run a series on it (the x range
shared by the runs, the height shared by the charts unless given); :func:`render_chart`
draws one chart and its legend from the series' views
(:class:`~expr_tracker.history.chartprep.SeriesView`: the points cut to the chart's width
and the non-finite points, prepared as the dashboard's are: ``history/chartprep.py``).
NaN ``✗`` and +inf ``▲`` are marked on the top edge, -inf ``▼`` on the bottom one, and the
legend counts them. Colours (xterm 256-colour codes) only when asked; without them, series
are told apart by their markers.

plotext is handed in (``plt``): ``cli/plot.py`` imports and checks it (``load_plotext``).
"""

from __future__ import annotations

import math
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from expr_tracker.cli import output
from expr_tracker.history.chartprep import SeriesView, column_xy, series_view
from expr_tracker.history.smoothing import Smoothing

#: series colours (xterm 256-colour codes of the 16 basic colours, readable on dark and light)
PALETTE = (12, 10, 9, 14, 13, 11, 6, 5)
#: markers telling series apart without colour
PLAIN_MARKERS = ("•", "+", "x", "o", "*", "#", "@", "%")
NAN_MARK, POS_INF_MARK, NEG_INF_MARK = "✗", "▲", "▼"


def _tick_label(v: float, integer: bool) -> str:
    if integer:
        n = round(v)
        if abs(n) >= 10_000_000:
            if abs(n) >= 1e15:  # past T: 2.5e+16, not 2.5e+07G
                return f"{n:.4g}"
            for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
                if abs(n) >= div:
                    return f"{n / div:.4g}{suffix}"
        return str(n)
    return f"{v:.4g}"


def _x_ticks(lo: float, hi: float, width: int, integer: bool) -> tuple[list[float], list[str]]:
    """Tick positions and labels for ``[lo, hi]``: both ends (so the labels span the data),
    and between them the multiples of a round step (1, 2, 2.5 or 5 times a power of ten;
    a whole number for steps) that keep their distance from the ends."""
    if hi <= lo:
        return [lo], [_tick_label(lo, integer)]
    k = max(2, min(8, width // 12))
    raw = (hi - lo) / (k - 1)
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    if integer:
        step = max(1.0, float(round(step)))
    pos = [lo]
    t = math.ceil((lo + 0.75 * step) / step) * step
    while t < hi - 0.75 * step:
        pos.append(t)
        t += step
    pos.append(hi)
    return pos, [_tick_label(p, integer) for p in pos]


def render_chart(
    plt: Any,
    title: str,
    views: list[SeriesView],
    *,
    width: int,
    height: int,
    lo: float,
    hi: float,
    x_label: str,
    integer_x: bool,
    log_y: bool,
    color: bool,
) -> str:
    """One chart (plotext) and its legend, as text (ANSI colours only when ``color``)."""
    fig = plt.figure
    fig.clear()
    plt.terminal.limit(False, False)
    fig.plot_size(width, height)
    fig.theme("simple" if color else "colorless")
    finite = [y for v in views for y in v.ys]
    if finite:
        y_lo, y_hi = min(finite), max(finite)
    else:
        y_lo, y_hi = (1.0, 10.0) if log_y else (0.0, 1.0)
    clip = not math.isfinite(y_hi - y_lo)  # -1e308 .. 1e308: plotext's scaling overflows
    if clip:  # (to NaN ticks, or a C++ bad_alloc that aborts): draw within +-8e307
        y_lo, y_hi = max(y_lo, -8e307), min(y_hi, 8e307)
    if log_y and y_lo < y_hi < y_lo * 1.001:  # too narrow for plotext's log axis (below)
        y_lo, y_hi = y_lo / 1.01, y_hi * 1.01
    if y_hi <= y_lo:
        pad = abs(y_lo) * 0.1 if y_lo else 1.0
        y_lo, y_hi = (y_lo / 2, y_hi * 2) if log_y else (y_lo - pad, y_hi + pad)
        y_lo, y_hi = max(y_lo, -sys.float_info.max), min(y_hi, sys.float_info.max)  # 1e308
    if log_y and y_hi > 1e308:  # plotext's log ticks (10 ** x) overflow past 1e308
        clip = True
        y_hi = 1e308
        y_lo = min(y_lo, 1e307)
    x_lo, x_hi = (lo, hi) if hi > lo else (lo - 1, hi + 1)
    if log_y:
        # plotext pads a data range narrower than about 1e-5 of its values (a constant lr
        # of 3e-4) by +-1 before taking its log: log10(<= 0), a math domain error. Two
        # blank points at the axis' ends (widened above) keep the data range as wide.
        fig.draw(fig.signal([x_lo, x_lo], [y_lo, y_hi], marker=plt.marker(" ")))
    many = len(views) > 1
    legend = []
    for n, v in enumerate(views):
        colour = PALETTE[n % len(PALETTE)]
        symbol = "braille" if color or not many else PLAIN_MARKERS[n % len(PLAIN_MARKERS)]
        sample = "⣿" if symbol == "braille" else symbol
        pixel = colour if color else None
        if v.xs:
            ys = [min(max(y, y_lo), y_hi) for y in v.ys] if clip else v.ys
            s = fig.signal(v.xs, ys, marker=plt.marker(symbol, pixel=pixel))
            s.lines(True)
            for i in v.breaks:
                s.line(i, False)
            fig.draw(s)
        for kind, mark, y in (
            ("nan", NAN_MARK, y_hi),
            ("inf", POS_INF_MARK, y_hi),
            ("-inf", NEG_INF_MARK, y_lo),
        ):
            xs = v.marks.get(kind)
            if xs:
                fig.draw(fig.signal(xs, [y] * len(xs), marker=plt.marker(mark, pixel=pixel)))
        legend.append(_legend_line(v, sample, colour if color else None, integer_x))
    fig.ruler("x").lim(x_lo, x_hi)
    fig.ruler("y").lim(y_lo, y_hi)
    if log_y:
        fig.ruler("y").scale("log")
    pos, labels = _x_ticks(lo, hi, width, integer_x)
    fig.ruler("x").ticks(pos, labels)
    if len(title) > width:  # plotext drops a title wider than the chart: cut its middle
        head = (width - 1) // 2
        title = title[:head] + "…" + title[len(title) - (width - 1 - head) :]
    fig.title(title)
    fig.label(x_label, "x")
    text = fig.build().string(colorless=not color).rstrip("\n")
    return text + "\n" + "\n".join(legend) + "\n"


def _legend_line(v: SeriesView, sample: str, colour: int | None, integer_x: bool) -> str:
    mark = f"\x1b[38;5;{colour}m{sample}\x1b[0m" if colour is not None else sample
    parts = [f"{v.points} points"]
    if v.last is not None:
        where = f"step {int(v.last_x)}" if integer_x else f"{v.last_x:.6g} s"
        parts.append(f"last {v.last:.6g} at {where}")
    names = {
        "nan": ("NaN", NAN_MARK, "top"),
        "inf": ("+inf", POS_INF_MARK, "top"),
        "-inf": ("-inf", NEG_INF_MARK, "bottom"),
    }
    for kind, (name, m, edge) in names.items():
        if v.counts.get(kind):
            parts.append(f"{v.counts[kind]} {name} ({m} on the {edge} edge)")
    if v.nonpositive:
        parts.append(f"{v.nonpositive} values <= 0 not drawn (log axis)")
    if v.skipped:
        parts.append(f"{v.skipped} non-numeric values not drawn")
    if v.no_time:
        parts.append(f"{v.no_time} points without _time not drawn")
    return f" {mark} {v.label}: " + ", ".join(parts)


@dataclass
class Layout:
    width: int
    height: int | None  # per chart; None: share the terminal's height


def render_frame(
    plt: Any,
    sources: Sequence[Any],
    metrics: list[str],
    *,
    x_mode: str,
    since: int | None,
    smooth: Smoothing | None,
    log_y: bool,
    layout: Layout,
    color: bool,
) -> str:
    """One chart per metric of ``metrics``, each run of ``sources`` (``label`` and
    ``columns``: its :class:`~expr_tracker.history.columns.MetricColumns`) a series on it,
    as text: the frame ``et plot`` prints, and redraws with ``--follow``."""
    if not metrics:
        return "(no data to plot yet)\n"
    width = layout.width
    nlines = len(sources) + 1
    if layout.height is not None:
        height = layout.height
    else:
        rows = shutil.get_terminal_size((100, 30)).lines
        height = max(10, (rows - 1) // len(metrics) - nlines)
    charts = []
    integer_x = x_mode == "step"
    buckets = max(1, width - 8)
    for metric in metrics:
        cols = []
        for src in sources:
            col = src.columns.columns.get(metric)
            if col is not None:
                cols.append((src, col.ordered()))
        lo = hi = None
        for src, col in cols:
            xs, _, _ = column_xy(col, x_mode, src.columns.first_time)
            if len(xs):
                a, b = (xs[0], xs[-1]) if x_mode == "step" else (min(xs), max(xs))
                lo = a if lo is None else min(lo, a)
                hi = b if hi is None else max(hi, b)
        if lo is None:
            lo = hi = float(since or 0)
        cuts: list[Any] = [None] * len(cols)
        if len(cols) > 1 and x_mode == "step" and smooth is None and not log_y:
            cuts = overlay_cuts(cols, metric, float(lo), float(hi), buckets)
        views = [
            series_view(
                f"{src.label}/{output.printable(metric)}",
                col,
                x_mode=x_mode,
                t0=src.columns.first_time,
                buckets=buckets,
                lo=float(lo),
                hi=float(hi),
                smooth=smooth,
                log_y=log_y,
                cut=cut,
            )
            for (src, col), cut in zip(cols, cuts, strict=True)
        ]
        title = output.printable(metric)
        if smooth is not None:
            title += f" ({smooth.label})"
        charts.append(
            render_chart(
                plt,
                title,
                views,
                width=width,
                height=height,
                lo=float(lo),
                hi=float(hi),
                x_label="step" if integer_x else "seconds since the run's first row",
                integer_x=integer_x,
                log_y=log_y,
                color=color,
            )
        )
    return "".join(charts)


def _pyramid(src: Any, metric: str, col: Any) -> Any:
    """The summaries (``history/pyramid.py``) of ``src``'s column ``col`` of ``metric``
    (ordered by step), kept on ``src`` (its ``pyramids``) and extended with the rows
    ``--follow`` appended since the last frame; rebuilt when the columns were read again
    (a file rewritten) or re-sorted (a step out of order), or the last value was patched."""
    from expr_tracker.history.pyramid import Pyramid

    keep = getattr(src, "pyramids", None)
    n = len(col)
    had = keep.get(metric) if keep is not None else None
    if had is not None:
        columns, steps, h_n, last, pyr = had
        if columns is src.columns and steps is col.steps and h_n <= n:
            same = h_n == 0 or _same_float(col.values[h_n - 1], last)
            if same and h_n == n:
                return pyr
            if same:
                pyr.extend(col.steps[h_n:], col.values[h_n:])
                keep[metric] = (src.columns, col.steps, n, col.values[n - 1], pyr)  # type: ignore[index]
                return pyr
    pyr = Pyramid(col.steps, col.values)
    if keep is not None:
        keep[metric] = (src.columns, col.steps, n, col.values[n - 1] if n else None, pyr)
    return pyr


def _same_float(a: float, b: Any) -> bool:
    return a == b or (a != a and b != b)


def overlay_cuts(
    cols: Sequence[tuple[Any, Any]], metric: str, lo: float, hi: float, buckets: int
) -> list[tuple[Any, dict[str, int]]]:
    """Each run's points of an overlay (``cols``: ``(source, column)`` pairs, x the step)
    cut to ``buckets`` over ``[lo, hi]`` from the runs' summaries, all runs queried together
    (:func:`expr_tracker.history.pyramid.query_many`: per bucket the true first, minimum,
    maximum and last point and a mark per kind of NaN/±inf, as the dashboard's compare page
    draws them), with the NaN/±inf counts in range for the legend."""
    from expr_tracker.history.pyramid import pixel_points, query_many

    pyrs = [_pyramid(src, metric, col) for src, col in cols]
    out = []
    for p, q in zip(pyrs, query_many(pyrs, lo, hi, buckets), strict=True):
        counts = {"nan": int(q["nan"].sum()), "inf": int(q["pinf"].sum())}
        counts["-inf"] = int(q["ninf"].sum())
        out.append((pixel_points(p, q), counts))
    return out


#: the marker of a band's edges (the centre line is drawn as the series are)
BAND_MARK = "·"
#: what each band is called in the legend
BAND_NAMES = {
    "minmax": "min–max",
    "std": "± std",
    "sem": "± standard error",
    "ci": "95 % bootstrap CI",
    "none": "no band",
}


def render_group_frame(
    plt: Any,
    sources: Sequence[Any],
    groups: Sequence[Any],
    metrics: list[str],
    *,
    agg: str,
    band: str,
    smooth: Smoothing | None,
    log_y: bool,
    layout: Layout,
    color: bool,
    seed: int = 0,
) -> str:
    """One chart per metric with one line per group of runs (``groups``: each with
    ``label`` and ``members``, indexes into ``sources``), its ``agg`` line and ``band``
    (``query/stats.py``: runs aligned on the step, nothing interpolated; the band where at
    least two runs have a finite value). Smoothing, when asked, is applied to each run's
    raw series before the runs are aggregated. A legend line per group says its runs, the
    band, the range of runs per step and the non-finite values left out."""
    import numpy as np

    from expr_tracker.history.smoothing import smooth as smooth_values
    from expr_tracker.query.groups import band_points
    from expr_tracker.query.stats import group_band

    if not metrics:
        return "(no data to plot yet)\n"
    width = layout.width
    if layout.height is not None:
        height = layout.height
    else:
        rows = shutil.get_terminal_size((100, 30)).lines
        height = max(10, (rows - 1) // len(metrics) - len(groups) - 1)
    buckets = max(1, width - 8)
    charts = []
    for metric in metrics:
        views = []
        lo = hi = None
        for g in groups:
            series = []
            for i in g.members:
                col = sources[i].columns.columns.get(metric)
                if col is None or not len(col):
                    continue
                col = col.ordered()
                ys = smooth_values(col.values, smooth) if smooth is not None else col.values
                series.append((np.frombuffer(col.steps, dtype=np.int64), np.asarray(ys)))
            if not series:
                continue
            b = group_band(series, agg=agg, band=band, seed=seed)
            below = 0
            if log_y:
                for arr in (b.center, b.lo, b.hi):
                    bad = np.isfinite(arr) & (arr <= 0)
                    below += int(bad.sum())
                    arr[bad] = np.nan
            pts = band_points(b, buckets)
            if pts["x"]:
                lo = pts["x"][0] if lo is None else min(lo, pts["x"][0])
                hi = pts["x"][-1] if hi is None else max(hi, pts["x"][-1])
            views.append((g, len(series), b, pts, below))
        if lo is None:
            lo = hi = 0.0
        charts.append(
            _group_chart(
                plt,
                metric,
                views,
                width,
                height,
                float(lo),
                float(hi),
                log_y,
                color,
                agg,
                band,
                smooth,
            )
        )
    return "".join(charts)


def _group_chart(
    plt: Any,
    metric: str,
    views: list[Any],
    width: int,
    height: int,
    lo: float,
    hi: float,
    log_y: bool,
    color: bool,
    agg: str,
    band: str,
    smooth: Smoothing | None,
) -> str:
    fig = plt.figure
    fig.clear()
    plt.terminal.limit(False, False)
    fig.plot_size(width, height)
    fig.theme("simple" if color else "colorless")
    finite = [
        y
        for _, _, _, p, _ in views
        for key in ("center", "lo", "hi")
        for y in p[key]
        if y is not None
    ]
    y_lo, y_hi = (min(finite), max(finite)) if finite else ((1.0, 10.0) if log_y else (0.0, 1.0))
    if y_hi <= y_lo:
        pad = abs(y_lo) * 0.1 if y_lo else 1.0
        y_lo, y_hi = (y_lo / 2, y_hi * 2) if log_y else (y_lo - pad, y_hi + pad)
    x_lo, x_hi = (lo, hi) if hi > lo else (lo - 1, hi + 1)
    legend = []
    for k, (g, nruns, b, pts, below) in enumerate(views):
        colour = PALETTE[k % len(PALETTE)]
        symbol = "braille" if color or len(views) == 1 else PLAIN_MARKERS[k % len(PLAIN_MARKERS)]
        sample = "⣿" if symbol == "braille" else symbol
        pixel = colour if color else None
        for key, mark in (("lo", BAND_MARK), ("hi", BAND_MARK), ("center", symbol)):
            xs = [x for x, y in zip(pts["x"], pts[key], strict=True) if y is not None]
            ys = [y for y in pts[key] if y is not None]
            if xs:
                s = fig.signal(xs, ys, marker=plt.marker(mark, pixel=pixel))
                s.lines(key == "center")
                fig.draw(s)
        legend.append(
            _group_legend(g, nruns, b, sample, colour if color else None, agg, band, below)
        )
    fig.ruler("x").lim(x_lo, x_hi)
    fig.ruler("y").lim(y_lo, y_hi)
    if log_y:
        fig.ruler("y").scale("log")
    pos, labels = _x_ticks(lo, hi, width, True)
    fig.ruler("x").ticks(pos, labels)
    title = f"{output.printable(metric)}: {agg}, {BAND_NAMES[band]}"
    if smooth is not None:
        title += f" ({smooth.label} per run)"
    if len(title) > width:
        head = (width - 1) // 2
        title = title[:head] + "…" + title[len(title) - (width - 1 - head) :]
    fig.title(title)
    fig.label("step", "x")
    text = fig.build().string(colorless=not color).rstrip("\n")
    return text + "\n" + "\n".join(legend) + "\n"


def _group_legend(
    g: Any, nruns: int, b: Any, sample: str, colour: int | None, agg: str, band: str, below: int
) -> str:
    import numpy as np

    mark = f"\x1b[38;5;{colour}m{sample}\x1b[0m" if colour is not None else sample
    parts = [f"{nruns} run{'s' if nruns != 1 else ''}"]
    n = b.n[b.n > 0]
    if len(n):
        lo_n, hi_n = int(n.min()), int(n.max())
        parts.append(f"n per step {lo_n}" + (f"–{hi_n}" if hi_n != lo_n else ""))
    fin = np.flatnonzero(np.isfinite(b.center))
    if len(fin):
        j = fin[-1]
        parts.append(f"last {agg} {b.center[j]:.6g} at step {int(b.x[j])}")
        if np.isfinite(b.lo[j]):
            parts.append(f"band {b.lo[j]:.6g} … {b.hi[j]:.6g}")
    if band != "none" and len(n) and int(n.max()) < 2:
        parts.append("no band (one run per step)")
    bad = int(b.nonfinite.sum())
    if bad:
        parts.append(f"{bad} NaN/inf values left out")
    if below:
        parts.append(f"{below} values <= 0 not drawn (log axis)")
    return f" {mark} {output.printable(g.label)}: " + ", ".join(parts)
