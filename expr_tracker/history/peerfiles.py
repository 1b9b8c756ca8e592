"""The other ranks' metrics files, tailed by rank 0 while it trains (``skew(m)`` in rules,
:class:`~expr_tracker.history.peers.RankSkew`; docs/streams.md "Straggler ranks"): only
the bytes appended since the last poll are read, never blocking, and a file that cannot be
read is given up with one warning, never raised into the training loop.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from expr_tracker._warn import Warner
from expr_tracker.history.codec import decode_line
from expr_tracker.history.paths import file_name
from expr_tracker.history.untrusted import open_regular

__all__ = ["PeerFiles"]

log = logging.getLogger("expr_tracker")

_READ = 1 << 20
_loads = orjson.loads


class PeerFiles:
    """Incremental readers of the other ranks' metrics files of one stream.

    Args:
        run_dir: the run directory (files are opened only inside it).
        stream: the stream (None: the main one).
        world_size: ranks in the job; ranks ``1..world_size-1`` are read (rank 0 is us).
        interval: seconds between two polls of the files (0: every call).
        clock: monotonic seconds (injectable).

    ``poll(names)`` returns ``[(rank, step, name, value)]`` for the tracked names in the
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
        self._next = 0.0
        self.bytes_read = 0
        self.lines = 0
        self.polls = 0

    def poll(self, names: dict[bytes, str]) -> list[tuple[int, int, str, float]]:
        """``[(rank, step, name, value)]`` of the tracked ``names`` (the key as it appears in
        a line, ``b'"time_ms/forward"'`` -> the name) in the complete lines appended since
        the last poll; nothing when the last poll was less than ``interval`` ago."""
        now = self.clock()
        if now < self._next:
            return []
        self._next = now + self.interval
        self.polls += 1
        out: list[tuple[int, int, str, float]] = []
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
            for line in buf[:cut].split(b"\n"):
                for key in names:
                    if key in line:
                        break
                else:
                    continue  # an empty line, or none of the names
                self.lines += 1
                try:
                    row = _loads(line)
                except ValueError:
                    try:
                        row = decode_line(line)  # NaN / Infinity tokens
                    except ValueError:
                        continue
                if type(row) is not dict:
                    continue
                step = row.get("_step")
                if type(step) is not int:
                    continue
                for name in names.values():
                    v = row.get(name)
                    t = type(v)
                    if t is float or t is int:
                        out.append((r, step, name, float(v)))  # type: ignore[arg-type]
        return out

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
