"""The in-memory cache of committed rows, kept as encoded bytes.

Rows are addressed by their physical row ordinal (one append sequence number per record,
equal to the line number in the file; spec design.txt B.2), never by step. Each row is
stored as its encoded line in a segment: one ``bytearray`` of line bytes, an ``array`` of
end offsets and an ``array`` of steps, so a cached row costs its JSON bytes plus 12 bytes
(no Python object per row). Eviction drops whole segments from the front, and only
segments whose rows are all on disk (below the ``flushed`` watermark).
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterator

MAX_STEP = (1 << 63) - 1


class _Segment:
    __slots__ = ("first", "data", "ends", "steps")

    def __init__(self, first: int) -> None:
        self.first = first  # ordinal of the first row
        self.data = bytearray()
        self.ends = array("I")
        self.steps = array("q")

    def __len__(self) -> int:
        return len(self.ends)

    def row(self, i: int) -> bytes:
        ends = self.ends
        return bytes(self.data[(ends[i - 1] if i else 0) : ends[i]])


class RowCache:
    """Encoded rows with two limits, ``max_bytes`` and ``max_rows``.

    Args:
        max_bytes: encoded line bytes kept at most (rows not on disk may exceed it).
        max_rows: rows kept at most (same exception).
        first_ordinal: the ordinal of the first row this cache will hold (after a resume,
            the number of lines already in the file: the disk prefix).
    """

    __slots__ = (
        "max_bytes",
        "max_rows",
        "segment_rows",
        "_segments",
        "first_ordinal",
        "next_ordinal",
        "nbytes",
        "nrows",
        "evicted_rows",
    )

    def __init__(self, max_bytes: int, max_rows: int, first_ordinal: int = 0) -> None:
        self.max_bytes = int(max_bytes)
        self.max_rows = int(max_rows)
        self.segment_rows = max(1, min(4096, self.max_rows // 4 or 1))
        self._segments: deque[_Segment] = deque()
        self.first_ordinal = first_ordinal  # ordinal of the oldest cached row
        self.next_ordinal = first_ordinal
        self.nbytes = 0
        self.nrows = 0
        self.evicted_rows = 0

    def append(self, line: bytes, step: int) -> int:
        """Add one row; returns its ordinal."""
        segs = self._segments
        seg = segs[-1] if segs else None
        if seg is None or len(seg.ends) >= self.segment_rows:
            seg = _Segment(self.next_ordinal)
            segs.append(seg)
        data = seg.data
        data += line
        seg.ends.append(len(data))
        seg.steps.append(step if -MAX_STEP <= step <= MAX_STEP else MAX_STEP)
        self.nbytes += len(line)
        self.nrows += 1
        o = self.next_ordinal
        self.next_ordinal = o + 1
        return o

    def over_limit(self) -> bool:
        return self.nbytes > self.max_bytes or self.nrows > self.max_rows

    def evict(self, flushed: int) -> int:
        """Drop the oldest segments while over a limit and wholly below ``flushed``.

        Returns the number of rows evicted. Rows at or above ``flushed`` (not on disk yet)
        are never evicted.
        """
        n = 0
        segs = self._segments
        while segs and self.over_limit():
            seg = segs[0]
            if seg.first + len(seg) > flushed or seg is segs[-1] and len(seg) < self.segment_rows:
                break
            segs.popleft()
            self.nbytes -= len(seg.data)
            self.nrows -= len(seg)
            n += len(seg)
            self.first_ordinal = segs[0].first if segs else self.next_ordinal
        self.evicted_rows += n
        return n

    def needs_flush_to_evict(self, flushed: int) -> bool:
        """True when over a limit but the oldest segment still has rows not on disk."""
        segs = self._segments
        return bool(segs) and self.over_limit() and segs[0].first + len(segs[0]) > flushed

    def iter_back(self) -> Iterator[tuple[int, int, bytes]]:
        """(ordinal, step, line) from the newest cached row to the oldest."""
        for seg in reversed(self._segments):
            ends = seg.ends
            steps = seg.steps
            data = seg.data
            first = seg.first
            for i in range(len(ends) - 1, -1, -1):
                yield first + i, steps[i], bytes(data[(ends[i - 1] if i else 0) : ends[i]])

    def iter_forward(self) -> Iterator[tuple[int, int, bytes]]:
        """(ordinal, step, line) from the oldest cached row to the newest."""
        for seg in list(self._segments):
            ends = seg.ends
            steps = seg.steps
            data = seg.data
            first = seg.first
            start = 0
            for i in range(len(ends)):
                end = ends[i]
                yield first + i, steps[i], bytes(data[start:end])
                start = end

    def tail_lines(self, nsteps: int) -> tuple[list[bytes], list[int], bool]:
        """Lines (oldest first) covering the newest ``nsteps`` distinct steps plus one.

        Reads whole steps only: it stops at the first row of the (nsteps+2)-th distinct
        step going backwards, so the boundary step is over-read and can be dropped by the
        caller. Returns (lines, steps, complete) where ``complete`` is False when the cache
        ran out before enough steps were seen.
        """
        lines: list[bytes] = []
        steps: list[int] = []
        seen = 0
        last = None
        limit = nsteps + 1
        for seg in reversed(self._segments):
            ends = seg.ends
            ss = seg.steps
            data = seg.data
            for i in range(len(ends) - 1, -1, -1):
                s = ss[i]
                if s != last:
                    seen += 1
                    if seen > limit:
                        lines.reverse()
                        steps.reverse()
                        return lines, steps, True
                    last = s
                lines.append(bytes(data[(ends[i - 1] if i else 0) : ends[i]]))
                steps.append(s)
        lines.reverse()
        steps.reverse()
        return lines, steps, False
