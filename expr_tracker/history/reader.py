"""Reading ``metrics*.jsonl`` files: backwards tails, forward scans, merge by step.

The reader trusts nothing about a file (spec design.txt A.1): lines may be out of step
order (``step_policy="allow"``), a step may span several lines (patch lines written after
``max_open_seconds``), another program may have written it, and the last line may be torn
by a crash. Undecodable lines are skipped and counted; rows of one step are merged in file
order (later lines win per key).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from expr_tracker.history.codec import decode_line

BLOCK = 1 << 16


def _last_line_end(f: Any, end: int) -> int:
    """The offset just past the last newline before ``end`` (0 when there is none)."""
    pos = end
    while pos > 0:
        lo = max(0, pos - BLOCK)
        f.seek(lo)
        chunk = f.read(pos - lo)
        nl = chunk.rfind(b"\n")
        if nl >= 0:
            return lo + nl + 1
        pos = lo
    return 0


def iter_lines_backward(path: str | os.PathLike[str], end: int | None = None) -> Iterator[bytes]:
    """Complete lines of ``path`` before byte ``end`` (default: EOF), newest first.

    A last line without a terminating newline (torn by a crash) is skipped.
    """
    with open(path, "rb") as f:
        if end is None:
            end = f.seek(0, os.SEEK_END)
        pos = _last_line_end(f, end)
        carry = b""
        while pos > 0:
            lo = max(0, pos - BLOCK)
            f.seek(lo)
            data = f.read(pos - lo) + carry
            pos = lo
            parts = data.split(b"\n")
            carry = parts[0]
            for line in reversed(parts[1:]):
                if line:
                    yield line
        if carry:
            yield carry


def offset_of_line(
    path: str | os.PathLike[str], line: int, index: Iterable[Iterable[int]] = ()
) -> int:
    """Byte offset where line number ``line`` (0-based) starts.

    ``index`` holds ``[step, line, offset]`` anchors (the sidecar's); the nearest anchor
    at or before ``line`` is the starting point of a forward count.
    """
    start_line, start_off = 0, 0
    for a in index:
        _s, ln, off = a
        if ln <= line and ln >= start_line:
            start_line, start_off = ln, off
    if start_line == line:
        return start_off
    with open(path, "rb") as f:
        f.seek(start_off)
        cur = start_line
        off = start_off
        for raw in f:
            if cur == line:
                return off
            off += len(raw)
            cur += 1
        return off


def iter_rows(path: str | os.PathLike[str], end: int | None = None) -> Iterator[dict[str, Any]]:
    """Decoded rows of ``path`` in file order, up to byte ``end``; bad lines skipped."""
    with open(path, "rb") as f:
        pos = 0
        for raw in f:
            pos += len(raw)
            if end is not None and pos > end:
                break
            if not raw.endswith(b"\n"):
                break  # torn last line
            try:
                rec = decode_line(raw)
            except ValueError:
                continue
            if isinstance(rec, dict):
                yield rec


def merge_by_step(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Merge rows sharing a ``_step`` (later rows win per key), in order of first appearance.

    Rows without an integer ``_step`` are kept as they are.
    """
    out: list[dict[str, Any]] = []
    at: dict[int, dict[str, Any]] = {}
    for r in rows:
        s = r.get("_step")
        if type(s) is not int:
            out.append(r)
            continue
        cur = at.get(s)
        if cur is None:
            cur = dict(r)
            at[s] = cur
            out.append(cur)
        else:
            cur.update(r)
    return out


def read_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every step of a metrics file, merged by step, in file order of first appearance."""
    return merge_by_step(iter_rows(Path(path)))
