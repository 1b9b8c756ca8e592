"""Finding run directories under a folder and judging their status (``et runs``, ``et query``).

A run is a directory holding a producer's ``run[.S][.rankN].json`` or a metrics file
``metrics[.S][.rankN].jsonl``. A producer's status is what its ``run*.json`` says, except
that ``running`` with its process gone on this host is ``crashed``; a run's status is the
worst of its producers' (``crashed`` > ``failed`` > ``running`` > ``finished``), ``unknown``
without any ``run*.json``. Judging only reads: no file is rewritten.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from expr_tracker.history.paths import parse_metrics_name
from expr_tracker.history.runinfo import read_run_info

#: how deep below the searched folder runs are looked for: 6 reaches the runs of a Hydra
#: multirun whose jobs change directory (``multirun/<date>/<time>/<job>/runs/<project>/<name>``)
MAX_DEPTH = 6
#: ``run[.S][.rankN].json``: one per producer (stream and rank)
RUN_FILE_RE = re.compile(r"^run(?:\.([A-Za-z0-9_-]+?))??(?:\.rank(\d+))?\.json$")
#: a run's combined status is the worst of its producers' (a higher number is worse)
SEVERITY = {"finished": 0, "running": 1, "failed": 2, "crashed": 3}


def find_runs(root: str | os.PathLike[str], max_depth: int = MAX_DEPTH) -> list[Path]:
    """Directories under ``root`` (itself included) that hold a run: a ``run*.json`` of any
    producer (stream, rank) or a metrics file of any producer. Hidden folders and a
    project's artifact store are not searched; a run does not hold runs. Symbolic links to
    folders are followed (a folder of hand-picked runs linked from elsewhere); a folder
    reached twice (two links, a link cycle) is searched once, by its first path in name
    order."""
    root = Path(root)
    found: list[Path] = []
    base = len(root.parts)
    seen: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
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
        dirnames[:] = [
            d
            for d in dirnames
            if not d.startswith(".") and not (d == "artifacts" and (p / d / "index.jsonl").exists())
        ]
    return found


def producer_infos(run_dir: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """Each producer's ``run[.S][.rankN].json`` of ``run_dir`` (file name -> its content,
    ``{}`` when unreadable), by file name; a dead ``running`` producer reads ``crashed``.
    A run directory that is gone (deleted since it was found) has none."""
    out: dict[str, dict[str, Any]] = {}
    try:
        entries = sorted(Path(run_dir).iterdir())
    except OSError:
        return out
    for q in entries:
        if RUN_FILE_RE.match(q.name) and q.is_file():
            out[q.name] = read_run_info(q, repair=False) or {}
    return out


def producer_status(info: dict[str, Any]) -> str:
    """A producer's status from its ``run*.json`` content (``unknown`` when it has none)."""
    st = info.get("status")
    return st if isinstance(st, str) else "unknown"


def worst_status(statuses: Any) -> str:
    """The combined status of a run: the worst of ``statuses`` (``unknown`` when empty)."""
    return max(statuses, key=lambda st: SEVERITY.get(st, -1), default="unknown")
