"""The columnar cache parts a dashboard page reads, through the process's DuckDB.

A page reads a producer's metric or span rows from its columnar cache
(:func:`producer_cache`: :func:`expr_tracker.query.cache.refresh`, asked to open the source
only as a regular file inside the served folder, ``refresh(root=)``; only bytes appended
since the last request are parsed) with a cursor of one in-memory DuckDB of this process
(:func:`duckdb_cursor`) that reads NaN in Parquet parts. :func:`metrics_sql` is the
``metrics`` view's SELECT of one producer (patch lines merged, later line wins);
:class:`PartsFrom` the FROM text of parts (or of rows held in memory when no cache folder
could be written). :func:`parts_read` records, per request, the parts handed to DuckDB, so
that the server can check them when a read fails without naming one.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from expr_tracker.query.catalog import Producer
from expr_tracker.query.views import import_duckdb, metrics_select, path_literal, quiet
from expr_tracker.ui.errors import Unreadable, why

if TYPE_CHECKING:
    from expr_tracker.ui.catalog import Catalog

__all__ = [
    "PartsFrom",
    "duckdb_cursor",
    "metric_names",
    "metrics_sql",
    "parts_read",
    "producer_cache",
]


_base: Any = None
_base_lock = threading.Lock()


def duckdb_cursor() -> Any:
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
        return quiet(_base.cursor())


_names = itertools.count(1)


class PartsFrom:
    """FROM text for Parquet parts (a pyarrow dataset where a path literal cannot be made),
    or, when ``cached`` holds its rows in memory (no cache folder could be written: a full
    disk), for those."""

    def __init__(self, con: Any, cached: Any = None) -> None:
        self.con = con
        self.cached = cached

    def __call__(self, parts: Sequence[Path]) -> str:
        if self.cached is not None and self.cached.memory:
            import pyarrow as pa
            import pyarrow.parquet as pq

            name = f"_ui_parts_{next(_names)}"
            tables = [pq.read_table(pa.BufferReader(b)) for b in self.cached.memory]
            self.con.register(name, pa.concat_tables(tables))
            return name
        lits = [path_literal(Path(p)) for p in parts]
        if all(lit is not None for lit in lits):
            return f"read_parquet([{', '.join(lits)}])"  # type: ignore[arg-type]
        import pyarrow.dataset as ds

        name = f"_ui_parts_{next(_names)}"
        self.con.register(name, ds.dataset([os.path.abspath(p) for p in parts], format="parquet"))
        return name


_read = threading.local()


@contextlib.contextmanager
def parts_read() -> Iterator[list[Path]]:
    """The cache parts handed to DuckDB on this thread while inside (a request's): when
    reading fails without naming one (a damaged footer), the server checks them
    (:func:`expr_tracker.query.api.recover_cache`) and answers again."""
    prev = getattr(_read, "parts", None)
    _read.parts = parts = []
    try:
        yield parts
    finally:
        _read.parts = prev


def producer_cache(catalog: Catalog, p: Producer, kind: str) -> Any:
    """The producer's columnar cache of ``kind`` (None: no such file, or gone); the source
    opened only as a regular file inside the served folder (:class:`Unreadable` else)."""
    from expr_tracker.query.cache import refresh

    path = p.metrics if kind == "metrics" else p.spans
    if path is None:
        return None
    try:
        c = refresh(path, kind, cache_dir=catalog.cache_dir, root=catalog.root_real)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:
        raise Unreadable(f"{path.name} of {p.run_id!r}: {why(exc)}") from None
    seen = getattr(_read, "parts", None)
    if seen is not None:
        seen.extend(c.parts)
    return c if c.parts or c.memory else None


def metrics_sql(con: Any, catalog: Catalog, p: Producer) -> str | None:
    """A SELECT of the producer's metric rows (the ``metrics`` view's columns), or None."""
    c = producer_cache(catalog, p, "metrics")
    if c is None:
        return None
    return metrics_select(p, c.parts, c.merged, PartsFrom(con, c))


def metric_names(catalog: Catalog, prods: list[Producer]) -> set[str]:
    """Every metric name in the producers' metric rows."""
    con = duckdb_cursor()
    names: set[str] = set()
    try:
        for p in prods:
            sql = metrics_sql(con, catalog, p)
            if sql is not None:
                names.update(
                    r[0] for r in con.execute(f"SELECT DISTINCT metric FROM ({sql})").fetchall()
                )
    finally:
        con.close()
    return names
