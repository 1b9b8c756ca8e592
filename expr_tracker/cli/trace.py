"""``et trace``: a run's span files -> Chrome Trace JSON for Perfetto / chrome://tracing."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(subparsers: Any) -> None:
    """Add the ``trace`` sub-command to ``subparsers`` (sets ``func``)."""
    p = subparsers.add_parser(
        "trace",
        help="export a run's spans as a Chrome Trace (open it in Perfetto)",
        description=(
            "Turn a run's span files (spans[.stream][.rankN].jsonl) into Chrome Trace Event "
            "JSON: each stream/rank a process, each thread a track. Output is written to a "
            "temporary file beside the destination and atomically replaced."
        ),
    )
    p.add_argument("run", help="run directory, or one span file")
    p.add_argument(
        "-o",
        "--output",
        default=None,
        help="output file (.json or .json.gz); default RUN/trace.json",
    )
    p.add_argument("--stream", default=None, help="streams to include: a,b or * (default: all)")
    p.add_argument(
        "--rank",
        default=None,
        metavar="N",
        help="ranks to include: N or a,b (default: every rank's spans[...].rankN.jsonl)",
    )
    p.add_argument(
        "--step-range", default=None, metavar="A:B", help="steps A..B-1 (either side optional)"
    )
    p.add_argument(
        "--time-range",
        default=None,
        metavar="A:B",
        help="epoch seconds: spans overlapping [A, B), not clipped (either side optional)",
    )
    p.add_argument(
        "--temp-dir", default=None, metavar="DIR", help="existing directory for the SQLite spool"
    )
    p.add_argument(
        "--no-align-clocks",
        dest="align_clocks",
        action="store_false",
        help="keep each host's own clock (default: hosts aligned at their first shared step)",
    )
    from expr_tracker.cli.sync import on_buckets

    p.set_defaults(func=on_buckets(run_trace, "trace", "run"))  # s3://, file:// (docs/team.md)


def run_trace(args: argparse.Namespace) -> int:
    """Exit codes: 0 written, 1 no run / no span files / write failure, 2 a malformed range
    or ``--rank``."""
    from expr_tracker.cli import output
    from expr_tracker.trace import parse_range, rank_set, write_trace

    try:
        step_range = parse_range(args.step_range, int)
        time_range = parse_range(args.time_range, float)
        rank_set(getattr(args, "rank", None))
    except ValueError as exc:
        print(f"et trace: {exc}", file=sys.stderr)
        return 2
    try:
        res = write_trace(
            args.run,
            args.output,
            streams=args.stream,
            step_range=step_range,
            time_range=time_range,
            temp_dir=args.temp_dir,
            ranks=getattr(args, "rank", None),
            align_clocks=getattr(args, "align_clocks", True),
        )
    except (OSError, ValueError) as exc:
        print(f"et trace: {exc}", file=sys.stderr)
        return 1
    msg = f"wrote {res['path']}: {res['events']} spans on {res['tracks']} tracks"
    if res["skipped"]:
        msg += f" ({res['skipped']} unreadable lines skipped)"
    if res.get("aligned_at") is not None:
        shifts = ", ".join(
            f"{output.printable(h or '?')} {off * 1e3:+.3f} ms"
            for h, off in res["clock_offsets"].items()
        )
        msg += f"; host clocks aligned at step {res['aligned_at']} ({shifts})"
    print(msg)
    return 0
