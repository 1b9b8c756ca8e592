"""Span files -> Chrome Trace Event JSON (Perfetto, chrome://tracing).

``write_trace(run, out)`` streams: each span file (``spans[.S][.rankN].jsonl``) is read line
by line into a temporary SQLite spool, sorted there by (track, start, end desc), and the
events are written one at a time to a temporary file beside the destination, which then
atomically replaces it. Memory depends on the largest record, the stream/thread metadata and
the peak number of overlapping spans, not on the number of spans.

Layout of the output (object form, ``ts``/``dur`` in µs since the epoch)::

    {"traceEvents": [
       {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "rank 3 (host-a) · data"}},
       {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "MainThread (tid 4242)"}},
       {"name": "attention", "cat": "data", "ph": "X", "ts": 1.7e15, "dur": 18400.0,
        "pid": 1, "tid": 1, "args": {"_step": 42, "path": "forward/attention", ...}}, ...],
     "displayTimeUnit": "ms"}

Each span file is one process, each (OS pid, thread, asyncio task) a track, named as the
records' ``track`` says (:func:`~expr_tracker.history.spanfiles.track_name`:
``MainThread (tid 4242)``, ``MainThread (tid 4242) · Task-3``). Spans that overlap without
nesting on one track (spans ended out of order) are put on separate lanes (extra tracks
named ``<track> · lane N``) so that nesting stays drawable; lanes are allocated in O(n log n) and an
outermost span never nests inside an unrelated one. Attributes, plugin measurements, the
step and the error go to ``args``; NaN/±inf become the strings "NaN"/"Infinity"/"-Infinity".

Finding the span files and parsing the selections is ``expr_tracker.history.spanfiles`` (its names are
re-exported here); this module is the converter: scan into the spool, lanes, events, writing.
"""

from __future__ import annotations

import gzip
import heapq
import logging
import math
import os
import sqlite3
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from expr_tracker.history.codec import decode_line, is_step
from expr_tracker.history.spanfiles import (  # re-exported: the documented import path
    SpanFile,
    find_span_files,
    is_empty_range,
    parse_range,
    rank_set,
    read_spans,
    span_files,
    track_name,
)
from expr_tracker.history.untrusted import open_regular
from expr_tracker.history.values import json_safe

log = logging.getLogger("expr_tracker")

__all__ = [
    "SpanFile",
    "build_trace",
    "find_span_files",
    "iter_trace",
    "parse_range",
    "rank_set",
    "read_spans",
    "span_files",
    "track_name",
    "write_trace",
]

_BATCH = 20_000
_loads = orjson.loads
_dumps = orjson.dumps


@dataclass
class _Stats:
    spans: int = 0
    skipped: int = 0
    events: int = 0
    tracks: int = 0
    unreadable: dict[str, str] = field(default_factory=dict)
    clock_offsets: dict[str, float] = field(default_factory=dict)  # host -> seconds added
    aligned_at: int | None = None  # the first step every host recorded


#: distinct steps per span file remembered for the clock alignment (the first shared step
#: is among the first few in any real run)
_ALIGN_STEPS = 1000


def _dumps_wide(event: dict[str, Any]) -> bytes | None:
    """``event`` encoded by the standard library, for what orjson refuses: an int beyond
    64 bits in a span's attributes (the spans file holds it exactly; the trace keeps its
    digits too). None when that fails as well (nesting too deep)."""
    import json

    try:
        return json.dumps(
            event, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode()
    except (ValueError, TypeError, RecursionError):
        return None


def _scan(
    files: list[SpanFile],
    conn: sqlite3.Connection,
    step_range: tuple[Any, Any] | None,
    time_range: tuple[Any, Any] | None,
    tracks: dict[tuple[Any, ...], list[Any]],
    stats: _Stats,
    root: str | os.PathLike[str] | None = None,
    firsts: list[dict[int, float]] | None = None,
) -> None:
    slo, shi = step_range if step_range else (None, None)
    tlo, thi = time_range if time_range else (None, None)
    timed = time_range is not None
    insert = "INSERT INTO s VALUES (?,?,?,?,?,?,?)"
    batch: list[tuple[Any, ...]] = []
    for fi, f in enumerate(files):
        cat = f.stream or "main"
        first: dict[int, float] = {}
        if firsts is not None:
            firsts.append(first)
        try:
            fd = open_regular(f.path, root=root)
        except OSError as exc:  # permissions, a FIFO in its place: the other files still count
            why = getattr(exc, "reason", None) or (exc.strerror or type(exc).__name__).lower()
            stats.unreadable[str(f.path)] = why
            log.warning("expr_tracker: et trace: %s cannot be read (%s); left out", f.path, why)
            continue
        with open(fd, "rb") as fh:
            for line in fh:
                nonfinite = False
                try:
                    r = _loads(line)
                except orjson.JSONDecodeError:
                    if not line.strip():
                        continue
                    try:  # NaN / Infinity tokens, a torn last line, a hostile line
                        r = decode_line(line)
                        nonfinite = True
                    except ValueError:
                        stats.skipped += 1
                        continue
                if type(r) is not dict:
                    stats.skipped += 1
                    continue
                start = r.get("start")
                dur = r.get("dur_ms")
                name = r.get("name")
                if type(name) is not str or type(start) not in (float, int):
                    stats.skipped += 1
                    continue
                if type(dur) not in (float, int):
                    stats.skipped += 1
                    continue
                if not (math.isfinite(start) and math.isfinite(dur)) or dur < 0:
                    stats.skipped += 1
                    continue
                step = r.get("_step")
                stepped = is_step(step)  # -4 or 2**64 is no step, as to et query's spans view
                if step_range is not None:
                    if not stepped:
                        continue
                    if (slo is not None and step < slo) or (shi is not None and step >= shi):
                        continue
                if stepped and (step in first or len(first) < _ALIGN_STEPS):
                    if start < first.get(step, math.inf):
                        first[step] = start
                end = start + dur / 1e3
                if timed:
                    if dur <= 0:
                        continue
                    if (tlo is not None and end <= tlo) or (thi is not None and start >= thi):
                        continue
                pid = r.get("pid")
                tid = r.get("tid")
                task = r.get("task")
                if type(task) is not str:
                    task = None
                key = (fi, pid, tid, task)
                info = tracks.get(key)
                if info is None:
                    info = tracks[key] = [len(tracks), track_name(r.get("thread"), tid, task)]
                    f.pids.add(pid)
                if f.host is None and r.get("host"):
                    f.host = str(r["host"])
                args: dict[str, Any] = {"_step": step, "path": name}
                a = r.get("args")
                if type(a) is dict:
                    for k, v in a.items():
                        args[k if k not in args else "args." + k] = v
                m = r.get("metrics")
                if type(m) is dict:
                    for k, v in m.items():
                        args[k if k not in args else "metrics." + k] = v
                err = r.get("error")
                if err:
                    args["error"] = err
                if task:
                    args["task"] = task
                if nonfinite:
                    args = json_safe(args, "string")
                leaf = name.rsplit("/", 1)[-1]
                ts = start * 1e6
                event = {
                    "name": leaf,
                    "cat": cat,
                    "ph": "X",
                    "dur": round(dur * 1e3, 3),
                    "args": args,
                }
                try:
                    body = _dumps(event, option=orjson.OPT_NON_STR_KEYS)
                except (orjson.JSONEncodeError, RecursionError):
                    body = _dumps_wide(event)
                    if body is None:
                        # args nested too deeply for the encoders (orjson decodes 1,024
                        # levels and encodes 254): one bad line, never a crash
                        stats.skipped += 1
                        continue
                depth = r.get("depth")
                batch.append(
                    (
                        info[0],
                        ts,
                        ts + dur * 1e3,
                        depth if type(depth) is int else 0,
                        _key(r.get("id")),
                        _key(r.get("parent")),
                        body,
                    )
                )
                stats.spans += 1
                if len(batch) >= _BATCH:
                    conn.executemany(insert, batch)
                    batch.clear()
    if batch:
        conn.executemany(insert, batch)


def _key(v: Any) -> Any:
    if v is None or type(v) in (int, str):
        return v
    return str(v)


def _events(
    files: list[SpanFile],
    step_range: tuple[Any, Any] | None,
    time_range: tuple[Any, Any] | None,
    temp_dir: str | os.PathLike[str] | None,
    stats: _Stats,
    root: str | os.PathLike[str] | None = None,
    align_clocks: bool = True,
) -> Iterator[bytes]:
    """Yield the encoded events (metadata first, then one complete event per span)."""
    if temp_dir is not None and not Path(temp_dir).is_dir():
        raise FileNotFoundError(f"temp_dir {str(temp_dir)!r} is not an existing directory")
    empty = is_empty_range(step_range) or is_empty_range(time_range)
    fd, spool = tempfile.mkstemp(prefix="et-trace-", suffix=".sqlite", dir=temp_dir)
    os.close(fd)
    # check_same_thread=False: a consumer of iter_trace (an HTTP server) may pull the events
    # from one worker thread after another (never two at once: a generator runs in one)
    conn = sqlite3.connect(spool, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode=OFF")
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("PRAGMA cache_size=-32768")  # 32 MiB, per connection
        conn.execute(
            "CREATE TABLE s (track INTEGER, ts REAL, te REAL, depth INTEGER, id, parent, body BLOB)"
        )
        tracks: dict[tuple[Any, ...], list[Any]] = {}
        firsts: list[dict[int, float]] = []
        if not empty:
            conn.execute("BEGIN")
            _scan(files, conn, step_range, time_range, tracks, stats, root, firsts)
            conn.execute("COMMIT")
        ranked = any(f.rank is not None for f in files)
        used = sorted({k[0] for k in tracks})
        offsets = _clock_offsets(files, used, firsts, stats) if align_clocks else {}
        for fi in used:
            f = files[fi]
            yield _dumps(
                {
                    "ph": "M",
                    "name": "process_name",
                    "pid": fi + 1,
                    "args": {"name": f.label(ranked)},
                }
            )
            yield _dumps(
                {"ph": "M", "name": "process_sort_index", "pid": fi + 1, "args": {"sort_index": fi}}
            )
            if stats.aligned_at is not None:
                off = offsets.get(fi, 0.0)
                yield _dumps(
                    {
                        "ph": "M",
                        "name": "process_labels",
                        "pid": fi + 1,
                        "args": {
                            "labels": f"clock {off * 1e3:+.3f} ms (hosts aligned at step "
                            f"{stats.aligned_at})"
                        },
                    }
                )
        by_index = {info[0]: (key, info[1]) for key, info in tracks.items()}
        cur = conn.execute(
            "SELECT track, ts, te, id, parent, body FROM s ORDER BY track, ts, te DESC, depth"
        )
        shift = {fi: off * 1e6 for fi, off in offsets.items()}
        yield from _assign_lanes(cur, files, by_index, stats, shift)
    finally:
        conn.close()
        for suffix in ("", "-journal", "-wal", "-shm"):
            try:
                os.unlink(spool + suffix)
            except FileNotFoundError:
                pass


def _assign_lanes(
    rows: Iterable[tuple[Any, ...]],
    files: list[SpanFile],
    by_index: dict[int, tuple[tuple[Any, ...], str]],
    stats: _Stats,
    shift: dict[int, float] | None = None,
) -> Iterator[bytes]:
    """Place each span of a track on a lane where it nests; yield events with pid/tid.

    Rows arrive sorted by (track, start, end desc). A span goes on its parent's lane when
    the parent is the innermost open span there; otherwise (an outermost span, or one
    overlapping an open sibling) on the lowest free lane. O(n log n) with a heap of busy
    lanes keyed by the end of their bottom span.
    """
    track = None
    lanes: list[list[tuple[float, Any]]] = []
    busy: list[tuple[float, int]] = []
    free: list[int] = []
    open_ids: dict[Any, int] = {}
    lane_tid: dict[int, int] = {}
    pid = 0
    next_tid = 0
    add = 0.0
    shift = shift or {}
    for t, ts, te, sid, parent, body in rows:
        if t != track:
            track = t
            lanes, busy, free, open_ids, lane_tid = [], [], [], {}, {}
            key, track_label = by_index[t]
            fi = key[0]
            pid = fi + 1
            add = shift.get(fi, 0.0)
        lane = -1
        if parent is not None:
            pl = open_ids.get(parent)
            if pl is not None:
                st = lanes[pl]
                while len(st) > 1 and st[-1][0] <= ts and st[-1][0] < te:
                    open_ids.pop(st.pop()[1], None)
                top = st[-1]
                if top[1] == parent and top[0] >= te:
                    lane = pl
                    st.append((te, sid))
                    if sid is not None:
                        open_ids[sid] = pl
        if lane < 0:
            while busy and busy[0][0] <= ts:
                _, fl = heapq.heappop(busy)
                for _, oid in lanes[fl]:
                    if open_ids.get(oid) == fl:
                        del open_ids[oid]
                lanes[fl] = []
                heapq.heappush(free, fl)
            if free:
                lane = heapq.heappop(free)
            else:
                lane = len(lanes)
                lanes.append([])
            lanes[lane] = [(te, sid)]
            if sid is not None:
                open_ids[sid] = lane
            heapq.heappush(busy, (te, lane))
        tid = lane_tid.get(lane)
        if tid is None:
            next_tid += 1
            tid = lane_tid[lane] = next_tid
            stats.tracks += 1
            name = track_label  # the records' `track`: one name in files and viewer
            if lane:
                name += f" · lane {lane + 1}"
            yield _dumps(
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}
            )
            yield _dumps(
                {
                    "ph": "M",
                    "name": "thread_sort_index",
                    "pid": pid,
                    "tid": tid,
                    "args": {"sort_index": tid},
                }
            )
        stats.events += 1
        stamp = repr(round(ts + add, 3)).encode()
        yield body[:-1] + b',"ts":%s,"pid":%d,"tid":%d}' % (stamp, pid, tid)


def _clock_offsets(
    files: list[SpanFile], used: list[int], firsts: list[dict[int, float]], stats: _Stats
) -> dict[int, float]:
    """Seconds to add to each span file's times so that every host's clock agrees with the
    first file's host at the first step every host recorded (docs/streams.md "Straggler
    ranks"): per host, the earliest span start at that step. Files of one host share its
    clock and keep their real differences (a straggler's late start stays visible); with a
    single host nothing moves. Fills ``stats.clock_offsets`` and ``stats.aligned_at``."""
    hosts: dict[str, list[int]] = {}
    for fi in used:
        hosts.setdefault(files[fi].host or "", []).append(fi)
    if len(hosts) < 2:
        return {}
    steps_of = {}
    for h, fis in hosts.items():
        steps_of[h] = set().union(*(firsts[fi].keys() for fi in fis if fi < len(firsts)))
    shared = set.intersection(*steps_of.values())
    if not shared:
        return {}
    at = min(shared)

    def start(h: str) -> float:
        return min(firsts[fi][at] for fi in hosts[h] if fi < len(firsts) and at in firsts[fi])

    ref = start(files[used[0]].host or "")
    offsets: dict[int, float] = {}
    for h, fis in hosts.items():
        off = ref - start(h)
        stats.clock_offsets[h] = off
        for fi in fis:
            offsets[fi] = off
    stats.aligned_at = at
    return offsets


def _prepare(
    run: str | os.PathLike[str],
    streams: Any,
    step_range: Any,
    time_range: Any,
    ranks: Any = None,
) -> tuple[list[SpanFile], Any, Any]:
    files = find_span_files(run, streams, ranks)
    return files, parse_range(step_range, int), parse_range(time_range, float)


def build_trace(
    run: str | os.PathLike[str],
    *,
    streams: Any = None,
    step_range: Any = None,
    time_range: Any = None,
    temp_dir: str | os.PathLike[str] | None = None,
    ranks: Any = None,
    align_clocks: bool = True,
) -> dict[str, Any]:
    """The Chrome Trace of a run as an in-memory dict (use :func:`write_trace` for large runs).

    - ``run``: a run directory or one span file.
    - ``streams``: None/``"*"`` (all), ``"a,b"`` or a list; ``"main"`` is the default stream.
    - ``ranks``: None (all), a rank, ``"0,2"`` or a list of ranks.
    - ``step_range``: ``(a, b)`` or ``"a:b"``, end-exclusive, either bound optional.
    - ``time_range``: ``(a, b)`` or ``"a:b"`` in epoch seconds: spans overlapping the
      half-open interval, not clipped; zero-duration spans are then excluded. An empty or
      reversed range selects nothing.
    - ``temp_dir``: an existing directory for the SQLite spool.
    - ``align_clocks``: with span files from several hosts, shift each host's times so the
      hosts agree at the first step they all recorded (its earliest span start); files of
      one host keep their own clock. Each process then carries a ``process_labels`` event
      saying its shift (docs/streams.md "Straggler ranks").

    Raises ``FileNotFoundError`` (no run, no span file, missing temp_dir) and ``ValueError``
    (a malformed range, a stream with no span file).
    """
    files, sr, tr = _prepare(run, streams, step_range, time_range, ranks)
    stats = _Stats()
    events = [_loads(e) for e in _events(files, sr, tr, temp_dir, stats, None, align_clocks)]
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def iter_trace(
    run: str | os.PathLike[str],
    *,
    streams: Any = None,
    step_range: Any = None,
    time_range: Any = None,
    temp_dir: str | os.PathLike[str] | None = None,
    ranks: Any = None,
    root: str | os.PathLike[str] | None = None,
    chunk_bytes: int = 1 << 16,
    align_clocks: bool = True,
) -> Iterator[bytes]:
    """The Chrome Trace of ``run`` as the bytes :func:`write_trace` writes, in chunks of
    about ``chunk_bytes``, made while they are consumed (an HTTP response streams them;
    memory as :func:`write_trace`'s, not the trace's size).

    Takes the filters of :func:`build_trace`; ``root``: open only regular span files lying
    inside this folder (:func:`expr_tracker.history.untrusted.open_regular`; a file swapped
    for a FIFO or a link out of it raises its ``UnsafeFileError``). The selection is checked
    before this returns (``FileNotFoundError``, ``ValueError`` as :func:`build_trace`); the
    span files are read when the first chunk is asked for (errors reading them are raised
    there). Closing the iterator early removes the spool.
    """
    files, sr, tr = _prepare(run, streams, step_range, time_range, ranks)

    def chunks() -> Iterator[bytes]:
        buf = [b'{"traceEvents":[']
        size = 0
        sep = b"\n"
        for ev in _events(files, sr, tr, temp_dir, _Stats(), root, align_clocks):
            buf.append(sep)
            buf.append(ev)
            sep = b",\n"
            size += len(ev) + 2
            if size >= chunk_bytes:
                yield b"".join(buf)
                buf.clear()
                size = 0
        buf.append(b'\n],"displayTimeUnit":"ms"}\n')
        yield b"".join(buf)

    return chunks()


def _default_mode(dest: Path) -> int:
    """The mode a plain ``open(dest, "w")`` would give: an existing file keeps its own,
    a new one gets 0666 less the umask."""
    try:
        return dest.stat().st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_trace(
    run: str | os.PathLike[str],
    out: str | os.PathLike[str] | None = None,
    *,
    streams: Any = None,
    step_range: Any = None,
    time_range: Any = None,
    temp_dir: str | os.PathLike[str] | None = None,
    compresslevel: int = 6,
    _write_hook: Callable[[int], None] | None = None,
    ranks: Any = None,
    align_clocks: bool = True,
) -> dict[str, Any]:
    """Write the Chrome Trace of ``run`` to ``out`` (default ``<run dir>/trace.json``).

    Takes the filters of :func:`build_trace`. A name ending in ``.gz`` is gzip-compressed.
    The file is written beside the destination under a temporary name and atomically
    replaces it; on any failure the temporary file and spool are removed and an existing
    destination is left as it was.

    Returns ``{"path", "spans" (selected), "events" (complete events written), "tracks"
    (thread lanes), "skipped" (unreadable lines), "files" (span files read), "unreadable"
    (span file -> why it could not be read: left out, with one warning each), "clock_offsets"
    (host -> seconds added to its times; empty when one host or not aligned), "aligned_at"
    (the step the hosts were aligned at, or None)}``.
    """
    files, sr, tr = _prepare(run, streams, step_range, time_range, ranks)
    if out is None:
        base = Path(run)
        out = (base if base.is_dir() else base.parent) / "trace.json"
    dest = Path(out)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent or ".")
    stats = _Stats()
    try:
        with open(fd, "wb", buffering=1 << 20) as raw:
            fh: Any = (
                gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=compresslevel, mtime=0)
                if dest.name.endswith(".gz")
                else raw
            )
            write = fh.write
            write(b'{"traceEvents":[')
            sep = b"\n"
            n = 0
            for ev in _events(files, sr, tr, temp_dir, stats, None, align_clocks):
                write(sep)
                write(ev)
                sep = b",\n"
                n += 1
                if _write_hook is not None:
                    _write_hook(n)
            write(b'\n],"displayTimeUnit":"ms"}\n')
            if fh is not raw:
                fh.close()
            raw.flush()
            os.fsync(raw.fileno())
        os.chmod(tmp, _default_mode(dest))  # mkstemp makes 0600; a trace is meant to be shared
        os.replace(tmp, dest)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return {
        "path": str(dest),
        "spans": stats.spans,
        "events": stats.events,
        "tracks": stats.tracks,
        "skipped": stats.skipped,
        "files": [str(f.path) for f in files if str(f.path) not in stats.unreadable],
        "unreadable": dict(stats.unreadable),
        "clock_offsets": dict(stats.clock_offsets),
        "aligned_at": stats.aligned_at,
    }
