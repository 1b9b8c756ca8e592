"""The other ranks' metrics files, tailed by rank 0 while it trains (``skew(m)`` in rules,
:class:`~expr_tracker.history.peers.RankSkew`; docs/streams.md "Straggler ranks"): only
the bytes appended since the last poll are read, never blocking, and a file that cannot be
read is given up with one warning, never raised into the training loop.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from expr_tracker._warn import Warner
from expr_tracker.history.codec import MAX_STEP, decode_line, is_step
from expr_tracker.history.paths import file_name
from expr_tracker.history.untrusted import open_regular

__all__ = ["PeerFiles"]

log = logging.getLogger("expr_tracker")

_READ = 1 << 20
_loads = orjson.loads
#: a JSON number as the writers write it (orjson; the standard module's NaN and Infinity)
_NUMBER = rb"(-?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|Infinity)|NaN)"
#: the step of a row (a literal, found by a fast search)
_STEP = re.compile(rb'"_step": ?([0-9]+) ?(?=[,}])')


def _value_pattern(key: bytes) -> re.Pattern[bytes]:
    """A number held by ``key`` (quoted, as in a line): ``"key":`` is a literal, found by
    a fast search. A ``"`` inside a JSON string is always escaped, so it never matches
    inside a string; a nested ``{...}`` is ruled out by the caller."""
    return re.compile(re.escape(key) + rb": ?" + _NUMBER + rb"(?= ?[,}])")


class PeerFiles:
    """Incremental readers of the other ranks' metrics files of one stream.

    Args:
        run_dir: the run directory (files are opened only inside it).
        stream: the stream (None: the main one).
        world_size: ranks in the job; ranks ``1..world_size-1`` are read (rank 0 is us).
        interval: seconds between two polls of the files (0: every call).
        clock: monotonic seconds (injectable).

    ``poll(names)`` returns ``[(rank, name, steps, values)]`` for the tracked names in the
    complete lines appended since the last poll. A file not there yet is
    retried at the next poll; one that cannot be read (not a regular file, outside the run
    directory, an I/O error) is given up with one warning.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        stream: str | None,
        world_size: int,
        *,
        interval: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        warner: Warner | None = None,
    ) -> None:
        self.root = Path(run_dir)
        self.ranks = list(range(1, int(world_size)))
        self.paths = {r: self.root / file_name("metrics", stream, r) for r in self.ranks}
        self.interval = float(interval)
        self.clock = clock
        self.warner = warner or Warner(log)
        self._fds: dict[int, int] = {}
        self._rest: dict[int, bytes] = {}
        self._dead: set[int] = set()
        self._patterns: dict[bytes, re.Pattern[bytes]] = {}
        self.next_poll = 0.0  # the clock time of the next poll that reads
        self.bytes_read = 0
        self.lines = 0
        self.polls = 0

    def poll(self, names: dict[bytes, str]) -> list[tuple[int, str, list[int], list[float]]]:
        """``[(rank, name, steps, values)]``: per peer and tracked name (the key as it
        appears in a line, ``b'"time_ms/forward"'`` -> the name), the steps and numeric
        values in the complete lines appended since the last poll, in file order (a later
        line of a step after an earlier one); nothing when the last poll was less than
        ``interval`` ago.

        The bytes read are scanned at once, not line by line: when every line is a flat
        row as the history writer writes it and holds the name with a number (a span's
        time, every step), one search for the steps and one for the values; otherwise (a
        line without the name, a patch line, another layout, a nested value) the lines
        holding the name are decoded as one JSON array (line by line if that fails)."""
        now = self.clock()
        if now < self.next_poll:
            return []
        self.next_poll = now + self.interval
        self.polls += 1
        out: list[tuple[int, str, list[int], list[float]]] = []
        for r in self.ranks:
            if r in self._dead:
                continue
            fd = self._fds.get(r)
            try:
                if fd is None:
                    try:
                        fd = open_regular(self.paths[r], root=self.root)
                    except FileNotFoundError:
                        continue  # that rank has not started writing yet
                    self._fds[r] = fd
                    self._rest[r] = b""
                data = self._read(fd)
            except OSError as exc:
                self._give_up(r, exc)
                continue
            if not data:
                continue
            self.bytes_read += len(data)
            rest = self._rest[r]
            buf = rest + data if rest else data
            cut = buf.rfind(b"\n") + 1
            self._rest[r] = buf[cut:]
            if not cut:
                continue
            chunk = buf[:cut] if cut < len(buf) else buf
            n = chunk.count(b"\n")
            steps: list[int] | None = None  # every line's step, when every line is a flat row
            for key, name in names.items():
                k = chunk.count(key)
                if not k:
                    continue
                self.lines += k
                if k == n:  # the key on every line: read the whole chunk at once
                    if steps is None:
                        steps = self._steps(chunk, n)
                    if steps:
                        pattern = self._patterns.get(key)
                        if pattern is None:
                            pattern = self._patterns[key] = _value_pattern(key)
                        found = pattern.findall(chunk)
                        if len(found) == n:
                            out.append((r, name, steps, list(map(float, found))))
                            continue
                out.append((r, name, *self._decode(chunk, key, name)))
        return out

    @staticmethod
    def _steps(chunk: bytes, n: int) -> list[int]:
        """The step of each of the ``n`` lines of ``chunk`` when every line is a flat row
        (no ``{`` but the row's own: nothing nested) holding a step (``is_step``: the
        pattern takes no sign; one past 2**63-1 sends the chunk to :meth:`_decode`), else
        ``[]``."""
        if chunk.count(b"{") != n:
            return []
        found = _STEP.findall(chunk)
        if len(found) != n:
            return []
        steps = list(map(int, found))
        return steps if not steps or max(steps) <= MAX_STEP else []

    @staticmethod
    def _decode(chunk: bytes, key: bytes, name: str) -> tuple[list[int], list[float]]:
        """Each line holding ``key`` decoded as JSON (all of them in one call when they all
        decode; else line by line, NaN and Infinity tokens accepted, a bad line skipped):
        the steps and numeric values of ``name``."""
        lines = [line for line in chunk.split(b"\n") if key in line]
        try:
            rows = _loads(b"[" + b",".join(lines) + b"]")
        except ValueError:
            rows = None
        if rows is None or len(rows) != len(lines):
            rows = []
            for line in lines:
                try:
                    rows.append(decode_line(line))
                except ValueError:
                    continue
        steps: list[int] = []
        values: list[float] = []
        for row in rows:
            if type(row) is not dict:
                continue
            step = row.get("_step")
            v = row.get(name)
            t = type(v)
            if is_step(step) and (t is float or t is int):
                steps.append(step)
                values.append(float(v))  # type: ignore[arg-type]  # int or float, checked above
        return steps, values

    @staticmethod
    def _read(fd: int) -> bytes:
        parts = []
        while True:
            b = os.read(fd, _READ)
            if not b:
                break
            parts.append(b)
            if len(b) < _READ:
                break
        return b"".join(parts)

    def _give_up(self, rank: int, exc: OSError) -> None:
        self._dead.add(rank)
        fd = self._fds.pop(rank, None)
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
        self.warner.warn(
            ("peer", rank),
            "expr_tracker: skew(): rank %d's metrics file %s cannot be read (%s); its values "
            "count as missing",
            rank,
            self.paths[rank],
            exc,
        )

    def close(self) -> None:
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()
