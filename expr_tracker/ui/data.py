"""What the dashboard shows, as plain JSON-able values (no web stack here).

Runs are found with :func:`expr_tracker.query.catalog.discover` and looked up by their
``run_id`` in that list (:class:`Catalog`): a run identifier from a request is never joined
into a path, so nothing outside the served folder can be named. Metric and span rows are
read through the per-producer columnar cache (:func:`expr_tracker.query.cache.refresh`:
only bytes appended since the last request are parsed) with DuckDB, a series is cut to the
chart's width by :func:`expr_tracker.history.downsample.m4` (first, last, min, max per
bucket and every NaN/±inf point). Status is judged as ``et runs`` does
(:mod:`expr_tracker.history.rundirs`).

Non-finite numbers cannot travel in JSON: a series carries ``y`` with ``None`` there and
lists the point in ``nonfinite`` as ``{"x", "step", "kind": "nan"|"inf"|"-inf"}``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from expr_tracker.history.downsample import m4
from expr_tracker.history.metricdefs import read_step_metrics
from expr_tracker.history.rundirs import producer_infos, producer_status, worst_status
from expr_tracker.query.catalog import Producer, discover
from expr_tracker.query.views import import_duckdb, metrics_select, path_literal, sql_literal

#: seconds a discovered run list is reused before the folder is searched again
DISCOVER_TTL = 2.0
#: most chart buckets a request may ask for (``width``)
MAX_WIDTH = 4000
#: a live poll returning more new rows than this tells the page to reload the charts
MAX_NEW_ROWS = 20_000


class NotFound(LookupError):
    """A run, metric or file the request names does not exist (HTTP 404)."""


class BadRequest(ValueError):
    """A malformed query parameter (HTTP 400)."""


def producer_label(p: Producer) -> str:
    """``main``, ``S``, ``main/rank1``, ``S/rank2``: the producer's short name."""
    base = p.stream or "main"
    return base if p.rank == 0 else f"{base}/rank{p.rank}"


#: the file fields of a Producer
FILE_FIELDS = ("metrics", "spans", "alerts", "run_file", "summary", "config", "artifacts")


def _inside(path: Path, root_real: str) -> bool:
    real = os.path.realpath(path)
    return real == root_real or real.startswith(root_real.rstrip(os.sep) + os.sep)


def contained(p: Producer, root: Path) -> Producer | None:
    """``p`` as served from ``root``: None when its run directory resolves outside ``root``
    (a symbolic link out of it), and without the files that resolve outside (a linked
    ``metrics.jsonl``). Discovery follows links, as ``et runs`` does; the dashboard serves
    only what lies inside the folder it was given."""
    root_real = os.path.realpath(root)
    if not _inside(p.run_dir, root_real):
        return None
    outside = {
        f: None
        for f in FILE_FIELDS
        if getattr(p, f) is not None and not _inside(getattr(p, f), root_real)
    }
    return dataclasses.replace(p, **outside) if outside else p


def _gone(prods: list[Producer]) -> None:
    """FileNotFoundError when the run's directory was deleted since it was found."""
    if not prods[0].run_dir.is_dir():
        raise FileNotFoundError(f"run directory {str(prods[0].run_dir)!r} is gone")


class Catalog:
    """The runs under ``root``, re-discovered at most every :data:`DISCOVER_TTL` seconds."""

    def __init__(self, root: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None):
        self.root = Path(root)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._lock = threading.Lock()
        self._runs: dict[str, list[Producer]] = {}
        self._at = -1e18

    def runs(self) -> dict[str, list[Producer]]:
        """run_id -> its producers (sorted as :func:`discover` sorts)."""
        with self._lock:
            now = time.monotonic()
            if now - self._at > DISCOVER_TTL:
                runs: dict[str, list[Producer]] = {}
                for p in discover(self.root):
                    q = contained(p, self.root)
                    if q is not None:
                        runs.setdefault(q.run_id, []).append(q)
                self._runs, self._at = runs, now
            return self._runs

    def get(self, run_id: str) -> list[Producer]:
        """The producers of ``run_id``; :class:`NotFound` when no discovered run has it."""
        prods = self.runs().get(run_id)
        if prods is None:
            self._at = -1e18  # a run created since: look again once
            prods = self.runs().get(run_id)
        if prods is None:
            raise NotFound(f"no run {run_id!r} under the served folder")
        return prods


# ----------------------------------------------------------------------------- DuckDB


_base: Any = None
_base_lock = threading.Lock()


def connect() -> Any:
    """A DuckDB connection (a cursor of one in-memory database of this process: opening a
    database costs milliseconds, a cursor nothing) that reads NaN in Parquet parts."""
    global _base
    with _base_lock:
        if _base is None:
            duckdb = import_duckdb()
            base = duckdb.connect(":memory:")
            try:
                base.execute("SET GLOBAL parquet_can_have_nan = true")
            except Exception:  # noqa: BLE001 - older DuckDB: no pushdown, still right
                base.execute(
                    "SET GLOBAL disabled_optimizers = 'filter_pushdown,statistics_propagation'"
                )
            _base = base
        return _base.cursor()


_names = itertools.count(1)


class _Source:
    """FROM text for Parquet parts (a pyarrow dataset where a path literal cannot be made)."""

    def __init__(self, con: Any) -> None:
        self.con = con

    def __call__(self, parts: Sequence[Path]) -> str:
        lits = [path_literal(Path(p)) for p in parts]
        if all(lit is not None for lit in lits):
            return f"read_parquet([{', '.join(lits)}])"  # type: ignore[arg-type]
        import pyarrow.dataset as ds

        name = f"_ui_parts_{next(_names)}"
        self.con.register(name, ds.dataset([os.path.abspath(p) for p in parts], format="parquet"))
        return name


def _cached(p: Producer, kind: str, cache_dir: Path | None) -> Any:
    from expr_tracker.query.cache import refresh

    path = p.metrics if kind == "metrics" else p.spans
    if path is None:
        return None
    try:
        c = refresh(path, kind, cache_dir=cache_dir)
    except FileNotFoundError:
        return None
    return c if c.parts else None


def _metrics_sql(con: Any, p: Producer, cache_dir: Path | None) -> str | None:
    """A SELECT of the producer's metric rows (the ``metrics`` view's columns), or None."""
    c = _cached(p, "metrics", cache_dir)
    if c is None:
        return None
    return metrics_select(p, c.parts, c.merged, _Source(con))


# ----------------------------------------------------------------------------- runs


def _read_json(path: Path | None) -> Any:
    if path is None:
        return None
    try:
        return json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def run_row(run_id: str, prods: list[Producer], cache_dir: Path | None, con: Any) -> dict:
    """One line of the runs table (FileNotFoundError: the run was deleted)."""
    _gone(prods)
    main = prods[0]
    infos = producer_infos(main.run_dir)
    status = worst_status(producer_status(v) for v in infos.values())
    info = infos.get(main.run_file.name, {}) if main.run_file is not None else {}
    max_step = max_time = None
    producer_steps: dict[str, int] = {}
    for p in prods:
        c = _cached(p, "metrics", cache_dir)
        if c is None:
            continue
        # FILTER: DuckDB 2.0.1 answers max(time) of one Parquet file from its statistics
        # as NaN when parquet_can_have_nan is set; a filter makes it read the values
        s, t = con.execute(
            f"SELECT max(step), max(time) FILTER (WHERE isfinite(time)) "
            f"FROM {_Source(con)(c.parts)}"
        ).fetchone()
        if s is not None:
            producer_steps[producer_label(p)] = int(s)
        if s is not None and (max_step is None or s > max_step):
            max_step = s
        if t is not None and (max_time is None or t > max_time):
            max_time = t
    started = _num(info.get("started_at"))
    ended = _num(info.get("ended_at"))
    if started is not None and ended is not None:
        duration = ended - started
    elif started is not None and max_time is not None:
        duration = max_time - started
    else:
        duration = None
    tags = info.get("tags")
    group = info.get("group")
    return {
        "run": run_id,
        "project": main.project,
        "name": main.name,
        "status": status,
        "steps": int(max_step) + 1 if max_step is not None else None,
        "started_at": started,
        "duration_s": duration,
        "tags": [str(t) for t in tags] if isinstance(tags, list) else [],
        "group": group if isinstance(group, str) else None,
        "producers": [producer_label(p) for p in prods],
        "producer_steps": producer_steps,
    }


def runs_list(catalog: Catalog) -> list[dict]:
    """Every run under the folder (see :func:`run_row`), newest start first; a run
    deleted since it was found is left out."""
    con = connect()
    try:
        rows = []
        for rid, prods in catalog.runs().items():
            try:
                rows.append(run_row(rid, prods, catalog.cache_dir, con))
            except FileNotFoundError:  # deleted since it was found: not listed
                continue
    finally:
        con.close()
    rows.sort(key=lambda r: (-(r["started_at"] or 0.0), r["run"]))
    return rows


def flatten(value: Any, prefix: str = "") -> list[list[Any]]:
    """``[[dotted key, value], ...]`` of nested dicts (lists and scalars are leaves)."""
    out: list[list[Any]] = []
    if isinstance(value, dict) and value:
        for k, v in value.items():
            out.extend(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif prefix:
        out.append([prefix, jsonable(value)])
    return out


def jsonable(v: Any) -> Any:
    """``v`` with non-finite floats as the strings ``NaN``, ``Infinity``, ``-Infinity``."""
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    return v


def run_detail(catalog: Catalog, run_id: str) -> dict:
    """The run page's data but the series: identity, status, metrics, step metrics,
    config and summary (flattened), alert events."""
    prods = catalog.get(run_id)
    con = connect()
    try:
        row = run_row(run_id, prods, catalog.cache_dir, con)
        metrics: dict[str, set[str]] = {}
        for p in prods:
            sql = _metrics_sql(con, p, catalog.cache_dir)
            if sql is None:
                continue
            for (m,) in con.execute(
                f"SELECT DISTINCT metric FROM ({sql}) WHERE value IS NOT NULL OR text IS NULL"
            ).fetchall():
                metrics.setdefault(m, set()).add(producer_label(p))
    finally:
        con.close()
    step_metrics: dict[str, str] = {}
    for p in prods:
        if p.metrics is not None:
            look = read_step_metrics(p.metrics)
            for m in metrics:
                sm = look(m)
                if sm and sm in metrics:
                    step_metrics[m] = sm
    main = prods[0]
    return {
        **row,
        "path": str(main.run_dir),
        "metrics": sorted(metrics),
        "step_metrics": step_metrics,
        "x_options": sorted(set(step_metrics.values())),
        "config": flatten(_read_json(main.config) or {}),
        "summary": [kv for kv in flatten(_read_json(main.summary) or {}) if kv[0][:1] != "_"],
        "alerts": alert_events(prods),
        "has_spans": any(p.spans is not None for p in prods),
    }


def alert_events(prods: list[Producer]) -> list[dict]:
    """The alert transitions (firing, recovered) of the run's producers, in file order."""
    out: list[dict] = []
    for p in prods:
        if p.alerts is None:
            continue
        try:
            lines = p.alerts.read_text("utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict) or rec.get("kind") != "transition":
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
                    "step": step if isinstance(step, int) else None,
                    "time": _num(rec.get("time")),
                    "message": _str(rec.get("message") or rec.get("title")),
                    "metrics": sorted(metrics) if isinstance(metrics, dict) else [],
                }
            )
    return out


def _str(v: Any) -> str | None:
    return None if v is None else str(v)


# ----------------------------------------------------------------------------- series


def _kind(y: float) -> str:
    return "nan" if y != y else ("inf" if y > 0 else "-inf")


def _xsql(x: str) -> tuple[str, str]:
    """(x expression, extra join) for the x axis ``x``."""
    if x == "step":
        return "m.step::DOUBLE", ""
    if x == "time":
        return "m.time", ""
    return "s.value", (
        f" JOIN (SELECT step, value FROM src WHERE metric = {sql_literal(x)}) s ON s.step = m.step"
    )


def parse_float(name: str, v: str | None) -> float | None:
    if v is None or v == "":
        return None
    try:
        f = float(v)
    except ValueError:
        raise BadRequest(f"{name}={v!r} is not a number") from None
    if not math.isfinite(f):
        raise BadRequest(f"{name}={v!r} is not a finite number")
    return f


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
) -> dict:
    """One metric of a run, one trace per producer holding it, downsampled to ``width``
    buckets over ``[lo, hi]`` (default: all of it).

    Returns ``{"metric", "x", "traces": [{"producer", "x", "y", "step", "nonfinite",
    "total"}]}``: ``total`` counts the points in range before downsampling; ``x`` is the
    step, epoch seconds (``time``) or the step metric's value. Up to ``sql_min`` points are
    cut by :func:`expr_tracker.history.downsample.m4`; more by the same M4 in DuckDB (the
    rows never leave it; first and last by step, a tie for min or max may pick another of
    the equal points).
    """
    if not 1 <= width <= MAX_WIDTH:
        raise BadRequest(f"width={width} is not valid: 1..{MAX_WIDTH}")
    if lo is not None and hi is not None and lo > hi:
        raise BadRequest(f"lo={lo} > hi={hi}")
    prods = catalog.get(run_id)
    con = connect()
    traces = []
    try:
        for p in prods:
            sql = _metrics_sql(con, p, catalog.cache_dir)
            if sql is None:
                continue
            xexpr, join = _xsql(x)
            where = [f"m.metric = {sql_literal(metric)}", "m.value IS NOT NULL"]
            where.append(f"{xexpr} IS NOT NULL AND isfinite({xexpr})")
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
            if n <= sql_min:
                cols = con.execute(f"{pts}SELECT x, y, step FROM pts ORDER BY step").fetchnumpy()
                xs, ys, steps = cols["x"], cols["y"], cols["step"]
                idx = m4(xs, ys, width, lo, hi)
            else:
                a = float(xmin) if lo is None else lo
                b = float(xmax) if hi is None else hi
                cols = _m4_sql(con, pts, width, a, b)
                xs, ys, steps = cols["x"], cols["y"], cols["step"]
                idx = list(range(len(xs)))
            traces.append(_trace(p, xs, ys, steps, idx, int(n)))
    finally:
        con.close()
    if not traces and metric not in _metric_names(catalog, prods):
        raise NotFound(f"run {run_id!r} has no metric {metric!r}")
    return {"metric": metric, "x": x, "traces": traces}


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


def _metric_names(catalog: Catalog, prods: list[Producer]) -> set[str]:
    con = connect()
    names: set[str] = set()
    try:
        for p in prods:
            sql = _metrics_sql(con, p, catalog.cache_dir)
            if sql is not None:
                names.update(
                    r[0] for r in con.execute(f"SELECT DISTINCT metric FROM ({sql})").fetchall()
                )
    finally:
        con.close()
    return names


def _trace(p: Producer, xs: Any, ys: Any, steps: Any, idx: list[int], total: int) -> dict:
    ox, oy, ost, bad = [], [], [], []
    for i in idx:
        xv, yv, st = float(xs[i]), float(ys[i]), int(steps[i])
        if math.isfinite(yv):
            ox.append(xv)
            oy.append(yv)
            ost.append(st)
        else:
            bad.append({"x": xv, "step": st, "kind": _kind(yv)})
            ox.append(xv)
            oy.append(None)  # a gap in the line where the value is not a number
            ost.append(st)
    return {
        "producer": producer_label(p),
        "x": ox,
        "y": oy,
        "step": ost,
        "nonfinite": bad,
        "total": total,
    }


def new_points(
    catalog: Catalog,
    run_id: str,
    after: int,
    x: str = "step",
    since: dict[str, int] | None = None,
) -> dict:
    """Rows of every metric with a step above ``after`` (a live page's poll), per metric
    and producer: ``{"max_step", "max_steps", "reset", "metrics": {metric: [trace]}}``.
    ``since`` maps a producer label to its own last step (a rank or stream that lags the
    others, or a stream that stopped, is asked from where it is, not from the run's
    highest step); producers not in it use ``after``. ``max_steps``: each producer's
    highest step (as far as read). ``reset``: more than :data:`MAX_NEW_ROWS` new rows
    (the page reloads its charts instead; ``max_steps`` are then the producers' last
    steps, so the next poll asks only for what comes after the reload). Rows whose x is
    not finite (a NaN step metric) are left out, as :func:`series` leaves them out."""
    prods = catalog.get(run_id)
    since = since or {}
    con = connect()
    out: dict[str, list[dict]] = {}
    max_steps: dict[str, int] = {}
    reset = False
    try:
        for p in prods:
            sql = _metrics_sql(con, p, catalog.cache_dir)
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
                out.setdefault(m, []).append(
                    _trace(p, xs, ys, steps, list(range(len(rs))), len(rs))
                )
        if reset:  # the page reloads everything: the next poll starts at each one's end
            out = {}
            for p in prods:
                sql = _metrics_sql(con, p, catalog.cache_dir)
                if sql is None:
                    continue
                (top,) = con.execute(f"SELECT max(step) FROM ({sql})").fetchone()
                if top is not None:
                    max_steps[producer_label(p)] = int(top)
    finally:
        con.close()
    _gone(prods)
    status = worst_status(producer_status(v) for v in producer_infos(prods[0].run_dir).values())
    max_step = max([after, *max_steps.values()])
    return {
        "max_step": max_step,
        "max_steps": max_steps,
        "reset": reset,
        "metrics": out,
        "status": status,
    }


# ----------------------------------------------------------------------------- spans


def span_breakdown(
    catalog: Catalog, run_id: str, start: int | None = None, stop: int | None = None
) -> dict:
    """Mean, total and count of ``dur_ms`` per span path over steps ``[start, stop)``
    (either bound optional), slowest mean first: ``{"rows": [{"name", "count", "mean_ms",
    "total_ms", "max_ms"}], "start", "stop"}``."""
    prods = catalog.get(run_id)
    con = connect()
    selects = []
    try:
        for p in prods:
            c = _cached(p, "spans", catalog.cache_dir)
            if c is not None:
                selects.append(f"SELECT name, dur_ms, step FROM {_Source(con)(c.parts)}")
        if not selects:
            return {"rows": [], "start": start, "stop": stop}
        where = ["dur_ms IS NOT NULL"]
        if start is not None:
            where.append(f"step >= {int(start)}")
        if stop is not None:
            where.append(f"step < {int(stop)}")
        q = (
            f"SELECT name, count(*), avg(dur_ms), sum(dur_ms), max(dur_ms) FROM "
            f"({' UNION ALL '.join(selects)}) WHERE {' AND '.join(where)} "
            f"GROUP BY name ORDER BY avg(dur_ms) DESC, name"
        )
        rows = [
            {"name": r[0], "count": r[1], "mean_ms": r[2], "total_ms": r[3], "max_ms": r[4]}
            for r in con.execute(q).fetchall()
        ]
    finally:
        con.close()
    return {"rows": jsonable(rows), "start": start, "stop": stop}


def trace_json(catalog: Catalog, run_id: str, start: int | None, stop: int | None) -> dict:
    """The run's Chrome Trace (:func:`expr_tracker.trace.build_trace`) over steps
    ``[start, stop)``."""
    from expr_tracker.trace import build_trace

    prods = catalog.get(run_id)
    if not any(p.spans is not None for p in prods):
        raise NotFound(f"run {run_id!r} has no span file")
    rng = None if start is None and stop is None else (start, stop)
    return build_trace(prods[0].run_dir, step_range=rng)


# ----------------------------------------------------------------------------- compare


def compare(catalog: Catalog, run_ids: list[str]) -> dict:
    """Config and summary differences of the runs (:func:`expr_tracker.query.compare.compare_runs`,
    every key, ``equal`` telling which differ) plus the metrics each run has."""
    from expr_tracker.query.compare import CompareError, compare_runs

    if len(run_ids) < 2:
        raise BadRequest(f"compare needs at least two runs, got {len(run_ids)}")
    if len(set(run_ids)) != len(run_ids):
        raise BadRequest("a run is given twice")
    prods = [catalog.get(r) for r in run_ids]
    try:
        res = compare_runs([p[0].run_dir for p in prods], root=catalog.root, include_equal=True)
    except CompareError as exc:
        raise BadRequest(str(exc)) from None
    for r, rid in zip(res["runs"], run_ids, strict=True):
        r["run"] = rid
    metrics: set[str] = set()
    for ps in prods:
        metrics |= _metric_names(catalog, ps)
    res["metrics"] = sorted(metrics)
    return jsonable(res)
