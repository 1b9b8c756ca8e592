"""``et.query(sql, dir=...)``: SQL over every run under a folder, answered by DuckDB.

The views (``runs``, ``metrics``, ``spans``, ``alerts``, ``artifacts``) are those of
:func:`expr_tracker.query.views.connect`; docs/query.md lists their columns.
"""

from __future__ import annotations

import os
from typing import Any

from expr_tracker.errors import QueryError

#: the values of ``output_type`` (case-insensitive)
OUTPUT_TYPES = ("pandas", "polars", "arrow", "dicts")


def check_output_type(output_type: Any) -> str:
    """``output_type`` lower-cased, or ValueError naming the argument, the value and the
    valid ones."""
    kind = output_type.lower() if isinstance(output_type, str) else None
    if kind not in OUTPUT_TYPES:
        raise ValueError(
            f"output_type must be one of {', '.join(repr(t) for t in OUTPUT_TYPES)} "
            f"(case-insensitive), not {output_type!r}"
        )
    return kind


def query(
    sql: str,
    dir: str | os.PathLike[str] = "runs",
    *,
    output_type: str = "pandas",
    cache_dir: str | os.PathLike[str] | None = None,
    params: Any = None,
) -> Any:
    """Run ``sql`` (DuckDB's dialect) over the views of every run under ``dir``.

    Args:
        sql: one statement, or several separated by ``;`` (the last one's result is
            returned). Views: ``runs`` (one row per run and producer, with ``config.*`` and
            ``summary.*`` columns: quote them, ``"config.lr"``), ``metrics`` (long: run,
            step, time, metric, value, text), ``spans``, ``alerts``, ``artifacts``.
        dir: a folder of runs (searched as ``et runs`` does) or one run directory.
        output_type: ``"pandas"`` (a DataFrame; NULL and NaN both read NaN there),
            ``"polars"``, ``"arrow"`` (a ``pyarrow.Table``) or ``"dicts"`` (a list of
            dicts, one per row; NULL is None, NaN stays ``float('nan')``).
        cache_dir: where the columnar cache lives (default: beside each run).
        params: values for ``?`` or ``$name`` placeholders in ``sql`` (a list or a dict).

    Returns:
        The result in ``output_type``; a statement without a result (``CREATE ...``)
        gives an empty one.

    Raises:
        ValueError: a bad ``output_type`` or an empty ``sql``.
        QueryError: DuckDB rejected or failed the SQL (its message, then the views and
            their columns).
        TypeError: ``dir`` or ``cache_dir`` is not a path, or ``params`` is not a list,
            tuple or dict.
        FileNotFoundError: ``dir`` does not exist.
        ImportError: duckdb/pyarrow (or the output's library) is missing, naming
            ``pip install 'expr-tracker[query]'``.
    """
    kind = check_output_type(output_type)
    if not isinstance(sql, str) or not sql.strip():
        raise ValueError(f"sql must be a non-empty string of SQL, not {sql!r}")
    check_path("dir", dir)
    if cache_dir is not None:
        check_path("cache_dir", cache_dir)
    check_params(params)
    _check_output_library(kind)
    from expr_tracker.query.views import connect, import_duckdb

    duckdb = import_duckdb()
    for attempt in (1, 2):
        con = connect(dir, cache_dir=cache_dir)
        try:
            return convert(execute(con, sql, params), kind)
        except duckdb.IOException as exc:
            # a cache part replaced between the refresh and the read (another query
            # compacting it): refresh again, once
            if attempt == 1 and missing_file(exc):
                continue
            raise query_error(con, exc, sql, dir) from None
        except duckdb.Error as exc:
            raise query_error(con, exc, sql, dir) from None
        finally:
            con.close()
    raise AssertionError("unreachable")  # pragma: no cover


def check_path(field: str, value: Any) -> None:
    """TypeError naming ``field`` when ``value`` is not a path (a str or os.PathLike)."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(
            f"{field} must be a path (a str or os.PathLike, e.g. 'runs'), not {value!r}"
        )


def check_params(params: Any) -> None:
    """TypeError naming ``params`` unless it is None, a list/tuple (for ``?``) or a dict
    (for ``$name``); a string would be taken as a sequence of its characters."""
    if params is not None and not isinstance(params, (list, tuple, dict)):
        raise TypeError(
            "params must be a list or tuple (values for ?) or a dict (values for $name), "
            f"not {params!r}"
        )


def missing_file(exc: Exception) -> bool:
    """True when DuckDB failed because a file it was to read is gone."""
    text = str(exc)
    return "No files found" in text or "No such file" in text


def execute(con: Any, sql: str, params: Any = None) -> Any:
    """The DuckDB relation of ``sql``'s result (None for a statement without one)."""
    if params is None:
        return con.sql(sql)
    return con.sql(sql, params=params)


def query_error(con: Any, exc: Exception, sql: str, root: Any = None) -> QueryError:
    """A :class:`QueryError` for DuckDB's ``exc``, listing the views of ``con`` (and saying
    so when no run was found under ``root``)."""
    from expr_tracker.query.views import describe, no_runs_note

    message = str(exc)
    try:
        views = describe(con)
        note = no_runs_note(con, root) if root is not None else None
    except Exception:  # noqa: BLE001 - the message matters more than the listing
        views, note = {}, None
    if note:
        message = f"{message.rstrip()}\n({note})"
    return QueryError(message, sql, views)


def arrow_table(rel: Any) -> Any:
    """``rel``'s rows as a ``pyarrow.Table`` (DuckDB 2's name, else 1.x's)."""
    fn = getattr(rel, "to_arrow_table", None)
    return fn() if fn is not None else rel.arrow()


def arrow_reader(rel: Any, batch_rows: int = 100_000) -> Any:
    """``rel``'s rows as a ``pyarrow.RecordBatchReader`` (streamed, not all in memory)."""
    fn = getattr(rel, "to_arrow_reader", None) or getattr(rel, "fetch_arrow_reader", None)
    if fn is not None:
        return fn(batch_rows)
    return rel.record_batch(batch_rows)


def unique_names(names: list[str]) -> list[str]:
    """Column names with repeats made distinct as DuckDB does for pandas (``a``, ``a_1``)."""
    seen: set[str] = set()
    out = []
    for n in names:
        name, i = n, 0
        while name in seen:
            i += 1
            name = f"{n}_{i}"
        seen.add(name)
        out.append(name)
    return out


def convert(rel: Any, kind: str) -> Any:
    """``rel`` (a DuckDB relation or None) as ``kind`` (pandas, polars, arrow, dicts)."""
    if rel is None:
        import pyarrow as pa

        table = pa.table({})
    else:
        table = None
    if kind == "pandas":
        return rel.df() if rel is not None else table.to_pandas()
    if kind == "polars":
        if rel is not None:
            return rel.pl()
        import polars as pl

        return pl.DataFrame()
    if table is None:
        table = arrow_table(rel)
    names = unique_names(table.column_names)
    if names != table.column_names:
        table = table.rename_columns(names)
    if kind == "arrow":
        return table
    return table.to_pylist()


def _check_output_library(kind: str) -> None:
    lib = {"pandas": "pandas", "polars": "polars"}.get(kind)
    if lib is None:
        return
    try:
        __import__(lib)
    except ImportError as exc:
        extra = "query" if lib == "pandas" else "polars"
        raise ImportError(
            f"output_type={kind!r} needs {lib}: pip install 'expr-tracker[{extra}]' "
            f"(or choose output_type='arrow' or 'dicts')"
        ) from exc
