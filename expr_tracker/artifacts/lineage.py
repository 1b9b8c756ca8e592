"""Lineage: what each run logged and used, one JSON line per action in the run directory's
``artifacts[.S][.rankN].jsonl`` (per producer, named like the other per-producer files).

A line: ``{"action": "logged"|"used", "name", "version", "digest", "type", "aliases",
"step", "time", "path", "new"}`` (``new``: for ``logged``, False when identical contents
returned an existing version). ``step`` is the step the next ``log()`` writes at the time
of the call (:func:`current_step`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from expr_tracker.artifacts.files import append_line, read_jsonl

#: ``artifacts[.S][.rankN].jsonl``
LINEAGE_RE = re.compile(r"^artifacts(?:\.([A-Za-z0-9_-]+?))??(?:\.rank(\d+))?\.jsonl$")


def current_step(run: Any) -> int | None:
    """The step the run's next ``log()`` writes (the open row's step), None when unknown.

    The one place that knows where the step lives (``Run.step``, the open row's step)."""
    step = getattr(run, "step", None)
    return step if type(step) is int else None


def append_lineage(path: str | os.PathLike[str], record: dict[str, Any]) -> None:
    """Append one lineage line (all or nothing; a torn tail is repaired). Raises OSError."""
    append_line(path, record, sync=False)


def parse_lineage_name(name: str) -> tuple[str | None, int] | None:
    """``artifacts.data.rank2.jsonl`` -> ``("data", 2)``; None for other names."""
    m = LINEAGE_RE.match(name)
    if not m:
        return None
    return m.group(1), int(m.group(2) or 0)


def read_lineage(
    run_dir: str | os.PathLike[str], problems: list[str] | None = None
) -> list[dict[str, Any]]:
    """Every lineage line of a run directory, over all its producers; each record gets
    ``stream`` and ``rank`` from its file name. In file order, producers by file name.

    The files are untrusted input (:func:`files.read_jsonl`): a file that is not a regular
    file inside ``run_dir`` (a FIFO, a link out) or cannot be read is skipped, and so is
    each bad line; ``problems``, when given, gets one line per such file
    (``"<path>: <why>"``)."""
    out = []
    root = Path(run_dir)
    try:
        names = sorted(p.name for p in root.iterdir())
    except OSError:
        return []
    for name in names:
        parsed = parse_lineage_name(name)
        if parsed is None:
            continue
        try:
            records, bad = read_jsonl(root / name, root=root)
        except OSError as exc:
            if problems is not None:
                problems.append(f"{root / name}: {getattr(exc, 'reason', None) or exc}")
            continue
        if bad and problems is not None:
            problems.append(f"{root / name}: {bad} bad line(s) skipped")
        for rec in records:
            out.append({**rec, "stream": parsed[0], "rank": parsed[1]})
    return out
