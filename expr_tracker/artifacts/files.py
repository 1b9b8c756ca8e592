"""File operations of the store: hashing, copying while hashing, hard links with a copy as
the fallback, appending one JSON line, and an exclusive ``flock`` as a context manager."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

try:  # POSIX; elsewhere nothing is locked (and no staging directory is ever taken as stale)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

CHUNK = 1 << 20
#: os.link errors that mean "this file system cannot link these two paths": copy instead
LINK_FALLBACK = frozenset(
    {
        errno.EXDEV,  # another device
        errno.EPERM,  # a file system without hard links (or protected_hardlinks)
        errno.EMLINK,  # too many links to the source
        errno.ENOTSUP,
        errno.EOPNOTSUPP,
        errno.EACCES,
    }
)
READ_ONLY = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH


def hash_file(path: str | os.PathLike[str]) -> tuple[int, str]:
    """(size in bytes, sha256 hex) of a file's content. Raises ``OSError``."""
    import hashlib

    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(CHUNK)
            if not chunk:
                break
            size += len(chunk)
            h.update(chunk)
    return size, h.hexdigest()


def copy_hashed(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> tuple[int, str]:
    """Copy ``src`` to a new file ``dst`` (which must not exist) in one pass that also
    hashes it; returns (size, sha256 hex) of what was written. Raises ``OSError``."""
    import hashlib

    h = hashlib.sha256()
    size = 0
    with open(src, "rb") as fin:
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with open(fd, "wb") as fout:
            while True:
                chunk = fin.read(CHUNK)
                if not chunk:
                    break
                size += len(chunk)
                h.update(chunk)
                fout.write(chunk)
    return size, h.hexdigest()


def link_or_copy(src: str | os.PathLike[str], dst: str | os.PathLike[str], mode: str) -> str:
    """Make ``dst`` hold ``src``'s content: a hard link when ``mode`` is ``link`` and the file
    system allows it, else a copy. Returns ``"link"`` or ``"copy"``. Raises ``OSError``."""
    if mode == "link":
        try:
            os.link(src, dst)
            return "link"
        except OSError as exc:
            if exc.errno not in LINK_FALLBACK:
                raise
    copy_hashed(src, dst)
    return "copy"


def append_line(path: str | os.PathLike[str], record: dict[str, Any], *, sync: bool) -> None:
    """Append ``record`` as one JSON line to ``path``, all or nothing.

    A torn last line left by a crash (no final newline) is cut off first, so it never glues
    to the new record; a failed write (a full disk) is cut back to the size before, so the
    file never ends in half a record. ``sync`` fsyncs the file. Raises ``OSError``.
    """
    line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            size = _last_line_end(fd, size)
            os.ftruncate(fd, size)
        try:
            written = os.pwrite(fd, line, size)
            if written != len(line):
                raise OSError(errno.ENOSPC, "short write")
            if sync:
                os.fsync(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def _last_line_end(fd: int, size: int) -> int:
    """The offset just after the last newline before ``size`` (0 when there is none)."""
    pos = size
    while pos > 0:
        start = max(0, pos - CHUNK)
        i = os.pread(fd, pos - start, start).rfind(b"\n")
        if i >= 0:
            return start + i + 1
        pos = start
    return 0


def read_lines(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file, skipping lines that do not decode (a torn tail);
    ``[]`` when the file does not exist."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    out = []
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


@contextlib.contextmanager
def locked(path: str | os.PathLike[str]) -> Iterator[int]:
    """Hold an exclusive ``flock`` on ``path`` (created when missing) for the block; the
    kernel drops it when the process dies, so a killed holder never blocks the next one. The
    descriptor belongs to a file object, so an interrupt that skips the ``finally`` still
    closes it (and releases the lock) once the exception is handled."""
    f = open(path, "a+b")  # noqa: SIM115 - closed below, or by its refcount when interrupted
    try:
        hold(f.fileno())
        yield f.fileno()
    finally:
        f.close()  # releases the lock


def hold(fd: int) -> None:
    """Take an exclusive ``flock`` on ``fd``, waiting for it (released when ``fd`` closes)."""
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX)


def try_lock(path: str | os.PathLike[str]) -> int | None:
    """An exclusive ``flock`` on an existing ``path`` without waiting: the descriptor (close
    it to release), or None when another process holds it or the file is gone."""
    if fcntl is None:  # pragma: no cover - cannot tell: treat the writer as alive
        return None
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd
