"""``et history RUN``: a run's metrics as a table (people), JSON lines or CSV (scripts).

``--follow`` prints the newest rows and then every row as it lands until interrupted
(Ctrl-C exits 0) or until the run has ended (``run.json`` says finished, failed or crashed)
and every row it wrote is printed (exit 0). Like ``tail -F`` it waits for the metrics file
of a live run that has not written a row yet. Output formats:

- ``table``: a rich table; with ``--follow`` fixed-width lines under one header, so rows
  printed later line up with the first ones;
- ``json``: one JSON document, an array of rows; ``jsonl``: one row per line (JSON Lines).
  Both strict JSON (``cli/output.py``): NaN and ±Infinity are written as ``null`` so ``jq``
  and other strict parsers accept them (the file itself keeps ``NaN``; read it with
  ``et.history(run=...)`` to see them). With ``--follow``, ``json`` writes the array as
  rows land and closes it when following stops (the run ended, or Ctrl-C); a reader that
  wants each row at once uses ``jsonl``;
- ``csv``: a header, then one row per step; absent values are empty cells; NaN/inf are
  written as ``nan``/``inf``/``-inf``.

With ``--follow`` the columns are fixed by the first rows (or ``--metrics``); a metric that
first appears later is shown in ``json``/``jsonl`` only. A step written in several lines (a
patch line after ``max_open_seconds``) is printed as each line lands.

The files are untrusted input: only regular files are opened (a FIFO named
``metrics.jsonl`` or ``run.json`` is an error or an unreadable status, never a hang), a
line that is not a row (bad JSON, nested too deeply, a lone surrogate) is skipped and
named in one warning per file, and the ``table`` format escapes control characters in
names and values (``cli.output.printable``); ``json``, ``jsonl`` and ``csv`` keep them.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from expr_tracker.cli import output, runfiles
from expr_tracker.history.values import format_value, json_safe


def register(subparsers: Any) -> None:
    """Add the ``history`` sub-command to ``subparsers`` (sets ``func``)."""
    p = subparsers.add_parser(
        "history",
        help="print a run's metrics (table, JSON, JSON lines or CSV); --follow a live run",
        description=(
            "Print the newest steps of a run's metrics file. RUN is a run directory "
            "(metrics[.stream][.rankN].jsonl is chosen by exact name, from --stream and "
            "--rank), a metrics file, or project/name or name of a run under --dir."
        ),
    )
    p.add_argument("run", help="run directory, metrics .jsonl file, or a run's name under --dir")
    p.add_argument(
        "-n",
        type=int,
        default=None,
        help="the newest N steps (negative, e.g. -1: all of them); default 20, or with --step-range every "
        "step of the range",
    )
    p.add_argument("--metrics", default=None, metavar="A,B", help="columns to show")
    p.add_argument(
        "--step-range", default=None, metavar="A:B", help="steps A..B-1 (either side optional)"
    )
    runfiles.add_producer_options(p, "metrics", "metrics")
    runfiles.add_dir_option(p)
    output.add_format_option(p, "table", extra=("csv",), what="rows")
    p.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep printing rows as they land, until the run ends (or Ctrl-C)",
    )
    p.add_argument(
        "--interval",
        type=float,
        default=0.5,
        help="seconds between polls with --follow (default 0.5)",
    )
    from expr_tracker.cli.sync import on_buckets

    p.set_defaults(
        func=on_buckets(run_history, "history", "run", "dir")
    )  # s3://, file:// (docs/team.md)


# --------------------------------------------------------------------------- values


def _isatty(f: Any) -> bool:
    try:
        return bool(f.isatty())
    except (AttributeError, ValueError):
        return False


def table_width(out: Any, width: int | None = None) -> int | None:
    """The width for a rich table written to ``out``: ``width`` when given; None (the
    terminal's) on a terminal; otherwise ``$COLUMNS`` or 200, so piped tables of every
    ``et`` command are cut at the same width (rich alone would use 80)."""
    if width is not None:
        return width
    if _isatty(out):
        return None
    env = os.environ.get("COLUMNS", "")
    return int(env) if env.isdigit() and int(env) > 0 else 200


def _csv_value(v: Any) -> Any:
    if v is None:
        return ""
    if type(v) is float:
        return repr(v) if math.isfinite(v) else str(v)
    if isinstance(v, (list, dict)):
        return json.dumps(json_safe(v, "null"), separators=(",", ":"))
    return v


def _clock(t: Any) -> str:
    if not isinstance(t, (int, float)) or isinstance(t, bool):
        return ""
    try:
        return time.strftime("%H:%M:%S", time.localtime(t))
    except (OverflowError, OSError, ValueError):
        return ""


# --------------------------------------------------------------------------- printers


class Printer:
    """Writes rows in one format to ``out``; ``start(columns)`` once, then ``rows(...)``."""

    def __init__(
        self, fmt: str, out: IO[str], follow: bool = False, width: int | None = None
    ) -> None:
        self.fmt = fmt
        self.out = out
        self.follow = follow
        #: table width in cells (None: the terminal's; when ``out`` is not a terminal,
        #: ``$COLUMNS`` or 200)
        self.width = width
        self.columns: list[str] = []
        self._csv: Any = None
        self._widths: list[int] = []
        self._records: Any = None  # json/jsonl: a cli.output.RecordWriter

    def start(self, columns: list[str]) -> None:
        self.columns = columns
        if self.fmt in ("json", "jsonl"):
            from expr_tracker.cli.output import RecordWriter

            self._records = RecordWriter(self.fmt, self.out)
        elif self.fmt == "csv":
            self._csv = csv.writer(self.out, lineterminator="\n")
            self._csv.writerow(["_step", "_time", *columns])
        elif self.fmt == "table" and self.follow:
            shown = [output.printable(c) for c in columns]
            self._widths = [max(10, len(c)) for c in shown]
            head = f"{'step':>8}  {'time':>8}  " + "  ".join(
                f"{c:>{w}}" for c, w in zip(shown, self._widths, strict=True)
            )
            self.out.write(head + "\n")

    def rows(self, rows: list[dict[str, Any]]) -> None:
        out = self.out
        if self._records is not None:
            self._records.write(rows)
        elif self.fmt == "csv":
            for r in rows:
                self._csv.writerow(
                    [_csv_value(r.get(k)) for k in ("_step", "_time", *self.columns)]
                )
        elif self.follow:
            for r in rows:
                cells = "  ".join(
                    f"{output.printable(format_value(r.get(c), 'cell')):>{w}}"
                    for c, w in zip(self.columns, self._widths, strict=True)
                )
                out.write(
                    f"{format_value(r.get('_step'), 'cell'):>8}  {_clock(r.get('_time')):>8}  {cells}\n"
                )
        else:
            self._table(rows)
        out.flush()

    def close(self) -> None:
        """End the output (``json``: the array's closing ``]``; ``[]`` when no row came)."""
        if self.fmt in ("json", "jsonl") and self._records is None:
            self.start(self.columns)
        if self._records is not None:
            self._records.close()

    def _table(self, rows: list[dict[str, Any]]) -> None:
        """One row per step when every column fits the width at its full size; otherwise
        transposed (one row per metric, one column per step), in as many blocks of steps
        as the width needs, so no header or value is ever cut."""
        from expr_tracker.cli.output import console as make_console

        console = make_console(self.out, table_width(self.out, self.width))
        printable = output.printable
        steps = [format_value(r.get("_step"), "cell") for r in rows]
        times = [_clock(r.get("_time")) for r in rows]
        cells = [[printable(format_value(r.get(c), "cell")) for r in rows] for c in self.columns]
        names = [printable(c) for c in self.columns]
        heads = ["step", "time", *names]
        cols = [steps, times, *cells]
        need = sum(
            max([cell_len(h), *(cell_len(v) for v in col)])
            for h, col in zip(heads, cols, strict=True)
        )
        need += _GAP * (len(heads) - 1)
        if need <= console.width or not self.columns or not rows:
            console.print(_wide_table(heads, cols))
            return
        for k, block in enumerate(_step_blocks(steps, times, cells, names, console.width)):
            if k:
                console.print()
            console.print(_tall_table(block, steps, times, cells, names))


_GAP = 2  # cells between two table columns (rich's padding (0, 1), no outer edge)


def cell_len(text: str) -> int:
    """Terminal cells taken by ``text`` (wide characters count twice)."""
    from rich.cells import cell_len as _cell_len

    return _cell_len(text)


def _table_class() -> Any:
    from rich.table import Table

    return Table(box=None, header_style="bold", pad_edge=False)


def _wide_table(heads: list[str], cols: list[list[str]]) -> Any:
    """One row per step: ``step``, ``time``, then a column per metric."""
    table = _table_class()
    table.add_column(heads[0], justify="right", no_wrap=True)
    table.add_column(heads[1], justify="right", style="dim", no_wrap=True)
    for h in heads[2:]:
        table.add_column(h, justify="right", no_wrap=True)
    for i in range(len(cols[0])):
        table.add_row(*(col[i] for col in cols))
    return table


def _step_blocks(
    steps: list[str], times: list[str], cells: list[list[str]], columns: list[str], width: int
) -> list[list[int]]:
    """Row indices split into consecutive blocks whose transposed table fits ``width``
    (at least one step per block)."""
    name_w = max([cell_len("step"), *(cell_len(c) for c in columns)])
    blocks: list[list[int]] = []
    cur: list[int] = []
    used = name_w
    for i in range(len(steps)):
        w = max(cell_len(steps[i]), cell_len(times[i]), *(cell_len(col[i]) for col in cells))
        if cur and used + _GAP + w > width:
            blocks.append(cur)
            cur, used = [], name_w
        cur.append(i)
        used += _GAP + w
    if cur:
        blocks.append(cur)
    return blocks


def _tall_table(
    block: list[int], steps: list[str], times: list[str], cells: list[list[str]], columns: list[str]
) -> Any:
    """Transposed: a column per step of ``block`` (headed by the step), a ``time`` row,
    then one row per metric (its full name in the first column)."""
    table = _table_class()
    table.add_column("step", justify="left", overflow="fold")
    for i in block:
        table.add_column(steps[i], justify="right", no_wrap=True)
    table.add_row("time", *(times[i] for i in block), style="dim")
    for name, col in zip(columns, cells, strict=True):
        table.add_row(name, *(col[i] for i in block))
    return table


# --------------------------------------------------------------------------- follow


def follow(
    path: str | os.PathLike[str],
    offset: int,
    on_rows: Callable[[list[dict[str, Any]]], None],
    *,
    interval: float = 0.5,
    stop: Callable[[], bool] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    done: Callable[[], bool] | None = None,
) -> int:
    """Call ``on_rows`` with the rows appended to ``path`` after byte ``offset``, until
    ``stop()`` is true, or — when ``done`` is given — until ``done()`` says the writer has
    finished and every complete line it wrote has been passed on (or forever). Returns the
    offset reached.

    Only complete lines are decoded; a partial last line waits for its newline. A file
    that shrinks (replaced, or a torn line repaired) is followed from its new end; a file
    that does not exist yet is waited for. ``done`` is asked only when no new data is
    there, and the file is read once more after it says yes, so the writer must finish
    writing before ``done()`` turns true (the run closes its metrics file before
    ``run.json`` says finished).
    """
    from expr_tracker.history.reader import decode_appended
    from expr_tracker.history.untrusted import UnsafeFileError, open_regular

    carry = b""
    finishing = False
    while stop is None or not stop():
        try:
            size = os.stat(path).st_size
        except OSError:
            size = offset
        if size == offset and done is not None:
            if finishing:
                break  # read once more after done() said yes: nothing left
            if done():
                finishing = True
                continue
        if size < offset:
            offset, carry = size, b""
        if size > offset:
            try:
                fd = open_regular(path)
            except UnsafeFileError:
                raise  # no longer a regular file (swapped for a FIFO): the caller says so
            except OSError:
                sleep(interval)  # gone or replaced between the stat and the open
                continue
            with open(fd, "rb") as f:
                f.seek(offset)
                data = f.read(size - offset)
            offset += len(data)
            rows, carry = decode_appended(carry, data)
            if rows:
                on_rows(rows)
            continue
        sleep(interval)
    return offset


# --------------------------------------------------------------------------- command


def complete_end(path: Path) -> int:
    """The offset after the last complete line (what a reader can use now).

    Raises ``OSError`` (``UnsafeFileError`` when ``path`` is not a regular file)."""
    from expr_tracker.history.untrusted import open_regular

    with open(open_regular(path), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return 0
        f.seek(max(0, size - 65536))
        tail = f.read(65536)
    nl = tail.rfind(b"\n")
    if nl < 0:
        return 0 if size <= 65536 else size  # a huge unterminated line: leave it
    return size - len(tail) + nl + 1


_ENDED = ("finished", "failed", "crashed", "preempted", "pruned")


def _status(info_path: Path | None) -> str | None:
    """The run's status (``crashed`` when run.json says running but its process is gone);
    None without a readable run.json. Never rewrites the file."""
    from expr_tracker.history.runinfo import read_run_info

    if info_path is None:
        return None
    info = read_run_info(info_path, repair=False)
    status = info.get("status") if info is not None else None
    return status if isinstance(status, str) else None


def run_history(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    """The ``et history`` command; returns the exit code (0 ok, 1 no such run, 2 usage).

    With ``--follow`` on a run directory whose ``run[.S].json`` says running but that has
    no metrics file yet, the file is waited for. Following stops (exit 0) once the run has
    ended (``finished``/``failed``/``crashed``) and every row it wrote has been printed,
    or at Ctrl-C (exit 0 too, also while the first rows are being printed).
    """
    try:
        return _history(args, out)
    except KeyboardInterrupt:
        if getattr(args, "follow", False):
            return 0
        raise
    except OSError as exc:  # a file that cannot be read: permissions, a FIFO in its place
        if isinstance(exc, BrokenPipeError):
            raise
        from expr_tracker.history.rundirs import os_reason

        where = exc.filename if exc.filename is not None else args.run
        sys.stderr.write(f"et history: cannot read {str(where)!r}: {os_reason(exc)}\n")
        return 1


def _history(args: argparse.Namespace, out: IO[str] | None) -> int:
    from expr_tracker.history.frame import (
        columns_of,
        parse_columns,
        shape,
        unknown_columns,
        unknown_message,
    )
    from expr_tracker.history.paths import file_name, rank_shards, resolve_run_path
    from expr_tracker.history.query import check_n, parse_step_range
    from expr_tracker.history.reader import JsonlReader

    out = out or sys.stdout
    err = sys.stderr
    rank = getattr(args, "rank", None)
    try:
        bounds = parse_step_range(args.step_range)
        # -n not given: 20 steps, or with --step-range every step of the range
        n = check_n(args.n) if args.n is not None else (20 if bounds is None else None)
        cols = parse_columns(args.metrics)
        runfiles.check_rank(rank)
    except (TypeError, ValueError) as exc:
        err.write(f"et history: {exc}\n")
        return 2
    from expr_tracker.query.catalog import RunNotFoundError

    try:
        args.run = runfiles.run_path(args.run, getattr(args, "dir", "runs"))
    except RunNotFoundError as exc:
        err.write(f"et history: {exc}\n")
        return 1
    waiting = False
    try:
        path = resolve_run_path(args.run, stream=args.stream, rank=rank)
    except (FileNotFoundError, ValueError) as exc:
        path = None
        want = Path(args.run) / file_name("metrics", args.stream, rank)
        # a FIFO, socket or device with the name: no rows can come from it (the message says)
        special = os.path.exists(want) and not os.path.isfile(want)
        if isinstance(exc, FileNotFoundError) and Path(args.run).is_dir() and not special:
            status = _status(runfiles.producer_file(args.run, "run", args.stream, rank))
            if args.follow and status == "running":
                # like `tail -F`: a live run that has not written a row yet will create it
                path, waiting = want, True
            elif status in _ENDED and want.is_file():
                path = want  # the run wrote its rows and ended since we looked: read them
            elif status in _ENDED:
                # the run ended without committing a row: nothing to show, not an error
                if args.format == "csv":
                    Printer("csv", out).start(cols or [])
                Printer(args.format, out).close()  # json: an empty array
                err.write(
                    f"et history: no rows: the run {status} without writing any "
                    f"({want.name} was never created in {str(args.run)!r})\n"
                )
                return 0
        if path is None:
            err.write(f"et history: {exc}\n")
            return 1
    if not rank and Path(args.run).is_dir():
        shards = rank_shards(args.run, args.stream)
        if shards:
            err.write(
                f"et history: note: {str(args.run)!r} also has rank shards "
                f"({', '.join(shards.values())}); showing {path.name} (rank 0) — use "
                f"--rank N for another rank\n"
            )
    info_path = runfiles.producer_file(args.run, "run", args.stream, rank) if args.follow else None
    if info_path is not None and (info_path.exists() or info_path.is_symlink()):
        from expr_tracker.history.rundirs import os_reason
        from expr_tracker.history.runinfo import load_run_info

        try:
            load_run_info(info_path)
        except (OSError, ValueError) as exc:
            err.write(
                f"et history: note: {info_path.name} cannot be read ({os_reason(exc)}), so "
                "the end of the run cannot be seen: following until Ctrl-C\n"
            )
    if waiting:
        err.write(f"et history: waiting for {path.name} in {str(args.run)!r} (the run is live)\n")
        end, rows = 0, []
    else:
        end = complete_end(path)
        reader = JsonlReader(path, end=end)
        rows = reader.tail(n) if bounds is None else reader.read_range(*bounds)
        if n is not None and len(rows) > n:
            rows = rows[-n:] if n else []
    for name, close in unknown_columns(rows, cols):
        # a metric may appear later in a live run: say so, but print what there is (exit 0)
        err.write(f"et history: warning: {unknown_message(name, close, len(rows))}\n")
    rows = shape(rows, cols)
    printer = Printer(args.format, out, follow=args.follow)
    # with --follow and nothing to show yet, the columns come from the first rows that land
    started = not (
        args.follow and not rows and cols is None and args.format not in ("json", "jsonl")
    )
    if started:
        printer.start(cols if cols is not None else columns_of(rows))
        printer.rows(rows)
    if not rows and args.format == "table" and n != 0 and not waiting:
        what = f"in --step-range {args.step_range}" if bounds is not None else "to show"
        err.write(f"et history: no rows {what} ({path.name} in {str(args.run)!r})\n")
    if not args.follow:
        printer.close()
        return 0
    lo = bounds[0] if bounds and bounds[0] is not None else None
    hi = bounds[1] if bounds and bounds[1] is not None else None

    def on_rows(new: list[dict[str, Any]]) -> None:
        nonlocal started
        if lo is not None or hi is not None:
            new = [
                r
                for r in new
                if type(r.get("_step")) is int
                and (lo is None or r["_step"] >= lo)
                and (hi is None or r["_step"] < hi)
            ]
        if not new:
            return
        new = shape(new, cols)
        if not started:
            printer.start(columns_of(new))
            started = True
        printer.rows(new)

    def done() -> bool:
        return _status(info_path) in _ENDED

    try:
        follow(
            path,
            end,
            on_rows,
            interval=max(0.01, args.interval),
            done=done if info_path is not None else None,
        )
    except KeyboardInterrupt:
        pass
    if not started and args.format == "csv":
        printer.start(cols or [])  # the header, as without --follow
    printer.close()  # json: the array's closing bracket
    return 0
