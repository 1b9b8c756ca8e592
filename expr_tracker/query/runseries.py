"""Past runs as whole series of a few metrics, read from the columnar cache, and labelled:
what ``et rules backtest`` evaluates rules over (docs/alerts.md "Backtesting").

:func:`labelled_runs` finds the runs under a folder as ``et runs`` and ``et query`` do
(:func:`~expr_tracker.query.catalog.discover`), one per run directory: its main stream's
rank 0 (the producer whose rules alert by default). :func:`read_series` refreshes that
producer's Parquet cache (:func:`~expr_tracker.query.cache.refresh`: only new JSONL lines
are decoded) and reads, with DuckDB, every step in commit order with its time, and the
values of the metrics asked for, patch lines merged as every reader merges them (per
(step, metric) the later line wins; a step's time is its last line's). Arrays, shapes
``(R,)`` for R steps:

- ``steps`` int64, ``times`` float64 (NaN for a line without a numeric ``_time``);
- ``columns[name] = (present bool, values float64)``: ``present`` where the step recorded a
  number (an int, float or bool: as the alert engine records it; NaN and ±inf kept), False
  where it recorded nothing, text, null, a list or a dict.

A line holding nothing but ``_step``/``_time`` (a ``log({})`` commit) gives no row in the
cache, so it is not a step here.

Labels (:func:`run_label`): the run's status (``--label status``, the default: ``failed``,
``crashed`` and ``diverged`` are bad, ``finished`` fine, anything else unlabelled), or any
column of the ``runs`` view (``summary.diverged``, ``config.lr``, ``tags``...), also named
without its ``summary.``/``config.`` prefix: true, non-zero, or one of ``failed``,
``crashed``, ``diverged``, ``bad``, ``true``, ``yes`` is bad; false, zero, ``finished``,
``ok``, ``good``, ``false``, ``no`` is fine; anything else (missing, NULL) unlabelled.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from expr_tracker.errors import ExprTrackerError
from expr_tracker.query.catalog import Producer, discover
from expr_tracker.query.tables import Problems, runs_table
from expr_tracker.query.views import cache_of, import_duckdb, quiet

__all__ = [
    "BAD",
    "FINE",
    "LabelError",
    "RunSeries",
    "iter_series",
    "run_label",
    "labelled_runs",
    "read_series",
]

#: status words read as a bad outcome / a good one (case-insensitive)
BAD = frozenset({"failed", "crashed", "diverged", "bad", "true", "yes"})
FINE = frozenset({"finished", "ok", "good", "false", "no"})


class LabelError(ExprTrackerError, ValueError):
    """``--label`` names no column of the runs (the message lists close ones)."""


@dataclass
class RunSeries:
    """One run to backtest: its identity, label and (after :func:`read_series`) series."""

    run: str
    path: Path
    status: str
    label: bool | None  # True: bad outcome, False: fine, None: unlabelled
    label_value: Any
    producer: Producer
    steps: Any = None
    times: Any = None
    columns: dict[str, tuple[Any, Any]] = field(default_factory=dict)


def run_label(value: Any) -> bool | None:
    """Bad (True), fine (False) or unlabelled (None), as the module doc says."""
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        if isinstance(value, float) and math.isnan(value):
            return None
        return value != 0
    text = str(value).strip().lower()
    if text in BAD:
        return True
    if text in FINE:
        return False
    return None


def _label_column(names: list[str], label: str) -> str:
    if label == "status":
        return "run_status"
    lower = {n.lower(): n for n in names}
    for want in (label, f"summary.{label}", f"config.{label}"):
        if want.lower() in lower:
            return lower[want.lower()]
    close = difflib.get_close_matches(label, names, n=3)
    hint = f"; close: {', '.join(close)}" if close else ""
    raise LabelError(
        f"--label {label!r}: no run has such a column (status, a run.json field, or a "
        f"summary.*/config.* key){hint}"
    )


def labelled_runs(
    root: str | os.PathLike[str], *, label: str = "status", problems: Problems | None = None
) -> list[RunSeries]:
    """The runs under ``root`` (one per run directory: the main stream's rank 0 producer
    with a metrics file), each with its status and label, series not read yet.

    Raises ``FileNotFoundError`` when ``root`` is not a folder, :class:`LabelError` when
    ``label`` names no column."""
    problems = problems if problems is not None else Problems()
    chosen: dict[Path, Producer] = {}
    for p in discover(root):
        if p.metrics is None:
            continue
        best = chosen.get(p.run_dir)
        key = (p.stream is not None, p.rank)
        if best is None or key < (best.stream is not None, best.rank):
            chosen[p.run_dir] = p
    producers = list(chosen.values())
    if not producers:
        return []
    table = runs_table(producers, {}, problems)
    column = _label_column(table.column_names, label)
    statuses = table.column("run_status").to_pylist()
    values = table.column(column).to_pylist()
    out = []
    for p, status, value in zip(producers, statuses, values, strict=True):
        if column == "run_status":
            low = str(value).lower()
            lab = (
                True
                if low in ("failed", "crashed", "diverged")
                else (False if low == "finished" else None)
            )
        else:
            lab = run_label(value)
        out.append(RunSeries(p.run_id, p.run_dir, status, lab, value, p))
    return out


def read_series(
    run: RunSeries,
    names: Iterable[str],
    *,
    con: Any = None,
    cache_dir: Path | None = None,
    problems: Problems | None = None,
) -> bool:
    """Fill ``run.steps``, ``run.times`` and ``run.columns`` (the metrics ``names`` the run
    has) from its cache. Returns False (with the reason in ``problems``) when the run's
    metrics cannot be read. ``con``: a DuckDB connection to reuse across runs.

    A cache whose steps each lie in one line (:attr:`CachedSource.merged`, the usual case)
    is read with pyarrow and numpy: a row per line. Otherwise DuckDB merges the patch lines
    (a window per (step, metric), the later line winning), as the ``metrics`` view does."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    problems = problems if problems is not None else Problems()
    cached, _ = cache_of(run.producer, "metrics", cache_dir, problems)
    if cached is None:
        return False
    columns = ["step", "time", "metric", "value", "line"]
    sources = [pa.BufferReader(b) for b in cached.memory] or [os.fspath(p) for p in cached.parts]
    try:
        tables = [
            pq.read_table(src, columns=columns, read_dictionary=["metric"]) for src in sources
        ]
    except (OSError, pa.ArrowInvalid) as exc:
        what = run.producer.metrics.name if run.producer.metrics else "metrics"
        problems.add(run.producer, f"{what}: cannot be read ({exc})")
        return False
    table = pa.concat_tables(tables).unify_dictionaries() if tables else None
    wanted = sorted(set(names))
    if table is None or table.num_rows == 0:
        _fill(run, [], [], {}, wanted)
        return True
    if cached.merged:
        _read_merged(run, table, wanted)
    else:
        _read_patched(run, table, wanted, con)
    return True


def _fill(run: RunSeries, steps: Any, times: Any, columns: dict, names: list[str]) -> None:
    import numpy as np

    run.steps = np.ascontiguousarray(steps, dtype=np.int64)
    run.times = np.ascontiguousarray(times, dtype=np.float64)
    run.columns = columns


def _numbers(col: Any, fill: float) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    if col.type != pa.float64():
        col = col.cast(pa.float64())
    if col.null_count:
        col = pc.fill_null(col, fill)
    return col.to_numpy()


def _read_merged(run: RunSeries, table: Any, names: list[str]) -> None:
    """One line per step: the rows are the lines holding an integer ``_step``, in order."""
    import numpy as np
    import pyarrow.compute as pc

    if table.column("step").null_count:  # lines without an integer _step are no step
        table = table.filter(pc.is_valid(table.column("step")))
    n = table.num_rows
    line = table.column("line").to_numpy()
    new = np.ones(n, dtype=bool)
    if n:
        new[1:] = line[1:] != line[:-1]
    row_of = np.cumsum(new) - 1
    steps = table.column("step").to_numpy()[new]
    times = _numbers(table.column("time"), math.nan)[new]
    metric = table.column("metric").combine_chunks()
    dictionary = metric.dictionary.to_pylist()
    codes = metric.indices.to_numpy(zero_copy_only=False)
    value = table.column("value")
    if value.null_count:
        has_value = pc.is_valid(value).to_numpy(zero_copy_only=False)
    else:
        has_value = np.ones(n, dtype=bool)
    vals = _numbers(value, math.nan)
    columns = {}
    r = steps.shape[0]
    for name in names:
        if name not in dictionary:
            continue
        sel = codes == dictionary.index(name)
        sel &= has_value  # text, null, lists and dicts are not recorded
        if not sel.any():
            continue
        present = np.zeros(r, dtype=bool)
        col = np.full(r, np.nan)
        idx = row_of[sel]
        present[idx] = True
        col[idx] = vals[sel]
        columns[name] = (present, col)
    _fill(run, steps, times, columns, names)


def _read_patched(run: RunSeries, table: Any, names: list[str], con: Any) -> None:
    """Steps spread over several lines: DuckDB merges them (the later line wins)."""
    import numpy as np
    import pyarrow.compute as pc

    duckdb = import_duckdb()
    own = con is None
    con = quiet(duckdb.connect()) if own else con
    con.register("_et_backtest_src", table)
    try:
        rows = _arrow(
            con.sql(
                "SELECT step, arg_max(time, line) AS time, min(line) AS first "
                "FROM _et_backtest_src WHERE step IS NOT NULL GROUP BY step ORDER BY first"
            )
        )
        values = _arrow(
            con.sql(
                "SELECT step, CAST(metric AS VARCHAR) AS metric, value FROM _et_backtest_src "
                "WHERE step IS NOT NULL AND CAST(metric AS VARCHAR) IN (SELECT unnest(?)) "
                "QUALIFY row_number() OVER (PARTITION BY step, metric ORDER BY line DESC) = 1",
                params=[names or [""]],
            )
        )
    finally:
        con.unregister("_et_backtest_src")
        if own:
            con.close()
    steps = rows.column("step").to_numpy()
    times = _numbers(rows.column("time"), math.nan)
    order = np.argsort(steps, kind="stable")
    where = order[np.searchsorted(steps[order], values.column("step").to_numpy())]
    metric = np.array(values.column("metric").to_pylist(), dtype=object)
    value = values.column("value")
    has_value = pc.is_valid(value).to_numpy(zero_copy_only=False)
    vals = _numbers(value, math.nan)
    columns = {}
    for name in names:
        sel = (metric == name) & has_value
        if not sel.any():
            continue
        present = np.zeros(steps.shape[0], dtype=bool)
        col = np.full(steps.shape[0], np.nan)
        present[where[sel]] = True
        col[where[sel]] = vals[sel]
        columns[name] = (present, col)
    _fill(run, steps, times, columns, names)


def _arrow(res: Any) -> Any:
    """A DuckDB relation as an Arrow table (``to_arrow_table`` from DuckDB 1.4, else
    ``arrow``)."""
    fn = getattr(res, "to_arrow_table", None)
    return fn() if fn is not None else res.arrow()


def iter_series(
    runs: list[RunSeries],
    names: Iterable[str],
    *,
    cache_dir: Path | None = None,
    problems: Problems | None = None,
) -> Iterator[RunSeries]:
    """Each run with its series read (one DuckDB connection for all; a run whose metrics
    cannot be read is left out, its reason in ``problems``). The series of one run are
    dropped before the next is read when the caller does not keep them."""
    duckdb = import_duckdb()
    con = quiet(duckdb.connect())
    names = list(names)
    try:
        for run in runs:
            if read_series(run, names, con=con, cache_dir=cache_dir, problems=problems):
                yield run
                run.steps = run.times = None
                run.columns = {}
    finally:
        con.close()
