"""Span files of a run directory: finding them (``spans[.S][.rankN].jsonl``, with the host from the
matching ``run*.json``), reading their records (:func:`read_spans`, :func:`span_files`: public
as ``expr_tracker.trace.read_spans``/``span_files``, docs/spans.md "Reading span files") and
parsing the selections ``et trace`` takes (ranks, streams, step and time ranges). The converter
is ``expr_tracker.trace``, which re-exports these names.

Only regular files are taken (a FIFO, device or socket named like a span file or a
``run*.json`` is never opened: ``history.untrusted``); a ``run*.json`` that cannot be read
only leaves the host unnamed."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from expr_tracker.history.paths import file_name, validate_stream
from expr_tracker.history.untrusted import inside, load_json_bytes, open_regular, read_json

log = logging.getLogger("expr_tracker")

__all__ = [
    "SpanFile",
    "find_span_files",
    "is_empty_range",
    "parse_range",
    "rank_set",
    "read_spans",
    "span_files",
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


def span_files(
    run_dir: str | os.PathLike[str], streams: Any = None, ranks: Any = None
) -> list[Path]:
    """The span files of a run directory, main stream first then by stream, each stream's
    ranks in order: ``[runs/p/r/spans.jsonl, runs/p/r/spans.data.jsonl, ...]``.

    ``streams``: None or ``"*"`` for every stream, else names (``"main"`` or ``""`` is the
    unnamed stream; a comma-separated string or an iterable); ``ranks``: None for every
    rank, else an int, ints or ``"0,2"``. Only regular files lying inside ``run_dir`` are
    listed (a link pointing out of it, a FIFO named like a span file are not).

    Raises:
        FileNotFoundError: ``run_dir`` does not exist or holds no span file.
        ValueError: a stream or rank asked for has no span file (naming those there are).
    """
    root = Path(run_dir)
    found = find_span_files(root, streams, ranks)
    base = root if root.is_dir() else root.parent
    out = [f for f in found if inside(f.path, base)]
    out.sort(key=lambda f: (f.stream or "", f.rank or 0))
    return [f.path for f in out]


def read_spans(
    run_dir: str | os.PathLike[str], stream: str | None = None, *, rank: int | None = None
) -> list[dict[str, Any]]:
    """The records of one producer's span file, in file order (children before parents).

    ``run_dir``: a run directory (the file is ``spans[.stream][.rankN].jsonl``) or a span
    file. ``stream``: None for the main stream; ``rank``: None or 0 for the file without a
    rank suffix. Each record is a dict: ``_step``, ``name`` (the span's path), ``depth``,
    ``start`` (epoch s), ``dur_ms``, ``id``, ``parent``, ``pid``, ``tid``, ``thread``,
    ``track`` (the name ``et trace`` gives its track: :func:`track_name`, filled in for
    files written before records carried it), and when present ``task``, ``args``,
    ``metrics``, ``error`` (docs/spans.md "The span file").

    The folder is untrusted (docs/query.md "Security"): only a regular file inside it is
    opened, lines are decoded with a depth limit, and a line that is not a span record (a
    torn last line, garbage) is skipped, with one log line counting them.

    Raises:
        FileNotFoundError: no such run, or no span file for that stream and rank (the
            message names the span files there are).
        ValueError: an invalid stream name or rank.
        OSError: the file cannot be read, or is not a regular file inside ``run_dir``
            (``expr_tracker.history.untrusted.UnsafeFileError``).
    """
    p = Path(run_dir)
    if p.is_dir():
        validate_stream(stream)
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
            raise ValueError(f"rank={rank!r} is not valid: an integer >= 0 (or None for 0)")
        path, root = p / file_name("spans", stream, rank), p
        if not path.is_file():
            try:
                there = ", ".join(f.name for f in span_files(p)) or "none"
            except (FileNotFoundError, ValueError):
                there = "none"
            raise FileNotFoundError(
                f"no span file {path.name!r} in {str(p)!r}; span files there: {there}"
            )
    elif p.is_file():
        path, root = p, p.parent
    else:
        raise FileNotFoundError(f"no run at {str(p)!r}: not a file or directory")
    out: list[dict[str, Any]] = []
    skipped = 0
    with open(open_regular(path, root=root), "rb") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                r = load_json_bytes(line)
            except ValueError:
                skipped += 1
                continue
            if type(r) is not dict or type(r.get("name")) is not str:
                skipped += 1
                continue
            if type(r.get("track")) is not str:
                task = r.get("task")
                r["track"] = track_name(r.get("thread"), r.get("tid"), task if task else None)
            out.append(r)
    if skipped:
        log.info("expr_tracker: %s: %d line(s) that are not span records skipped", path, skipped)
    return out
