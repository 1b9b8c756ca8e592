"""A sweep over any set of runs: the config keys that vary, one summary metric, and how much
each key matters (docs/compare.md "Sweeps").

:func:`sweep` answers from the ``runs`` SQL view (``query/views.py``: one row per run and
producer; the main stream's lowest rank of each run is used) and returns plain values: the
runs with their varying config values and the metric (``et compare --sweep`` prints the
importance table; the dashboard's sweep page draws the parallel coordinates and the
scatters from the same dict). Importance is the permutation importance of a small random
forest fitted to the runs (scikit-learn, when installed: the ``sweep`` extra), beside the
Pearson and Spearman correlations of each numeric key with the metric (numpy alone).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from expr_tracker.errors import ExprTrackerError

__all__ = ["SweepError", "sweep"]

SKLEARN_HINT = "pip install 'expr-tracker[sweep]'"
#: trees of the forest; permutation repeats
TREES = 100
REPEATS = 10
#: runs with a finite metric the forest needs
MIN_RUNS = 4


class SweepError(ExprTrackerError, ValueError):
    """A sweep that cannot be made: no runs, an unknown metric, a bad filter."""


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _text(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=repr)


def _load(text: Any) -> dict[str, Any]:
    from expr_tracker.history import untrusted
    from expr_tracker.history.values import flatten

    if not isinstance(text, str):
        return {}
    try:
        value = untrusted.load_json_bytes(text)
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {".".join(k): v for k, v in flatten(value).items()}


def _rows(
    root: Path, runs: Sequence[str] | None, group: str | None, where: str | None, cache_dir: Any
) -> list[dict[str, Any]]:
    """One row per run from the ``runs`` view: ``run``, ``path``, ``group``, ``config``
    and ``summary`` (flattened dicts)."""
    from expr_tracker.query.api import connect_retrying
    from expr_tracker.query.views import import_duckdb

    duckdb = import_duckdb()
    con, _ = connect_retrying(root, cache_dir, {"runs"})
    try:
        sql = (
            'SELECT run, path, "group", config, summary FROM runs WHERE stream IS NULL'
            + (' AND "group" = $group' if group is not None else "")
            + (f" AND ({where})" if where else "")
            + " QUALIFY row_number() OVER (PARTITION BY path ORDER BY rank) = 1 ORDER BY run"
        )
        params = {"group": group} if group is not None else {}
        try:
            got = con.execute(sql, params).fetchall()
        except duckdb.Error as exc:
            first = str(exc).strip().splitlines()[0]
            raise SweepError(
                f"where: {where!r} is not a valid SQL condition over the runs view ({first}); "
                'e.g. "config.lr" > 0.001 (et query --schema lists the columns)'
            ) from None
    finally:
        con.close()
    wanted = None
    if runs is not None:
        wanted = {Path(p).resolve() for p in runs}
    out = []
    for run, path, grp, config, summary in got:
        if wanted is not None and Path(path).resolve() not in wanted:
            continue
        out.append(
            {
                "run": run,
                "path": path,
                "group": grp,
                "config": _load(config),
                "summary": _load(summary),
            }
        )
    return out


def _numeric_keys(rows: list[dict[str, Any]]) -> list[str]:
    """The summary keys with a number in some run (not span timings, not ``_step``)."""
    seen: dict[str, None] = {}
    for r in rows:
        for k, v in r["summary"].items():
            if _num(v) and not k.startswith(("_", "time_ms/", "count/")):
                seen.setdefault(k, None)
    return list(seen)


def _default_metric(rows: list[dict[str, Any]]) -> str:
    from expr_tracker.query.compare import goal_from_name

    seen = _numeric_keys(rows)
    for k in seen:
        if goal_from_name(k):
            return k
    if seen:
        return seen[0]
    raise SweepError("metric: these runs have no numeric summary value to sweep over")


def _ranks(a: Any) -> Any:
    """Average ranks (ties share their mean rank), for the Spearman correlation."""
    import numpy as np

    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(len(a))
    ranks[order] = np.arange(len(a), dtype=np.float64)
    _, inv, counts = np.unique(a, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=ranks)
    return sums[inv] / counts[inv]


def _corr(x: Any, y: Any) -> float | None:
    import numpy as np

    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def sweep(
    dir: str | os.PathLike[str] = "runs",
    *,
    runs: Sequence[str | os.PathLike[str]] | None = None,
    metric: str | None = None,
    group: str | None = None,
    where: str | None = None,
    seed: int = 0,
    cache_dir: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """The sweep of the runs under ``dir``: the config keys that vary between them, ``metric``
    per run, and each key's importance and correlation with it.

    Args:
        dir: a folder of runs (a Hydra multirun directory, a project) or one run.
        runs: only these run directories (paths) among them.
        metric: a summary key (flattened: ``val/acc``, ``val/acc.max``); default: the first
            numeric summary key whose name says its direction (``loss``, ``acc``, ...), else
            the first numeric one.
        group: only the runs of this ``group``.
        where: an SQL condition over the ``runs`` view's columns (``"config.lr" > 1e-3``).
        seed: the forest's and the permutations' random seed.
        cache_dir: the query cache's folder (default: beside each run).

    Returns:
        ``{"root", "metric", "goal", "keys": [{"key", "kind": "number"|"bool"|"category",
        "values": [distinct values]}], "runs": [{"run", "path", "group", "config": {key:
        value}, "metric": value or None}], "importance": [{"key", "importance", "std",
        "pearson", "spearman"}], "method": str, "fitted_on": int, "notes": [str], "metrics": [str]}``.
        ``keys`` are the config keys whose values differ (a run without the key counts
        as a value); a run's ``config`` holds its values of them. ``importance``: the mean
        drop of the forest's R² when the key's values are shuffled (``std`` over
        :data:`REPEATS` shuffles), None without scikit-learn or with fewer than
        :data:`MIN_RUNS` runs with a finite metric; sorted by importance, highest first.
        ``metrics``: the numeric summary keys of the runs (what ``metric`` may be).
        Correlations only for number and bool keys (None for categories or a constant).

    Raises:
        SweepError: no runs, an unknown metric (the summary keys there are listed), a bad
            ``where``.
        ImportError: duckdb or pyarrow is missing (the ``query`` extra).
    """
    import numpy as np

    from expr_tracker.query.compare import goal_from_name

    root = Path(dir)
    if not root.exists():
        raise SweepError(f"dir {str(root)!r} does not exist (a folder of runs)")
    rows = _rows(
        root, [os.fspath(r) for r in runs] if runs is not None else None, group, where, cache_dir
    )
    if not rows:
        raise SweepError(f"no runs under {str(root)!r} match (group={group!r}, where={where!r})")
    if metric is None:
        metric = _default_metric(rows)
    known = {k for r in rows for k in r["summary"]}
    if metric not in known:
        import difflib

        close = difflib.get_close_matches(metric, sorted(known), n=3, cutoff=0.5)
        raise SweepError(
            f"metric: {metric!r} is no summary key of these runs"
            + (f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else "")
            + f"; summary keys: {', '.join(sorted(known)[:30]) or 'none'}"
        )
    keys: dict[str, None] = {}
    for r in rows:
        keys.update(dict.fromkeys(r["config"]))
    varying = []
    for k in keys:
        texts = {_text(r["config"][k]) if k in r["config"] else "" for r in rows}
        if len(texts) > 1:
            varying.append(k)
    key_info = []
    columns = []  # per key: the column of the design matrix
    for k in varying:
        vals = [r["config"].get(k) for r in rows]
        present = [v for v in vals if v is not None]
        if present and all(isinstance(v, bool) for v in present):
            kind = "bool"
            col = [float(v) if v is not None else math.nan for v in vals]
        elif present and all(_num(v) for v in present):
            kind = "number"
            col = [float(v) if v is not None else math.nan for v in vals]
        else:
            kind = "category"
            cats = sorted({_text(v) for v in vals})
            col = [float(cats.index(_text(v))) for v in vals]
        if kind == "category":
            distinct = [json.loads(t) for t in sorted({_text(v) for v in present})]
        else:  # numbers in numeric order (1 and 1.0 once)
            distinct = sorted(set(present))
        key_info.append({"key": k, "kind": kind, "values": distinct[:1000]})
        columns.append(col)
    y_all = []
    for r in rows:
        v = r["summary"].get(metric)
        y_all.append(float(v) if _num(v) else None)
    out_runs = [
        {
            "run": r["run"],
            "path": r["path"],
            "group": r["group"],
            "config": {k: r["config"][k] for k in varying if k in r["config"]},
            "metric": y,
        }
        for r, y in zip(rows, y_all, strict=True)
    ]
    fit = [i for i, y in enumerate(y_all) if y is not None and math.isfinite(y)]
    notes = []
    if len(fit) < len(rows):
        notes.append(
            f"{len(rows) - len(fit)} of {len(rows)} runs have no finite {metric} (left out "
            "of the importance and the correlations)"
        )
    y = np.array([y_all[i] for i in fit], dtype=np.float64)
    x = np.array([[c[i] for c in columns] for i in fit], dtype=np.float64).reshape(len(fit), -1)
    table: list[dict[str, Any]] = []
    for j, info in enumerate(key_info):
        pear = spear = None
        if info["kind"] != "category":
            ok = np.isfinite(x[:, j])
            pear = _corr(x[ok, j], y[ok])
            spear = _corr(_ranks(x[ok, j]), _ranks(y[ok])) if pear is not None else None
        table.append(
            {
                "key": info["key"],
                "importance": None,
                "std": None,
                "pearson": pear,
                "spearman": spear,
            }
        )
    method = "permutation importance of a random forest (scikit-learn)"
    if not varying:
        notes.append("no config key varies between these runs")
    elif len(fit) < MIN_RUNS:
        method = "none"
        notes.append(f"importance needs {MIN_RUNS} or more runs with a finite {metric}")
    else:
        try:
            from sklearn.ensemble import RandomForestRegressor
            from sklearn.inspection import permutation_importance
        except ImportError:
            method = "none"
            notes.append(f"importance needs scikit-learn: {SKLEARN_HINT}")
        else:
            forest = RandomForestRegressor(n_estimators=TREES, random_state=seed)
            forest.fit(x, y)
            perm = permutation_importance(forest, x, y, n_repeats=REPEATS, random_state=seed)
            for j, row in enumerate(table):
                row["importance"] = float(perm.importances_mean[j])
                row["std"] = float(perm.importances_std[j])
    table.sort(key=lambda r: (r["importance"] is None, -(r["importance"] or 0.0)))
    return {
        "root": str(root),
        "metric": metric,
        "goal": goal_from_name(metric),
        "keys": key_info,
        "runs": out_runs,
        "importance": table,
        "method": method,
        "fitted_on": len(fit),
        "notes": notes,
        "metrics": _numeric_keys(rows),
    }
