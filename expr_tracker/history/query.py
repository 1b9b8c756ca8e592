"""``et.history()``: select steps and columns from a live store or a file, and shape them.

The planning here is deliberately simple: tails come from :meth:`HistoryStore.tail`
(cache first, disk only for evicted rows); ``step_range`` and offline reads scan the file.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from expr_tracker.history.paths import resolve_run_path
from expr_tracker.history.reader import iter_rows, merge_by_step
from expr_tracker.history.store import HistoryStore

OUTPUT_TYPES = ("dict", "dicts", "pandas", "pd", "polars")
META = ("_step", "_time")


def _columns(metrics: Any) -> list[str] | None:
    if metrics is None:
        return None
    if isinstance(metrics, str):
        return [m.strip() for m in metrics.split(",") if m.strip()]
    return [str(m) for m in metrics]


def _step_bounds(step_range: Any) -> tuple[int | None, int | None]:
    if step_range is None:
        return None, None
    if isinstance(step_range, str):
        a, _, b = step_range.partition(":")
        return (int(a) if a.strip() else None, int(b) if b.strip() else None)
    start, end = step_range
    return start, end


def query_history(
    source: HistoryStore | str | Path,
    *,
    n: int | None = 50,
    output_type: str = "dict",
    metrics: Any = None,
    step_range: Any = None,
    include_meta: bool = True,
    include_open: bool = True,
    fill_missing: bool = False,
    dropna: bool = False,
    stream: str | None = None,
) -> Any:
    """Rows of a run as ``output_type``; see :func:`expr_tracker.history` for the arguments.

    Raises:
        ValueError: an unknown ``output_type`` (the valid ones are named).
        FileNotFoundError: ``source`` names no run.
    """
    if output_type not in OUTPUT_TYPES:
        raise ValueError(
            f"output_type={output_type!r} is not valid: one of {', '.join(OUTPUT_TYPES)}"
        )
    if n is not None and n < 0:
        n = None
    lo, hi = _step_bounds(step_range)
    if isinstance(source, HistoryStore):
        if step_range is None:
            rows = source.tail(n, include_open=include_open)
        else:
            rows = source.tail(None, include_open=include_open)
    else:
        path = resolve_run_path(source, stream=stream)
        rows = merge_by_step(iter_rows(path))
    if step_range is not None:
        rows = [
            r
            for r in rows
            if type(r.get("_step")) is int
            and (lo is None or r["_step"] >= lo)
            and (hi is None or r["_step"] < hi)
        ]
        rows.sort(key=lambda r: r["_step"])
    if n is not None and len(rows) > n:
        rows = rows[-n:] if n else []
    cols = _columns(metrics)
    rows = _shape(rows, cols, include_meta, fill_missing, dropna)
    return _output(rows, output_type)


def _shape(
    rows: list[dict[str, Any]],
    cols: list[str] | None,
    include_meta: bool,
    fill_missing: bool,
    dropna: bool,
) -> list[dict[str, Any]]:
    if cols is None and include_meta and not fill_missing and not dropna:
        return rows
    if cols is None:
        seen: dict[str, None] = {}
        for r in rows:
            for k in r:
                if k not in META:
                    seen[k] = None
        wanted: Iterable[str] = list(seen)
    else:
        wanted = cols
    out = []
    for r in rows:
        picked = {}
        if include_meta:
            for k in META:
                if k in r:
                    picked[k] = r[k]
        present = False
        for k in wanted:
            if k in r:
                picked[k] = r[k]
                if r[k] is not None:
                    present = True
            elif fill_missing:
                picked[k] = None
        if dropna and not present:
            continue
        out.append(picked)
    return out


def _output(rows: list[dict[str, Any]], output_type: str) -> Any:
    if output_type in ("dict", "dicts"):
        return rows
    if output_type in ("pandas", "pd"):
        try:
            import pandas as pd
        except ImportError:
            raise ImportError(
                "output_type='pandas' needs pandas: pip install 'expr-tracker[pandas]'"
            ) from None
        return pd.DataFrame(rows)
    try:
        import polars as pl
    except ImportError:
        raise ImportError(
            "output_type='polars' needs polars: pip install 'expr-tracker[polars]'"
        ) from None
    return pl.DataFrame(rows, infer_schema_length=None)
