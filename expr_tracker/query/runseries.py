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

Labels (:func:`label_of`): the run's status (``--label status``, the default: ``failed``,
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
from expr_tracker.query.views import cache_of, import_duckdb

__all__ = [
    "BAD",
    "FINE",
    "LabelError",
    "RunSeries",
    "iter_series",
    "label_of",
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


def label_of(value: Any) -> bool | None:
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
            lab = label_of(value)
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
    metrics cannot be read. ``con``: a DuckDB connection to reuse across runs."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    problems = problems if problems is not None else Problems()
    cached, _ = cache_of(run.producer, "metrics", cache_dir, problems)
    if cached is None:
        return False
    duckdb = import_duckdb()
    con = con if con is not None else duckdb.connect()
    if cached.memory:
        import pyarrow.parquet as pq

        src: Any = pa.concat_tables([pq.read_table(pa.BufferReader(b)) for b in cached.memory])
    else:
        import pyarrow.dataset as ds

        src = ds.dataset([os.fspath(p) for p in cached.parts], format="parquet")
    con.register("_et_backtest_src", src)
    try:
        rows = _arrow(
            con.sql(
                "SELECT step, arg_max(time, line) AS time, min(line) AS first "
                "FROM _et_backtest_src WHERE step IS NOT NULL GROUP BY step ORDER BY first"
            )
        )
        names = sorted(set(names))
        if names:
            latest = (
                ""
                if cached.merged
                else "QUALIFY row_number() OVER (PARTITION BY step, metric ORDER BY line DESC) = 1"
            )
            values = _arrow(
                con.sql(
                    "SELECT step, metric, value FROM _et_backtest_src "
                    f"WHERE step IS NOT NULL AND metric IN (SELECT unnest(?)) {latest}",
                    params=[names],
                )
            )
        else:
            values = None
    finally:
        con.unregister("_et_backtest_src")
    steps = rows.column("step").to_numpy()
    times = pc.fill_null(rows.column("time").cast(pa.float64()), math.nan).to_numpy()
    run.steps = np.ascontiguousarray(steps, dtype=np.int64)
    run.times = np.ascontiguousarray(times, dtype=np.float64)
    run.columns = {}
    if values is None or values.num_rows == 0:
        return True
    order = np.argsort(run.steps, kind="stable")
    sorted_steps = run.steps[order]
    vstep = values.column("step").to_numpy()
    where = order[np.searchsorted(sorted_steps, vstep)]
    metric = values.column("metric").combine_chunks()
    if not pa.types.is_dictionary(metric.type):
        metric = metric.dictionary_encode()
    codes = metric.indices.to_numpy(zero_copy_only=False)
    dictionary = metric.dictionary.to_pylist()
    value = values.column("value")
    has_value = pc.is_valid(value).to_numpy(zero_copy_only=False)
    vals = pc.fill_null(value, math.nan).to_numpy()
    r = run.steps.shape[0]
    for code, name in enumerate(dictionary):
        sel = codes == code
        if not has_value[sel].any():  # never a number (text only): never recorded
            continue
        present = np.zeros(r, dtype=bool)
        col = np.full(r, np.nan)
        idx = where[sel]
        present[idx] = has_value[sel]
        col[idx] = vals[sel]
        run.columns[name] = (present, col)
    return True


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
    con = duckdb.connect()
    names = list(names)
    try:
        for run in runs:
            if read_series(run, names, con=con, cache_dir=cache_dir, problems=problems):
                yield run
                run.steps = run.times = None
                run.columns = {}
    finally:
        con.close()
