"""``et ranks RUN``: span time across the ranks of a multi-rank run, the skew and the
slowest rank (docs/streams.md "Straggler ranks").

    et ranks RUN [--stream S] [--step-range A:B] [--dir DIR] [--format table|json|jsonl]

Per span path (the ``time_ms/<path>`` metrics every rank records), over the steps every
rank recorded it: the median across ranks (its median over steps), the maximum across
ranks (its median over steps), the skew max / median (its median and maximum over steps)
and how often each rank was the slowest (``expr_tracker.history.rankreport``).

Formats: ``table`` (rich), ``json`` (an array, one object per span), ``jsonl``. Exit 0
(also for a run with one rank: no skew to show, said on stderr), 1 no such run or no
metrics file, 2 a usage error.
"""

from __future__ import annotations

import argparse
import sys
from typing import IO, Any

from expr_tracker.cli import output, runfiles


def register(subparsers: Any) -> None:
    """Add the ``ranks`` sub-command to ``subparsers`` (sets ``func``)."""
    p = subparsers.add_parser(
        "ranks",
        help="span time across ranks: skew and the slowest rank",
        description=(
            "Per span path of a multi-rank run: the median and max across ranks per step, "
            "the skew (max / median) and which rank was slowest how often, over the steps "
            "every rank recorded. RUN is a run directory or a run's name under --dir. "
            "Exit 0, 1 no such run, 2 usage error."
        ),
    )
    p.add_argument("run", help="run directory, or a run's name under --dir")
    p.add_argument(
        "--stream", default=None, help="the stream whose ranks to compare (default: main)"
    )
    p.add_argument(
        "--step-range", default=None, metavar="A:B", help="steps A..B-1 (either side optional)"
    )
    runfiles.add_dir_option(p)
    output.add_format_option(p, "table", what="spans")
    p.set_defaults(func=run_ranks)


def _ms(v: Any) -> str:
    return "" if v is None else f"{v:.3f}"


def _x(v: Any) -> str:
    return "" if v is None else f"{v:.2f}x"


def _print_table(report: dict[str, Any], out: IO[str], width: int | None = None) -> None:
    """A rich table: span, steps, median ms, max ms, skew median and max, slowest ranks."""
    from rich.table import Table
    from rich.text import Text

    from expr_tracker.cli.history import table_width

    console = output.console(out, table_width(out, width))
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("span", overflow="fold", ratio=2)
    table.add_column("steps", justify="right", no_wrap=True)
    table.add_column("median ms", justify="right", no_wrap=True)
    table.add_column("max ms", justify="right", no_wrap=True)
    table.add_column("skew", justify="right", no_wrap=True)
    table.add_column("skew max", justify="right", no_wrap=True)
    table.add_column("slowest (steps)", overflow="fold", ratio=2)
    p = output.printable
    for s in report["spans"]:
        slowest = sorted(s["slowest"].items(), key=lambda kv: (-kv[1], kv[0]))
        skew = s["skew_median"]
        table.add_row(
            p(s["span"]),
            str(s["steps"]) + (f" (+{s['incomplete']} incomplete)" if s["incomplete"] else ""),
            _ms(s["median_ms"]),
            _ms(s["max_ms"]),
            Text(_x(skew), style="bold red" if skew is not None and skew > 1.5 else ""),
            _x(s["skew_max"]),
            ", ".join(f"rank {r}: {n}" for r, n in slowest),
        )
    console.print(table)


def run_ranks(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    """The ``et ranks`` command; returns the exit code (0 ok, 1 no such run, 2 usage)."""
    from expr_tracker.history.paths import validate_stream
    from expr_tracker.history.rankreport import rank_report
    from expr_tracker.history.spanfiles import parse_range
    from expr_tracker.query.catalog import RunNotFoundError

    out = out or sys.stdout
    err = sys.stderr
    try:
        validate_stream(args.stream)
        step_range = parse_range(args.step_range, int)
    except ValueError as exc:
        err.write(f"et ranks: {exc}\n")
        return 2
    try:
        run = runfiles.run_path(args.run, getattr(args, "dir", "runs"))
        report = rank_report(run, args.stream, step_range=step_range)
    except (RunNotFoundError, OSError) as exc:
        err.write(f"et ranks: {exc}\n")
        return 1
    n = len(report["ranks"])
    if n < 2:
        what = "one rank (1 metrics file" if n else "no rank (no metrics file"
        err.write(f"et ranks: {run!r} has {what} of this stream): nothing to compare\n")
        if not output.is_machine(args.format):
            return 0  # no empty table under the message
    if output.is_machine(args.format):
        output.write_records(report["spans"], args.format, out)
    else:
        _print_table(report, out)
    return 0
