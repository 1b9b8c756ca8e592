"""``et.query(sql, dir=...)``: SQL over every run under a folder, answered by DuckDB.

The views (``runs``, ``metrics``, ``spans``, ``alerts``, ``artifacts``) are those of
:func:`expr_tracker.query.views.connect`; docs/query.md lists their columns.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

from expr_tracker.errors import QueryError
from expr_tracker.history.frame import check_output_type

log = logging.getLogger("expr_tracker")

#: how often a query is run again when a cache part it read vanished (its ``.et-cache``
#: deleted under it) or could not be read (damaged): the last time with a cache of this
#: process only (:func:`expr_tracker.query.cache.temp_root`), so a cleaner deleting the
#: usual one in a loop never changes the answer
ATTEMPTS = 4

#: the values of ``output_type`` (case-insensitive), each the shape it names
OUTPUT_TYPES = {"pandas": "pandas", "polars": "polars", "arrow": "arrow", "dicts": "dicts"}


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

    A run that cannot be read (permissions, a FIFO, damaged files) is left out with one
    warning naming it and why (the ``runs`` view's ``problem`` column says the same); a
    damaged or vanished cache is rebuilt and the query run again.

    Raises:
        ValueError: a bad ``output_type`` or an empty ``sql``.
        QueryError: DuckDB rejected or failed the SQL (its message, then the views and
            their columns); never a raw DuckDB or pyarrow exception.
        TypeError: ``dir`` or ``cache_dir`` is not a path, or ``params`` is not a list,
            tuple or dict.
        FileNotFoundError: ``dir`` does not exist.
        ImportError: duckdb/pyarrow (or the output's library) is missing, naming
            ``pip install 'expr-tracker[query]'``.
    """
    kind = check_output_type(output_type, OUTPUT_TYPES, exact=False)
    if not isinstance(sql, str) or not sql.strip():
        raise ValueError(f"sql must be a non-empty string of SQL, not {sql!r}")
    check_path("dir", dir)
    if cache_dir is not None:
        check_path("cache_dir", cache_dir)
    check_params(params)
    _check_output_library(kind)
    from expr_tracker.query.views import connect, import_duckdb, referenced_views

    duckdb = import_duckdb()
    import pyarrow as pa

    cache = cache_dir
    for attempt in range(1, ATTEMPTS + 1):
        con = None
        try:
            con = connect(dir, cache_dir=cache, views=referenced_views(sql))
            return convert(execute(con, sql, params), kind)
        except (duckdb.Error, pa.ArrowException) as exc:
            # a cache part replaced or deleted between the refresh and the read (another
            # query compacting it, a cleaner deleting .et-cache), or damaged: refresh again
            if attempt < ATTEMPTS and recover_cache(exc, con):
                if attempt == ATTEMPTS - 1:
                    cache = temp_cache()
                continue
            raise query_error(con, exc, sql, dir, cache_dir) from None
        finally:
            if con is not None:
                con.close()
    raise AssertionError("unreachable")  # pragma: no cover


_PART = re.compile(r"part-[0-9]{12}-[0-9a-f]{8}\.parquet")
_PART_PATH = re.compile(r"[\"']([^\"'\n]*part-[0-9]{12}-[0-9a-f]{8}\.parquet)[\"']")


def recover_cache(exc: Exception, con: Any = None, parts: Any = None) -> bool:
    """True when DuckDB's ``exc`` is about a part of the query cache (gone, or not
    readable), so the query is worth running again: a part that is still there but could
    not be read has its cache rebuilt on the next refresh (one warning).

    DuckDB does not always name the file it failed on ("invalid TType", "don't know what
    type" for a damaged footer): then, for an error of reading (not of the SQL), the parts
    the connection ``con`` reads (or that the failed :func:`~expr_tracker.query.views.connect`
    attached to ``exc``, or ``parts`` as given) are checked against the SHA-256 their manifest recorded
    (:func:`expr_tracker.query.cache.damaged`), and a cache holding a damaged one is
    rebuilt."""
    text = str(exc)
    if not _PART.search(text):
        return _recover_unnamed(exc, con, parts)
    m = _PART_PATH.search(text)
    if m is not None and os.path.exists(m.group(1)) and not missing_file(exc):
        from expr_tracker.query.cache import invalidate

        if invalidate(m.group(1)):
            log.warning(
                "expr_tracker: the query cache part %s could not be read (%s): rebuilt from "
                "the JSONL",
                m.group(1),
                text.strip().splitlines()[0][:200],
            )
    return True


def _reading_error(exc: Exception) -> bool:
    """True for an error DuckDB or pyarrow gives when a file's bytes cannot be decoded;
    False for one of the SQL itself (parser, binder, catalog, conversion, ...)."""
    import pyarrow as pa

    from expr_tracker.query.views import import_duckdb

    if isinstance(exc, (pa.ArrowException, OSError)):
        return True
    duckdb = import_duckdb()
    # DuckDB gives a damaged footer or page as a plain Error ("invalid TType", "don't know
    # what type", "Deserializing page"); InvalidInputException is also what the SQL's own
    # error() raises, so it is left out (checking every part costs a read of the cache)
    kinds = (
        duckdb.Error,
        duckdb.IOException,
        duckdb.InternalException,
        duckdb.SerializationException,
    )
    return type(exc) in kinds


def _recover_unnamed(exc: Exception, con: Any, parts: Any) -> bool:
    if not _reading_error(exc):
        return False
    from expr_tracker.query.cache import damaged
    from expr_tracker.query.views import parts_of

    if parts is None:
        parts = getattr(exc, "et_parts", None)
    if parts is None:
        parts = parts_of(con) if con is not None else []
    if not parts:
        return False
    bad = damaged(parts)
    for part, why in bad:
        log.warning(
            "expr_tracker: the query cache part %s could not be read (%s; %s): rebuilt from "
            "the JSONL",
            part,
            str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__,
            why,
        )
    return bool(bad)


def connect_retrying(root: Any, cache_dir: Any, views: Any) -> tuple[Any, Any]:
    """``(connection, cache_dir used)``: :func:`~expr_tracker.query.views.connect`, made
    again (the last time with a cache of this process only) when a cache part vanished or
    could not be read between its refresh and the views' creation. Raises what ``connect``
    raises."""
    from expr_tracker.query.views import connect, import_duckdb

    duckdb = import_duckdb(arrow=False)
    cache = cache_dir
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return connect(root, cache_dir=cache, views=views), cache
        except duckdb.Error as exc:
            if attempt < ATTEMPTS and recover_cache(exc):
                if attempt == ATTEMPTS - 1:
                    cache = temp_cache()
                continue
            raise
    raise AssertionError("unreachable")  # pragma: no cover


def temp_cache() -> Any:
    """This process's own cache folder, for the last try of a query whose cache kept
    vanishing."""
    from expr_tracker.query.cache import temp_root

    return temp_root()


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


def query_error(
    con: Any, exc: Exception, sql: str, root: Any = None, cache_dir: Any = None
) -> QueryError:
    """A :class:`QueryError` for DuckDB's ``exc``, listing every view with its columns (of
    ``con``, or of a full connection over ``root`` when ``con`` has only the views the query
    named) and saying so when no run was found under ``root``."""
    from expr_tracker.query.views import no_runs_note

    message = str(exc)
    try:
        views = all_views(con, root, cache_dir)
        note = no_runs_note(con, root) if root is not None and con is not None else None
    except Exception:  # noqa: BLE001 - the message matters more than the listing
        views, note = {}, None
    if note:
        message = f"{message.rstrip()}\n({note})"
    return QueryError(message, sql, views)


def all_views(con: Any, root: Any = None, cache_dir: Any = None) -> dict[str, Any]:
    """Every view's columns (:func:`~expr_tracker.query.views.describe`): of ``con`` when it
    has them all, else of a full connection over ``root`` (an error message lists them)."""
    from expr_tracker.query.views import VIEWS, connect, describe

    views = describe(con) if con is not None else {}
    if len(views) == len(VIEWS) or root is None:
        return views
    full = connect(root, cache_dir=cache_dir)
    try:
        return describe(full)
    finally:
        full.close()


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
