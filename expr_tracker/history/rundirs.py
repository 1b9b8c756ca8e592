"""Finding run directories under a folder and judging their status (``et runs``, ``et query``).

A run is a directory holding a producer's ``run[.S][.rankN].json`` or a metrics file
``metrics[.S][.rankN].jsonl``. A producer's status is what its ``run*.json`` says, except
that ``running`` with its process gone on this host is ``crashed``; a run's status is the
worst of its producers' (``crashed`` > ``failed`` > ``running`` > ``finished``), ``unknown``
without any ``run*.json``. Judging only reads: no file is rewritten.

Everything here is read as untrusted input (docs/history.md "Unreadable runs"): a
``run*.json`` that cannot be read (permissions, a FIFO, damage, not a JSON object) is
reported per file by :func:`read_producers`, with the reason, and a folder that cannot be
listed is reported by :func:`find_runs` (``unlisted=``); neither stops the search.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from expr_tracker.history.paths import parse_metrics_name
from expr_tracker.history.runinfo import load_run_info
from expr_tracker.history.untrusted import present

#: how deep below the searched folder runs are looked for: 6 reaches the runs of a Hydra
#: multirun whose jobs change directory (``multirun/<date>/<time>/<job>/runs/<project>/<name>``)
MAX_DEPTH = 6
#: ``run[.S][.rankN].json``: one per producer (stream and rank)
RUN_FILE_RE = re.compile(r"^run(?:\.([A-Za-z0-9_-]+?))??(?:\.rank(\d+))?\.json$")
#: a run's combined status is the worst of its producers' (a higher number is worse);
#: ``unreadable`` (a producer's file could not be read, see :func:`read_producers`) is set
#: by the readers that report it (``et runs``), above all others
#: (``preempted``: stopped on purpose, to be resumed; above running, below a failure;
#: ``pruned``: ended early by a ``=> prune`` rule, docs/alerts.md "Actions", above finished)
SEVERITY = {
    "finished": 0,
    "pruned": 0.5,
    "running": 1,
    "preempted": 2,
    "failed": 3,
    "crashed": 4,
    "unreadable": 5,
}


def find_runs(
    root: str | os.PathLike[str],
    max_depth: int = MAX_DEPTH,
    *,
    unlisted: list[tuple[Path, str]] | None = None,
) -> list[Path]:
    """Directories under ``root`` (itself included) that hold a run: a ``run*.json`` of any
    producer (stream, rank) or a metrics file of any producer. Hidden folders and a
    project's artifact store are not searched; a run does not hold runs. Symbolic links to
    folders are followed (a folder of hand-picked runs linked from elsewhere); a folder
    reached twice (two links, a link cycle) is searched once, by its first path in name
    order.

    ``unlisted``: when given, each folder below ``root`` that could not be listed
    (permissions: a colleague's ``0700`` run) is appended as ``(path, reason)``, so a
    caller can report it instead of leaving it out silently; the search goes on. Only
    names are read here: no file is opened."""
    root = Path(root)
    found: list[Path] = []
    base = len(root.parts)
    seen: set[tuple[int, int]] = set()

    def onerror(exc: OSError) -> None:
        if unlisted is not None and exc.filename is not None:
            unlisted.append((Path(exc.filename), os_reason(exc)))

    for dirpath, dirnames, filenames in os.walk(root, onerror=onerror, followlinks=True):
        p = Path(dirpath)
        dirnames.sort()
        try:
            st = os.stat(dirpath)
        except OSError:
            dirnames[:] = []
            continue
        if (st.st_dev, st.st_ino) in seen:
            dirnames[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        if any(RUN_FILE_RE.match(f) or parse_metrics_name(f) for f in filenames):
            found.append(p)
            dirnames[:] = []  # a run does not hold runs
            continue
        if len(p.parts) - base >= max_depth:
            dirnames[:] = []
        # a project's artifact store holds files, not runs (a stored metrics.jsonl is data)
        # (a store of someone else's whose index cannot even be looked at counts as one:
        # pathlib's exists() raised PermissionError there and ended the whole search)
        dirnames[:] = [
            d
            for d in dirnames
            if not d.startswith(".") and not (d == "artifacts" and present(p / d / "index.jsonl"))
        ]
    return found


def os_reason(exc: BaseException) -> str:
    """A short phrase for why a file or folder could not be read (``permission denied``,
    ``a FIFO, not a regular file``, ``not JSON (...)``)."""
    reason = getattr(exc, "reason", None)  # history.untrusted.UnsafeFileError
    if isinstance(reason, str):
        return reason
    if isinstance(exc, OSError):
        return (exc.strerror or type(exc).__name__).lower()
    if isinstance(exc, ValueError):
        text = str(exc)
        return text if text.startswith("not a JSON") else f"not JSON ({text[:80]})"
    return f"{type(exc).__name__}: {str(exc)[:80]}"


def read_producers(
    run_dir: str | os.PathLike[str],
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Each producer's ``run[.S][.rankN].json`` of ``run_dir``, by file name: ``(infos,
    problems)``. ``infos`` maps each file read to its content (a dead ``running`` producer
    reads ``crashed``); ``problems`` maps each file that could not be read to the reason
    (``permission denied``, ``a FIFO, not a regular file``, ``not a JSON object (a JSON
    array)`` ...), and ``"."`` to the reason when the directory itself cannot be listed.
    Files are opened as ``history.untrusted`` opens them: never a hang, never a crash. A
    run directory that is gone (deleted since it was found) has neither."""
    infos: dict[str, dict[str, Any]] = {}
    problems: dict[str, str] = {}
    try:
        names = sorted(os.listdir(run_dir))
    except FileNotFoundError:
        return infos, problems
    except OSError as exc:
        problems["."] = os_reason(exc)
        return infos, problems
    for name in names:
        if not RUN_FILE_RE.match(name):
            continue
        q = Path(run_dir) / name
        if os.path.isdir(q):
            continue  # a folder named like one: not a producer's file
        try:
            infos[name] = load_run_info(q, repair=False)
        except FileNotFoundError:
            continue  # removed since listed
        except (OSError, ValueError) as exc:
            problems[name] = os_reason(exc)
    return infos, problems


def producer_infos(run_dir: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """Each producer's ``run[.S][.rankN].json`` of ``run_dir`` (file name -> its content,
    ``{}`` when unreadable), by file name; a dead ``running`` producer reads ``crashed``.
    A run directory that is gone (deleted since it was found) has none. (The reasons of
    unreadable files: :func:`read_producers`.)"""
    infos, problems = read_producers(run_dir)
    out = dict(infos)
    for name in problems:
        if name != ".":
            out[name] = {}
    return dict(sorted(out.items()))


def producer_status(info: dict[str, Any]) -> str:
    """A producer's status from its ``run*.json`` content (``unknown`` when it has none)."""
    st = info.get("status")
    return st if isinstance(st, str) else "unknown"


def worst_status(statuses: Any) -> str:
    """The combined status of a run: the worst of ``statuses`` (``unknown`` when empty)."""
    return max(statuses, key=lambda st: SEVERITY.get(st, -1), default="unknown")
