"""The per-producer columnar cache: Parquet parts covering a JSONL file's complete lines.

:func:`refresh` makes the cache of one source (``metrics*.jsonl`` or ``spans*.jsonl``) cover
every complete line now in it and returns a :class:`CachedSource` listing the Parquet parts
(schemas: :mod:`expr_tracker.query.scan`). The JSONL stays the truth; the cache is a
disposable index of it.

Location (the first that can be written):

1. with ``cache_dir=``: ``<cache_dir>/<digest>/``; otherwise ``<run_dir>/.et-cache/<source
   file name>/`` (a hidden folder: run discovery, ``et runs`` and resume never look in it);
2. ``$XDG_CACHE_HOME/expr_tracker/query/<digest>/`` (default ``~/.cache``) when the run
   directory cannot be written (a read-only mount, someone else's run) — unless the cache
   already there is trusted (see below) and covers every complete line: then it is used
   as it is, read-only, without the lock (the same for a read-only ``cache_dir=``);
3. a temporary directory of this process (``<tmp>/et-query-*/<digest>/``, removed at exit),
   with one warning, when nothing else can be written: queries still answer, the cache just
   does not outlive the process.

``<digest>`` is the SHA-256 (32 hex digits) of the source's absolute, resolved path.

Files of one source's cache: ``manifest.json`` (what is covered), ``lock`` (``flock``),
``part-<first line>-<random>.parquet`` (never reused names), ``.tmp-*`` while written.

What the manifest records, and when it is trusted: the source's absolute path, device and
inode, ``covered`` (bytes of the source covered: always the end of a complete line; a torn
last line is never covered, it is picked up once its newline is written), ``lines``
(complete lines covered, numbered 0.. in the ``line`` column) and a fingerprint of the
covered prefix (SHA-256 of its first and last 4 KiB and of eight 256-byte samples at fixed
fractions of it). A refresh rebuilds the cache from scratch when the manifest is missing,
of another version or unreadable, a part is missing, the source was replaced (device or
inode changed), truncated below ``covered``, or its covered bytes no longer match the
fingerprint (a resumed run whose repair rewrote covered bytes, a user edit). An edit that
keeps size, inode and every fingerprinted byte is not detected (nothing short of re-reading
the whole file would be). Otherwise only the bytes appended since the last refresh are read,
into one new part (a row group per block of at most 4 MiB of lines, so a refresh's memory is
bounded by the block, not by the file).

Compaction: when a source has more than 16 parts (a live run queried every second adds one
per query), the trailing parts of fewer than 1,000,000 rows each are merged into one,
streamed row group by row group.

Concurrency: a refresh holds an exclusive ``flock`` on ``lock`` for its whole duration, so two
processes refreshing one source at once serialize and both end with the same, correct cache.
Parts and the manifest are written to temporary names and renamed into place. A part
replaced by compaction or a rebuild is not deleted at once: it is listed in the manifest's
``garbage`` and removed by a later refresh once it was replaced at least 10 minutes ago, so
a query (DuckDB) still reading the previous manifest's parts never sees one vanish (a query
running longer than that across a compaction could). Leftover ``.tmp-*`` files of a refresh
that died are removed by the next one; parts no manifest lists, after 10 minutes. ``flock``
is advisory and local: on a network file system without working ``flock``, two hosts
refreshing one run's cache at the same moment are not serialized (point ``cache_dir=`` at a
local folder there).

Merged steps (metrics): ``CachedSource.merged`` is True while the ``_step`` of the lines that
gave rows strictly increase (checked per block); when they do not, the parts' ``step`` per
line are read back once per refresh with new lines to tell a patch line (the same step in
two lines: ``merged`` False for good) from steps merely out of order.

Size and speed (this machine, 2 shared cores): 100,000 lines of 5 random float metrics
(17.7 MB of JSONL) give ~3.6 MB of parts; a first build decodes ~160,000-350,000 such lines
a second once pyarrow is warm (a process's first refresh also pays pyarrow's one-time
import of pandas, ~0.5-0.9 s); a refresh with nothing new takes ~0.5 ms; the peak RSS of a
refresh stays ~215 MiB for a 1,000,000-line file as for a 100,000-line one.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import secrets
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from expr_tracker.history.paths import QUERY_CACHE_DIR
from expr_tracker.query import scan

log = logging.getLogger("expr_tracker")

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock, one refresher at a time
    fcntl = None  # type: ignore[assignment]

__all__ = ["CachedSource", "cache_location", "refresh"]

#: manifest format version; another version is rebuilt (2: no statistics on `value`)
VERSION = 2
#: the default cache folder inside a run directory
CACHE_DIR_NAME = QUERY_CACHE_DIR
MANIFEST = "manifest.json"
LOCK = "lock"
#: bytes of lines decoded at once (one row group per block)
BLOCK_BYTES = 4 << 20
#: more parts than this trigger compaction
MAX_PARTS = 16
#: parts with fewer rows than this are merged by compaction
SMALL_PART_ROWS = 1_000_000
#: a replaced part is deleted by a refresh at least this long after it was replaced
GRACE_S = 600.0

_KINDS = ("metrics", "spans")
_temp_root: Path | None = None
_warned_temp = False


@dataclass(frozen=True)
class CachedSource:
    """What a refresh covers. ``parts``: Parquet files (absolute paths) that together hold
    every complete line of ``source[:covered]``; ``covered`` in bytes; ``rows`` in the parts;
    ``merged`` (metrics): False when some ``_step`` may occur in more than one line (patch
    lines of a long step: readers then keep, per (step, metric), the value of the largest
    ``line``); always True for spans. ``lines``: complete lines covered (0-based ``line``
    numbers below it); ``cache_dir``: where the parts live."""

    source: Path
    kind: str
    parts: tuple[Path, ...]
    covered: int
    rows: int
    merged: bool
    lines: int = 0
    cache_dir: Path | None = None


def _digest(source: Path) -> str:
    return hashlib.sha256(os.fsencode(str(source))).hexdigest()[:32]


def _xdg_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "expr_tracker" / "query"


def cache_location(
    source: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None
) -> Path:
    """The preferred cache folder of ``source`` (it may not be writable: :func:`refresh`
    then falls back as the module docstring says)."""
    src = Path(source).absolute()
    if cache_dir is not None:
        return Path(cache_dir).absolute() / _digest(src.resolve())
    return src.parent / CACHE_DIR_NAME / src.name


def _usable(d: Path) -> int | None:
    """Create ``d`` and open its lock file; the lock descriptor, or None when ``d`` cannot
    be written."""
    try:
        d.mkdir(parents=True, exist_ok=True)
        if not os.access(d, os.W_OK | os.X_OK):
            return None
        return os.open(d / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return None


def _temp_dir(tried: str) -> Path:
    """This process's temporary cache root (warned once); ``tried``: where the cache could
    not be written, for the warning."""
    global _temp_root, _warned_temp
    if _temp_root is None:
        import atexit
        import shutil

        _temp_root = Path(tempfile.mkdtemp(prefix="et-query-"))
        atexit.register(shutil.rmtree, _temp_root, True)
    if not _warned_temp:
        _warned_temp = True
        log.warning(
            "expr_tracker: the query cache cannot be written %s; "
            "using a temporary folder for this process (%s): queries work, but the next "
            "process decodes the JSONL again",
            tried,
            _temp_root,
        )
    return _temp_root


def _open_cache(
    src: Path, cache_dir: str | os.PathLike[str] | None, sfd: int, kind: str
) -> tuple[Path, int | None, CachedSource | None]:
    """``(folder, lock descriptor, None)`` of the first writable location, or ``(folder,
    None, current)`` when the preferred folder cannot be written but already holds a cache
    covering every complete line of the source (someone else's run, a read-only mount)."""
    digest = _digest(src.resolve())
    first = cache_location(src, cache_dir)
    candidates = [first]
    if cache_dir is None:
        candidates.append(_xdg_root() / digest)
    for d in candidates:
        fd = _usable(d)
        if fd is not None:
            return d, fd, None
        if d == first:
            current = _current_read_only(src, sfd, kind, d)
            if current is not None:
                return d, None, current
    tried = (
        f"under cache_dir {str(cache_dir)!r}"
        if cache_dir is not None
        else f"beside the runs nor under {_xdg_root()}"
    )
    d = _temp_dir(tried) / digest
    fd = _usable(d)
    if fd is None:  # pragma: no cover - the temp dir we just made is not writable
        raise OSError(errno.EACCES, f"no writable folder for the query cache of {src}")
    return d, fd, None


def _current_read_only(src: Path, sfd: int, kind: str, d: Path) -> CachedSource | None:
    """The cache in ``d`` (not writable here) when it is trusted and nothing but a torn
    tail follows what it covers; else None. Read without the lock: the manifest is replaced
    atomically and replaced parts outlive it by ``GRACE_S``."""
    m = _load_manifest(d)
    if m is None:
        return None
    try:
        st = os.fstat(sfd)
        if not _trusted(m, src, kind, st, sfd, d):
            return None
        tail = st.st_size - m["covered"]
        if tail > (1 << 20) or b"\n" in os.pread(sfd, tail, m["covered"]):
            return None
    except OSError:
        return None
    return _result(src, kind, d, m)


# --------------------------------------------------------------------------- fingerprint

_EDGE = 4096
_SAMPLE = 256
_SAMPLES = 8


def _fingerprint(fd: int, covered: int) -> str:
    h = hashlib.sha256()
    h.update(str(covered).encode())
    h.update(os.pread(fd, min(covered, _EDGE), 0))
    start = max(0, covered - _EDGE)
    h.update(os.pread(fd, covered - start, start))
    if covered > 2 * _EDGE:
        for k in range(1, _SAMPLES + 1):
            off = covered * k // (_SAMPLES + 1)
            h.update(os.pread(fd, min(_SAMPLE, covered - off), off))
    return h.hexdigest()


# --------------------------------------------------------------------------- manifest


def _load_manifest(d: Path) -> dict[str, Any] | None:
    try:
        m = json.loads((d / MANIFEST).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and m.get("version") == VERSION else None


def _write_manifest(d: Path, m: dict[str, Any]) -> None:
    tmp = d / f".tmp-manifest-{os.getpid()}-{secrets.token_hex(4)}.json"
    tmp.write_text(json.dumps(m), "utf-8")
    os.replace(tmp, d / MANIFEST)


def _trusted(
    m: dict[str, Any] | None, src: Path, kind: str, st: os.stat_result, fd: int, d: Path
) -> bool:
    if m is None or m.get("kind") != kind or m.get("source") != str(src):
        return False
    if m.get("dev") != st.st_dev or m.get("ino") != st.st_ino:
        return False
    covered = m.get("covered")
    if not isinstance(covered, int) or covered > st.st_size:
        return False
    if any(not (d / p["file"]).is_file() for p in m.get("parts", [])):
        return False
    try:
        return _fingerprint(fd, covered) == m.get("fingerprint")
    except OSError:
        return False


def _fresh_manifest(src: Path, kind: str, st: os.stat_result) -> dict[str, Any]:
    return {
        "version": VERSION,
        "kind": kind,
        "source": str(src),
        "dev": st.st_dev,
        "ino": st.st_ino,
        "covered": 0,
        "lines": 0,
        "rows": 0,
        "fingerprint": None,
        "max_step": None,
        "monotonic": True,
        "merged": True,
        "parts": [],
        "garbage": [],
    }


# --------------------------------------------------------------------------- reading


def _blocks(fd: int, start: int, end: int):
    """``(offset, chunk)``: complete lines of ``[start, end)`` (``chunk`` ends with a newline;
    ``offset`` is where it ends), a block at a time; the bytes after the last newline are
    not yielded."""
    pos = start
    carry = b""
    while pos < end:
        data = os.pread(fd, min(BLOCK_BYTES, end - pos), pos)
        if not data:
            break
        pos += len(data)
        buf = carry + data if carry else data
        cut = buf.rfind(b"\n")
        if cut < 0:
            carry = buf
            continue
        carry = buf[cut + 1 :]
        yield pos - len(carry), buf[: cut + 1]


def _new_part_name(first_line: int) -> str:
    return f"part-{first_line:012d}-{secrets.token_hex(4)}.parquet"


def _append(fd: int, d: Path, kind: str, m: dict[str, Any], end: int) -> None:
    """Decode the complete lines of ``[m["covered"], end)`` into one new part; update ``m``."""
    import pyarrow.parquet as pq

    writer = None
    tmp = d / f".tmp-{os.getpid()}-{secrets.token_hex(4)}.parquet"
    first = m["lines"]
    rows = 0
    covered = m["covered"]
    lines = m["lines"]
    try:
        for new_covered, chunk in _blocks(fd, covered, end):
            if kind == "metrics":
                table, steps = scan.decode_metrics_block(chunk, lines)
                _track_steps(m, steps)
            else:
                table = scan.decode_spans_block(chunk, lines)
            lines += chunk.count(b"\n")
            covered = new_covered
            if table.num_rows:
                if writer is None:
                    writer = pq.ParquetWriter(tmp, scan.schema(kind), **scan.WRITE_OPTIONS[kind])
                writer.write_table(table)
                rows += table.num_rows
        if writer is not None:
            writer.close()
            writer = None
            name = _new_part_name(first)
            os.replace(tmp, d / name)
            m["parts"].append({"file": name, "rows": rows, "first_line": first, "lines": lines})
    finally:
        if writer is not None:
            writer.close()
        if tmp.exists():
            tmp.unlink()
    m["covered"] = covered
    m["lines"] = lines
    m["rows"] += rows


def _track_steps(m: dict[str, Any], steps: Any) -> None:
    """Keep ``monotonic`` (the steps of the lines with rows strictly increase, none missing)
    and ``max_step`` up to date from ``steps`` (int64 ``pyarrow.Array``)."""
    import pyarrow.compute as pc

    if not m["monotonic"] or len(steps) == 0:
        return
    if steps.null_count:
        m["monotonic"] = False
        return
    mx = m["max_step"]
    if mx is not None and steps[0].as_py() <= mx:
        m["monotonic"] = False
        return
    if len(steps) > 1 and not pc.all(pc.greater(steps[1:], steps[:-1])).as_py():
        m["monotonic"] = False
        return
    m["max_step"] = steps[len(steps) - 1].as_py()


def _exact_merged(d: Path, m: dict[str, Any]) -> bool:
    """True when no ``step`` occurs in two lines of the parts (read back, a row group at a
    time, when the steps were not increasing). The rows of one line are consecutive and
    never split between row groups."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    seen: set[Any] = set()
    for p in m["parts"]:
        f = pq.ParquetFile(d / p["file"])
        for g in range(f.num_row_groups):
            t = f.read_row_group(g, columns=["step", "line"])
            if not t.num_rows:
                continue
            line = t.column("line").combine_chunks()
            starts = pc.not_equal(line.slice(1), line.slice(0, len(line) - 1))
            mask = pa.concat_arrays([pa.array([True]), starts])
            for s in t.column("step").combine_chunks().filter(mask).to_pylist():
                if s in seen:
                    return False
                seen.add(s)
    return True


# --------------------------------------------------------------------------- compaction


def _compact(d: Path, kind: str, m: dict[str, Any], now: float) -> None:
    import pyarrow.parquet as pq

    parts = m["parts"]
    if len(parts) <= MAX_PARTS:
        return
    i = len(parts)
    while i > 0 and parts[i - 1]["rows"] < SMALL_PART_ROWS:
        i -= 1
    run = parts[i:]
    if len(run) < 2:
        return
    tmp = d / f".tmp-{os.getpid()}-{secrets.token_hex(4)}.parquet"
    rows = 0
    try:
        with pq.ParquetWriter(tmp, scan.schema(kind), **scan.WRITE_OPTIONS[kind]) as w:
            for p in run:
                f = pq.ParquetFile(d / p["file"])
                for g in range(f.num_row_groups):
                    t = f.read_row_group(g)
                    rows += t.num_rows
                    w.write_table(t)
        name = _new_part_name(run[0]["first_line"])
        os.replace(tmp, d / name)
    finally:
        if tmp.exists():
            tmp.unlink()
    merged_part = {
        "file": name,
        "rows": rows,
        "first_line": run[0]["first_line"],
        "lines": run[-1]["lines"],
    }
    m["parts"] = parts[:i] + [merged_part]
    m["garbage"].extend({"file": p["file"], "replaced_at": now} for p in run)


def _collect_garbage(d: Path, m: dict[str, Any], now: float) -> None:
    keep = []
    for g in m.get("garbage", []):
        if now - g.get("replaced_at", 0) >= GRACE_S:
            try:
                (d / g["file"]).unlink()
            except FileNotFoundError:
                pass
            except OSError:
                keep.append(g)
        else:
            keep.append(g)
    m["garbage"] = keep
    # leftovers of a refresh that died (we hold the lock: nobody else writes here)
    listed = {p["file"] for p in m["parts"]} | {g["file"] for g in keep}
    for q in d.iterdir():
        n = q.name
        if n.startswith(".tmp-") or (n.startswith("part-") and n not in listed):
            try:
                if now - q.stat().st_mtime >= GRACE_S or n.startswith(".tmp-"):
                    q.unlink()
            except OSError:
                pass


# --------------------------------------------------------------------------- refresh


def refresh(
    source: str | os.PathLike[str],
    kind: str,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    root: str | os.PathLike[str] | None = None,
) -> CachedSource:
    """Make the cache of ``source`` cover every complete line now in it.

    ``kind``: ``"metrics"`` or ``"spans"``. Reads only the bytes appended since the last
    refresh; rebuilds when the cached prefix no longer matches the file (see the module
    docstring). Safe to call while another process appends to ``source`` and while another
    process refreshes the same source. With ``root``, ``source`` is opened only if it is a
    regular file lying inside ``root`` (:func:`expr_tracker.history.untrusted.open_regular`:
    never a FIFO, never a link out of the folder; ``et ui`` passes the folder it serves).

    Raises ``ValueError`` for another ``kind`` or a ``source`` that is not a regular file,
    ``FileNotFoundError`` when ``source`` does not exist, ``ImportError`` (naming ``pip install 'expr-tracker[query]'``) without
    pyarrow.
    """
    if kind not in _KINDS:
        raise ValueError(f"kind={kind!r} is not valid: use 'metrics' or 'spans'")
    _need_pyarrow()
    src = Path(source).absolute()
    if root is not None:
        from expr_tracker.history.untrusted import open_regular

        sfd = open_regular(src, root=root)  # UnsafeFileError: a FIFO, a link out of root
    else:
        sfd = os.open(src, os.O_RDONLY)  # FileNotFoundError names the path
    try:
        if not stat.S_ISREG(os.fstat(sfd).st_mode):
            raise ValueError(f"source {str(src)!r} is not a regular file (a JSONL file is)")
        d, lock_fd, current = _open_cache(src, cache_dir, sfd, kind)
        if current is not None:
            return current
        assert lock_fd is not None
        try:
            if fcntl is not None:
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
            return _refresh_locked(src, sfd, kind, d)
        finally:
            os.close(lock_fd)  # releases the flock
    finally:
        os.close(sfd)


def _refresh_locked(src: Path, sfd: int, kind: str, d: Path) -> CachedSource:
    st = os.fstat(sfd)
    now = time.time()
    m = _load_manifest(d)
    changed = False
    if not _trusted(m, src, kind, st, sfd, d):
        old = m
        m = _fresh_manifest(src, kind, st)
        if old is not None:
            m["garbage"] = list(old.get("garbage", []))
            m["garbage"].extend(
                {"file": p["file"], "replaced_at": now} for p in old.get("parts", [])
            )
        changed = True
    assert m is not None
    end = st.st_size
    if end > m["covered"]:
        before = m["covered"]
        _append(sfd, d, kind, m, end)
        if m["covered"] != before:
            changed = True
            m["fingerprint"] = _fingerprint(sfd, m["covered"])
            if kind == "metrics" and m["merged"] and not m["monotonic"]:
                m["merged"] = _exact_merged(d, m)
    if m["fingerprint"] is None:
        m["fingerprint"] = _fingerprint(sfd, m["covered"])
        changed = True
    if len(m["parts"]) > MAX_PARTS:
        _compact(d, kind, m, now)
        changed = True
    if m["garbage"] or changed:
        _collect_garbage(d, m, now)
    if changed:
        _write_manifest(d, m)
    return _result(src, kind, d, m)


def _result(src: Path, kind: str, d: Path, m: dict[str, Any]) -> CachedSource:
    return CachedSource(
        source=src,
        kind=kind,
        parts=tuple(d / p["file"] for p in m["parts"]),
        covered=m["covered"],
        rows=m["rows"],
        merged=bool(m["merged"]) if kind == "metrics" else True,
        lines=m["lines"],
        cache_dir=d,
    )


def _need_pyarrow() -> None:
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "the query cache needs pyarrow: pip install 'expr-tracker[query]'"
        ) from exc
