"""File operations of the store: hashing, copying while hashing (a reflink clone or an
in-kernel ``copy_file_range`` where the file system offers one, a plain read and write
otherwise), hard links with a copy as the fallback, appending one JSON line, and an
exclusive ``flock`` as a context manager."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import sys
from collections.abc import Iterator
from typing import Any

try:  # POSIX; elsewhere nothing is locked (and no staging directory is ever taken as stale)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

CHUNK = 1 << 20
#: bytes handed to one ``copy_file_range`` call (a network file system copies each call on
#: the server: fewer, larger calls); what it copied is read back for the hash in ``CHUNK``s
COPY_CHUNK = 8 << 20
#: ``ioctl(dst, FICLONE, src)`` (Linux ``_IOW(0x94, 9, int)``): make ``dst`` share ``src``'s
#: blocks, copy-on-write (Btrfs, XFS with reflink, bcachefs, OCFS2, NFS 4.2 servers that
#: clone). Elsewhere the ioctl fails (``EOPNOTSUPP``, ``EXDEV``, ``EINVAL``, ``ENOTTY``) and
#: the copy is made by ``copy_file_range`` or by reading and writing.
FICLONE = 0x40049409 if sys.platform.startswith("linux") else None
#: ``copy_file_range`` errors that mean "not here" (another file system on an older kernel,
#: a file system without it, a sandbox that forbids it): read and write instead
COPY_RANGE_FALLBACK = frozenset(
    {
        errno.EXDEV,
        errno.EINVAL,
        errno.ENOSYS,
        errno.EOPNOTSUPP,
        errno.ENOTSUP,
        errno.EBADF,
        errno.EPERM,
        errno.ETXTBSY,
    }
)
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
#: the permission bits a stored or downloaded copy may keep of its source: the read and
#: execute bits (never a write bit, never set-uid, set-gid or sticky)
KEEP_BITS = 0o555
#: a buffer of zeros, hashed for the holes of a sparse file instead of reading them
_ZEROS = bytes(CHUNK)


def stored_mode(source_mode: int) -> int:
    """The permission bits of a copy of a file whose ``st_mode`` is ``source_mode``: the
    source's own, write bits cleared (``0o600`` -> ``0o400``, ``0o644`` -> ``0o444``,
    ``0o640`` -> ``0o440``, ``0o755`` -> ``0o555``). A copy is never more readable than its
    source; the process umask applies on top (the file is created with these bits)."""
    return stat.S_IMODE(source_mode) & KEEP_BITS


def dir_mode(file_modes: list[int]) -> int:
    """The permission bits for a directory made to hold files of these modes (a stored
    version, one of its sub-directories, a download): the owner's ``rwx``, and for group
    and others read and search only when every one of the files is readable by them. So
    a directory holding a ``0600`` key is ``0700``: its listing (the names) is no more
    visible than the key. The umask applies on top."""
    shared = 0o044
    for m in file_modes:
        shared &= m
    return 0o700 | shared | (shared >> 2)


def _open_source(src: str | os.PathLike[str] | int) -> tuple[int, bool]:
    """(descriptor, whether we opened it): an ``int`` is taken as an open descriptor; a
    path is opened as a regular file only, non-blocking (a FIFO never hangs the copy)."""
    if isinstance(src, int):
        return src, False
    from expr_tracker.history.untrusted import open_regular

    return open_regular(src), True


def hash_fd(fd: int) -> tuple[int, str]:
    """(size in bytes, sha256 hex) of an open file's content, read from offset 0 with
    ``pread`` (the descriptor's offset is left alone). Raises ``OSError``."""
    import hashlib

    h = hashlib.sha256()
    pos = 0
    while True:
        chunk = os.pread(fd, CHUNK, pos)
        if not chunk:
            break
        pos += len(chunk)
        h.update(chunk)
    return pos, h.hexdigest()


def hash_file(
    path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None
) -> tuple[int, str]:
    """(size in bytes, sha256 hex) of a file's content. Only a regular file is read (a FIFO
    or device raises instead of blocking); with ``root``, only one lying inside ``root``.

    Raises:
        OSError: the file cannot be opened or read;
            :class:`~expr_tracker.history.untrusted.UnsafeFileError` when it is not a regular
            file or lies outside ``root``.
    """
    from expr_tracker.history.untrusted import open_regular

    fd = open_regular(path, root=root)
    try:
        return hash_fd(fd)
    finally:
        os.close(fd)


def _data_segments(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """(offset, end) of each data region of an open file of ``size`` bytes, in order; the
    gaps between them are holes (they read as zeros). A file system that cannot tell
    (``SEEK_DATA`` unsupported) yields the whole file as one region."""
    seek_data = getattr(os, "SEEK_DATA", None)
    seek_hole = getattr(os, "SEEK_HOLE", None)
    if seek_data is None or seek_hole is None or size == 0:
        if size:
            yield 0, size
        return
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, seek_data)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no data past pos: the rest is a hole
                return
            if exc.errno in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
                yield pos, size
                return
            raise
        if start >= size:
            return
        end = min(os.lseek(fd, start, seek_hole), size)
        if end <= start:  # cannot happen; never loop forever on a confused file system
            yield start, size
            return
        yield start, end
        pos = end


def copy_hashed(
    src: str | os.PathLike[str] | int,
    dst: str | os.PathLike[str],
    *,
    dir_fd: int | None = None,
    mode: int | None = None,
) -> tuple[int, str]:
    """Copy ``src`` to a new file ``dst`` and hash the copy; returns (size in bytes, sha256
    hex) of what ``dst`` holds. The one routine that copies a file (staging a version, a
    download).

    ``src``: a path (opened as a regular file only, non-blocking, symbolic links followed)
    or an open descriptor (read with ``pread`` from offset 0). ``dst`` must not exist
    (``O_EXCL``) and is never followed if it is a symbolic link; relative to ``dir_fd``
    when given. ``mode``: the new file's permission bits (default :func:`stored_mode` of
    the source's: write bits cleared, so the copy is never more readable than the source;
    the umask applies on top).

    How, cheapest first (the result is the same file):

    1. a reflink clone (``ioctl FICLONE``, Linux) where the file system has one: ``dst``
       shares ``src``'s blocks copy-on-write, so a later rewrite of the source (``torch.save``
       to the same path) leaves the copy alone, and copying costs no data. The clone is then
       read once for the hash (holes skipped);
    2. ``os.copy_file_range`` per data region, where the kernel has it: the data never
       passes through this process, and the file system may make it a server-side copy
       (NFS 4.2, SMB) or a clone. What it wrote is read back for the hash;
    3. ``pread``/``pwrite`` of each data region, hashing the bytes as they are written.

    The hash is always of what ``dst`` holds, never a second read of the source (which may
    change meanwhile). Holes stay holes: data regions are found with
    ``SEEK_DATA``/``SEEK_HOLE`` and copied at their offsets, holes are hashed as zeros
    without being read or written, and the copy is truncated to the full size, so a 2 GB
    sparse file costs its data on disk, not 2 GB (a clone shares the source's extents, holes
    included). A failed copy removes ``dst``.

    Raises:
        OSError: reading, creating or writing failed (``FileExistsError`` when ``dst``
            exists; :class:`~expr_tracker.history.untrusted.UnsafeFileError` when ``src``
            is not a regular file).
    """
    import hashlib

    fin, owned = _open_source(src)
    try:
        st = os.fstat(fin)
        perm = stored_mode(st.st_mode) if mode is None else mode
        # read and write: the copy is read back for its hash after a clone or an in-kernel copy
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        flags |= getattr(os, "O_CLOEXEC", 0)
        # created with the final bits (the umask applies); the descriptor is writable anyway
        fout = os.open(dst, flags, perm, dir_fd=dir_fd)
        try:
            h = hashlib.sha256()
            if _clone(fin, fout):
                pos = _hash_data(fout, h)
            else:
                pos = _copy_data(fin, fout, st.st_size, h)
        except BaseException:
            os.close(fout)
            with contextlib.suppress(OSError):
                os.unlink(dst, dir_fd=dir_fd)
            raise
        os.close(fout)
        return pos, h.hexdigest()
    finally:
        if owned:
            os.close(fin)


def _clone(fin: int, fout: int) -> bool:
    """Make the empty file ``fout`` a reflink clone of ``fin`` (``ioctl FICLONE``); False
    where the file system (or the platform) has none, with ``fout`` left empty."""
    if FICLONE is None or fcntl is None:
        return False
    try:
        fcntl.ioctl(fout, FICLONE, fin)
    except OSError:
        # not supported here (EOPNOTSUPP, EXDEV, EINVAL, ENOTTY ...): a copy follows; a clone
        # that failed half-way must not leave shared extents under it
        os.ftruncate(fout, 0)
        return False
    return True


def _hash_data(fd: int, h: Any) -> int:
    """Feed the content of the open file ``fd`` to the hash ``h``, reading only its data
    regions (holes are hashed as zeros, unread); returns its size."""
    size = os.fstat(fd).st_size
    pos = 0
    for start, end in _data_segments(fd, size):
        pos = _hash_zeros(h, pos, start)
        while pos < end:
            chunk = os.pread(fd, min(CHUNK, end - pos), pos)
            if not chunk:  # cut meanwhile (cannot happen to our own copy)
                return pos
            h.update(chunk)
            pos += len(chunk)
    return _hash_zeros(h, pos, size)


def _copy_data(fin: int, fout: int, size: int, h: Any) -> int:
    """Copy the data regions of ``fin`` (``size`` bytes when it was looked at) into the empty
    ``fout`` at their offsets, hashing what ``fout`` receives and the holes as zeros; then
    anything appended since. Returns the size of the copy (``fout`` truncated to it, so the
    holes take no space)."""
    in_kernel = hasattr(os, "copy_file_range")
    pos = 0  # bytes hashed so far: what the copy holds below this offset
    shrank = False
    for start, end in _data_segments(fin, size):
        pos = _hash_zeros(h, pos, start)  # a hole: in the hash, not on disk
        while pos < end:
            if in_kernel:
                try:
                    n = os.copy_file_range(fin, fout, min(COPY_CHUNK, end - pos), pos, pos)
                except OSError as exc:
                    if exc.errno not in COPY_RANGE_FALLBACK:
                        raise
                    in_kernel = False  # not here: read and write from pos on
                    continue
                if n > 0:
                    pos = _hash_range(fout, h, pos, pos + n)
                    continue
                # nothing copied before the end: the source was cut, or a file system that
                # copies nothing (some pseudo files); reading tells which
                in_kernel = False
            chunk = os.pread(fin, min(CHUNK, end - pos), pos)
            if not chunk:
                shrank = True  # the file was cut while copied: stop at its end
                break
            _pwrite_all(fout, chunk, pos)
            h.update(chunk)
            pos += len(chunk)
        if shrank:
            break
    if not shrank:
        pos = _hash_zeros(h, pos, size)  # a trailing hole
    while True:  # anything appended since the fstat of the caller
        chunk = os.pread(fin, CHUNK, pos)
        if not chunk:
            break
        _pwrite_all(fout, chunk, pos)
        h.update(chunk)
        pos += len(chunk)
    os.ftruncate(fout, pos)  # the holes: zeros that take no space
    return pos


def _hash_range(fd: int, h: Any, pos: int, end: int) -> int:
    """Feed ``[pos, end)`` of the open file ``fd`` (just written by the kernel) to ``h``;
    returns ``end``.

    Raises:
        OSError: the file is shorter than ``end`` (it cannot be: it is our own copy).
    """
    while pos < end:
        chunk = os.pread(fd, min(CHUNK, end - pos), pos)
        if not chunk:
            raise OSError(errno.EIO, "the copy is shorter than what was copied into it")
        h.update(chunk)
        pos += len(chunk)
    return pos


def _hash_zeros(h: Any, pos: int, end: int) -> int:
    """Feed the zeros of a hole ``[pos, end)`` to the hash ``h``; returns ``max(pos, end)``."""
    while pos < end:
        n = min(CHUNK, end - pos)
        h.update(_ZEROS[:n] if n < CHUNK else _ZEROS)
        pos += n
    return pos


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(errno.ENOSPC, "short write")
        view = view[n:]
        offset += n


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


#: the longest JSONL line read (index, lineage); a longer one is skipped as bad
MAX_LINE = 1 << 20


def read_jsonl(
    path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None
) -> tuple[list[dict[str, Any]], int]:
    """The JSON objects of a JSONL file (the store's index, a run's lineage) and the number
    of lines skipped as bad; ``([], 0)`` when the file does not exist.

    The file is untrusted input: only a regular file is opened (non-blocking: a FIFO never
    hangs the reader), inside ``root`` when given; each line is decoded with a depth limit
    (a line nested 20,000 deep is one bad line, never a ``RecursionError``) and refused when
    it holds a lone surrogate escape, is not an object, or is longer than ``MAX_LINE``
    bytes. A torn last line (no final newline: a writer killed mid-append, cut off by the
    next appender) is skipped without being counted.

    Raises:
        OSError: the file exists but cannot be read (a permission,
            :class:`~expr_tracker.history.untrusted.UnsafeFileError` for a FIFO, a device
            or a file outside ``root``).
    """
    from expr_tracker.history.untrusted import load_json_bytes, open_regular

    try:
        fd = open_regular(path, root=root)
    except FileNotFoundError:
        return [], 0
    out: list[dict[str, Any]] = []
    bad = 0
    with open(fd, "rb", closefd=True) as f:
        while True:
            raw = f.readline(MAX_LINE + 1)
            if not raw:
                break
            if len(raw) > MAX_LINE and not raw.endswith(b"\n"):
                while raw and not raw.endswith(b"\n"):  # the rest of the long line
                    raw = f.readline(MAX_LINE)
                bad += 1
                continue
            if not raw.endswith(b"\n"):  # a torn tail
                break
            if not raw.strip():
                continue
            try:
                obj = load_json_bytes(raw)
            except ValueError:
                bad += 1
                continue
            if isinstance(obj, dict):
                out.append(obj)
            else:
                bad += 1
    return out, bad


def read_lines(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file, skipping bad lines (see :func:`read_jsonl`);
    ``[]`` when the file does not exist. Raises ``OSError`` as :func:`read_jsonl` does."""
    return read_jsonl(path)[0]


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
