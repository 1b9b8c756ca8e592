"""RUN, ``--dir``, ``--stream`` and ``--rank``: how ``et history`` and ``et alerts`` name the
file of one producer (a stream and a rank) of a run.

A producer's files are named ``KIND[.stream][.rankN].EXT`` (``history.paths.file_name``);
RUN is a run directory (the file then chosen by exact name from ``--stream`` and
``--rank``) or one of the producer's files, whose name says the stream and rank; or the
name of a run under ``--dir``, by the rule every command follows (``run_path``:
docs/cli.md "Naming a run").
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def add_producer_options(parser: argparse.ArgumentParser, kind: str, what: str) -> None:
    """Add ``--stream S`` and ``--rank N`` (an int) to ``parser``; ``kind`` is the file kind
    read (``metrics``, ``alerts``), ``what`` names what is read, for the help text."""
    parser.add_argument(
        "--stream", default=None, help=f"the stream whose {what} to read (default: the main one)"
    )
    parser.add_argument(
        "--rank",
        type=int,
        default=None,
        metavar="N",
        help=f"the rank whose {what} to read ({kind}[.stream].rankN.jsonl; default: rank 0)",
    )


def add_dir_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--dir DIR`` (default ``runs``): where a RUN that is no path is looked up."""
    parser.add_argument(
        "--dir", default="runs", help="where run names are looked up (default ./runs)"
    )


def run_path(run: str | os.PathLike[str], root: str | os.PathLike[str] = "runs") -> str:
    """RUN as a path: itself when it exists or can only be a path, else the run directory its
    name names among the runs under ``root`` (``query.catalog.resolve_run``, docs/cli.md
    "Naming a run").

    Raises:
        RunNotFoundError: no such path and no such run (close matches named), or a name of
            several runs (listed).
    """
    from expr_tracker.query.catalog import is_path_only, resolve_run

    if os.path.lexists(run) or is_path_only(os.fspath(run)):
        return os.fspath(run)  # a path: the command says what is wrong with it

    return str(resolve_run(run, root).path)


def check_rank(rank: int | None) -> None:
    """Raises ``ValueError`` (naming ``--rank`` and the value) for a negative rank."""
    if rank is not None and rank < 0:
        raise ValueError(f"--rank {rank} is not valid: a rank is an integer >= 0")


def producer_file(
    run: str | os.PathLike[str], kind: str, stream: str | None, rank: int | None
) -> Path | None:
    """The ``kind`` file (``run``, ``alerts``, ...) of the producer RUN names: beside a
    metrics file the one of that file's stream and rank; otherwise (a run directory, or a
    path that does not exist) the one of ``stream`` and ``rank`` in RUN. None when RUN is a
    file whose name is not a metrics file name. The file may not exist."""
    from expr_tracker.history.paths import file_name, parse_metrics_name

    p = Path(run)
    if not p.is_file():
        return p / file_name(kind, stream, rank)
    parsed = parse_metrics_name(p.name)
    if parsed is None:
        return None
    return p.with_name(file_name(kind, parsed[0], parsed[1]))
