"""The in-memory cache of committed rows, kept as encoded bytes.

Rows are addressed by their physical row ordinal (one append sequence number per record,
equal to the line number in the file; docs/history.md "Where the answer comes from"), never
by step. Each row is stored as its encoded line in a segment: one buffer of line bytes
allocated once at its final size (its own anonymous mapping when 64 KiB or more), an
``array`` of uint32 end offsets, and the steps: a ``range`` while they are consecutive (the
common case), an ``array`` of int64 once a row breaks the run. A cached 3-float row costs
its JSON bytes plus about 5 bytes (no Python object per row; docs/history.md "Figures"). A
segment holds at most 4096 rows and a quarter of each limit. Eviction drops whole segments
from the front, and only segments whose rows are all on disk (below the ``flushed``
watermark).
"""

from __future__ import annotations

import mmap
from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Sequence
from typing import Any

from expr_tracker.history.codec import decode_line

try:
    from orjson import JSONDecodeError as _JSONDecodeError
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - orjson is a dependency
    _loads = None  # type: ignore[assignment]
    _JSONDecodeError = ValueError  # type: ignore[assignment,misc]


#: the line size the first segment is sized for (a 3-float row is 79 bytes)
FIRST_ROW_BYTES = 128
#: segments of at least this capacity get a private anonymous mapping of their own
MAP_MIN_BYTES = 64 * 1024


def _buffer(capacity: int) -> bytearray | mmap.mmap:
    """A zeroed writable buffer of ``capacity`` bytes: its own anonymous mapping when large
    (pages count in RSS once written; dropping it returns them to the system at once; it
    never shares the heap with short-lived objects, so it leaves no holes there), else a
    ``bytearray`` (also the fallback when the system refuses a mapping)."""
    if capacity >= MAP_MIN_BYTES:
        try:
            return mmap.mmap(-1, capacity)
        except (OSError, ValueError):
            pass
    return bytearray(capacity)


class _Segment:
    """One run of consecutive rows: ``data[:ends[-1]]`` holds their lines back to back.

    ``data`` is allocated once at its final capacity (never grown: growing a buffer by
    reallocation leaves holes in the heap) and trimmed when the segment closes; the cache
    opens a new segment when a line does not fit. ``steps`` is None while the steps are
    ``step0, step0 + 1, ...`` (the common case: no array at all) and becomes an int64 array
    at the first row that breaks the run.
    """

    __slots__ = ("first", "data", "cap", "ends", "steps", "step0")

    def __init__(self, first: int, capacity: int, step0: int) -> None:
        self.first = first  # ordinal of the first row
        self.data = _buffer(capacity)
        self.cap = capacity  # bytes this segment may hold (0 once closed)
        self.ends = array("I")
        self.steps: array[int] | None = None
        self.step0 = step0

    def __len__(self) -> int:
        return len(self.ends)

    def size(self) -> int:
        """Line bytes held (``data`` may be longer: unused capacity)."""
        ends = self.ends
        return ends[-1] if ends else 0

    def trim(self) -> None:
        """Give back the unused capacity (the segment is closed: no row comes after)."""
        data = self.data
        used = self.size()
        self.cap = 0
        if isinstance(data, bytearray):
            if len(data) - used > used >> 3:  # an eighth or less: not worth a copy
                self.data = data[:used]
        elif 0 < used < len(data):
            try:
                data.resize(used)  # an anonymous mapping shrinks in place
            except (BufferError, OSError, SystemError, ValueError):
                pass

    def step_seq(self) -> Sequence[int]:
        """The rows' steps, oldest first (a ``range`` while they are consecutive)."""
        steps = self.steps
        if steps is None:
            return range(self.step0, self.step0 + len(self.ends))
        return steps


def _first_of(seg: _Segment) -> int:
    return seg.first


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
        "segment_bytes",
        "_segments",
        "first_ordinal",
        "next_ordinal",
        "nbytes",
        "nrows",
        "evicted_rows",
        "sorted",
        "last_step",
    )

    def __init__(self, max_bytes: int, max_rows: int, first_ordinal: int = 0) -> None:
        self.max_bytes = int(max_bytes)
        self.max_rows = int(max_rows)
        # eviction drops whole segments: a segment holds at most a quarter of either limit,
        # so the cache keeps 3/4 to all of its budget, whatever the size of a row (and the
        # uint32 end offsets of a segment never overflow)
        self.segment_rows = max(1, min(4096, self.max_rows // 4 or 1))
        self.segment_bytes = max(1, min(1 << 30, self.max_bytes // 4))
        # the first segment now (so the first append is as cheap as the others), sized for
        # rows of FIRST_ROW_BYTES; later ones for the rows actually seen
        self._segments: deque[_Segment] = deque(
            [
                _Segment(
                    first_ordinal, min(self.segment_bytes, FIRST_ROW_BYTES * self.segment_rows), 0
                )
            ]
        )
        self.first_ordinal = first_ordinal  # ordinal of the oldest cached row
        self.next_ordinal = first_ordinal
        self.nbytes = 0
        self.nrows = 0
        self.evicted_rows = 0
        self.sorted = True  # every step appended so far was >= the one before it
        self.last_step: int | None = None

    def append(self, line: bytes, step: int) -> None:
        """Add one row (its ordinal is ``next_ordinal`` before the call). The store's
        writer takes its pending lines from here (:meth:`batch`): this is the row's one
        copy until it is written.

        All or nothing: an exception raised at any point (a Ctrl-C on the main thread)
        leaves the cache as it was, so ``next_ordinal`` tells whether the row is in.
        """
        k = len(line)
        try:
            seg = self._segments[-1]
            ends = seg.ends
            n = len(ends)
            size = ends[-1] if n else 0
            if n >= self.segment_rows or size + k > seg.cap:
                raise IndexError  # full: a new segment
        except IndexError:
            seg = self._new_segment(k, step)
            ends = seg.ends
            n = size = 0
        end = size + k
        o = self.next_ordinal
        try:
            seg.data[size:end] = line  # within the capacity: a copy, never a reallocation
            ends.append(end)
            steps = seg.steps
            if steps is not None:
                steps.append(step)  # ingest bounds steps to [0, 2**63-1]
            elif step - n != seg.step0:
                if n:  # the run of consecutive steps ends: keep them all from here on
                    steps = array("q", range(seg.step0, seg.step0 + n))
                    steps.append(step)
                    seg.steps = steps
                else:  # an empty segment (left by an interrupt): its run starts here
                    seg.step0 = step
            last = self.last_step
            # the counters in one statement, the ordinal last: the commit point
            self.sorted, self.last_step, self.nbytes, self.nrows, self.next_ordinal = (
                self.sorted and (last is None or step >= last),
                step,
                self.nbytes + k,
                self.nrows + 1,
                o + 1,
            )
        except BaseException:
            if self.next_ordinal == o:
                del ends[n:]
                if seg.steps is not None:
                    del seg.steps[n:]
            raise

    def _new_segment(self, k: int, step: int) -> _Segment:
        """Close the newest segment and open one for a line of ``k`` bytes at ``step``.

        Its capacity is ``segment_rows`` lines at the closed segment's mean line size (the
        first: at ``k``), at least ``k`` and at most ``segment_bytes``, so a segment mostly
        closes when its bytes are used, wasting less than a line; a closed segment gives
        its unused capacity back.
        """
        segs = self._segments
        if segs and not len(segs[-1]):
            segs.pop()  # an empty segment left by an interrupt: replaced
        last = segs[-1] if segs else None
        if last is not None:
            last.trim()
            mean = last.size() / len(last)
        else:
            mean = float(k)
        cap = max(k, min(self.segment_bytes, int(mean * self.segment_rows)))
        seg = _Segment(self.next_ordinal, cap, step)
        segs.append(seg)
        return seg

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
            if seg.first + len(seg) > flushed:
                break
            segs.popleft()
            self.nbytes -= seg.size()
            self.nrows -= len(seg)
            n += len(seg)
            self.first_ordinal = segs[0].first if segs else self.next_ordinal
        self.evicted_rows += n
        return n

    def needs_flush_to_evict(self, flushed: int) -> bool:
        """True when over a limit but the oldest segment still has rows not on disk."""
        segs = self._segments
        return bool(segs) and self.over_limit() and segs[0].first + len(segs[0]) > flushed

    def _seg_index(self, ordinal: int) -> int:
        """The index in ``_segments`` of the segment holding ``ordinal`` (must be cached).

        Segments hold ``segment_rows`` rows unless the byte bound closed one early; the
        arithmetic guess is checked, and a binary search over the segments' first ordinals
        answers otherwise.
        """
        segs = self._segments
        k = (ordinal - segs[0].first) // self.segment_rows
        if k < len(segs):
            seg = segs[k]
            if seg.first <= ordinal < seg.first + len(seg.ends):
                return k
        return bisect_right(segs, ordinal, key=_first_of) - 1

    def first_step(self) -> int | None:
        """The step of the oldest cached row (None when empty)."""
        segs = self._segments
        return segs[0].step_seq()[0] if segs and len(segs[0]) else None

    def tail_start(self, nsteps: int) -> tuple[int, bool, bool]:
        """Where the rows covering the newest ``nsteps`` distinct steps plus one begin.

        Walks the step arrays backwards (no JSON) until a row of the (nsteps+2)-th distinct
        step is met. Returns ``(ordinal, complete, simple)``: rows ``[ordinal,
        next_ordinal)`` are the window; ``complete`` is False when the cache ran out first
        (older rows may be on disk); ``simple`` is True when the window holds one row per
        step in strictly increasing step order (nothing to merge).
        """
        limit = nsteps + 1
        segs = self._segments
        if segs and segs[-1].steps is None and len(segs[-1]) > limit:
            # the newest segment's steps are consecutive: its newest ``limit`` rows are the
            # window, one row per step in increasing order (the walk below, worked out)
            return self.next_ordinal - limit, True, True
        seen: set[int] = set()
        simple = True
        prev = None
        o = self.next_ordinal
        for seg in reversed(self._segments):
            ss = seg.step_seq()
            for i in range(len(ss) - 1, -1, -1):
                s = ss[i]
                if s not in seen:
                    if len(seen) >= limit:
                        return o, True, simple
                    seen.add(s)
                    if prev is not None and s >= prev:
                        simple = False
                else:
                    simple = False
                prev = s
                o -= 1
        return o, False, simple

    def lines(self, start: int, stop: int) -> list[bytes]:
        """The encoded lines of ordinals ``[start, stop)`` (clipped to what is cached)."""
        start = max(start, self.first_ordinal)
        stop = min(stop, self.next_ordinal)
        out: list[bytes] = []
        if start >= stop:
            return out
        segs = self._segments
        k = self._seg_index(start)
        o = start
        while o < stop:
            seg = segs[k]
            ends = seg.ends
            data = seg.data
            j = o - seg.first
            last = min(len(ends), stop - seg.first)
            prev = ends[j - 1] if j else 0
            for jj in range(j, last):
                e = ends[jj]
                out.append(bytes(data[prev:e]))
                prev = e
            o = seg.first + last
            k += 1
        return out

    def nbytes_between(self, start: int, stop: int) -> int:
        """The bytes of the lines of ordinals ``[start, stop)``, from the segments' end
        offsets (no line is copied); the same rules as :meth:`batch` (``start`` cached,
        every ordinal below ``stop`` committed), and safe beside appends as it is.

        Raises:
            ValueError: ``start`` is below the oldest cached row.
        """
        if start >= stop:
            return 0
        segs = list(self._segments)
        k = bisect_right(segs, start, key=_first_of) - 1
        if k < 0:
            raise ValueError(f"row {start} is no longer cached")
        total = 0
        o = start
        while o < stop:
            seg = segs[k]
            ends = seg.ends
            j = o - seg.first
            last = min(len(ends), stop - seg.first)
            total += ends[last - 1] - (ends[j - 1] if j else 0)
            o = seg.first + last
            k += 1
        return total

    def batch(self, start: int, stop: int) -> tuple[list[bytes], list[int]]:
        """Copies of the lines of ordinals ``[start, stop)`` and their steps, for the
        writer's flush, which calls it WITHOUT the store's lock, on its own thread, while
        rows are appended (and segments evicted) on others. ``start`` must not be evicted
        nor be evicted meanwhile, and every ordinal below ``stop`` must be committed (below
        ``next_ordinal`` when the call begins). Safe under the GIL because:

        - ``list(self._segments)`` copies the deque in one C call (no Python code runs
          during it, so no other thread changes it meanwhile): every segment holding a row
          of the range is in the copy (eviction only drops segments wholly below
          ``start``; the segment an interrupt left empty holds no committed row);
        - a segment's ``first`` never changes; its ``ends`` and ``steps`` only grow, and
          their entries of committed rows never change (an interrupted append removes
          only its own, uncommitted, entry); ``step0`` changes only while the segment
          holds no committed row;
        - ``data`` is read once per segment and sliced in one C call: closing a segment
          (``trim``) replaces a ``bytearray`` by a copy of its used bytes or shrinks a
          mapping in place above them, both holding every committed line; appends write
          only above them; no ``memoryview`` is held across a call that releases the GIL.

        Raises:
            ValueError: ``start`` is below the oldest cached row (a bug: eviction keeps
                every row not on disk).
        """
        lines: list[bytes] = []
        steps: list[int] = []
        if start >= stop:
            return lines, steps
        add = lines.append
        segs = list(self._segments)
        k = bisect_right(segs, start, key=_first_of) - 1
        if k < 0:  # a row not on disk was evicted: never (evict's rule); say so, loudly
            raise ValueError(f"row {start} is no longer cached")
        o = start
        while o < stop:
            seg = segs[k]
            first = seg.first
            ends = seg.ends
            j = o - first
            last = min(len(ends), stop - first)
            a = ends[j - 1] if j else 0
            data = seg.data
            offs = ends[j:last]
            # one slice a line, in a plain loop (map(slice, ...) costs a call a line more)
            if isinstance(data, bytearray):  # its slices are bytearrays: one bytes copy
                chunk = bytes(data[a : offs[-1]])
                prev = 0
                for e in offs:
                    e -= a
                    add(chunk[prev:e])
                    prev = e
            else:  # a mapping's slices are bytes
                prev = a
                for e in offs:
                    add(data[prev:e])
                    prev = e
            steps += seg.step_seq()[j:last]
            o = first + last
            k += 1
        return lines, steps

    def ordinal_of_step(self, step: int) -> int:
        """For a sorted cache: the ordinal of the first cached row with ``step`` or later."""
        for seg in self._segments:
            ss = seg.step_seq()
            if ss and ss[-1] >= step:
                return seg.first + bisect_left(ss, step)
        return self.next_ordinal

    def ordinals_in(self, lo: int, hi: int) -> list[int]:
        """For any cache: the ordinals whose step lies in ``[lo, hi)`` (a full walk)."""
        out: list[int] = []
        for seg in self._segments:
            first = seg.first
            if seg.steps is None:  # consecutive steps: the ordinals are one slice
                s0 = seg.step0
                out.extend(range(first + max(lo, s0) - s0, first + min(hi, s0 + len(seg)) - s0))
                continue
            for i, s in enumerate(seg.steps):
                if lo <= s < hi:
                    out.append(first + i)
        return out


def decode_lines(lines: list[bytes]) -> list[dict[str, Any]]:
    """Decode many encoded rows at once (one orjson call); NaN/Infinity rows per line."""
    if not lines:
        return []
    if _loads is not None:
        try:
            rows: list[dict[str, Any]] = _loads(b"[" + b",".join(lines) + b"]")
            return rows
        except _JSONDecodeError:
            pass
    return [decode_line(x) for x in lines]


_FLAT = frozenset((float, int, str, bool, type(None)))


class DecodedTail:
    """Decoded copies of the newest cached rows, so a repeated ``history(n)`` only decodes
    the rows committed since the previous query.

    Holds at most ``capacity`` rows (ordinals ``[first, first + len(rows))``); entries of
    rows holding lists or dicts are None (decoded afresh each time, so a caller can never
    mutate a shared nested value). Ordinals never change meaning, so entries stay valid
    across evictions. Not thread-safe: the store serialises access.
    """

    __slots__ = ("capacity", "first", "rows")

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self.first = 0
        self.rows: list[dict[str, Any] | None] = []

    def get(self, cache: RowCache, start: int, stop: int) -> list[dict[str, Any]] | None:
        """Shallow-safe copies of rows ``[start, stop)``; None when the window is too big.

        ``cache`` must still hold every row not already decoded here.
        """
        if stop - start > self.capacity:
            return None
        rows = self.rows
        first = self.first
        end = first + len(rows)
        if start < first or start > end:  # disjoint or older: start afresh
            rows = self.rows = []
            first = self.first = start
            end = start
        if stop > end:
            for d in decode_lines(cache.lines(end, stop)):
                if any(type(v) not in _FLAT for v in d.values()):
                    rows.append(None)
                else:
                    rows.append(d)
        over = len(rows) - self.capacity
        if over > 0:
            del rows[:over]
            first = self.first = first + over
        a = start - first
        # (a loop, and each comprehension its own name: mypyc, which compiles this module
        # in an ET_COMPILE=1 build, types a comprehension's name per function)
        out: list[Any] = []
        for row in rows[a : a + stop - start]:
            out.append(row.copy() if row is not None else None)
        if None in out:
            fresh = decode_lines(
                [cache.lines(start + i, start + i + 1)[0] for i, o in enumerate(out) if o is None]
            )
            it = iter(fresh)
            out = [got if got is not None else next(it) for got in out]
        return out  # no None left in it
