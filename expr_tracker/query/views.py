"""DuckDB views over every run under a directory: ``runs``, ``metrics``, ``spans``,
``alerts``, ``artifacts`` (docs/query.md lists their columns).

:func:`connect` finds the producers under a folder (:func:`expr_tracker.query.catalog.discover`:
one per run, stream and rank), brings each one's columnar cache up to date with its JSONL
(:func:`expr_tracker.query.cache.refresh`: only appended bytes are read) and opens an
in-memory DuckDB connection with the five views registered:

- ``metrics`` and ``spans`` read the cache's Parquet parts, a ``UNION ALL`` of one
  ``SELECT`` per producer that adds its identity (project, run, stream, rank) as constants.
  Identity is never taken from the data, so two producers never merge. A metrics cache
  whose steps each occur in one line (``merged``) is read as it is; otherwise (patch
  lines of a long step) each (step, metric) keeps the value of its latest line.
- ``runs``, ``alerts`` and ``artifacts`` come from small files read in Python
  (:mod:`expr_tracker.query.tables`) into Arrow tables.

A run that cannot be read (a colleague's ``0600`` files, a FIFO named ``metrics.jsonl``, a
file swapped for a link out of its run directory, damaged JSON) never fails the connection:
its rows are left out, the ``runs`` view's ``problem`` column says what and why, and
:func:`connect` logs one warning naming every such run (docs/query.md "Security").

Each view exists, with its columns, even when no run has such files. Identity values and
file paths are written into the view text as SQL string literals (quotes doubled), file
paths with DuckDB's glob characters escaped, so no run name can change the SQL.

duckdb and pyarrow are imported inside the functions (the ``[query]`` extra).
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from expr_tracker._warn import Warner
from expr_tracker.query.tables import (
    ALERTS_COLUMNS,
    ARTIFACTS_COLUMNS,
    RUNS_COLUMNS,
    Problems,
    alerts_table,
    artifacts_table,
    lines_problem,
    read_problem,
    runs_table,
    unlisted_problem,
)

INSTALL_HINT = "pip install 'expr-tracker[query]'"

#: the views, in the order listings show them
VIEWS = ("runs", "metrics", "spans", "alerts", "artifacts")

#: the ``metrics`` view (long: one row per step and metric)
METRICS_COLUMNS: tuple[tuple[str, str], ...] = (
    ("project", "VARCHAR"),
    ("run", "VARCHAR"),
    ("name", "VARCHAR"),
    ("stream", "VARCHAR"),
    ("rank", "INTEGER"),
    ("step", "BIGINT"),
    ("time", "DOUBLE"),
    ("metric", "VARCHAR"),
    ("value", "DOUBLE"),
    ("text", "VARCHAR"),
)

#: the ``spans`` view (one row per span record); ``name`` is the span's path (``fwd/inner``)
SPANS_COLUMNS: tuple[tuple[str, str], ...] = (
    ("project", "VARCHAR"),
    ("run", "VARCHAR"),
    ("stream", "VARCHAR"),
    ("rank", "INTEGER"),
    ("step", "BIGINT"),
    ("name", "VARCHAR"),
    ("depth", "INTEGER"),
    ("start", "DOUBLE"),
    ("dur_ms", "DOUBLE"),
    ("thread", "VARCHAR"),
    ("error", "VARCHAR"),
    ("args", "VARCHAR"),
    ("id", "BIGINT"),
    ("parent", "BIGINT"),
    ("pid", "BIGINT"),
    ("tid", "BIGINT"),
    ("task", "VARCHAR"),
    ("track", "VARCHAR"),
    ("metrics", "VARCHAR"),
    ("line", "BIGINT"),
)

#: columns a view computes from its parts' columns (no part stores them): ``track``, the
#: span's track as ``et trace`` names it (``track_name``: ``MainThread (tid 4242)``, then
#: `` · Task-3`` inside an asyncio task; docs/query.md "The views")
DERIVED = {
    "track": (
        "concat(coalesce(nullif(\"thread\", ''), 'thread'), ' (tid ', "
        "coalesce(CAST(\"tid\" AS VARCHAR), 'None'), ')', "
        "CASE WHEN \"task\" <> '' THEN ' · ' || \"task\" ELSE '' END)"
    ),
}

#: the columns of each view that exist whatever the runs hold (``runs`` gains ``config.*``
#: and ``summary.*`` columns from the runs' files)
BASE_COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    "runs": RUNS_COLUMNS,
    "metrics": METRICS_COLUMNS,
    "spans": SPANS_COLUMNS,
    "alerts": ALERTS_COLUMNS,
    "artifacts": ARTIFACTS_COLUMNS,
}


def import_duckdb(arrow: bool = True) -> Any:
    """``duckdb`` (and check ``pyarrow``), or ImportError naming the extra to install.

    ``arrow=False``: pyarrow is only looked for, not imported (~0.15 s of a fresh process
    that answers from an up-to-date cache without Arrow: ``et query --format csv``); the
    code that needs it imports it when it does."""
    try:
        import duckdb

        if arrow:
            import pyarrow  # noqa: F401
        elif sys.modules.get("pyarrow") is None and importlib.util.find_spec("pyarrow") is None:
            raise ModuleNotFoundError("No module named 'pyarrow'", name="pyarrow")
    except ImportError as exc:
        raise ImportError(
            f"et.query needs duckdb and pyarrow ({exc.name} is missing): {INSTALL_HINT}"
        ) from exc
    return duckdb


def quiet(con: Any) -> Any:
    """``con`` (a DuckDB connection or cursor) with its progress bar's printing off, and
    returned. DuckDB prints the bar to this process's standard output once a query runs
    longer than 2 s, into whatever a script writes there (its CSV, its JSON); the setting
    is per connection (a cursor starts with DuckDB's default). Progress is still tracked
    (``con.query_progress()``). docs/query.md "Results in Python"."""
    con.execute("SET enable_progress_bar_print = false")
    return con


def arrow_errors() -> tuple[type[BaseException], ...]:
    """``(pyarrow.ArrowException,)`` once pyarrow is imported, else ``()``: for an
    ``except`` clause that must not import pyarrow (an error of it cannot happen before)."""
    pa = sys.modules.get("pyarrow")
    exc = getattr(pa, "ArrowException", None) if pa is not None else None
    return (exc,) if exc is not None else ()


def sql_literal(value: Any) -> str:
    """``value`` as a SQL literal: NULL, an int, or a string with its quotes doubled.

    Raises:
        TypeError: any other type (only identity values and paths go into view text).
    """
    if value is None:
        return "NULL"
    if type(value) is int:
        return str(value)
    if type(value) is str:
        return "'" + value.replace("'", "''") + "'"
    raise TypeError(f"no SQL literal for a {type(value).__name__}: {value!r}")


def quote_ident(name: str) -> str:
    """``name`` as a SQL identifier: double-quoted, its double quotes doubled."""
    return '"' + name.replace('"', '""') + '"'


_GLOB = re.compile(r"[*?\[]")


def path_literal(path: Path) -> str | None:
    """An absolute file path as a literal DuckDB's ``read_parquet`` reads as exactly that
    file: its glob characters (``*``, ``?``, ``[``) each inside a character class. None
    when that cannot be said (a path holding both a backslash and a glob character)."""
    text = os.path.abspath(path)
    if _GLOB.search(text):
        if "\\" in text:
            return None
        text = _GLOB.sub(lambda m: f"[{m.group(0)}]", text)
    return sql_literal(text)


def _null_select(columns: Sequence[tuple[str, str]]) -> str:
    cols = ", ".join(f"CAST(NULL AS {t}) AS {quote_ident(n)}" for n, t in columns)
    return f"SELECT {cols} WHERE false"


def _select_list(p: Any, columns: Sequence[tuple[str, str]], identity: Sequence[str]) -> str:
    """The select list of one producer: its ``identity`` columns as constants, the others
    cast from the part's columns of the same name, in ``columns`` order."""
    values = {
        "project": p.project,
        "run": p.run_id,
        "name": p.name,
        "stream": p.stream,
        "rank": p.rank,
    }
    out = []
    for n, t in columns:
        expr = (
            sql_literal(values[n])
            if n in identity
            else DERIVED[n]
            if n in DERIVED
            else quote_ident(n)
        )
        out.append(f"CAST({expr} AS {t}) AS {quote_ident(n)}")
    return ", ".join(out)


#: the identity columns each producer adds as constants
METRICS_IDENTITY = ("project", "run", "name", "stream", "rank")
SPANS_IDENTITY = ("project", "run", "stream", "rank")


class _Sources:
    """The FROM clause for a set of Parquet parts: ``read_parquet([...])``. A path DuckDB's
    globbing cannot name (a backslash and a glob character) is read through a symbolic link
    of a plain name in a folder of this process (:func:`_plain_link`); where no link can be
    made, through a registered pyarrow dataset."""

    def __init__(self, con: Any) -> None:
        self.con = con
        self.count = 0

    def of(self, cached: Any) -> str:
        """The FROM clause of a refresh's rows: its parts, or the Parquet it holds in memory
        (:attr:`~expr_tracker.query.cache.CachedSource.memory`, registered as a table)."""
        if not cached.memory:
            return self(cached.parts)
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.count += 1
        name = f"_et_parts_{self.count}"
        table = pa.concat_tables([pq.read_table(pa.BufferReader(b)) for b in cached.memory])
        self.con.register(name, table)
        return quote_ident(name)

    def __call__(self, parts: Sequence[Path]) -> str:
        literals = []
        for part in parts:
            lit = path_literal(Path(part))
            if lit is None:
                link = _plain_link(Path(part))
                lit = path_literal(link) if link is not None else None
            literals.append(lit)
        if all(lit is not None for lit in literals):
            return f"read_parquet([{', '.join(literals)}])"  # type: ignore[arg-type]
        import pyarrow.dataset as ds

        self.count += 1
        name = f"_et_parts_{self.count}"
        self.con.register(name, ds.dataset([os.path.abspath(p) for p in parts], format="parquet"))
        return quote_ident(name)


_link_dir: Path | None = None


def _plain_link(part: Path) -> Path | None:
    """A symbolic link to ``part`` named by the digest of its path, in a temporary folder
    of this process (removed at exit); None when links cannot be made."""
    global _link_dir
    import hashlib
    import tempfile

    try:
        if _link_dir is None:
            import atexit
            import shutil

            _link_dir = Path(tempfile.mkdtemp(prefix="et-query-links-"))
            atexit.register(shutil.rmtree, _link_dir, True)
        target = os.path.abspath(part)
        link = _link_dir / (hashlib.sha256(os.fsencode(target)).hexdigest()[:32] + ".parquet")
        if not link.is_symlink():
            os.symlink(target, link)
        return link
    except OSError:
        return None


def metrics_select(p: Any, parts: Sequence[Path], merged: bool, source: Any) -> str:
    """One producer's ``SELECT`` of the ``metrics`` view, as ``et.history`` reads the file:
    lines without an integer ``_step`` are left out, and when not ``merged`` (a step in
    several lines) per (step, metric) only the row of the largest ``line`` is kept (a later
    patch line wins) and every row of the step carries the time of its last line.

    The ``WHERE step IS NOT NULL`` stays even when the cache's manifest says every line had
    a step: a cache may be planted in someone else's folder, and its manifest is no proof
    of what its parts hold (docs/query.md "Security")."""
    cols = _select_list(p, METRICS_COLUMNS, METRICS_IDENTITY)
    src = source(parts)
    if not merged:
        src = (
            f"(SELECT * REPLACE (max_by(time, line) OVER (PARTITION BY step) AS time) "
            f"FROM {src} WHERE step IS NOT NULL "
            f"QUALIFY row_number() OVER (PARTITION BY step, metric ORDER BY line DESC) = 1)"
        )
        return f"SELECT {cols} FROM {src}"
    return f"SELECT {cols} FROM {src} WHERE step IS NOT NULL"


def spans_select(p: Any, parts: Sequence[Path], source: Any) -> str:
    """One producer's ``SELECT`` of the ``spans`` view."""
    cols = _select_list(p, SPANS_COLUMNS, SPANS_IDENTITY)
    return f"SELECT {cols} FROM {source(parts)}"


def _union(selects: list[str], columns: Sequence[tuple[str, str]]) -> str:
    return "\nUNION ALL\n".join(selects) if selects else _null_select(columns)


def _parts_stats(parts: Sequence[Any]) -> tuple[Any, Any]:
    """(max step, max time) over Parquet parts (paths, or ``pyarrow.Buffer`` of parts held
    in memory), from their footers' statistics; (None, None) when a part has none (then the
    ``runs`` view falls back to the meta file). ``FileNotFoundError`` when a part vanished
    (its cache was deleted: refresh again)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    best_step = best_time = None
    for part in parts:
        try:
            src = pa.BufferReader(part) if isinstance(part, pa.Buffer) else part
            meta = pq.read_metadata(src)
        except FileNotFoundError:
            raise
        except (OSError, ValueError):
            return None, None
        names = meta.schema.names
        for rg in range(meta.num_row_groups):
            group = meta.row_group(rg)
            for col, which in (("step", 0), ("time", 1)):
                if col not in names:
                    continue
                st = group.column(names.index(col)).statistics
                if st is None or not st.has_min_max:
                    if col == "step" and group.num_rows:
                        return None, None
                    continue
                if which == 0:
                    best_step = st.max if best_step is None else max(best_step, st.max)
                else:
                    best_time = st.max if best_time is None else max(best_time, st.max)
    return best_step, best_time


#: SQL that can see every view without naming one (catalog functions, SHOW, DESCRIBE, ...)
_CATALOG_SQL = re.compile(
    r"information_schema|duckdb_\w+|\bpragma\b|\bshow\b|\bdescribe\b|\bsummarize\b", re.I
)


def referenced_views(sql: str) -> set[str]:
    """The views ``sql`` may read: those whose name appears in it as a word (any case,
    quoted or not), or every view for SQL that lists the catalog (``SHOW TABLES``,
    ``information_schema``, ``duckdb_views()``, ``DESCRIBE``). Over-inclusion only costs time."""
    if _CATALOG_SQL.search(sql):
        return set(VIEWS)
    return {v for v in VIEWS if re.search(rf"\b{v}\b", sql, re.I)}


def connect(
    root: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    views: Any = None,
) -> Any:
    """An in-memory DuckDB connection with the views ``runs``, ``metrics``, ``spans``,
    ``alerts`` and ``artifacts`` over every run under ``root`` (``root`` may be one run
    directory). Each producer's cache is refreshed first, so the views hold every complete
    line written before this call (a torn last line is left for the next call).

    ``cache_dir``: where the columnar cache lives (default: beside each run, see
    :mod:`expr_tracker.query.cache`).

    ``views``: the names of the views to build (None: all; :func:`referenced_views` of a
    query gives the ones it reads). Only those exist in the connection; ``metrics`` and
    ``spans`` caches are refreshed only when a built view reads them (``runs`` reads the
    metrics caches for its ``steps``). A repeated aggregate over ``metrics`` so skips reading
    every run's config, summary, alerts and lineage (and pyarrow's import of pandas).

    What cannot be read (a whole run or file: permissions, not a regular file, outside its
    run directory, damaged JSON; or some lines of a file) is left out, named in the ``runs``
    view's ``problem`` column and in one logged warning; it never raises.

    Returns:
        ``duckdb.DuckDBPyConnection`` (close it when done; the views read the cache files
        lazily, at query time).

    Raises:
        ImportError: duckdb or pyarrow is not installed (names the extra to install).
        FileNotFoundError: ``root`` does not exist.
    """
    duckdb = import_duckdb(arrow=False)
    from expr_tracker.query.catalog import discover

    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"dir {str(root)!r} does not exist (a folder of runs or a run)")
    cdir = Path(cache_dir) if cache_dir is not None else None
    wanted = set(VIEWS) if views is None else set(views) & set(VIEWS)
    need_metrics = bool(wanted & {"metrics", "runs"})
    need_spans = "spans" in wanted
    producers = discover(root, include_unlisted=True)
    problems = Problems()
    for p in producers:
        if p.unlisted is not None:
            problems.add(p, unlisted_problem(p))
    con = quiet(duckdb.connect(":memory:"))
    source = _Sources(con)
    metric_selects: list[str] = []
    span_selects: list[str] = []
    stats: dict[int, tuple[Any, Any]] = {}
    parts: list[str] = []
    refreshed = _refresh_all(producers, cdir, need_metrics, need_spans, "runs" in wanted)
    for i, (p, (m_cached, st, s_cached, found)) in enumerate(
        zip(producers, refreshed, strict=True)
    ):
        problems.extend(found)
        cached = m_cached
        if cached is not None and (cached.parts or cached.memory):
            metric_selects.append(
                metrics_select(
                    p,
                    cached.parts,
                    cached.merged,
                    lambda _, c=cached: source.of(c),
                )
            )
            stats[i] = st
            parts.extend(map(str, cached.parts))
        cached = s_cached
        if cached is not None and (cached.parts or cached.memory):
            span_selects.append(spans_select(p, cached.parts, lambda _, c=cached: source.of(c)))
            parts.extend(map(str, cached.parts))
    try:
        con.execute(f"CREATE TABLE _et_found AS SELECT {len(producers)}::BIGINT AS producers")
        # the parts the views read: when DuckDB fails on one without naming it (a damaged
        # footer: "invalid TType"), api.recover_cache checks them (cache.damaged)
        con.execute("CREATE TABLE _et_parts AS SELECT unnest($1::VARCHAR[]) AS path", [parts])
        # DuckDB opens the parts here already (their schema): a part deleted or damaged
        # since its refresh fails this, and the caller refreshes and connects again
        if "metrics" in wanted:
            con.execute(f"CREATE VIEW metrics AS {_union(metric_selects, METRICS_COLUMNS)}")
        if "spans" in wanted:
            con.execute(f"CREATE VIEW spans AS {_union(span_selects, SPANS_COLUMNS)}")
        # runs last: its problem column names what the other views could not read
        for name, build in (
            ("alerts", lambda: alerts_table(producers, problems)),
            ("artifacts", lambda: artifacts_table(producers, problems)),
            ("runs", lambda: runs_table(producers, stats, problems)),
        ):
            if name in wanted:
                con.register(f"_et_{name}", build())
                con.execute(f"CREATE VIEW {name} AS SELECT * FROM _et_{name}")
    except BaseException as exc:
        con.close()
        if isinstance(exc, Exception):
            try:
                exc.et_parts = parts  # type: ignore[attr-defined]
            except AttributeError:  # pragma: no cover - an exception without a __dict__
                pass
        raise
    message = problems.message()
    if message:
        _unreadable.warn(message, "%s", message)
    return con


_unreadable = Warner()

#: producers whose caches are refreshed at once (threads: decoding and writing Parquet
#: release the GIL), at most this many and at most the machine's cores
REFRESH_THREADS = 8
#: caches are refreshed one after the other while each refresh takes less CPU than this
#: (seconds): one with nothing new (~0.3 ms) is Python and system calls under the GIL,
#: which threads only slow down (100 up-to-date runs: ~25 ms in one thread, ~80-110 ms
#: in a pool of 2 on 2 cores); from the first that takes longer (it decoded new lines)
#: the rest go to the threads (the very first always does, so two runs to decode are
#: decoded at once)
SERIAL_REFRESH_S = 0.005


def _refresh_all(
    producers: Sequence[Any], cdir: Path | None, metrics: bool, spans: bool, stats: bool
) -> list[tuple[Any, Any, Any, Problems]]:
    """Each producer's ``(metrics cache, its stats, spans cache, problems)``, in producer
    order, refreshed in parallel threads when there are several and some have new lines
    (a first query over 100 runs decodes them on every core; up-to-date caches are checked
    in this thread, :data:`SERIAL_REFRESH_S`; the answer and its problems do not depend on
    the order in which the threads finish). ``stats`` (the ``runs`` view's ``steps``) are read
    from the parts' footers only when asked for."""

    def one(p: Any) -> tuple[Any, Any, Any, Problems]:
        found = Problems()
        m_cached = st = s_cached = None
        if p.metrics is not None and metrics:
            m_cached, st = cache_of(p, "metrics", cdir, found, stats=stats)
        if p.spans is not None and spans:
            s_cached, _ = cache_of(p, "spans", cdir, found)
        return m_cached, st, s_cached, found

    workers = min(REFRESH_THREADS, os.cpu_count() or 1, len(producers))
    if workers < 2:
        return [one(p) for p in producers]
    import time
    from concurrent.futures import ThreadPoolExecutor

    import expr_tracker.query.cache  # noqa: F401 - imported before the first is timed

    with ThreadPoolExecutor(workers, thread_name_prefix="et-query-cache") as pool:
        # the first in a thread of the pool, the next ones here one after the other while
        # each is quick (up to date); from the first that is not, the rest in the pool
        first = pool.submit(one, producers[0])
        here = []
        rest = iter(producers[1:])
        for p in rest:
            t0 = time.thread_time()  # CPU: a thread preempted under load is not "slow"
            here.append(one(p))
            if time.thread_time() - t0 > SERIAL_REFRESH_S:
                break
        pooled = [pool.submit(one, p) for p in rest]
        return [first.result(), *here, *(f.result() for f in pooled)]


def cache_of(
    p: Any, kind: str, cache_dir: Path | None, problems: Problems, *, stats: bool = False
) -> tuple[Any, Any]:
    """``(cached, stats)``: the producer's refreshed cache (``None`` when its file vanished
    since it was found, a run being deleted, or cannot be read: recorded in ``problems``,
    like lines it skipped) and, with ``stats``, ``(max step, max time)`` of its rows. A
    cache folder deleted meanwhile is made again (never taken as a run without rows)."""
    from expr_tracker.query.cache import refresh

    path = p.metrics if kind == "metrics" else p.spans
    cached = None
    for _attempt in range(3):
        try:
            cached = refresh(path, kind, cache_dir=cache_dir, root=p.root)
        except FileNotFoundError:
            return None, None
        except (OSError, ValueError, RecursionError) as exc:
            problems.add(p, read_problem(path, exc))
            return None, None
        except Exception as exc:  # noqa: BLE001 - one run's bad file never ends the query
            problems.add(p, f"{path.name}: cannot be read ({type(exc).__name__}: {exc})")
            return None, None
        if not stats:
            break
        try:
            st = _parts_stats(cached.memory or cached.parts)
        except FileNotFoundError:  # its cache was deleted under us: refresh again
            continue
        if cached.bad_lines:
            problems.add(p, lines_problem(path, cached.bad_lines, cached.bad_first))
        return cached, st
    if cached is not None and cached.bad_lines:
        problems.add(p, lines_problem(path, cached.bad_lines, cached.bad_first))
    return cached, (None, None)


def no_runs_note(con: Any, root: str | os.PathLike[str]) -> str | None:
    """A note for a connection of :func:`connect` that found no run under ``root`` (None
    when it found some): where runs are looked for, so an empty answer is not a mystery."""
    from expr_tracker.history.rundirs import MAX_DEPTH

    if con.execute("SELECT producers FROM _et_found").fetchall()[0][0]:
        return None
    return (
        f"no runs under {str(root)!r} (a run is a folder holding a run*.json or "
        f"metrics*.jsonl, searched down to {MAX_DEPTH} folders below it)"
    )


def parts_of(con: Any) -> list[str]:
    """The cache parts the views of a :func:`connect` connection read ([] when it has
    none or is closed)."""
    try:
        return [r[0] for r in con.execute("SELECT path FROM _et_parts").fetchall()]
    except Exception:  # noqa: BLE001 - a closed connection, or not one of connect's
        return []


def describe(con: Any) -> dict[str, list[tuple[str, str]]]:
    """Each view's columns as (name, DuckDB type), in :data:`VIEWS` order (the views built
    in ``con``: see :func:`connect`'s ``views``)."""
    built = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views()").fetchall()}
    out: dict[str, list[tuple[str, str]]] = {}
    for view in (v for v in VIEWS if v in built):
        rows = con.execute(f"DESCRIBE {view}").fetchall()
        out[view] = [(r[0], str(r[1])) for r in rows]
    return out
