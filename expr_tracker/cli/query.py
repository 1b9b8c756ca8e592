"""``et query "SQL" [DIR]``: SQL over every run under DIR, answered by DuckDB.

The views (``runs``, ``metrics``, ``spans``, ``alerts``, ``artifacts``) are those of
``et.query`` (docs/query.md); ``et query --schema [DIR]`` lists them with their columns.

Output formats (``--format``):

- ``table`` (default): a rich table of the first ``--max-rows`` rows (100), then the row
  count. NULL prints ``NULL``; NaN and ±inf print ``nan``, ``inf``, ``-inf``; floats to 6
  significant digits (use csv or json for every digit).
- ``csv``: a header, then one line per row; NULL is an empty cell, NaN/±inf are ``nan``,
  ``inf``, ``-inf``; floats with every digit (``repr``); lists and structs as JSON.
- ``json`` (one array, a row per line) and ``jsonl`` (one object per line): strict JSON,
  as every ``et`` command writes it (``jq`` reads it): NaN and ±inf become ``null``, like
  NULL. To keep them apart use ``csv`` or ``parquet``, or ask SQL
  (``isnan(value)``, ``isinf(value)``).
- ``parquet``: needs ``-o FILE``; the result's own types, NaN/±inf intact.

``-o FILE`` writes to FILE instead of stdout, through a temporary ``.FILE.HOST.PID.partial``
beside it that is renamed into place when complete (an existing FILE is replaced), as
``et export`` writes (``query/placement.py``; a killed query's is removed by the next). Rows are streamed: ``csv``, ``json``, ``jsonl`` and ``parquet`` never hold
the whole result in memory.

Exit codes: 0 ok; 1 DIR does not exist, a missing dependency or a write failure; 2 bad SQL
(DuckDB's message and the views with their columns on stderr) or a usage error.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import decimal
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from expr_tracker.cli import output
from expr_tracker.history.values import json_safe
from expr_tracker.query.placement import Placement

FORMATS = ("table", "csv", "json", "jsonl", "parquet")
#: columns of a view shown per line in an error message (the rest: et query --schema)
ERROR_COLUMNS = 14


def register(subparsers: Any) -> None:
    """Add the ``query`` sub-command to ``subparsers`` (sets ``func``)."""
    p = subparsers.add_parser(
        "query",
        help="SQL over every run under a directory (DuckDB): runs, metrics, spans, alerts, "
        "artifacts",
        description=(
            "Run SQL (DuckDB's dialect) over the views runs, metrics, spans, alerts and "
            "artifacts of every run under DIR (default ./runs). Quote dotted column names: "
            'SELECT "config.lr" FROM runs. `et query --schema [DIR]` lists the views.'
        ),
    )
    p.add_argument("sql", nargs="?", default=None, help="the SQL (quote it for the shell)")
    p.add_argument("dir", nargs="?", default=None, help="folder of runs, or a run (default ./runs)")
    p.add_argument(
        "--schema", action="store_true", help="list the views and their columns, then exit"
    )
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="table",
        help="table (default); csv; json: one array; jsonl: one object per line (both strict "
        "JSON: NaN/Infinity as null); parquet (needs -o)",
    )
    p.add_argument("-o", "--output", default=None, metavar="FILE", help="write to FILE")
    p.add_argument(
        "--cache-dir",
        default=None,
        metavar="D",
        help="where the columnar cache lives (default: beside each run)",
    )
    p.add_argument(
        "--max-rows",
        type=int,
        default=100,
        metavar="N",
        help="table: rows shown (default 100; the count of all rows is printed)",
    )
    from expr_tracker.cli.sync import on_buckets

    p.set_defaults(
        func=on_buckets(run_query, "query", "sql", "dir")
    )  # s3://, file:// (docs/team.md)


class UsageError(Exception):
    """A bad combination of arguments (exit 2)."""


def run_query(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    """The ``et query`` command; returns the exit code (see the module doc)."""
    out = out or sys.stdout
    try:
        sql, root = _parse(args)
    except UsageError as exc:
        sys.stderr.write(f"et query: {exc}\n")
        return 2
    if not root.exists():
        sys.stderr.write(f"et query: {str(root)!r} does not exist (a folder of runs, or a run)\n")
        return 1
    try:
        from expr_tracker.query.views import (
            arrow_errors,
            describe,
            import_duckdb,
            no_runs_note,
            referenced_views,
        )

        # first: a missing duckdb or pyarrow names the extra; pyarrow is imported only
        # where used (a cache part to write, a result that needs Arrow: _write)
        duckdb = import_duckdb(arrow=False)

        from expr_tracker.query.api import (
            ATTEMPTS,
            connect_retrying,
            execute,
            recover_cache,
            temp_cache,
        )
    except ImportError as exc:
        sys.stderr.write(f"et query: {exc}\n")
        return 1
    views = None if sql is None else referenced_views(sql)
    try:
        con, cache = connect_retrying(root, args.cache_dir, views)
    except FileNotFoundError as exc:  # DIR is a file, or vanished
        sys.stderr.write(f"et query: {exc}\n")
        return 1
    except duckdb.Error as exc:
        return _sql_error(exc, None, root, args.cache_dir)
    note = no_runs_note(con, root)
    if note:
        sys.stderr.write(f"et query: {note}\n")
    if sql is None:
        try:
            return _print_schema(describe(con), args, out)
        finally:
            con.close()
    for attempt in range(1, ATTEMPTS + 1):
        if attempt > 1:
            try:
                con, cache = connect_retrying(root, cache, views)
            except duckdb.Error as exc:
                return _sql_error(exc, None, root, args.cache_dir)
        sink = _Sink(args.output, out, binary=args.format == "parquet")
        try:
            rel = execute(con, sql)
            _write(rel, args, sink, con=con, sql=sql)
            sink.commit()
            return 0
        except (duckdb.Error, *arrow_errors()) as exc:
            sink.abort()
            if attempt < ATTEMPTS and not sink.wrote_stdout and recover_cache(exc, con):
                # a cache part replaced, deleted or damaged under the query: refresh (the
                # last time into a cache of this process only) and run it again
                if attempt == ATTEMPTS - 1:
                    cache = temp_cache()
                continue
            return _sql_error(exc, con, root, args.cache_dir)
        except ResultError as exc:
            sink.abort()
            sys.stderr.write(f"et query: {exc}\n")
            return 2
        except OSError as exc:
            sink.abort()
            if isinstance(exc, BrokenPipeError):
                raise
            sys.stderr.write(f"et query: cannot write {args.output or 'stdout'}: {exc}\n")
            return 1
        except BaseException:  # Ctrl-C or a bug: no half-written temporary file stays
            sink.abort()
            raise
        finally:
            con.close()
    return 1  # pragma: no cover


def _parse(args: argparse.Namespace) -> tuple[str | None, Path]:
    if args.schema:
        if args.sql is not None and args.dir is not None:
            raise UsageError("--schema takes only DIR, not SQL")
        dir_ = args.dir if args.dir is not None else args.sql
        if args.format == "parquet":
            raise UsageError("--schema prints table, csv, json or jsonl, not parquet")
        return None, Path(dir_ if dir_ is not None else "runs")
    if args.sql is None or not args.sql.strip():
        raise UsageError('give the SQL to run, e.g. et query "SELECT * FROM runs" [DIR]')
    if args.format == "parquet" and not args.output:
        raise UsageError("--format parquet needs -o FILE (Parquet is binary, not for a terminal)")
    if args.max_rows < 0:
        raise UsageError(f"--max-rows must be 0 or more, not {args.max_rows}")
    return args.sql, Path(args.dir if args.dir is not None else "runs")


def _sql_error(exc: Exception, con: Any, root: Path, cache_dir: Any) -> int:
    from expr_tracker.errors import format_query_error
    from expr_tracker.query.api import all_views

    try:
        views = all_views(con, root, cache_dir)
    except Exception:  # noqa: BLE001 - the message matters more than the listing
        views = {}
    lines = str(exc).rstrip().splitlines()
    if len(lines) > 12:
        lines = [*lines[:12], f"... ({len(lines) - 12} more lines)"]
    text = format_query_error("\n".join(lines), views, max_columns=ERROR_COLUMNS)
    sys.stderr.write(f"et query: {text}\n")
    return 2


# --------------------------------------------------------------------------- sinks


#: output to stdout is held back until this much is written, so a query run again (its
#: cache deleted under it) never prints the same rows twice
HOLD_CHARS = 1 << 20


class _Held:
    """``out`` with its first :data:`HOLD_CHARS` characters held back until :meth:`release`
    (or until more are written): until then a failed attempt prints nothing."""

    def __init__(self, out: IO[str]) -> None:
        self._out = out
        self._held: list[str] | None = []
        self._size = 0

    @property
    def passed(self) -> bool:
        """True once anything reached ``out``."""
        return self._held is None

    def write(self, text: str) -> int:
        if self._held is None:
            return self._out.write(text)
        self._held.append(text)
        self._size += len(text)
        if self._size > HOLD_CHARS:
            self.release()
        return len(text)

    def release(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self._out.write("".join(held))

    def flush(self) -> None:
        if self._held is None:
            self._out.flush()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding ... of ``out``
        return getattr(self._out, name)


class _Sink:
    """Where the output goes: ``out`` (stdout, its start held back until :meth:`commit`),
    or ``path`` through a temporary file beside it that :meth:`commit` renames into place
    (:meth:`abort` removes it): the placement ``et export`` uses too
    (:class:`~expr_tracker.query.placement.Placement`; an existing file is replaced)."""

    def __init__(self, path: str | None, out: IO[str], binary: bool = False) -> None:
        self.path = Path(path) if path else None
        self.out = out
        self.binary = binary
        self.place: Placement | None = None
        self._file: Any = None
        self._held: _Held | None = None

    @property
    def wrote_stdout(self) -> bool:
        """True once output reached stdout (an attempt can no longer be taken back)."""
        return self._held is not None and self._held.passed

    def text(self) -> IO[str]:
        """The text stream to write to (opened on first use)."""
        if self.path is None:
            if self._held is None:
                self._held = _Held(self.out)
            return self._held  # type: ignore[return-value]
        if self._file is None:
            self._file = open(self._temp(), "w", encoding="utf-8", newline="")  # noqa: SIM115
        return self._file

    def binary_path(self) -> Path:
        """The temporary file a binary writer (Parquet) writes to."""
        return self._temp()

    def _temp(self) -> Path:
        if self.place is None:
            assert self.path is not None
            place = Placement(self.path, overwrite=True)
            # created like any file (permissions from the umask, not mkstemp's 0600)
            with open(place.tmp, "xb"):
                pass
            self.place = place
        return self.place.tmp

    def commit(self) -> None:
        if self._file is not None:
            self._file.close()
        if self.path is not None:
            if self.place is None:  # nothing written: an empty file
                self.text()
                self._file.close()
            self.place.commit()  # type: ignore[union-attr]
        else:
            if self._held is not None:
                self._held.release()
            self.out.flush()

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
        if self.place is not None:
            self.place.abort()


# --------------------------------------------------------------------------- values


def json_value(v: Any) -> Any:
    """A result value as JSON data: floats stay floats (NaN/±inf included), decimals become
    floats (a decimal without a fraction, as DuckDB's HUGEINT ``sum()`` of integers, an
    int), dates and times ISO 8601 text, intervals seconds (a month counted as 30 days, as
    DuckDB's ``epoch()`` does), lists and structs recursively; other values their
    ``str()``."""
    if v is None or type(v) in (bool, int, float, str):
        return v
    if isinstance(v, decimal.Decimal):
        if v.is_finite() and v.as_tuple().exponent >= 0:  # type: ignore[operator]
            return int(v)
        return float(v)
    if isinstance(v, (_dt.datetime, _dt.date, _dt.time)):
        return v.isoformat()
    if isinstance(v, _dt.timedelta):
        return v.total_seconds()
    if type(v).__name__ == "MonthDayNano":  # pyarrow's interval (DuckDB's INTERVAL)
        return (v.months * 30 + v.days) * 86400 + v.nanoseconds / 1e9
    if isinstance(v, dict):
        return {str(k): json_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_value(x) for x in v]
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", errors="backslashreplace")
    return str(v)


def json_dumps(v: Any) -> str:
    """Compact JSON with ``NaN``/``Infinity``/``-Infinity`` for non-finite floats (as the
    run's files write them) and ASCII escapes."""
    return json.dumps(json_value(v), separators=(",", ":"), allow_nan=True)


def csv_value(v: Any) -> Any:
    """A CSV cell: NULL empty, floats with every digit (``nan``/``inf``/``-inf``),
    booleans ``true``/``false``, lists and structs as JSON."""
    if v is None:
        return ""
    t = type(v)
    if t is float:
        return repr(v)
    if t is bool:
        return "true" if v else "false"
    if t in (int, str):
        return v
    if isinstance(v, (list, tuple, dict)):
        return json_dumps(v)
    j = json_value(v)
    return repr(j) if type(j) is float else j


def cell_value(v: Any) -> str:
    """A table cell for people: floats to 6 significant digits (``nan``, ``inf``,
    ``-inf`` shown as such; see :func:`_short_float`), lists and structs as JSON."""
    if v is None:
        return "NULL"
    t = type(v)
    if t is float:
        return _short_float(v)
    if t is bool:
        return "true" if v else "false"
    if isinstance(v, (list, tuple, dict)):
        return json_dumps(v)
    if t in (int, str):
        return str(v)
    j = json_value(v)
    return _short_float(j) if type(j) is float else str(j)


def _short_float(v: float) -> str:
    """6 significant digits; a large number (an epoch time) keeps its integer part and two
    decimals instead (``1796157260.38``, not ``1.79616e+09``)."""
    if math.isfinite(v) and 1e6 <= abs(v) < 1e15:
        return f"{v:.2f}"
    return f"{v:.6g}"


def _rows(reader: Any, names: list[str]) -> Iterator[Any]:
    """Each row of a record batch reader (or of :class:`_PlainRows`) as a sequence of
    Python values (column order)."""
    if isinstance(reader, _PlainRows):
        for rows in reader:
            yield from rows
        return
    for batch in reader:
        cols = [c.to_pylist() for c in batch.columns]
        yield from zip(*cols, strict=True) if cols else ([] for _ in range(batch.num_rows))


# --------------------------------------------------------------------------- writers


#: DuckDB result types whose Python values (``fetchmany``) are those of pyarrow's
#: ``to_pylist`` (bool, int, float, str, None): a result of only these is written without
#: Arrow (no pyarrow import in the process); any other type goes through Arrow
_PLAIN_TYPES = frozenset(
    {"BOOLEAN", "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "FLOAT", "DOUBLE", "VARCHAR"}
    | {"UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT"}
)
_NUMERIC_TYPES = _PLAIN_TYPES - {"BOOLEAN", "VARCHAR"}

#: rows fetched from DuckDB at a time when writing without Arrow
FETCH_ROWS = 10_000


class _PlainRows:
    """A result of :data:`_PLAIN_TYPES` columns read as Python tuples straight from
    DuckDB (a streamed cursor: never the whole result in memory): the same values the
    Arrow path gives, without importing pyarrow. Iterating yields batches (lists of
    tuples) of at most :data:`FETCH_ROWS` rows."""

    def __init__(self, cursor: Any, names: list[str], types: list[str]) -> None:
        self.cursor = cursor
        self.names = names
        self.numeric = [t in _NUMERIC_TYPES for t in types]

    def __iter__(self) -> Iterator[list[tuple[Any, ...]]]:
        while True:
            batch = self.cursor.fetchmany(FETCH_ROWS)
            if not batch:
                return
            yield batch


def _plain_rows(rel: Any, fmt: str, con: Any, sql: str | None) -> _PlainRows | None:
    """The rows of ``sql`` (the statement ``rel`` is of, on ``con``) as
    :class:`_PlainRows` when ``fmt`` is a text format, ``sql`` is one statement and every
    column of ``rel`` is of a plain type; else None (the Arrow path). The statement is run
    here (``rel`` is only bound, not run)."""
    if fmt == "parquet" or con is None or sql is None:
        return None
    try:
        types = [str(t) for t in rel.types]
        names = list(rel.columns)
        fetchmany = getattr(con, "fetchmany", None)
        single = len(con.extract_statements(sql)) == 1
    except Exception:  # noqa: BLE001 - anything unusual: the Arrow path decides
        return None
    if fetchmany is None or not single or len(types) != len(names):
        return None
    if not all(t in _PLAIN_TYPES for t in types):
        return None
    cursor = con.execute(sql)
    got = [str(d[1]) for d in cursor.description or ()]
    if got != types:  # pragma: no cover - the same statement bound twice
        raise ResultError(f"the result's types changed between two bindings: {types} {got}")
    return _PlainRows(cursor, names, types)


def _write(
    rel: Any, args: argparse.Namespace, sink: _Sink, *, con: Any = None, sql: str | None = None
) -> None:
    from expr_tracker.query.api import unique_names

    if rel is None:  # a statement without a result (CREATE, SET ...)
        if args.format == "table":
            sink.text().write("ok\n")
        return
    plain = _plain_rows(rel, args.format, con, sql)
    if plain is not None:
        reader: Any = plain
        names = plain.names
    else:
        from expr_tracker.query.api import arrow_reader

        reader = arrow_reader(rel)
        names = list(reader.schema.names)
    if args.format == "parquet":
        _write_parquet(reader, unique_names(names), sink.binary_path())
    elif args.format == "csv":
        w = csv.writer(sink.text(), lineterminator="\n")
        w.writerow(names)
        for row in _rows(reader, names):
            w.writerow([csv_value(v) for v in row])
    elif args.format in ("json", "jsonl"):
        keys = unique_names(names)
        f = sink.text()
        first = True
        for row in _rows(reader, names):
            obj = json.dumps(
                json_safe({k: json_value(v) for k, v in zip(keys, row, strict=True)}, "null"),
                separators=(",", ":"),
                allow_nan=False,
            )
            if args.format == "jsonl":
                f.write(obj + "\n")
            else:
                f.write(("[\n" if first else ",\n") + obj)
            first = False
        if args.format == "json":
            f.write("[]\n" if first else "\n]\n")
    else:
        _write_table(reader, names, args.max_rows, sink)


class ResultError(Exception):
    """The result cannot be written in the format asked for (exit 2)."""


def _write_parquet(reader: Any, names: list[str], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([f.with_name(n) for f, n in zip(reader.schema, names, strict=True)])
    bad = [f"{f.name!r} ({f.type})" for f in schema if "interval" in str(f.type)]
    if bad:
        raise ResultError(
            f"Parquet cannot hold the INTERVAL column {', '.join(bad)}: give it in seconds "
            "in the SQL (epoch(ended - started)), or use --format csv or json"
        )
    try:
        writer = pq.ParquetWriter(path, schema)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid) as exc:
        raise ResultError(f"Parquet cannot hold this result: {exc}") from None
    with writer:
        for batch in reader:
            writer.write_batch(pa.RecordBatch.from_arrays(batch.columns, schema=schema))


def _write_table(reader: Any, names: list[str], max_rows: int, sink: _Sink) -> None:
    from rich.table import Table
    from rich.text import Text

    from expr_tracker.cli.history import cell_len, table_width

    shown: list[list[Any]] = []
    total = 0
    for row in _rows(reader, names):
        if len(shown) < max_rows:
            shown.append(list(row))
        total += 1
    if isinstance(reader, _PlainRows):
        numeric = reader.numeric
    else:
        numeric = [
            str(f.type).startswith(("int", "uint", "float", "double", "decimal"))
            for f in reader.schema
        ]
    f = sink.text()
    to_file = sink.path is not None
    console = output.console(
        f, table_width(f) if not to_file else 200, no_color=to_file, force_terminal=False
    )
    names = [output.printable(n) for n in names]  # control characters escaped for people
    cells = [[output.printable(cell_value(v)) for v in row] for row in shown]
    need = sum(
        max([cell_len(n), *(max(map(cell_len, c[i].splitlines() or [""])) for c in cells)])
        for i, n in enumerate(names)
    ) + 2 * max(len(names) - 1, 0)
    if need > console.width and shown:
        _print_vertical(console, names, shown, cells)
    else:
        table = Table(box=None, header_style="bold", pad_edge=False)
        for name, num in zip(names, numeric, strict=True):
            table.add_column(Text(name), justify="right" if num else "left", overflow="fold")
        for row, texts in zip(shown, cells, strict=True):
            table.add_row(
                *(
                    Text(t, style="dim") if v is None else Text(t)
                    for v, t in zip(row, texts, strict=True)
                )
            )
        console.print(table)
    rows = "row" if total == 1 else "rows"
    if total > len(shown):
        console.print(
            Text(
                f"{total} {rows}, the first {len(shown)} shown (--max-rows N; --format csv "
                "or json for all)",
                style="dim",
            )
        )
    else:
        console.print(Text(f"{total} {rows}", style="dim"))


def _print_vertical(console: Any, names: list[str], rows: list[list[Any]], cells: list) -> None:
    """Rows too wide for the terminal, one block per row: ``column  value`` lines."""
    from rich.table import Table
    from rich.text import Text

    for i, (row, texts) in enumerate(zip(rows, cells, strict=True)):
        console.print(Text(f"-[ row {i + 1} ]-", style="bold"))
        table = Table(box=None, show_header=False, pad_edge=False)
        table.add_column(no_wrap=True, style="bold")
        table.add_column(overflow="fold")
        for name, v, t in zip(names, row, texts, strict=True):
            table.add_row(Text(name), Text(t, style="dim") if v is None else Text(t))
        console.print(table)


def _print_schema(
    views: dict[str, list[tuple[str, str]]], args: argparse.Namespace, out: IO[str]
) -> int:
    records = [{"view": v, "column": c, "type": t} for v, cols in views.items() for c, t in cols]
    sink = _Sink(args.output, out)
    f = sink.text()
    if args.format in ("json", "jsonl"):
        output.write_records(records, args.format, f)
    elif args.format == "csv":
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["view", "column", "type"])
        for r in records:
            w.writerow([r["view"], r["column"], r["type"]])
    else:
        from rich.table import Table
        from rich.text import Text

        from expr_tracker.cli.history import table_width

        console = output.console(f, table_width(f) if sink.path is None else 200)
        for i, (view, cols) in enumerate(views.items()):
            if i:
                console.print()
            console.print(Text(f"{view} ({len(cols)} columns)", style="bold"))
            table = Table(box=None, show_header=False, pad_edge=False, padding=(0, 2, 0, 2))
            table.add_column(overflow="fold")
            table.add_column(style="dim", no_wrap=True)
            for c, t in cols:
                table.add_row(Text(output.printable(c)), Text(t))
            console.print(table)
    sink.commit()
    return 0
