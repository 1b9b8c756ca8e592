"""``et export``: runs' metrics -> Parquet, CSV or JSONL (wide or long, partitioned by run)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from expr_tracker.cli import output


def register(subparsers: Any) -> None:
    """Add the ``export`` sub-command to ``subparsers`` (sets ``func``)."""
    p = subparsers.add_parser(
        "export",
        help="export runs' metrics to Parquet, CSV or JSONL (wide or long)",
        description=(
            "Export the metrics of one run directory (to one file) or of every run under a "
            "folder (to a directory partitioned Hive-style: PATH/project=P/run=R/...), "
            "streaming with bounded memory. Written under a temporary name beside PATH and "
            "renamed when complete. See docs/export.md."
        ),
    )
    p.add_argument("source", metavar="RUN|DIR", help="a run directory or a folder of runs")
    p.add_argument("-o", "--output", required=True, metavar="PATH", help="output file or folder")
    p.add_argument(
        "--format",
        choices=("parquet", "csv", "jsonl"),
        default=None,
        help="default: from PATH's suffix (.parquet, .csv, .jsonl), else parquet",
    )
    p.add_argument(
        "--layout",
        choices=("wide", "long"),
        default="wide",
        help="wide: a row per step, a column per metric (default); long: a row per metric value",
    )
    p.add_argument(
        "--metrics",
        default=None,
        metavar="A,B",
        help="metric names or globs (train/*); default all",
    )
    p.add_argument(
        "--stream", default=None, metavar="S", help="streams: a,b ('main' is the default stream)"
    )
    p.add_argument("--rank", default=None, metavar="N", help="ranks: N or N,M (default: all)")
    part = p.add_mutually_exclusive_group()
    part.add_argument(
        "--partition",
        dest="partition",
        action="store_true",
        default=None,
        help="write PATH/project=P/run=R/... even for one run (default for a folder of runs)",
    )
    part.add_argument(
        "--no-partition",
        dest="partition",
        action="store_false",
        help="one file (a single run only)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing PATH")
    p.add_argument("--cache-dir", default=None, metavar="DIR", help="columnar cache location")
    med = p.add_mutually_exclusive_group()
    med.add_argument(
        "--media-dir",
        default=None,
        metavar="DIR",
        help="copy the referenced media files here (default: media/ next to PATH, "
        "PATH/_media/ when partitioned)",
    )
    med.add_argument(
        "--no-media",
        dest="media",
        action="store_false",
        default=True,
        help="copy no media files (references keep pointing into the runs)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    from expr_tracker.cli.sync import on_buckets

    p.set_defaults(func=on_buckets(run_export, "export", "source"))  # s3://, file:// (docs/team.md)


def run_export(args: argparse.Namespace) -> int:
    """Exit codes: 0 written (a run that cannot be read is left out, named in one warning on
    stderr), 1 a bad source/argument, no run that can be read, an existing PATH or a failed
    write."""
    from expr_tracker.query.export import ExportError, export_runs

    # SIGTERM (kill, SLURM) exits 143 after the half-written temporary file or folder is
    # removed, as on Ctrl-C (a leftover .PATH.<pid>.partial folder is read by a ** glob)
    try:
        with output.sigterm_as_exit():
            res = export_runs(
                args.source,
                args.output,
                format=args.format,
                layout=args.layout,
                metrics=args.metrics,
                stream=args.stream,
                rank=args.rank,
                partition=args.partition,
                overwrite=args.overwrite,
                cache_dir=args.cache_dir,
                media=args.media,
                media_dir=args.media_dir,
            )
    except (ExportError, ImportError, OSError) as exc:
        print(f"et export: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(res))
        return 0
    where = "files" if res["files"] != 1 else "file"
    skipped = res.get("skipped") or []
    note = f"; {len(skipped)} producer(s) not read whole (see the warning)" if skipped else ""
    m = res.get("media")
    if m and (m["files"] or m["refused"]):
        note += f"; {m['files']} media file(s) ({m['bytes']} bytes) copied to {m['dir']}"
        if m["refused"]:
            note += f", {m['refused']} reference(s) not copied (see the warning)"
    print(
        f"wrote {res['path']}: {res['rows']} rows ({res['layout']}, {len(res['columns'])} "
        f"columns) from {res['producers']} producer(s) of {res['runs']} run(s), "
        f"{res['files']} {res['format']} {where}, {res['bytes']} bytes in "
        f"{res['seconds']:.2f} s{note}"
    )
    return 0
