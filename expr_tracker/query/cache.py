"""The per-producer columnar cache: Parquet parts covering a JSONL file's complete lines.

:func:`refresh` makes the cache of one source (``metrics*.jsonl`` or ``spans*.jsonl``) cover
every complete line now in it and returns a :class:`CachedSource` listing the Parquet parts
(schemas: :mod:`expr_tracker.query.scan`). The JSONL stays the truth; the cache is a
disposable index of it.

Location (the first that can be used):

1. with ``cache_dir=``: ``<cache_dir>/<digest>/``; otherwise ``<run_dir>/.et-cache/<source
   file name>/`` (a hidden folder: run discovery, ``et runs`` and resume never look in it),
   only when the run directory belongs to this user: a folder this user made in someone
   else's run would be one its owner cannot delete (``rm -rf`` of their own run fails);
2. ``$XDG_CACHE_HOME/expr_tracker/query/<digest>/`` (default ``~/.cache``) when the run
   directory is another user's or cannot be written (a read-only mount) — unless the cache
   already there is this user's, trusted (see below) and covers every complete line: then it
   is used as it is, read-only, without the lock (the same for a read-only ``cache_dir=``);
3. a temporary directory of this process (``<tmp>/et-query-*/<digest>/``, removed at exit),
   with one warning, when nothing else can be written: queries still answer, the cache just
   does not outlive the process.

``<digest>`` is the SHA-256 (32 hex digits) of the source's absolute, resolved path.

Trust (docs/query.md "Security"): a cache folder (``.et-cache`` and the folder of one source
in it, or ``<digest>``) is used only when it is a folder, not a symbolic link, owned by this
user and not writable by group or others; the folders are made ``0755`` whatever the umask.
Anything else (a colleague's cache, a tarball's, a folder others may write into) is never
read nor written: the next location is used. Inside a folder that is used, the manifest is
untrusted input too: every file it names must be named as this cache names its parts
(``part-<12 digits>-<8 hex>.parquet``: no path, no ``..``, no other file) and each part must
be a regular file of this user, of the size written and with Parquet's magic at both ends;
a manifest that is damaged or names anything else is ignored (one warning) and the cache
rebuilt from the JSONL. Files are created, renamed and removed relative to the folder's
descriptor (opened without following links), and only under the cache's own names
(``part-*.parquet`` as above, ``.tmp-[manifest-]<pid>-<8 hex>.parquet|json``): a refresh
never removes anything else, and a link named like a part is removed as a link.

Files of one source's cache: ``manifest.json`` (what is covered), ``lock`` (``flock``),
``part-<first line>-<random>.parquet`` (never reused names), ``.tmp-*`` while written.

Disposable in fact: a part is written, ``fsync``-ed and renamed into place, then the
manifest the same way, then the folder is synced: after a power cut the cache is the old one
or the new one. A part found empty, cut short or not Parquet (a disk that lied, a hand-made
file), or a manifest cut short, is rebuilt from the JSONL on the next refresh with one
warning; a part DuckDB cannot read is reported by the query layer (:func:`invalidate`) and
rebuilt the same way. Each part's SHA-256 is recorded with it: when a read fails without
naming a part (DuckDB's "invalid TType" for a damaged footer), and before ``et export``
reads a run's parts, :func:`damaged` compares them and rebuilds a cache whose part changed
in the middle (which size and magic do not show). A query does not hash the parts it
reads: a part changed in its middle that still decodes gives other numbers to ``et
query`` until it is rebuilt (``et export`` never exports them). When the cache cannot be written (a full disk, a quota), one warning
names the folder and the rows come back decoded in memory (:attr:`CachedSource.memory`).
A cache folder deleted while a refresh writes it (a cleaner) is made again and the refresh
retried (:data:`RETRIES` times, then in memory): only a missing *source* means a run is gone.

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

Written by the run too: :func:`warm` is this refresh for the process writing the source
(its helper, :mod:`expr_tracker.query.warmer`), beside the run only, quiet, None where a
reader would fall back; a finished run's cache so covers its whole file (docs/query.md
"Kept by the run").

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
(17.7 MB of JSONL) give ~3.9 MB of parts (LZ4: :data:`~expr_tracker.query.scan.CACHE_WRITE_OPTIONS`);
decoding a 4 MiB block of such lines takes ~31 ms of CPU with ``pyarrow.json`` (~23 ms of it
the parser), about a third less with polars when installed (:mod:`~expr_tracker.query.scan`),
and writing it ~8-10 ms (its ``metric`` column given to the writer dictionary-encoded:
:func:`~expr_tracker.query.scan.part_schema`); a refresh imports no pandas; a refresh with
nothing new takes ~0.3 ms of CPU (~0.55 ms before pyarrow was looked for once a process
and the path resolved only where needed); the peak RSS of a refresh stays ~215 MiB for a
1,000,000-line file as for a 100,000-line one. :func:`expr_tracker.query.views.connect`
refreshes the runs of a folder in parallel threads once one has new lines (each refresh
holds only its own source's lock).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import math
import os
import re
import secrets
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from expr_tracker._warn import Warner
from expr_tracker.history import untrusted
from expr_tracker.history.paths import QUERY_CACHE_DIR
from expr_tracker.query import scan

log = logging.getLogger("expr_tracker")

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock, one refresher at a time
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "CachedSource",
    "DerivedFolder",
    "cache_location",
    "damaged",
    "derived_folder",
    "fingerprint_of",
    "invalidate",
    "is_part_name",
    "refresh",
    "warm",
]

#: manifest format version; another version is rebuilt (2: no statistics on `value`;
#: 3: each part's size, unreadable lines counted; 4: each part's SHA-256; 5: a line whose
#: ``_step`` is negative is no step, as to ``et.history``)
VERSION = 5
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
#: the largest manifest read (a manifest lists at most MAX_PARTS parts and their garbage)
MAX_MANIFEST_BYTES = 4 << 20
#: the only names a refresh ever creates, renames or removes in a cache folder (besides
#: ``manifest.json`` and ``lock``): its parts and its temporary files
PART_RE = re.compile(r"^part-[0-9]{12}-[0-9a-f]{8}\.parquet$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
TMP_RE = re.compile(r"^\.tmp-(?:manifest-)?[0-9]+-[0-9a-f]{8}\.(?:parquet|json)$")
#: how often a refresh starts again when its cache folder is deleted under it
RETRIES = 3

_KINDS = ("metrics", "spans")
_DIR_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_DIRECTORY", 0)
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
_NEW_FILE = (
    os.O_RDWR  # a part is read back for its SHA-256
    | os.O_CREAT
    | os.O_EXCL
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
_READ_FILE = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
_MAGIC = b"PAR1"
_temp_root: Path | None = None
_warned_temp = False
_warner = Warner(log)


@dataclass(frozen=True)
class CachedSource:
    """What a refresh covers. ``parts``: Parquet files (absolute paths) that together hold
    every complete line of ``source[:covered]``; ``covered`` in bytes; ``rows`` in the parts;
    ``merged`` (metrics): False when some ``_step`` may occur in more than one line (patch
    lines of a long step: readers then keep, per (step, metric), the value of the largest
    ``line``); always True for spans. ``lines``: complete lines covered (0-based ``line``
    numbers below it); ``cache_dir``: where the parts live (None when in memory).

    ``memory``: when no cache folder could be written (a full disk), the same rows as
    Parquet files held in memory (``pyarrow.Buffer``; ``parts`` is then empty): read them
    with ``pyarrow.parquet.ParquetFile(pyarrow.BufferReader(buf))``. ``bad_lines``: complete
    lines that could not be read (not JSON, not an object, nested too deeply, ...; they give
    no row); ``bad_first``: ``(line number, 0-based; reason)`` of the first of them."""

    source: Path
    kind: str
    parts: tuple[Path, ...]
    covered: int
    rows: int
    merged: bool
    lines: int = 0
    cache_dir: Path | None = None
    memory: tuple[Any, ...] = ()
    bad_lines: int = 0
    bad_first: tuple[int, str] | None = None
    fingerprint: str | None = None
    dev: int | None = None
    ino: int | None = None


def is_part_name(name: str) -> bool:
    """True for the file name of a cache part (``part-<12 digits>-<8 hex>.parquet``)."""
    return PART_RE.match(name) is not None


def _digest(source: Path) -> str:
    return hashlib.sha256(os.fsencode(str(source))).hexdigest()[:32]


def _xdg_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "expr_tracker" / "query"


def cache_location(
    source: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None
) -> Path:
    """The preferred cache folder of ``source`` (it may not be usable: :func:`refresh`
    then falls back as the module docstring says)."""
    src = Path(source).absolute()
    if cache_dir is not None:
        return Path(cache_dir).absolute() / _digest(src.resolve())
    return src.parent / CACHE_DIR_NAME / src.name


def fallback_location(source: str | os.PathLike[str]) -> Path:
    """The cache folder of ``source`` under ``$XDG_CACHE_HOME`` (location 2 of the module
    doc), where it is when the run directory could not hold it; it may not exist."""
    return _xdg_root() / _digest(Path(source).absolute().resolve())


def fallback_root() -> Path:
    """The folder holding every source's fallback cache (``$XDG_CACHE_HOME/expr_tracker/
    query``)."""
    return _xdg_root()


# --------------------------------------------------------------------------- folders


def _euid() -> int | None:
    return os.geteuid() if hasattr(os, "geteuid") else None


def _distrust(st: os.stat_result) -> str | None:
    """Why a folder (or file) of the cache cannot be trusted as this user's own: owned by
    another user, or writable by group or others; None when it can."""
    uid = _euid()
    if uid is not None and st.st_uid != uid:
        return f"owned by uid {st.st_uid}, not this user ({uid})"
    if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o022:
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


class _Folder:
    """An open cache folder: ``path`` as named, ``fd`` a descriptor of the very folder that
    was checked (opened without following a symbolic link). Every file of the cache is
    created, renamed and removed relative to ``fd``."""

    __slots__ = ("fd", "path")

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd

    def close(self) -> None:
        os.close(self.fd)

    def gone(self) -> bool:
        """True when the folder was deleted since it was opened."""
        try:
            return os.fstat(self.fd).st_nlink == 0
        except OSError:
            return True


class _Refused(Exception):
    """A cache folder that exists but is not this user's to use (``reason``)."""


def _open_dir(name: str | Path, parent_fd: int | None, create: bool) -> int:
    """Open (and with ``create`` first make, mode 0755 whatever the umask lets through) the
    folder ``name`` (relative to ``parent_fd`` when given) without following a symbolic link,
    and check it is this user's: :class:`_Refused` when not, ``OSError`` when it cannot be
    opened or made."""
    if create:
        try:
            os.mkdir(name, 0o755, dir_fd=parent_fd)
        except FileExistsError:
            pass
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _Refused("a symbolic link or a file, not a folder") from None
        raise
    try:
        why = _distrust(os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    if why is not None:
        os.close(fd)
        raise _Refused(why)
    return fd


def _open_in_run(src: Path, create: bool, sfd: int | None = None) -> _Folder:
    """``<run dir>/.et-cache/<source name>``, only when the run directory is this user's: a
    cache made by a reader in someone else's run would be a folder its owner cannot delete.
    With ``sfd`` (the source as opened), only when the folder opened is the one holding that
    very file: a run directory swapped for a link to another folder after the source was
    opened gets no cache made there."""
    rfd = os.open(src.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        owner = os.fstat(rfd).st_uid
        uid = _euid()
        if uid is not None and owner != uid:
            raise _Refused(f"the run directory belongs to uid {owner}")
        if sfd is not None:
            here = os.stat(src.name, dir_fd=rfd)
            opened = os.fstat(sfd)
            if (here.st_dev, here.st_ino) != (opened.st_dev, opened.st_ino):
                raise _Refused("the run directory is not the one the source was opened in")
        top = _open_dir(CACHE_DIR_NAME, rfd, create)
        try:
            fd = _open_dir(src.name, top, create)
        finally:
            os.close(top)
    finally:
        os.close(rfd)
    return _Folder(src.parent / CACHE_DIR_NAME / src.name, fd)


def _open_under(base: Path, digest: str, create: bool) -> _Folder:
    """``<base>/<digest>`` (``base``: ``cache_dir``, the XDG cache, a temporary folder)."""
    if create:
        base.mkdir(parents=True, exist_ok=True)
    bfd = os.open(base, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fd = _open_dir(digest, bfd, create)
    finally:
        os.close(bfd)
    return _Folder(base / digest, fd)


def _lock(folder: _Folder) -> int | None:
    """Open (create) ``lock`` in ``folder``; None when the folder cannot be written."""
    try:
        fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | _READ_FILE, 0o644, dir_fd=folder.fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
    except OSError:
        os.close(fd)
        return None
    return fd


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


def temp_root() -> Path:
    """This process's temporary cache folder (made on first use, removed at exit), without
    a warning: where a query goes when the usual cache keeps vanishing under it."""
    global _temp_root
    if _temp_root is None:
        import atexit
        import shutil

        _temp_root = Path(tempfile.mkdtemp(prefix="et-query-"))
        atexit.register(shutil.rmtree, _temp_root, True)
    return _temp_root


def _open_cache(
    src: Path, cache_dir: str | os.PathLike[str] | None, sfd: int, kind: str
) -> tuple[_Folder, int | None, CachedSource | None]:
    """``(folder, lock descriptor, None)`` of the first usable location, or ``(folder, None,
    current)`` when the preferred folder is this user's but cannot be written (a read-only
    mount) and already holds a cache covering every complete line of the source. A folder
    that is a symbolic link, owned by another user or writable by group or others is never
    used, nor a run directory of another user (see the module docstring)."""
    digests: list[str] = []

    def digest() -> str:
        # resolved only where a folder is named by it (not beside the runs: ~0.1 ms)
        if not digests:
            digests.append(_digest(src.resolve()))
        return digests[0]

    if cache_dir is not None:
        candidates = [lambda c: _open_under(Path(cache_dir).absolute(), digest(), c)]
    else:
        candidates = [
            lambda c: _open_in_run(src, c, sfd),
            lambda c: _open_under(_xdg_root(), digest(), c),
        ]
    for i, opener in enumerate(candidates):
        try:
            folder = opener(True)
        except (OSError, _Refused):
            if i:
                continue
            try:  # a read-only mount: the folder may exist, unwritable
                folder = opener(False)
            except (OSError, _Refused):
                continue
        fd = _lock(folder)
        if fd is not None:
            return folder, fd, None
        if i == 0:
            current = _current_read_only(src, sfd, kind, folder)
            if current is not None:
                return folder, None, current
        folder.close()
    tried = (
        f"under cache_dir {str(cache_dir)!r}"
        if cache_dir is not None
        else f"beside the runs nor under {_xdg_root()}"
    )
    folder = _open_under(_temp_dir(tried), digest(), True)
    fd = _lock(folder)
    if fd is None:  # pragma: no cover - the temp dir we just made is not writable
        folder.close()
        raise OSError(errno.EACCES, f"no writable folder for the query cache of {src}")
    return folder, fd, None


def _current_read_only(src: Path, sfd: int, kind: str, folder: _Folder) -> CachedSource | None:
    """The cache in ``folder`` (not writable here) when it is trusted and nothing but a torn
    tail follows what it covers; else None. Read without the lock: the manifest is replaced
    atomically and replaced parts outlive it by ``GRACE_S``."""
    m, _problem = _load_manifest(folder)
    if m is None:
        return None
    try:
        st = os.fstat(sfd)
        if _check(m, src, kind, st, sfd, folder) != (True, None):
            return None
        tail = st.st_size - m["covered"]
        if tail > (1 << 20) or b"\n" in os.pread(sfd, tail, m["covered"]):
            return None
    except OSError:
        return None
    return _result(src, kind, folder.path, m)


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


#: the largest count, size, device or inode number a manifest may hold (a file anyone may
#: have written: an int past it, decoded by the standard module, overflows float arithmetic)
_MAX_INT = (1 << 64) - 1


def fingerprint_of(fd: int, covered: int) -> str:
    """The fingerprint the cache records of the first ``covered`` bytes of the source open
    as ``fd`` (the manifest's ``fingerprint``: see the module doc). Raises ``OSError``."""
    return _fingerprint(fd, covered)


def _is_int(v: Any, low: int = 0) -> bool:
    return type(v) is int and low <= v <= _MAX_INT


def _is_time(v: Any) -> bool:
    """A finite time in seconds (not NaN, which is never past a grace time, nor an int no
    float holds)."""
    if type(v) is int:
        return abs(v) <= _MAX_INT
    return type(v) is float and math.isfinite(v)


def _manifest_problem(m: Any) -> str | None:
    """What makes a decoded manifest unusable (None: nothing). Every file it names must be
    a part of this cache's own naming (:data:`PART_RE`): no path, no ``..``, no other file."""
    if not isinstance(m, dict):
        return "not a JSON object"
    for key in ("covered", "lines", "rows", "dev", "ino"):
        if not _is_int(m.get(key)):
            return f"{key!r} is not a count"
    if not isinstance(m.get("source"), str) or m.get("kind") not in _KINDS:
        return "no source or kind"
    if m.get("fingerprint") is not None and not isinstance(m.get("fingerprint"), str):
        return "a bad fingerprint"
    if m.get("max_step") is not None and not _is_int(m.get("max_step"), -_MAX_INT):
        return "a bad max_step"
    if type(m.get("monotonic")) is not bool or type(m.get("merged")) is not bool:
        return "bad flags"
    if not _is_int(m.get("bad_lines")):
        return "a bad count of unreadable lines"
    first = m.get("bad_first")
    if first is not None and not (
        isinstance(first, list)
        and len(first) == 2
        and _is_int(first[0])
        and isinstance(first[1], str)
    ):
        return "a bad first unreadable line"
    parts, garbage = m.get("parts"), m.get("garbage")
    if not isinstance(parts, list) or not isinstance(garbage, list):
        return "no list of parts"
    if len(parts) > 4 * MAX_PARTS or len(garbage) > 4096:
        return "too many parts"
    for p in parts:
        if not isinstance(p, dict) or not isinstance(p.get("file"), str):
            return "a part without a file name"
        if not PART_RE.match(p["file"]):
            return f"the part {p['file']!r}, not a file of its own"
        if not all(_is_int(p.get(k)) for k in ("rows", "first_line", "lines")):
            return f"the part {p['file']!r} without its counts"
        if not _is_int(p.get("bytes"), 1):
            return f"the part {p['file']!r} without its size"
        if not isinstance(p.get("sha256"), str) or not _SHA256_RE.match(p["sha256"]):
            return f"the part {p['file']!r} without its SHA-256"
    for g in garbage:
        if not isinstance(g, dict) or not isinstance(g.get("file"), str):
            return "a replaced part without a file name"
        if not PART_RE.match(g["file"]):
            return f"the replaced part {g['file']!r}, not a file of its own"
        if not _is_time(g.get("replaced_at")):
            return f"the replaced part {g['file']!r} without its time"
    return None


def _load_manifest(folder: _Folder) -> tuple[dict[str, Any] | None, str | None]:
    """``(manifest, None)``; ``(None, None)`` when there is none or it is of another version
    (rebuilt without a word); ``(None, why)`` when it is damaged or names files that are not
    this cache's own (rebuilt, with a warning)."""
    try:
        fd = os.open(MANIFEST, _READ_FILE, dir_fd=folder.fd)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "not a regular file"
        if st.st_size > MAX_MANIFEST_BYTES:
            return None, f"{st.st_size:,} bytes"
        data = os.pread(fd, MAX_MANIFEST_BYTES + 1, 0)
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    finally:
        os.close(fd)
    try:
        m = untrusted.load_json_bytes(data)
    except ValueError:
        return None, "not JSON (a write cut short?)"
    if isinstance(m, dict) and m.get("version") != VERSION:
        return None, None
    why = _manifest_problem(m)
    if why is not None:
        return None, f"names {why}" if why.startswith("the ") else why
    return m, None


def _fsync_dir(folder: _Folder) -> None:
    try:
        os.fsync(folder.fd)
    except OSError:  # pragma: no cover - some file systems cannot sync a folder
        pass


def _write_manifest(folder: _Folder, m: dict[str, Any]) -> None:
    """Write ``m`` under a temporary name, sync it, rename it into place, sync the folder:
    after a power cut the manifest is the old one or the new one, never a torn one, and
    every part it names was synced before it."""
    import json

    tmp = f".tmp-manifest-{os.getpid()}-{secrets.token_hex(4)}.json"
    fd = os.open(tmp, _NEW_FILE, 0o644, dir_fd=folder.fd)
    try:
        try:
            data = json.dumps(m).encode("utf-8")
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, MANIFEST, src_dir_fd=folder.fd, dst_dir_fd=folder.fd)
    except BaseException:
        _unlink(folder, tmp)
        raise
    _fsync_dir(folder)


def _unlink(folder: _Folder, name: str) -> None:
    """Remove ``name`` from ``folder`` when it is one of the cache's own names (a part or a
    temporary file); anything else is left alone. A symbolic link is removed, never what it
    points to."""
    if not (PART_RE.match(name) or TMP_RE.match(name)):  # pragma: no cover - a bug
        raise ValueError(f"not a file of the query cache: {name!r}")
    try:
        os.unlink(name, dir_fd=folder.fd)
    except FileNotFoundError:
        pass


def _check(
    m: dict[str, Any] | None,
    src: Path,
    kind: str,
    st: os.stat_result,
    fd: int,
    folder: _Folder,
) -> tuple[bool, str | None]:
    """``(True, None)`` when ``m`` covers a prefix of the source as it is now and every part
    it names is whole; ``(False, None)`` when the source changed or a part is missing
    (rebuilt without a word); ``(False, why)`` when a part is damaged (rebuilt, warned)."""
    if m is None or m.get("kind") != kind or m.get("source") != str(src):
        return False, None
    if m.get("dev") != st.st_dev or m.get("ino") != st.st_ino:
        return False, None
    covered = m["covered"]
    if covered > st.st_size:
        return False, None
    for p in m["parts"]:
        why = _part_problem(folder, p)
        if why == "":
            return False, None
        if why is not None:
            return False, f"part {p['file']}: {why}"
    try:
        return _fingerprint(fd, covered) == m.get("fingerprint"), None
    except OSError:
        return False, None


def _part_problem(folder: _Folder, p: dict[str, Any]) -> str | None:
    """None when the part is whole (a regular file of this user, of the size written, with
    Parquet's magic at both ends); "" when it is missing; else what is wrong with it."""
    try:
        fd = os.open(p["file"], _READ_FILE, dir_fd=folder.fd)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symbolic link"
        return exc.strerror or str(exc)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        uid = _euid()
        if uid is not None and st.st_uid != uid:
            return f"owned by uid {st.st_uid}"
        if st.st_size != p["bytes"]:
            return f"{st.st_size:,} bytes where {p['bytes']:,} were written (cut short?)"
        if os.pread(fd, 4, 0) != _MAGIC or os.pread(fd, 4, st.st_size - 4) != _MAGIC:
            return "not a whole Parquet file"
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        os.close(fd)
    return None


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
        "bad_lines": 0,
        "bad_first": None,
        "parts": [],
        "garbage": [],
    }


# --------------------------------------------------------------------------- reading


def _blocks(fd: int, start: int, end: int):
    """``(offset, chunk)``: complete lines of ``[start, end)`` (``chunk`` ends with a newline;
    ``offset`` is where it ends), a block at a time; the bytes after the last newline are
    not yielded."""
    pos = start  # the next byte to read; ``pieces`` hold the bytes of a line before it
    pieces: list[bytes] = []  # a line longer than a block, gathered: joined once
    while pos < end:
        data = os.pread(fd, min(BLOCK_BYTES, end - pos), pos)
        if not data:
            break
        cut = data.rfind(b"\n")
        if cut < 0:
            pieces.append(data)
            pos += len(data)
            continue
        pos += cut + 1
        # the bytes after the last newline are read again with the next block (from the
        # page cache): one copy of the block instead of two (a carry joined to the next)
        if cut + 1 < len(data):
            data = data[: cut + 1]
        if pieces:
            data = b"".join([*pieces, data])
            pieces = []
        yield pos, data


def _new_part_name(first_line: int) -> str:
    return f"part-{first_line:012d}-{secrets.token_hex(4)}.parquet"


def _sha256_fd(fd: int) -> str:
    """The SHA-256 of the whole file open as ``fd`` (read with ``pread``: the offset is
    left alone)."""
    h = hashlib.sha256()
    pos = 0
    while True:
        data = os.pread(fd, 1 << 20, pos)
        if not data:
            return h.hexdigest()
        h.update(data)
        pos += len(data)


def _decode_into(
    writer_of: Any, fd: int, kind: str, m: dict[str, Any], end: int
) -> tuple[int, int, int]:
    """Decode the complete lines of ``[m["covered"], end)`` into the writer ``writer_of()``
    makes on first use (one row group per block); update ``m``'s steps and unreadable lines.
    Returns ``(rows, covered, lines)``."""
    rows = 0
    covered = m["covered"]
    lines = m["lines"]
    bad = scan.BadLines()
    if m["bad_lines"]:
        bad.count = m["bad_lines"]
        bad.first = tuple(m["bad_first"]) if m["bad_first"] else None
    writer = None
    for new_covered, chunk in _blocks(fd, covered, end):
        if kind == "metrics":
            table, steps, count = scan.decode_metrics_part(chunk, lines, bad)
            _track_steps(m, steps)
        else:
            table = scan.decode_spans_block(chunk, lines, bad)
            count = scan.count_lines(chunk)
        lines += count
        covered = new_covered
        if table.num_rows:
            if writer is None:
                writer = writer_of()
            writer.write_table(table)
            rows += table.num_rows
    m["bad_lines"] = bad.count
    m["bad_first"] = list(bad.first) if bad.first else None
    return rows, covered, lines


def _append(fd: int, folder: _Folder, kind: str, m: dict[str, Any], end: int) -> None:
    """Decode the complete lines of ``[m["covered"], end)`` into one new part (written under
    a temporary name, synced, renamed into place); update ``m``."""
    import pyarrow.parquet as pq

    tmp = f".tmp-{os.getpid()}-{secrets.token_hex(4)}.parquet"
    first = m["lines"]
    state: dict[str, Any] = {}

    def writer_of() -> Any:
        f = os.fdopen(os.open(tmp, _NEW_FILE, 0o644, dir_fd=folder.fd), "wb")
        state["file"] = f
        state["writer"] = pq.ParquetWriter(
            f, scan.part_schema(kind), **scan.CACHE_WRITE_OPTIONS[kind]
        )
        return state["writer"]

    try:
        rows, covered, lines = _decode_into(writer_of, fd, kind, m, end)
        if "writer" in state:
            state.pop("writer").close()
            f = state["file"]  # left in state until closed: a full disk fails the flush
            f.flush()
            os.fsync(f.fileno())
            size = os.fstat(f.fileno()).st_size
            digest = _sha256_fd(f.fileno())
            state.pop("file").close()
            name = _new_part_name(first)
            os.replace(tmp, name, src_dir_fd=folder.fd, dst_dir_fd=folder.fd)
            m["parts"].append(
                {
                    "file": name,
                    "rows": rows,
                    "first_line": first,
                    "lines": lines,
                    "bytes": size,
                    "sha256": digest,
                }
            )
    finally:
        w = state.pop("writer", None)
        if w is not None:
            try:
                w.close()
            except Exception:  # noqa: BLE001 - a full disk fails the close too
                pass
        f = state.pop("file", None)
        if f is not None:
            try:
                f.close()
            except OSError:
                pass
            _unlink(folder, tmp)
    m["covered"] = covered
    m["lines"] = lines
    m["rows"] += rows


def _in_memory(src: Path, sfd: int, kind: str) -> CachedSource:
    """Every complete line of the source decoded into a Parquet file held in memory (no
    cache folder could be written, or it kept vanishing): the query still answers."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    st = os.fstat(sfd)
    m = _fresh_manifest(src, kind, st)
    sink = pa.BufferOutputStream()
    state: dict[str, Any] = {}

    def writer_of() -> Any:
        state["w"] = pq.ParquetWriter(
            sink, scan.part_schema(kind), **scan.CACHE_WRITE_OPTIONS[kind]
        )
        return state["w"]

    rows, covered, lines = _decode_into(writer_of, sfd, kind, m, st.st_size)
    memory: tuple[Any, ...] = ()
    if "w" in state:
        state["w"].close()
        memory = (sink.getvalue(),)
    m.update(covered=covered, lines=lines, rows=rows)
    merged = True
    if kind == "metrics" and not m["monotonic"] and memory:
        merged = _exact_merged([pq.ParquetFile(pa.BufferReader(memory[0]))])
    return CachedSource(
        source=src,
        kind=kind,
        parts=(),
        covered=covered,
        rows=rows,
        merged=merged,
        lines=lines,
        cache_dir=None,
        memory=memory,
        bad_lines=m["bad_lines"],
        bad_first=tuple(m["bad_first"]) if m["bad_first"] else None,
        fingerprint=_fingerprint(sfd, covered),
        dev=m["dev"],
        ino=m["ino"],
    )


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


class _Damaged(Exception):
    """A part that passed the cheap checks cannot be read (``why``): rebuild."""


def _read_part(folder: _Folder, p: dict[str, Any]) -> Any:
    """A part of ``folder`` as a ``pyarrow.parquet.ParquetFile`` (:class:`_Damaged` when it
    cannot be read as one)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(str(folder.path / p["file"]))
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as exc:
        raise _Damaged(f"part {p['file']}: {exc}") from None


def _exact_merged(files: Any) -> bool:
    """True when no ``step`` occurs in two lines of the parts (``ParquetFile``s, read back a
    row group at a time, when the steps were not increasing). The rows of one line are
    consecutive and never split between row groups."""
    import pyarrow as pa
    import pyarrow.compute as pc

    seen: set[Any] = set()
    for f in files:
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


def _exact_merged_parts(folder: _Folder, m: dict[str, Any]) -> bool:
    import pyarrow as pa

    def files() -> Any:
        for p in m["parts"]:
            yield _read_part(folder, p)

    try:
        return _exact_merged(files())
    except (OSError, pa.ArrowException) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise _Damaged(str(exc)) from None


# --------------------------------------------------------------------------- compaction


def _compact(folder: _Folder, kind: str, m: dict[str, Any], now: float) -> None:
    import pyarrow as pa
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
    tmp = f".tmp-{os.getpid()}-{secrets.token_hex(4)}.parquet"
    rows = 0
    f = os.fdopen(os.open(tmp, _NEW_FILE, 0o644, dir_fd=folder.fd), "wb")
    try:
        with pq.ParquetWriter(f, scan.part_schema(kind), **scan.CACHE_WRITE_OPTIONS[kind]) as w:
            for p in run:
                pf = _read_part(folder, p)
                try:
                    for g in range(pf.num_row_groups):
                        t = pf.read_row_group(g)
                        rows += t.num_rows
                        w.write_table(scan.part_table(t, kind))
                except pa.ArrowException as exc:
                    raise _Damaged(f"part {p['file']}: {exc}") from None
                finally:
                    pf.close()
        f.flush()
        os.fsync(f.fileno())
        size = os.fstat(f.fileno()).st_size
        digest = _sha256_fd(f.fileno())
        f.close()
        name = _new_part_name(run[0]["first_line"])
        os.replace(tmp, name, src_dir_fd=folder.fd, dst_dir_fd=folder.fd)
    finally:
        if not f.closed:
            f.close()
        _unlink(folder, tmp)
    merged_part = {
        "file": name,
        "rows": rows,
        "first_line": run[0]["first_line"],
        "lines": run[-1]["lines"],
        "bytes": size,
        "sha256": digest,
    }
    m["parts"] = parts[:i] + [merged_part]
    m["garbage"].extend({"file": p["file"], "replaced_at": now} for p in run)


def _collect_garbage(folder: _Folder, m: dict[str, Any], now: float) -> None:
    """Remove replaced parts past their grace time, temporary files of a refresh that died
    and parts no manifest lists (after the grace time): only names of the cache's own
    (:data:`PART_RE`, :data:`TMP_RE`), in its own folder, a symbolic link as itself."""
    keep = []
    for g in m.get("garbage", []):
        if now - g.get("replaced_at", 0) >= GRACE_S:
            try:
                _unlink(folder, g["file"])
            except OSError:
                keep.append(g)
        else:
            keep.append(g)
    m["garbage"] = keep
    # leftovers of a refresh that died (we hold the lock: nobody else writes here)
    listed = {p["file"] for p in m["parts"]} | {g["file"] for g in keep}
    try:
        names = os.listdir(folder.fd)
    except OSError:
        return
    for n in names:
        try:
            if TMP_RE.match(n):
                _unlink(folder, n)
            elif PART_RE.match(n) and n not in listed:
                st = os.stat(n, dir_fd=folder.fd, follow_symlinks=False)
                if now - st.st_mtime >= GRACE_S:
                    _unlink(folder, n)
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
    refresh; rebuilds when the cached prefix no longer matches the file or the cache is
    damaged (see the module docstring). Safe to call while another process appends to
    ``source``, while another process refreshes the same source, and while the cache
    folder is deleted. ``root``: the folder ``source`` must lie in (default: its parent; a
    reader gives the run directory's real path as it discovered it, ``et ui`` the folder
    it serves), so a file swapped for a symbolic link to elsewhere is refused, and a FIFO
    is never waited on (:func:`expr_tracker.history.untrusted.open_regular`).

    When no cache folder can be written (a full disk), the rows come back in memory
    (:attr:`CachedSource.memory`), with one warning naming the folder.

    Raises ``ValueError`` for another ``kind``; ``FileNotFoundError`` when ``source`` does
    not exist; ``PermissionError`` when it cannot be read;
    :class:`~expr_tracker.history.untrusted.UnsafeFileError` (an ``OSError``) when it is not
    a regular file (a FIFO, a device, a folder) or lies outside ``root``; another
    ``OSError`` when reading it fails; ``ImportError`` (naming ``pip install
    'expr-tracker[query]'``) without pyarrow.
    """
    if kind not in _KINDS:
        raise ValueError(f"kind={kind!r} is not valid: use 'metrics' or 'spans'")
    _need_pyarrow()
    src = Path(source).absolute()
    sfd = untrusted.open_regular(src, root=root if root is not None else src.parent)
    try:
        for _attempt in range(RETRIES + 1):
            folder, lock_fd, current = _open_cache(src, cache_dir, sfd, kind)
            try:
                if current is not None:
                    return current
                assert lock_fd is not None
                if fcntl is not None:
                    fcntl.flock(lock_fd, fcntl.LOCK_EX)
                return _refresh_locked(src, sfd, kind, folder)
            except OSError as exc:
                if folder.gone() or isinstance(exc, FileNotFoundError):
                    continue  # the cache folder was deleted under us: make it again
                if _source_error(exc, sfd):
                    raise
                # one line per disk and cause (a full disk fails every run's cache)
                _warner.warn(
                    ("write", _device(folder), exc.errno),
                    "expr_tracker: cannot write the query cache in %s (%s): reading %s "
                    "without it, in memory (and any other run whose cache is on that disk)",
                    folder.path,
                    exc.strerror or exc,
                    src,
                )
                return _in_memory(src, sfd, kind)
            finally:
                if lock_fd is not None:
                    os.close(lock_fd)  # releases the flock
                folder.close()
        _warner.warn(
            ("vanished", str(src)),
            "expr_tracker: the query cache of %s was deleted %d times while it was being "
            "written: reading it without a cache, in memory",
            src,
            RETRIES + 1,
        )
        return _in_memory(src, sfd, kind)
    finally:
        os.close(sfd)


def warm(source: str | os.PathLike[str], kind: str) -> int | None:
    """For the process writing ``source``: make the cache beside it (``<run
    dir>/.et-cache/<file name>/``, the folder a reader uses first) cover every complete
    line now in it, as :func:`refresh` would, and return the bytes covered; None when that
    folder cannot be used or written, or the source cannot be read.

    Unlike :func:`refresh` it never falls back (no cache under ``$XDG_CACHE_HOME``, in a
    temporary folder or in memory: only what a later reader finds is worth building), and
    it never warns: a cache rebuilt because the file changed under it (a resumed run's
    repair) is logged at debug level, and a failure is returned as None. The cache it
    writes is the one :func:`refresh` writes, under the same lock, so a reader refreshing
    at the same moment waits for it and then reads only what is left (docs/query.md "The
    cache").

    Raises ``ValueError`` for another ``kind``; nothing else (a missing pyarrow, a full
    disk, a run directory of another user: None).
    """
    if kind not in _KINDS:
        raise ValueError(f"kind={kind!r} is not valid: use 'metrics' or 'spans'")
    try:
        _need_pyarrow()
        src = Path(source).absolute()
        sfd = untrusted.open_regular(src, root=src.parent)
    except (ImportError, OSError):
        return None
    try:
        try:
            folder = _open_in_run(src, True, sfd)
        except (OSError, _Refused):
            return None
        try:
            lock_fd = _lock(folder)
            if lock_fd is None:
                return None
            try:
                if fcntl is not None:
                    fcntl.flock(lock_fd, fcntl.LOCK_EX)
                return _refresh_locked(src, sfd, kind, folder, quiet=True).covered
            except OSError as exc:
                log.debug("expr_tracker: the query cache of %s was not kept: %s", src, exc)
                return None
            finally:
                os.close(lock_fd)
        finally:
            folder.close()
    finally:
        os.close(sfd)


def _device(folder: _Folder) -> Any:
    try:
        return os.fstat(folder.fd).st_dev
    except OSError:
        return str(folder.path)


def _source_error(exc: OSError, sfd: int) -> bool:
    """True when ``exc`` came from reading the source (it names it, or the source itself
    can no longer be read), not from writing the cache."""
    try:
        os.pread(sfd, 1, 0)
    except OSError:
        return True
    return False


def _refresh_locked(
    src: Path, sfd: int, kind: str, folder: _Folder, *, quiet: bool = False
) -> CachedSource:
    st = os.fstat(sfd)
    now = time.time()
    m, problem = _load_manifest(folder)
    ok, part_problem = _check(m, src, kind, st, sfd, folder)
    why = problem or part_problem
    if why:
        _warn_rebuilt(folder, src, why, quiet)
    for _attempt in (1, 2):
        try:
            return _update(src, sfd, kind, folder, m, ok, st, now)
        except _Damaged as exc:
            _warn_rebuilt(folder, src, str(exc), quiet)
            ok = False
    raise OSError(errno.EIO, f"the query cache in {folder.path} cannot be rebuilt")


def _warn_rebuilt(folder: _Folder, src: Path, why: str, quiet: bool = False) -> None:
    message = "expr_tracker: the query cache in %s was damaged or not its own (%s): rebuilt from %s"
    if quiet:
        log.debug(message, folder.path, why, src)
        return
    _warner.warn(("damaged", str(folder.path), why), message, folder.path, why, src)


def _update(
    src: Path,
    sfd: int,
    kind: str,
    folder: _Folder,
    m: dict[str, Any] | None,
    ok: bool,
    st: os.stat_result,
    now: float,
) -> CachedSource:
    changed = False
    if not ok or m is None:
        old = m
        m = _fresh_manifest(src, kind, st)
        if old is not None:  # a valid manifest: every name it holds is a part of our own
            m["garbage"] = list(old["garbage"])
            m["garbage"].extend({"file": p["file"], "replaced_at": now} for p in old["parts"])
        changed = True
    end = st.st_size
    if end > m["covered"]:
        before = m["covered"]
        _append(sfd, folder, kind, m, end)
        if m["covered"] != before:
            changed = True
            m["fingerprint"] = _fingerprint(sfd, m["covered"])
            if kind == "metrics" and m["merged"] and not m["monotonic"]:
                m["merged"] = _exact_merged_parts(folder, m)
    if m["fingerprint"] is None:
        m["fingerprint"] = _fingerprint(sfd, m["covered"])
        changed = True
    if len(m["parts"]) > MAX_PARTS:
        _compact(folder, kind, m, now)
        changed = True
    if m["garbage"] or changed:
        _collect_garbage(folder, m, now)
    if changed:
        _write_manifest(folder, m)
    return _result(src, kind, folder.path, m)


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
        bad_lines=m["bad_lines"],
        bad_first=tuple(m["bad_first"]) if m["bad_first"] else None,
        fingerprint=m["fingerprint"],
        dev=m["dev"],
        ino=m["ino"],
    )


class DerivedFolder:
    """A folder for files derived from a source's cache (the overlay summaries:
    :mod:`expr_tracker.query.pyramids`), inside that cache's folder: ``fd`` a descriptor
    of it, opened as the cache's own folders are (no link followed, this user's, not
    writable by group or others). :meth:`lock` takes the cache's ``flock`` (the one a
    refresh holds) so that a builder never races a refresh or another builder."""

    __slots__ = ("_folder", "fd", "path")

    def __init__(self, folder: _Folder, fd: int, path: Path) -> None:
        self._folder = folder
        self.fd = fd
        self.path = path

    def lock(self) -> int | None:
        """Take the cache's lock, exclusively; its descriptor (close it to release), or
        None when the folder cannot be written."""
        fd = _lock(self._folder)
        if fd is not None and fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    def close(self) -> None:
        os.close(self.fd)
        self._folder.close()


def derived_folder(
    cached: CachedSource, name: str, create: bool = True, sfd: int | None = None
) -> DerivedFolder | None:
    """The folder ``name`` (letters, digits, ``-``, ``_``) inside ``cached``'s cache folder,
    made (0755) when ``create``; None when the cache is in memory or a folder on the way
    is not this user's, a link or cannot be opened or made (the caller keeps what it
    derives in memory). The cache folder is opened again as :func:`refresh` opens it: by
    descriptors from the run directory, a link at ``.et-cache`` or below never followed;
    with ``sfd`` (the source as opened) only in the folder holding that very file. Close it with :meth:`DerivedFolder.close`."""
    if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
        raise ValueError(f"name={name!r} is not valid: letters, digits, '-' or '_'")
    d = cached.cache_dir
    if d is None:
        return None
    src = cached.source
    try:
        if d == src.parent / CACHE_DIR_NAME / src.name:
            folder = _open_in_run(src, False, sfd)
        else:
            folder = _Folder(d, _open_dir(d, None, False))
    except (OSError, _Refused):
        return None
    try:
        fd = _open_dir(name, folder.fd, create)
    except (OSError, _Refused):
        folder.close()
        return None
    return DerivedFolder(folder, fd, d / name)


def invalidate(part: str | os.PathLike[str]) -> bool:
    """Make the next refresh rebuild the cache holding ``part`` (a part DuckDB could not
    read): its folder's manifest is removed, only when ``part`` is named as a part of the
    cache's own and its folder is this user's. Returns True when a manifest was removed."""
    p = Path(part)
    if not PART_RE.match(p.name):
        return False
    try:
        fd = _open_dir(p.parent, None, False)
    except (OSError, _Refused):
        return False
    try:
        os.unlink(MANIFEST, dir_fd=fd)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def damaged(parts: Any) -> list[tuple[Path, str]]:
    """The parts among ``parts`` (paths a refresh handed out) whose bytes are not those the
    cache wrote: their SHA-256 differs from the one their manifest recorded (a disk that
    lied, a hand edit), or they cannot be read. Each cache holding one is invalidated (its
    manifest removed under its lock, so the next refresh rebuilds it from the JSONL).

    Called when reading parts failed in a way that names none of them (DuckDB's "invalid
    TType" for a damaged footer), and by ``et export`` before it reads a run's parts: the
    size and Parquet's magic, which every refresh checks, do not see a damaged middle.
    Only folders that are this user's own caches are looked at; a part their manifest no
    longer lists (replaced since) is not judged. Returns ``[(part, why)]``."""
    by_dir: dict[Path, list[str]] = {}
    for part in parts:
        p = Path(part)
        if PART_RE.match(p.name):
            by_dir.setdefault(p.parent, []).append(p.name)
    out: list[tuple[Path, str]] = []
    for d, names in by_dir.items():
        try:
            folder = _Folder(d, _open_dir(d, None, False))
        except (OSError, _Refused):
            continue
        lock_fd = _lock(folder)
        try:
            if lock_fd is not None and fcntl is not None:
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
            m, _problem = _load_manifest(folder)
            if m is None:
                continue
            listed = {p["file"]: p for p in m["parts"]}
            bad = []
            for name in dict.fromkeys(names):
                entry = listed.get(name)
                if entry is None:
                    continue
                why = _part_problem(folder, entry)
                if why == "":
                    continue  # gone: a refresh makes it again
                if why is None:
                    try:
                        fd = os.open(name, _READ_FILE, dir_fd=folder.fd)
                        try:
                            if _sha256_fd(fd) != entry["sha256"]:
                                why = "its bytes are not those written (SHA-256 differs)"
                        finally:
                            os.close(fd)
                    except OSError as exc:
                        why = exc.strerror or str(exc)
                if why is not None:
                    bad.append((d / name, why))
            if bad:
                try:
                    os.unlink(MANIFEST, dir_fd=folder.fd)
                except FileNotFoundError:
                    pass
                except OSError:
                    continue  # cannot be rebuilt from here: not reported as recovered
                out.extend(bad)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)
            folder.close()
    return out


def _need_pyarrow() -> None:
    """ImportError naming the extra when pyarrow is not installed. Only looked for, not
    imported: a refresh with nothing new never uses it (a fresh ``et query`` over an
    up-to-date cache so skips its import); the code writing parts imports it."""
    if _have_pyarrow:
        return
    import importlib.util
    import sys

    if sys.modules.get("pyarrow") is None and importlib.util.find_spec("pyarrow") is None:
        raise ImportError("the query cache needs pyarrow: pip install 'expr-tracker[query]'")
    _have_pyarrow.append(True)  # looked for once a process (~0.3 ms a refresh otherwise)


_have_pyarrow: list[bool] = []
