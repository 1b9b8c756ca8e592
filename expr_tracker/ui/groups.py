"""The dashboard's groups of runs (one line and band per group) and its sweep page.

:func:`groups` groups the runs a page names by config keys (``query/stats.py``: ``auto`` is
everything but seed-like keys) and, for one metric, returns each group's centre line and
band (:func:`~expr_tracker.query.stats.group_band`: runs aligned on the step, nothing
interpolated, the band where n >= 2) cut to the chart's width
(:func:`~expr_tracker.query.groups.band_points`). Each run's rows are read from its
columnar cache as every chart's are (``ui/parts.py``); its config as a regular file inside
the served folder. :func:`sweep_page` is :func:`expr_tracker.query.sweep.sweep` over the
served folder (the ``runs`` view); a page cannot hand it SQL (no ``where``: the dashboard
never runs a query text from a request). docs/ui.md "Groups and sweeps".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from expr_tracker.history.values import flatten, json_safe
from expr_tracker.query.views import sql_literal
from expr_tracker.ui.errors import BadRequest, NotFound, Unreadable, why
from expr_tracker.ui.parts import duckdb_cursor, metric_names, metrics_sql

if TYPE_CHECKING:
    from expr_tracker.query.catalog import Producer
    from expr_tracker.ui.catalog import Catalog

__all__ = ["MAX_GROUP_RUNS", "groups", "sweep_page"]

#: most runs one grouped chart may name
MAX_GROUP_RUNS = 1000


def _main(prods: list[Producer]) -> Producer:
    """The producer a run is grouped by: its main stream's lowest rank (else its first)."""
    main = sorted((p for p in prods if p.stream is None), key=lambda p: p.rank)
    return main[0] if main else prods[0]


def _config(catalog: Catalog, p: Producer) -> dict[str, Any]:
    from expr_tracker.history import untrusted

    if p.config is None:
        return {}
    try:
        value = untrusted.read_json(p.config, root=catalog.root_real)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise Unreadable(f"{p.config.name} of {p.run_id!r}: {why(exc)}") from None
    if not isinstance(value, dict):
        return {}
    return {".".join(k): v for k, v in flatten(value).items()}


def groups(
    catalog: Catalog,
    run_ids: list[str],
    by: str,
    *,
    metric: str | None = None,
    agg: str = "mean",
    band: str = "std",
    width: int | None = 1000,
) -> dict:
    """The runs ``run_ids`` grouped by ``by`` (config keys ``a,b`` or ``auto``).

    Returns ``{"group_keys", "groups": [{"label", "values", "runs"}], "metrics": [names]}``;
    with ``metric``, also ``"series": [{"label", "runs", "x", "center", "lo", "hi", "n",
    "nonfinite"}]``, one per group holding the metric: points cut to ``width`` columns
    (None where a value is NaN: no band where n < 2), ``nonfinite`` the NaN/±inf values
    left out of the statistics.

    Raises:
        BadRequest: no runs, too many, a run given twice, a bad ``by``/``agg``/``band``/
            ``width``.
        NotFound: a run that does not exist, or a metric none of the runs has.
    """
    import numpy as np

    from expr_tracker.query.groups import band_points
    from expr_tracker.query.stats import GroupError, group_band, group_runs

    if not run_ids:
        raise BadRequest("give the runs to group: run=A&run=B...")
    if len(run_ids) > MAX_GROUP_RUNS:
        raise BadRequest(f"{len(run_ids)} runs: at most {MAX_GROUP_RUNS} at once")
    if len(set(run_ids)) != len(run_ids):
        raise BadRequest("a run is given twice")
    if width is None:
        width = 1000
    if not 1 <= width <= 4000:
        raise BadRequest(f"width={width} is not valid: 1..4000")
    prods = [_main(catalog.get(r)) for r in run_ids]
    configs = [_config(catalog, p) for p in prods]
    try:
        keys, found = group_runs(configs, by)
    except GroupError as exc:
        raise BadRequest(f"by: {exc}") from None
    out: dict[str, Any] = {
        "group_keys": keys,
        "groups": [
            {"label": g.label, "values": g.values, "runs": [run_ids[i] for i in g.members]}
            for g in found
        ],
        "metrics": sorted(metric_names(catalog, prods)),
    }
    if metric is None:
        return json_safe(out, "string")
    series: list[Any] = [None] * len(prods)
    con = duckdb_cursor()
    try:
        for i, p in enumerate(prods):
            sql = metrics_sql(con, catalog, p)
            if sql is None:
                continue
            cols = con.execute(
                f"WITH src AS ({sql}) SELECT step, value FROM src WHERE metric = "
                f"{sql_literal(metric)} AND value IS NOT NULL ORDER BY step"
            ).fetchnumpy()
            if len(cols["step"]):
                series[i] = (np.asarray(cols["step"]), np.asarray(cols["value"], dtype=float))
    finally:
        con.close()
    if all(s is None for s in series):
        raise NotFound(f"none of the runs has a metric {metric!r}")
    lines = []
    for g in found:
        members = [series[i] for i in g.members if series[i] is not None]
        if not members:
            continue
        try:
            b = group_band(members, agg=agg, band=band)
        except GroupError as exc:
            raise BadRequest(str(exc)) from None
        pts = band_points(b, width)
        lines.append(
            {"label": g.label, "runs": len(members), **pts, "nonfinite": int(b.nonfinite.sum())}
        )
    out.update(metric=metric, agg=agg, band=band, series=lines)
    return json_safe(out, "string")


def sweep_page(catalog: Catalog, run_ids: list[str], metric: str | None, group: str | None) -> dict:
    """The sweep of the served runs (``run_ids``: only those; none: every run served, none
    linked from outside the folder), ``metric``
    explained by the varying config keys: :func:`expr_tracker.query.sweep.sweep`'s dict
    (its ``run`` is the dashboard's run id)."""
    from expr_tracker.query.sweep import SweepError, sweep

    # only the runs the dashboard serves: a run linked from outside the folder is not one
    # (the runs view follows links, as et query does)
    if run_ids:
        paths = [str(_main(catalog.get(r)).run_dir) for r in run_ids]
    else:
        paths = [str(_main(prods).run_dir) for prods in catalog.runs().values() if prods]
    try:
        res = sweep(
            catalog.root,
            runs=paths,
            metric=metric or None,
            group=group or None,
            cache_dir=catalog.cache_dir,
        )
    except SweepError as exc:
        raise BadRequest(str(exc)) from None
    return json_safe(res, "string")
