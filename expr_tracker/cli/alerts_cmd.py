"""``et alerts RUN``: list a run's alerts from ``alerts[.S][.rankN].jsonl``.

    et alerts RUN [--since STEP] [--kind transition|delivery] [--stream S] [--rank N]
                  [--dir DIR] [--format table|json|jsonl]

RUN is a run directory (the file is chosen by exact name from ``--stream`` and ``--rank``,
as ``et history`` does), an ``alerts*.jsonl`` file, a ``metrics*.jsonl`` file (the alerts
file beside it), or the name of a run under ``--dir`` (docs/cli.md "Naming a run"). Each record is a rule transition (``kind: transition``: rule, event, level,
state, step, message) or a delivery outcome (``kind: delivery``: channel, delivered, error).

``--since STEP`` keeps records at step STEP or later; a record without a step (a run-level
notice such as the ``notify_on`` message) is kept when it comes after the first one kept.

Formats: ``table`` (a rich table that wraps, readable at 80 columns), ``json`` (ONE JSON
document: an array of the records), ``jsonl`` (one object per line). JSON output is strict
(NaN and ±Infinity become ``null``). A run without alerts prints nothing (``[]`` for json)
and exits 0; a closed pipe (``| head``) exits 0. Exit 1: no such run; 2: a usage error
(``et alert`` sends an alert; this command lists them).

The file is read as every reader of it reads it (``history/alertlog.py``): untrusted input,
only a regular file (a FIFO in its place is an error, exit 1, never a hang); lines that are
not records (bad JSON, nested too deeply, a lone surrogate, a last line without its newline)
are skipped and counted in one warning; the table escapes control characters
(``cli.output.printable``), ``json``/``jsonl`` keep the records exact.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import IO, Any

from expr_tracker.cli import output, runfiles

KINDS = ("transition", "delivery")


def register(subparsers: Any) -> None:
    """Add the ``alerts`` sub-command to ``subparsers`` (sets ``func``)."""
    p = subparsers.add_parser(
        "alerts",
        help="list a run's alerts (rule transitions and delivery outcomes)",
        description=(
            "List a run's alert records: rule transitions and delivery outcomes, from "
            "alerts[.stream][.rankN].jsonl. RUN is a run directory (the file chosen by "
            "--stream and --rank), an alerts .jsonl file, a metrics .jsonl file (the "
            "alerts file beside it) or project/name or name of a run under --dir. Exit 0 (also when there are none), 1 no such run, "
            "2 usage error."
        ),
    )
    p.add_argument(
        "run", help="run directory, its alerts/metrics .jsonl file, or a run's name under --dir"
    )
    p.add_argument("--since", type=int, default=None, metavar="STEP", help="from step STEP on")
    p.add_argument("--kind", choices=KINDS, default=None, help="only this kind of record")
    runfiles.add_producer_options(p, "alerts", "alerts")
    runfiles.add_dir_option(p)
    output.add_format_option(p, "table", what="alert records")
    p.set_defaults(func=run_alerts)


# --------------------------------------------------------------------------- reading


class RunNotFound(Exception):
    """RUN names no run (the message says what was looked for)."""


def alerts_file(run: str | os.PathLike[str], stream: str | None, rank: int | None) -> Path:
    """The alerts file RUN names (it may not exist: a run that never alerted).

    Raises ``RunNotFound`` when RUN is no run (``resolve_run_path``'s message), ``ValueError``
    for a bad stream name or a file that is neither an alerts nor a metrics file.
    """
    from expr_tracker.history.paths import file_name, resolve_run_path, validate_stream

    p = Path(run)
    if p.is_file():
        if p.name.startswith("alerts") and p.name.endswith(".jsonl"):
            return p
        beside = runfiles.producer_file(p, "alerts", stream, rank)
        if beside is None:
            raise ValueError(f"{str(p)!r} is neither an alerts*.jsonl nor a metrics*.jsonl file")
        return beside
    validate_stream(stream)
    want = p / file_name("alerts", stream, rank)
    if want.is_file():
        return want
    try:  # the producer must exist (its metrics, else its run.json); the error names them
        resolve_run_path(p, stream=stream, rank=rank)
    except FileNotFoundError as exc:
        if not (p / file_name("run", stream, rank)).is_file():
            raise RunNotFound(str(exc)) from None
    return want


def select(
    records: list[dict[str, Any]], since: int | None = None, kind: str | None = None
) -> list[dict[str, Any]]:
    """Records of ``kind`` from step ``since`` on (see the module docstring for records
    without a step)."""
    out = []
    started = since is None
    for rec in records:
        step = rec.get("step")
        if since is not None:
            if isinstance(step, int) and not isinstance(step, bool):
                if step < since:
                    continue
                started = True
            elif not started:
                continue
        if kind is not None and rec.get("kind") != kind:
            continue
        out.append(rec)
    return out


# --------------------------------------------------------------------------- printing


def _clock(t: Any) -> str:
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t):
        return ""
    try:
        return time.strftime("%H:%M:%S", time.localtime(t))
    except (OverflowError, OSError, ValueError):
        return ""


def _row(rec: dict[str, Any]) -> tuple[str, str, str, str, str, str]:
    """step, time, event, rule (or title), level, detail: the cells of one record."""
    step = rec.get("step")
    step_s = "" if step is None else str(step)
    what = rec.get("rule") or rec.get("title") or ""
    level = str(rec.get("level") or "")
    if rec.get("kind") == "delivery":
        ok = rec.get("delivered")
        event = "delivered" if ok else "UNDELIVERED"
        said = rec.get("answer") if ok else rec.get("error")
        detail = f"{rec.get('channel')}: {said or ''}".rstrip(": ")
        if rec.get("fallback"):
            detail += f" (fallback: {rec['fallback']})"
    else:
        event = str(rec.get("event") or rec.get("kind") or "")
        detail = str(rec.get("message") or "")
    return step_s, _clock(rec.get("time")), event, str(what), level, detail


def print_table(records: list[dict[str, Any]], out: IO[str], width: int | None = None) -> None:
    """A rich table of ``records``: step, time, event, rule, level, detail; long cells wrap
    so nothing is cut, down to 80 columns."""
    from rich.table import Table
    from rich.text import Text

    from expr_tracker.alerts.rules import LEVEL_STYLE
    from expr_tracker.cli.history import table_width

    console = output.console(out, table_width(out, width), markup=False)
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("step", justify="right", no_wrap=True)
    table.add_column("time", style="dim", no_wrap=True)
    table.add_column("event", no_wrap=True)
    table.add_column("rule", overflow="fold", ratio=2)
    table.add_column("level", no_wrap=True)
    table.add_column("detail", overflow="fold", ratio=3)
    p = output.printable
    for rec in records:
        step, when, event, rule, level, detail = _row(rec)
        table.add_row(
            p(step),
            when,
            Text(p(event), style="bold red" if event == "UNDELIVERED" else ""),
            p(rule),
            Text(p(level), style=LEVEL_STYLE.get(level, "")),
            p(detail),
        )
    console.print(table)


# --------------------------------------------------------------------------- command


def run_alerts(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    """The ``et alerts`` command; returns the exit code (0 ok, 1 no such run, 2 usage)."""
    out = out or sys.stdout
    err = sys.stderr
    try:
        runfiles.check_rank(args.rank)
    except ValueError as exc:
        err.write(f"et alerts: {exc}\n")
        return 2
    from expr_tracker.query.catalog import RunNotFoundError

    try:
        path = alerts_file(
            runfiles.run_path(args.run, getattr(args, "dir", "runs")), args.stream, args.rank
        )
    except (RunNotFound, RunNotFoundError) as exc:
        err.write(f"et alerts: {exc}\n")
        return 1
    except ValueError as exc:
        err.write(f"et alerts: {exc}\n")
        return 2
    records: list[dict[str, Any]] = []
    if path.exists() or path.is_symlink():
        from expr_tracker.history.alertlog import read_alert_log

        try:
            lines = read_alert_log(path)
        except OSError as exc:
            from expr_tracker.history.rundirs import os_reason

            err.write(f"et alerts: cannot read {str(path)!r}: {os_reason(exc)}\n")
            return 1
        records = [r.record for r in lines.records]
        bad = lines.bad + lines.torn  # a torn last line is not a record either
        if bad:
            err.write(f"et alerts: skipped {bad} line(s) of {path} that are not records\n")
    records = select(records, args.since, args.kind)
    if not records and args.format == "table":
        since = f" from step {args.since}" if args.since is not None else ""
        what = "no alerts recorded" if not path.is_file() else f"no alert records{since}"
        err.write(f"et alerts: {what} ({path.name} in {str(path.parent)!r})\n")
        return 0
    if output.is_machine(args.format):
        output.write_records(records, args.format, out)
    else:
        print_table(records, out)
    return 0
