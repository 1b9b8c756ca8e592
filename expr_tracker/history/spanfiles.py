"""Span files of a run directory: finding them (``spans[.S][.rankN].jsonl``, with the host from the
matching ``run*.json``) and parsing the selections ``et trace`` takes (ranks, streams, step and
time ranges). The converter is ``expr_tracker.trace``, which re-exports these names.

Only regular files are taken (a FIFO, device or socket named like a span file or a
``run*.json`` is never opened: ``history.untrusted``); a ``run*.json`` that cannot be read
only leaves the host unnamed."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from expr_tracker.history.untrusted import read_json

__all__ = [
    "SpanFile",
    "find_span_files",
    "is_empty_range",
    "parse_range",
    "rank_set",
    "stream_set",
    "track_name",
]

_SPANS_RE = re.compile(r"^spans(?:\.([A-Za-z0-9_-]+?))??(?:\.rank(\d+))?\.jsonl$")


def track_name(thread: Any, tid: Any, task: Any = None) -> str:
    """The name of a span's track, as a span record's ``track`` holds it and ``et trace``
    names the track (docs/spans.md "The span file"): ``"MainThread (tid 4242)"`` for a
    thread, ``"MainThread (tid 4242) · Task-3"`` inside an asyncio task. ``thread`` None
    (a record without one) reads ``thread``."""
    name = f"{thread or 'thread'} (tid {tid})"
    return f"{name} · {task}" if task else name


@dataclass
class SpanFile:
    """One producer's span file: ``stream`` None for the default stream, ``rank`` None
    when the name has no rank suffix."""

    path: Path
    stream: str | None
    rank: int | None
    host: str | None = None
    pids: set[Any] = field(default_factory=set)

    def label(self, ranked: bool) -> str:
        """``rank 3 (host-a) · data`` in a ranked run, ``data (host-a)`` / ``main`` otherwise."""
        host = f" ({self.host})" if self.host else ""
        if ranked or self.rank is not None:
            label = f"rank {self.rank or 0}{host}"
            return f"{label} · {self.stream}" if self.stream else label
        return f"{self.stream or 'main'}{host}"


def find_span_files(
    run: str | os.PathLike[str], streams: Any = None, ranks: Any = None
) -> list[SpanFile]:
    """The span files of a run directory (or the one file ``run`` names).

    ``streams``: None or ``"*"`` for all; a comma-separated string or an iterable of stream
    names otherwise (``"main"`` or ``""`` names the default stream). ``ranks``: None for all;
    an int, a comma-separated string (``"0,2"``) or an iterable of ints otherwise. Raises
    ``FileNotFoundError`` when ``run`` does not exist or holds no span file, and
    ``ValueError`` naming the streams (ranks) that exist when a stream (rank) asked for has
    no span file.
    """
    p = Path(run)
    if p.is_file():
        m = _SPANS_RE.match(p.name)
        files = [SpanFile(p, m.group(1) if m else None, _rank(m))]
    elif p.is_dir():
        files = []
        for q in sorted(p.iterdir()):
            m = _SPANS_RE.match(q.name)
            if m and q.is_file():
                files.append(SpanFile(q, m.group(1), _rank(m)))
        if not files:
            raise FileNotFoundError(
                f"no span files (spans[.stream][.rankN].jsonl) in {str(p)!r}; spans are "
                "written when a run records spans with spans enabled"
            )
    else:
        raise FileNotFoundError(f"no run at {str(p)!r}: not a file or directory")
    wanted = stream_set(streams)
    if wanted is not None:
        present = {f.stream or "main" for f in files}
        unknown = sorted(wanted - present)
        if unknown:
            raise ValueError(
                f"no stream {', '.join(map(repr, unknown))} in {str(p)!r}; streams with span "
                f"files: {', '.join(sorted(present))} (or * for all)"
            )
        files = [f for f in files if (f.stream or "main") in wanted]
    wanted_ranks = rank_set(ranks)
    if wanted_ranks is not None:
        present_ranks = {f.rank or 0 for f in files}
        missing = sorted(wanted_ranks - present_ranks)
        if missing:
            raise ValueError(
                f"no span file of rank {', '.join(map(str, missing))} in {str(p)!r}; ranks "
                f"with span files: {', '.join(map(str, sorted(present_ranks))) or 'none'}"
            )
        files = [f for f in files if (f.rank or 0) in wanted_ranks]
    for f in files:
        f.host = _host_of(f)
    files.sort(key=lambda f: (f.rank or 0, f.stream or ""))
    return files


def _rank(m: re.Match[str] | None) -> int | None:
    return int(m.group(2)) if m and m.group(2) is not None else None


def rank_set(ranks: Any) -> set[int] | None:
    """The ranks ``ranks`` selects (an int, ints, or ``"0,1"``); None for all (None or ``"*"``).

    Raises:
        ValueError: for a rank that is not an integer >= 0.
    """
    if ranks is None:
        return None
    if isinstance(ranks, str):
        parts = [r.strip() for r in ranks.split(",") if r.strip()]
        if "*" in parts:
            return None
        try:
            ranks = [int(r) for r in parts]
        except ValueError:
            raise ValueError(f"ranks={ranks!r} is not valid: integers like 0,1 or *") from None
    elif isinstance(ranks, int):
        ranks = [ranks]
    out = set()
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, int) or r < 0:
            raise ValueError(f"rank {r!r} is not valid: an integer >= 0")
        out.add(r)
    return out


def stream_set(streams: Any) -> set[str] | None:
    if streams is None:
        return None
    if isinstance(streams, str):
        streams = streams.split(",")
    names = {s.strip() or "main" for s in streams}
    if "*" in names:
        return None
    return names


def _host_of(f: SpanFile) -> str | None:
    name = "run" + f.path.name[len("spans") : -len(".jsonl")] + ".json"
    try:
        data = read_json(f.path.with_name(name), root=f.path.parent)
    except (OSError, ValueError):
        return None
    host = data.get("host") if isinstance(data, dict) else None
    return host if isinstance(host, str) and host else None


def parse_range(text: str | None, kind: type = float) -> tuple[Any, Any] | None:
    """``"a:b"`` -> ``(a, b)`` with either side optional (None); None stays None.

    ``kind`` is ``int`` for steps, ``float`` for epoch seconds. Raises ``ValueError`` for
    text without a colon or with bounds that are not numbers.
    """
    if text is None:
        return None
    if isinstance(text, (tuple, list)):
        lo, hi = text
        return (None if lo is None else kind(lo), None if hi is None else kind(hi))
    if ":" not in text:
        raise ValueError(f"range {text!r} must look like a:b (either side may be empty)")
    a, b = text.split(":", 1)
    try:
        return (kind(a) if a.strip() else None, kind(b) if b.strip() else None)
    except ValueError:
        raise ValueError(f"range {text!r}: bounds must be {kind.__name__} numbers") from None


def is_empty_range(r: tuple[Any, Any] | None) -> bool:
    return r is not None and r[0] is not None and r[1] is not None and r[0] >= r[1]
