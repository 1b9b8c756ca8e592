"""Reading ``metrics*.jsonl`` files: backward tails, step-range reads, merge by step.

The reader trusts nothing about a file (docs/history.md "Steps, not lines", "Where the answer
comes from"): lines may be out of
step order (``step_policy="allow"``), a step may span several lines (patch lines written
after ``max_open_seconds``), another program may have written the file (no sidecar, or a
sidecar that no longer matches), and the last line may be torn by a crash. Lines that are
not rows — undecodable (bad JSON, nested deeper than ``codec.MAX_LINE_DEPTH``, a lone
surrogate escape), not a JSON object, or without an integer ``_step`` — are skipped and
counted (``JsonlReader.skipped``, ``JsonlReader.no_step``), and warned about once per file
(naming the file, and for a line that does not decode its byte offset and why). A last
line without its newline is never returned; rows of one step are merged in file order
(later lines win per key).

Files are opened as untrusted input (``history.untrusted.open_regular``): only a regular
file is read, so a FIFO or device named ``metrics.jsonl`` (or its sidecar) is an
``OSError`` (``UnsafeFileError``), never a reader blocked for good.

:class:`JsonlReader` is the planner over one file:

- ``tail_rows(n)`` returns the newest ``n`` physical rows; ``tail(n)`` the newest ``n``
  merged steps, reading backwards until one whole spare step has been seen (the boundary
  step may be half read, so it is read and dropped);
- ``read_range(start, end)`` is exact by step. When the sidecar is trustworthy and says the
  file is sorted, ``offset_of_step`` binary-searches its sparse ``[step, line, offset]``
  index and only the rows of the range are read (plus the part of the file written after
  the sidecar, which is scanned whole because nothing is known about it); otherwise the
  file is scanned once, in full;
- ``bytes_read`` counts the bytes actually read from the OS, so tests and ``et.info()``
  can show that a query did not load the file.

Module functions: ``last_line_end`` (also used by the writer's torn-line repair),
``iter_rows``, ``merge_by_step``, ``step_key`` and ``read_rows``.
"""

from __future__ import annotations

import io
import os
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from expr_tracker._warn import Warner
from expr_tracker.history.codec import decode_line, is_step
from expr_tracker.history.untrusted import open_regular, read_json

BLOCK = 1 << 16
META_SCHEMA = 2  # the sidecar schema (the writer writes it, this reader understands it)

#: once-only memory for "line without _step" warnings of readers given no warner
NO_STEP_WARNER = Warner()


def warn_no_step(warner: Warner | None, path: Any) -> None:
    """Count a line of ``path`` without a step (an int in [0, 2**63-1]: ``is_step``);
    warn once per file."""
    (warner or NO_STEP_WARNER).warn(
        ("no_step", str(path)),
        "expr_tracker: %s has a line without an integer _step in [0, 2**63-1]; such lines "
        "are not rows and "
        "are skipped (warned once per file, counted)",
        path,
    )


def warn_bad_line(warner: Warner | None, path: Any, offset: int | None, why: str) -> None:
    """Count a line of ``path`` that is not a JSON object (``why``: what is wrong with it);
    warn once per file, naming the line's byte offset when known."""
    where = f" at byte {offset}" if offset is not None else ""
    (warner or NO_STEP_WARNER).warn(
        ("bad_line", str(path)),
        "expr_tracker: %s has a line that is not a row%s (%s); such lines are skipped "
        "(warned once per file, counted)",
        path,
        where,
        why[:120],
    )


def _is_row(rec: Any) -> bool:
    return isinstance(rec, dict) and is_step(rec.get("_step"))


# --------------------------------------------------------------------------- primitives


def last_line_end(f: Any, end: int) -> int:
    """The offset just past the last newline before ``end`` (0 when there is none)."""
    pos = end
    while pos > 0:
        lo = max(0, pos - BLOCK)
        f.seek(lo)
        chunk: bytes = f.read(pos - lo)
        nl = chunk.rfind(b"\n")
        if nl >= 0:
            return lo + nl + 1
        pos = lo
    return 0


def _lines_backward(f: Any, end: int) -> Iterator[tuple[int, bytes]]:
    """``(offset, line)`` of each complete line before ``end``, newest first.

    A line longer than a block is gathered from its pieces and joined once: adding each
    block to the front of what was read of it so far copied it again for every block
    (quadratic: a line of 300 MB held ``et runs`` for hours)."""
    pos = last_line_end(f, end)
    line_end = pos  # where the line being gathered ends (its newline's offset)
    pieces: list[bytes] = []  # of that line, the last piece first
    while pos > 0:
        lo = max(0, pos - BLOCK)
        f.seek(lo)
        data = f.read(pos - lo)
        pos = lo
        parts = data.split(b"\n")
        if len(parts) == 1:
            pieces.append(data)
            continue
        pieces.append(parts[-1])
        gathered = b"".join(reversed(pieces)) if len(pieces) > 1 else pieces[0]
        for line in (gathered, *reversed(parts[1:-1])):
            start = line_end - len(line)
            if line:
                yield start, line
            line_end = start - 1
        pieces = [parts[0]]
    line = b"".join(reversed(pieces))
    if line:
        yield 0, line


def iter_rows(path: str | os.PathLike[str], end: int | None = None) -> Iterator[dict[str, Any]]:
    """Decoded rows of ``path`` in file order, up to byte ``end``; lines that are not rows
    (undecodable, or without an integer ``_step``: warned once per file) skipped.

    Raises ``OSError`` (``UnsafeFileError`` for a file that is not a regular file)."""
    with open(open_regular(path), "rb") as f:
        pos = 0
        for raw in f:
            start = pos
            pos += len(raw)
            if end is not None and pos > end:
                break
            if not raw.endswith(b"\n"):
                break  # torn last line
            try:
                rec = decode_line(raw)
            except ValueError as exc:
                if raw.strip():
                    warn_bad_line(None, path, start, str(exc))
                continue
            if _is_row(rec):
                yield rec
            elif isinstance(rec, dict):
                warn_no_step(None, path)
            else:
                warn_bad_line(None, path, start, "not a JSON object")


def decode_appended(carry: bytes, data: bytes) -> tuple[list[dict[str, Any]], bytes]:
    """The complete lines of ``carry + data`` (bytes appended to a JSONL file since the last
    read) decoded: ``(records, new_carry)``, where ``new_carry`` is the unfinished last line
    to prepend next time. Undecodable lines and lines that are not JSON objects are skipped
    (``et history --follow`` and ``et plot --follow`` read a live file this way)."""
    parts = (carry + data).split(b"\n")
    new_carry = parts.pop()
    rows = []
    for raw in parts:
        try:
            rec = decode_line(raw)
        except ValueError:
            continue
        if isinstance(rec, dict):
            rows.append(rec)
    return rows, new_carry


def merge_by_step(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Merge rows sharing a ``_step`` (later rows win per key), in order of first appearance.

    Every returned dict is new (the input rows are never modified). Rows without an
    integer ``_step`` (readers never return one) are copied as they are.
    """
    out: list[dict[str, Any]] = []
    at: dict[int, dict[str, Any]] = {}
    for r in rows:
        s = r.get("_step")
        if type(s) is not int:
            out.append(dict(r))
            continue
        cur = at.get(s)
        if cur is None:
            cur = dict(r)
            at[s] = cur
            out.append(cur)
        else:
            cur.update(r)  # later lines win per key; _step/_time stay last (written last)
            cur["_step"] = cur.pop("_step")
            if "_time" in cur:
                cur["_time"] = cur.pop("_time")
    return out


def step_key(row: dict[str, Any]) -> int:
    """Sort key by ``_step`` (rows without an integer step sort first)."""
    s = row.get("_step")
    return s if type(s) is int else -1


def read_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every step of a metrics file, merged by step, in file order of first appearance."""
    return merge_by_step(iter_rows(Path(path)))


def meta_path_for(path: str | os.PathLike[str]) -> Path:
    """The sidecar of a metrics file: ``metrics[.S][.rankN].jsonl`` -> ``....meta.json``."""
    p = Path(path)
    name = p.name[: -len(".jsonl")] if p.name.endswith(".jsonl") else p.name
    return p.with_name(name + ".meta.json")


# --------------------------------------------------------------------------- reader


class _CountingFile(io.FileIO):
    """A raw file that adds every byte it reads to ``owner.bytes_read``; only a regular file
    is opened (``untrusted.open_regular``: a FIFO never blocks the reader)."""

    def __init__(self, path: str | os.PathLike[str], owner: JsonlReader) -> None:
        super().__init__(open_regular(path, root=owner.root), "rb", closefd=True)
        self._owner = owner

    def readinto(self, b: Any) -> int | None:
        n = super().readinto(b)
        if n:
            self._owner.bytes_read += n
        return n

    def read(self, size: int | None = -1) -> bytes:  # a regular file: never None
        data = super().read(size)
        if data:
            self._owner.bytes_read += len(data)
        return data

    def readall(self) -> bytes:
        data = super().readall()
        self._owner.bytes_read += len(data)
        return data


def _decode(raw: bytes) -> dict[str, Any] | None:
    try:
        rec = decode_line(raw)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) else None


_NOT_JSON = object()  # what _decode_row returns for JSON that is not an object


def _decode_row(raw: bytes) -> Any:
    """The row of ``raw`` (a dict); None for a JSON object without an integer ``_step``;
    ``_NOT_JSON`` for other JSON; the ``ValueError`` for a line that does not decode."""
    try:
        rec = decode_line(raw)
    except ValueError as exc:
        return exc
    if not isinstance(rec, dict):
        return _NOT_JSON
    return rec if is_step(rec.get("_step")) else None


class JsonlReader:
    """Tail and step-range reads over one metrics file; see the module docstring.

    Args:
        path: the ``.jsonl`` file.
        meta: the sidecar content to plan with (a live writer passes its in-memory
            ``meta()``); None reads ``meta_path`` (default: the file's own sidecar).
            A sidecar is used only when its schema is known and its ``size`` is not larger
            than the file; anchors are verified against the file before they are trusted.
        meta_path: where the sidecar is (None: beside the file).
        end: read only the bytes before this offset (the cache/disk boundary of a live
            store); None is the whole file.
        warner: where the once-per-file warnings about lines that are not rows go (and are
            counted); None: a module-level one.
        root: when given, the file and its sidecar are read only if they lie inside this
            folder (a run directory: a file swapped for a symbolic link to elsewhere is
            refused, see ``history.untrusted``).

    Attributes:
        bytes_read: bytes read from the OS so far.
        skipped: lines met so far that are not rows (undecodable, not an object, or
            without an integer ``_step``); never returned.
        no_step: the part of ``skipped`` that decoded but has no integer ``_step``.
        full_scans: reads that had to scan every line (no usable sidecar, or unsorted).
        sorted: whether the planner may treat the trusted prefix as sorted by step.

    Raises:
        FileNotFoundError: ``path`` does not exist (raised by the first read).
        OSError: it cannot be read (``PermissionError``; ``UnsafeFileError`` for a FIFO,
            device or socket, or a file outside ``root``), raised by the first read.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        meta: dict[str, Any] | None = None,
        meta_path: str | os.PathLike[str] | None = None,
        end: int | None = None,
        warner: Warner | None = None,
        root: str | os.PathLike[str] | None = None,
    ) -> None:
        self.path = Path(path)
        self.root = root
        self.bytes_read = 0
        self.skipped = 0
        self.no_step = 0
        self._warner = warner
        self.full_scans = 0
        self.index_lookups = 0
        self._end = end
        if meta is None:
            meta = self._load_meta(Path(meta_path) if meta_path else meta_path_for(self.path), root)
        self.meta = meta
        self._meta_ok: bool | None = None
        self._anchors: list[list[int]] | None = None

    # ------------------------------------------------------------------ sidecar

    @staticmethod
    def _load_meta(p: Path, root: Any = None) -> dict[str, Any] | None:
        """The sidecar's content; None when it is missing, unreadable or not JSON (the
        reader then scans; a sidecar is only ever a shortcut)."""
        try:
            data = read_json(p, root=root)
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _open(self) -> io.BufferedReader:
        return io.BufferedReader(_CountingFile(self.path, self), BLOCK)

    def _file_end(self, f: Any) -> int:
        size = os.fstat(f.fileno()).st_size
        return size if self._end is None else min(size, self._end)

    def _trusted_size(self, file_end: int) -> int:
        """Bytes at the start of the file the sidecar describes (0: use no sidecar)."""
        m = self.meta
        if self._meta_ok is None:
            ok = (
                m is not None
                and m.get("schema") == META_SCHEMA
                and isinstance(m.get("size"), int)
                and isinstance(m.get("index"), list)
            )
            if ok:
                assert m is not None
                try:
                    ok = int(m["size"]) <= os.stat(self.path).st_size
                except OSError:
                    ok = False
            self._meta_ok = bool(ok)
        if not self._meta_ok:
            return 0
        return min(int(m["size"]), file_end)  # type: ignore[index]

    @property
    def sorted(self) -> bool:
        """True when a usable sidecar says every line it covers is in step order."""
        return bool(self.meta and self.meta.get("sorted", False)) and self._meta_ok is not False

    def anchors(self) -> list[list[int]]:
        """The sidecar's ``[step, line, offset]`` anchors, ascending by line (possibly [])."""
        if self._anchors is None:
            raw = (self.meta or {}).get("index") or []
            out = []
            for a in raw:
                if isinstance(a, (list, tuple)) and len(a) == 3 and all(type(x) is int for x in a):
                    out.append([a[0], a[1], a[2]])
            out.sort(key=lambda a: a[1])
            self._anchors = out
        return self._anchors

    def _verify_anchor(self, f: Any, a: list[int], limit: int) -> bool:
        """An anchor is trusted when it starts a line holding the step it names."""
        step, _line, off = a
        if off < 0 or off >= limit:
            return False
        if off > 0:
            f.seek(off - 1)
            if f.read(1) != b"\n":
                return False
        else:
            f.seek(0)
        raw = f.readline()
        if not raw.endswith(b"\n"):
            return False
        rec = _decode(raw)
        return rec is not None and rec.get("_step") == step

    def offset_of_step(self, step: int, f: Any = None) -> int:
        """A byte offset from which a forward scan meets every row with ``_step >= step``.

        Binary-searches the sidecar's anchors for the last one whose step is strictly below
        ``step`` (an earlier line of ``step`` itself may precede an anchor holding it) and
        verifies it against the file, walking back over anchors that do not match. Only
        meaningful for a sorted file; returns 0 when nothing better is known.
        """
        own = f is None
        if own:
            f = self._open()
        try:
            limit = self._trusted_size(self._file_end(f))
            if not limit:
                return 0
            anchors = self.anchors()
            self.index_lookups += 1
            i = bisect_left([a[0] for a in anchors], step) - 1
            while i >= 0:
                a = anchors[i]
                if self._verify_anchor(f, a, limit):
                    return a[2]
                i -= 1
            return 0
        finally:
            if own:
                f.close()

    def set_end(self, end: int | None) -> None:
        """Read only the bytes before ``end`` from now on (None: the whole file)."""
        self._end = end

    def offset_of_line(self, line: int) -> int:
        """Byte offset where line ``line`` (0-based) starts, counting forward from the
        nearest anchor at or before it (the file size when the file is shorter).

        The anchors are used as given: this is for a live writer's own index.
        """
        start_line = start_off = 0
        for _s, ln, off in self.anchors():
            if start_line <= ln <= line:
                start_line, start_off = ln, off
        if start_line == line:
            return start_off
        with self._open() as f:
            f.seek(start_off)
            cur, off = start_line, start_off
            for raw in f:
                if cur == line:
                    return off
                off += len(raw)
                cur += 1
            return off

    # ------------------------------------------------------------------ reads

    def _not_a_row(self, rec: Any, offset: int | None = None, raw: bytes = b"") -> None:
        """Count a line ``_decode_row`` did not make a row of (``rec``: what it returned)."""
        self.skipped += 1
        if rec is None:  # an object without a step (is_step)
            self.no_step += 1
            warn_no_step(self._warner, self.path)
        elif raw.strip():  # a line that is not an object (a blank line is only counted)
            why = str(rec) if isinstance(rec, ValueError) else "not a JSON object"
            warn_bad_line(self._warner, self.path, offset, why)

    def stats(self) -> dict[str, int]:
        """What this reader did so far: ``bytes_read``, ``skipped`` and ``no_step`` lines
        (see the class attributes), ``full_scans``, ``index_lookups``."""
        return {
            "bytes_read": self.bytes_read,
            "skipped": self.skipped,
            "no_step": self.no_step,
            "full_scans": self.full_scans,
            "index_lookups": self.index_lookups,
        }

    def _rows_backward(self, f: Any, end: int) -> Iterator[dict[str, Any]]:
        for off, raw in _lines_backward(f, end):
            rec = _decode_row(raw)
            if type(rec) is not dict:
                self._not_a_row(rec, off, raw)
                continue
            yield rec

    def tail_rows(self, n: int) -> list[dict[str, Any]]:
        """The newest ``n`` physical rows (not merged), oldest first.

        Raises:
            FileNotFoundError: the file does not exist.
        """
        if n <= 0:
            return []
        out: list[dict[str, Any]] = []
        with self._open() as f:
            for rec in self._rows_backward(f, self._file_end(f)):
                out.append(rec)
                if len(out) >= n:
                    break
        out.reverse()
        return out

    def tail_physical(self, nsteps: int) -> list[dict[str, Any]]:
        """Rows (oldest first, unmerged) covering the newest ``nsteps`` steps plus one spare.

        Reads backwards until a row of the (``nsteps`` + 2)-th distinct step is met, so the
        newest ``nsteps`` + 1 steps are read whole where their lines are adjacent; the
        caller merges and drops the spare step.
        """
        if nsteps <= 0:
            return []
        out: list[dict[str, Any]] = []
        seen: set[Any] = set()
        limit = nsteps + 1
        with self._open() as f:
            for rec in self._rows_backward(f, self._file_end(f)):
                s = rec.get("_step")
                key = s if type(s) is int else ("row", len(out))
                if key not in seen:
                    if len(seen) >= limit:
                        break
                    seen.add(key)
                out.append(rec)
        out.reverse()
        return out

    def tail(self, n: int | None) -> list[dict[str, Any]]:
        """The newest ``n`` steps, merged by step, oldest first (None/-1: all, exact by step).

        "Newest" is the order lines were written: with an unsorted file these are the most
        recently written steps, not the highest-numbered ones (docs/history.md "Steps, not
        lines").
        """
        if n is None or n < 0:
            return self.read_all()
        if n == 0:
            return []
        merged = merge_by_step(self.tail_physical(n))
        return merged[-n:] if len(merged) > n else merged

    def iter_rows(self, start: int = 0, stop: int | None = None) -> Iterator[dict[str, Any]]:
        """Decoded rows in file order from byte ``start`` up to byte ``stop`` (default: end).

        Lines that are not rows are skipped (counted in ``skipped``; those without an
        integer ``_step`` also in ``no_step``, warned once per file); a line without its
        newline at the end of the file (torn by a crash, or being written) is not returned.
        """
        with self._open() as f:
            end = self._file_end(f)
            if stop is None or stop > end:
                stop = end
            f.seek(start)
            pos = start
            for raw in f:
                at = pos
                pos += len(raw)
                if pos > stop or not raw.endswith(b"\n"):
                    break
                rec = _decode_row(raw)
                if type(rec) is not dict:
                    self._not_a_row(rec, at, raw)
                    continue
                yield rec

    def read_all(self) -> list[dict[str, Any]]:
        """Every step, merged by step; in step order unless the file is known sorted."""
        self.full_scans += 1
        with self._open() as f:
            end = self._file_end(f)
            trusted = self._trusted_size(end)
        rows = merge_by_step(self.iter_rows())
        if not (self.sorted and trusted >= end):
            rows.sort(key=step_key)
        return rows

    def read_range(self, start: int | None, end: int | None) -> list[dict[str, Any]]:
        """Rows with ``start <= _step < end`` (None: open side), merged by step, step order.

        Exact by step for any file. With a trusted sorted sidecar only the range itself
        (from the nearest verified anchor) and the bytes written after the sidecar are read;
        otherwise one full scan.
        """
        if start is not None and end is not None and end <= start:
            return []
        return _sorted_merge(self.range_rows(start, end))

    def range_rows(self, start: int | None, end: int | None) -> list[dict[str, Any]]:
        """The physical rows (file order, unmerged) whose step lies in ``[start, end)``."""
        lo = -(1 << 63) if start is None else start
        hi = 1 << 63 if end is None else end
        out: list[dict[str, Any]] = []
        with self._open() as f:
            file_end = self._file_end(f)
            trusted = self._trusted_size(file_end)
            use_index = bool(trusted) and self.sorted
            off = self.offset_of_step(lo, f) if use_index and start is not None else 0
        if use_index:
            # the sorted part the sidecar describes: from the anchor to the first step >= end
            for rec in self._iter(off, trusted):
                s = rec.get("_step")
                if type(s) is not int:
                    continue
                if s >= hi:
                    break
                if s >= lo:
                    out.append(rec)
            rest = trusted
        else:
            self.full_scans += 1
            rest = 0
        # what no sidecar describes (written after it, or the whole file): every line
        for rec in self._iter(rest, file_end):
            s = rec.get("_step")
            if type(s) is int and lo <= s < hi:
                out.append(rec)
        return out

    def _iter(self, start: int, stop: int) -> Iterator[dict[str, Any]]:
        if start >= stop:
            return
        yield from self.iter_rows(start, stop)


def _sorted_merge(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    merged = merge_by_step(rows)
    merged.sort(key=step_key)
    return merged
