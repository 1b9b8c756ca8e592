"""The dashboard's run page, but its charts: the run's line of the runs table, its metrics
and step metrics, config and summary (flattened), its alert events, and its System section
(the ``system`` stream's metrics per node: docs/system.md).

What cannot be read is named in ``error`` and the rest is shown. Small JSON files are read
as untrusted input inside the served folder (:func:`~expr_tracker.history.untrusted.
read_json`), the alert logs as ``history/alertlog.py`` reads them for every reader; the
metrics come from the columnar cache the charts read (``ui/parts.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from expr_tracker.history.alertlog import read_alert_log
from expr_tracker.history.metricdefs import MetricDefs, defs_path_for
from expr_tracker.history.untrusted import read_json
from expr_tracker.history.values import flatten, json_safe
from expr_tracker.query.catalog import Producer
from expr_tracker.query.views import metrics_select
from expr_tracker.ui.errors import BadRequest, Unreadable, why
from expr_tracker.ui.parts import PartsFrom, duckdb_cursor, producer_cache
from expr_tracker.ui.runs import SMALL_MAX, finite_number, producer_label

if TYPE_CHECKING:
    from expr_tracker.ui.catalog import Catalog

__all__ = [
    "ALERTS_MAX",
    "SPAN_PREFIXES",
    "SYSTEM_STREAM",
    "alert_events",
    "config_panel",
    "metric_sections",
    "run_detail",
]

#: the system sampler's stream (docs/system.md): its own section of the run page, on time
SYSTEM_STREAM = "system"

#: the prefixes of the metrics spans make (docs/spans.md): their own section of the run page
SPAN_PREFIXES = ("time_ms/", "count/")

#: the most bytes of an alerts file read
ALERTS_MAX = 64 << 20


def _small(path: Path | None, root: str, errors: list[str]) -> Any:
    """A small JSON file of a run read as untrusted; None (with the reason in ``errors``
    unless it is simply absent) when it cannot be read."""
    if path is None:
        return None
    try:
        return read_json(path, root=root, max_bytes=SMALL_MAX)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:
        errors.append(f"{path.name}: {why(exc)}")
        return None


def _pairs(value: Any) -> list[list[Any]]:
    """``[[dotted key, value], ...]`` of a config or summary (a nested dict; anything else
    has none), values as the page's JSON takes them (NaN and ±inf as strings)."""
    if not isinstance(value, dict):
        return []
    return [[".".join(k), json_safe(v, "string")] for k, v in flatten(value).items()]


def run_detail(
    catalog: Catalog, run_id: str, *, pin: list[str] | None = None, baseline: str | None = None
) -> dict:
    """The run page's data but the series: the runs table's line, metrics (in the order
    they were first logged), their ``sections`` (:func:`metric_sections`: ``pin`` first),
    step metrics, config and summary (flattened), the config panel
    (:func:`config_panel`: defaults, the ``baseline`` run's differences), alert events;
    ``producer_steps`` as far as the columnar cache (which the charts read) reaches;
    ``error`` names every file that could not be read (the rest is shown)."""
    prods = catalog.get(run_id)
    row = catalog.row(run_id, prods)
    root = catalog.root_real
    errors: list[str] = [row["error"]] if row["error"] else []
    con = duckdb_cursor()
    metrics: dict[str, set[str]] = {}
    first: dict[str, tuple[int, int]] = {}  # metric -> (first step, position in the scan)
    producer_steps: dict[str, int] = {}
    system: list[dict] = []  # the System section: one entry per node (docs/system.md)
    try:
        for p in prods:
            try:
                c = producer_cache(catalog, p, "metrics")
            except Unreadable as exc:
                if p.metrics is not None and not any(e.startswith(p.metrics.name) for e in errors):
                    errors.append(str(exc))
                continue
            if c is None:
                continue
            if p.stream == SYSTEM_STREAM:
                system.append(_system_node(con, p, c))
                continue
            (top,) = con.execute(f"SELECT max(step) FROM {PartsFrom(con, c)(c.parts)}").fetchall()[
                0
            ]
            if top is not None:
                producer_steps[producer_label(p)] = int(top)
            sql = metrics_select(p, c.parts, c.merged, PartsFrom(con, c))
            for m, step, pos in _first_logged(con, sql):
                metrics.setdefault(m, set()).add(producer_label(p))
                first[m] = min(first.get(m, (step, pos)), (step, pos))
    finally:
        con.close()
    step_metrics: dict[str, str] = {}
    for p in prods:
        if p.metrics is not None and p.stream != SYSTEM_STREAM:
            defs = MetricDefs()
            raw = _small(defs_path_for(p.metrics), root, errors)
            if raw is not None:
                try:
                    defs.load(raw)
                except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
                    errors.append(f"{defs_path_for(p.metrics).name}: not metric definitions")
            for m in metrics:
                sm = defs.step_metric_of(m)
                if sm and sm in metrics:
                    step_metrics[m] = sm
    main = prods[0]
    config = _small(main.config, root, errors)
    summary = _small(main.summary, root, errors)
    alerts = alert_events(prods, root, errors)
    if producer_steps:
        row["producer_steps"] = producer_steps
    order = sorted(metrics, key=lambda m: (*first[m], m))
    return {
        **row,
        "path": str(main.run_dir),
        "metrics": order,
        "sections": metric_sections(order, pin or []),
        "config_view": config_panel(catalog, run_id, config, main, baseline, errors),
        "step_metrics": step_metrics,
        "x_options": sorted(set(step_metrics.values())),
        "config": _pairs(config),
        "summary": [kv for kv in _pairs(summary) if kv[0][:1] != "_"],
        "alerts": alerts,
        "system": sorted(system, key=lambda n: (n["host"] or "", n["producer"])),
        "has_spans": any(p.spans is not None for p in prods),
        "error": "; ".join(dict.fromkeys(errors)) or None,
    }


def _first_logged(con: Any, sql: str) -> list[tuple[str, int, int]]:
    """``(metric, first step, position)`` of each metric of a producer's rows (``sql``),
    the position of its first row in the file order telling apart metrics first logged at
    the same step (the keys of one ``et.log`` call, in the order given)."""
    rows = con.execute(
        f"SELECT metric, min(step), min(pos) FROM (SELECT metric, step, "
        f"row_number() OVER () AS pos, value, text FROM ({sql})) "
        "WHERE value IS NOT NULL OR text IS NULL GROUP BY metric"
    ).fetchall()
    return [(m, int(s), int(pos)) for m, s, pos in rows]


def metric_sections(order: list[str], pin: list[str]) -> list[dict]:
    """The run page's sections of charts: ``pinned`` (the metrics of ``pin`` the run has,
    in that order), ``metrics`` (the user's metrics, in the order given: first logged),
    ``spans`` (span timings: :data:`SPAN_PREFIXES`), each ``{"name", "metrics"}`` and
    left out when empty; the System section is the run's ``system`` entry."""
    have = set(order)
    pinned = [m for m in dict.fromkeys(pin) if m in have]
    rest = [m for m in order if m not in set(pinned)]
    spans = [m for m in rest if m.startswith(SPAN_PREFIXES)]
    user = [m for m in rest if not m.startswith(SPAN_PREFIXES)]
    out = [{"name": "pinned", "metrics": pinned}, {"name": "metrics", "metrics": user}]
    out.append({"name": "spans", "metrics": spans})
    return [s for s in out if s["metrics"]]


def config_panel(
    catalog: Catalog,
    run_id: str,
    config: Any,
    main: Producer,
    baseline: str | None,
    errors: list[str],
) -> dict:
    """The run page's config view (:func:`expr_tracker.query.configview.config_view`):
    defaults marked from the Hydra overrides in the run's ``run.json`` (read as untrusted
    inside the served folder), and with ``baseline`` (a run id of the catalog) that run's
    values beside them; ``baseline_run`` names it."""
    from expr_tracker.query.configview import config_view, hydra_overrides

    root = catalog.root_real
    info = _small(main.run_file, root, errors)
    if baseline is None:
        view = config_view(config, overrides=hydra_overrides(info))
    else:
        if baseline == run_id:
            raise BadRequest(f"baseline={baseline!r} is the run itself: pick another run")
        bmain = catalog.get(baseline)[0]  # NotFound: no such run
        bcfg = _small(bmain.config, root, errors)
        view = config_view(config, overrides=hydra_overrides(info), baseline=bcfg)
    view["baseline_run"] = baseline
    return json_safe(view, "string")


def _system_node(con: Any, p: Producer, c: Any) -> dict:
    """One node of the System section: the system producer's label, the host its rows
    name (the last one), and its metrics (numbers only)."""
    sql = metrics_select(p, c.parts, c.merged, PartsFrom(con, c))
    names = [
        m
        for (m,) in con.execute(
            f"SELECT DISTINCT metric FROM ({sql}) WHERE value IS NOT NULL ORDER BY metric"
        ).fetchall()
    ]
    host = con.execute(
        f"SELECT text FROM ({sql}) WHERE metric = 'host' AND text IS NOT NULL "
        "ORDER BY step DESC LIMIT 1"
    ).fetchall()
    return {"producer": producer_label(p), "host": host[0][0] if host else None, "metrics": names}


def alert_events(prods: list[Producer], root: str, errors: list[str] | None = None) -> list[dict]:
    """The alert transitions (firing, recovered) of the run's producers, in file order (each
    alert log read as :func:`~expr_tracker.history.alertlog.read_alert_log` reads it, inside
    ``root``; what cannot be read is named in ``errors``, a line that is no record skipped)."""
    out: list[dict] = []
    for p in prods:
        if p.alerts is None:
            continue
        try:
            lines = read_alert_log(p.alerts, root=root, max_bytes=ALERTS_MAX)
        except OSError as exc:
            if errors is not None:
                errors.append(f"{p.alerts.name}: {why(exc)}")
            continue
        for line in lines.records:
            rec = line.record
            if rec.get("kind") != "transition":
                continue  # deliveries are not drawn
            step = rec.get("step", rec.get("_step"))
            metrics = rec.get("metrics")
            out.append(
                {
                    "producer": producer_label(p),
                    "rule": _str(rec.get("rule")),
                    "event": _str(rec.get("event")),
                    "state": _str(rec.get("state")),
                    "level": _str(rec.get("level")),
                    "step": step if type(step) is int else None,
                    "time": finite_number(rec.get("time")),
                    "message": _str(rec.get("message") or rec.get("title")),
                    "metrics": sorted(str(m) for m in metrics) if isinstance(metrics, dict) else [],
                }
            )
    return out


def _str(v: Any) -> str | None:
    return None if v is None else str(v)
