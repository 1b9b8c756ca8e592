"""The dashboard's span panel: where a run's time goes, and its Chrome Trace.

:func:`span_breakdown` sums ``dur_ms`` per span path over a step range from the span
files' columnar cache (``ui/parts.py``); :func:`trace_chunks` streams the run's Chrome
Trace as ``et trace`` writes it (:func:`expr_tracker.trace.iter_trace`), reading only
regular files inside the served folder.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from expr_tracker.history.values import json_safe
from expr_tracker.ui.errors import NotFound, Unreadable, why
from expr_tracker.ui.parts import PartsFrom, duckdb_cursor, producer_cache

if TYPE_CHECKING:
    from expr_tracker.ui.catalog import Catalog

__all__ = ["span_breakdown", "trace_chunks"]


def span_breakdown(
    catalog: Catalog, run_id: str, start: int | None = None, stop: int | None = None
) -> dict:
    """Mean, total and count of ``dur_ms`` per span path over steps ``[start, stop)``
    (either bound optional), slowest mean first: ``{"rows": [{"name", "count", "mean_ms",
    "total_ms", "max_ms"}], "start", "stop"}``."""
    prods = catalog.get(run_id)
    con = duckdb_cursor()
    selects = []
    try:
        for p in prods:
            c = producer_cache(catalog, p, "spans")
            if c is not None:
                selects.append(f"SELECT name, dur_ms, step FROM {PartsFrom(con, c)(c.parts)}")
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
    return {"rows": json_safe(rows, "string"), "start": start, "stop": stop}


def trace_chunks(
    catalog: Catalog, run_id: str, start: int | None, stop: int | None
) -> Iterator[bytes]:
    """The run's Chrome Trace over steps ``[start, stop)`` as chunks of JSON text, streamed
    as ``et trace`` writes it (:func:`expr_tracker.trace.iter_trace`: spooled in SQLite,
    memory independent of the number of spans). The span files are read (only regular
    files inside the served folder) before this returns, so a bad file is an error here
    (:class:`Unreadable`), not a broken download; the rest is made as it is consumed."""
    from expr_tracker.trace import iter_trace

    prods = catalog.get(run_id)
    if not any(p.spans is not None for p in prods):
        raise NotFound(f"run {run_id!r} has no span file")
    rng = None if start is None and stop is None else (start, stop)
    it = iter_trace(prods[0].run_dir, step_range=rng, root=catalog.root_real)
    try:
        first = next(it)
    except (OSError, ValueError, RecursionError) as exc:
        it.close()
        if isinstance(exc, FileNotFoundError):
            raise
        raise Unreadable(f"the span files of {run_id!r}: {why(exc)}") from None

    def chunks() -> Iterator[bytes]:
        try:
            yield first
            yield from it
        finally:
            it.close()  # the spool is removed

    return chunks()
