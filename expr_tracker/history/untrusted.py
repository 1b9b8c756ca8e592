"""Opening and decoding files that may come from anyone (docs/query.md "Security").

Every reader of a runs folder (``et runs``, ``et query``, ``et export``, ``et ui``, the query
cache, artifact manifests) treats what it opens as untrusted input: a run folder may be a
colleague's, a tarball, an NFS share. The functions here are the one way such a file is
opened and decoded:

- only a **regular file** is read: the file is opened non-blocking (a FIFO without a writer,
  a device or a socket named ``config.json`` never blocks the reader) and checked with
  ``fstat`` on the descriptor actually opened; anything else raises :class:`UnsafeFileError`;
- with ``root=``, the opened file must **lie inside** ``root``: its real path is read back
  from the open descriptor (``/proc/self/fd`` on Linux; elsewhere the path is opened with
  ``O_NOFOLLOW`` and its resolved parent compared), so a file swapped for a symbolic link
  after discovery (``config.json -> ~/.docker/config.json``) is refused, not read;
- JSON is decoded with a **depth limit** (orjson's, 1024 levels; the standard module's
  fallback for ``NaN``/``Infinity`` tokens is run with its ``RecursionError`` turned into
  ``ValueError``), so a line of 20,000 nested brackets is one bad line, never a crash;
- whole-file reads are **bounded** (``max_bytes``): a 10 GB ``summary.json`` is refused
  without being read.

Errors: :class:`UnsafeFileError` (an ``OSError`` subclass, so callers that already report an
unreadable file per run keep doing so) carries a short ``reason`` for the user.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import sys
from typing import Any

import orjson

__all__ = [
    "DEFAULT_MAX_BYTES",
    "UnsafeFileError",
    "inside",
    "load_json_bytes",
    "open_regular",
    "present",
    "read_json",
    "read_regular",
]

#: the largest small file (run.json, summary.json, a manifest) read whole: 64 MiB
DEFAULT_MAX_BYTES = 64 << 20

_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
_PROC_FD = "/proc/self/fd" if sys.platform.startswith("linux") else None


class UnsafeFileError(OSError):
    """A file a reader refused: not a regular file, outside the folder it was given, or too
    large. ``reason`` is a short phrase for the user (``"a FIFO, not a regular file"``);
    ``filename`` the path asked for."""

    def __init__(self, path: str | os.PathLike[str], reason: str, err: int = errno.EINVAL):
        super().__init__(err, reason, os.fspath(path))
        self.reason = reason


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a plain file"


def present(path: str | os.PathLike[str]) -> bool:
    """True when something is named ``path`` (a link counts as itself), or when that cannot
    be told (a folder of someone else's that may be listed but not searched: ``EACCES``):
    whatever is there is then read, and reported when it cannot be. ``pathlib``'s
    ``exists()``/``is_file()`` raise ``PermissionError`` there (Python < 3.12), which ended
    a whole folder listing over one colleague's folder; ``os.path.exists`` says False, which
    would hide it."""
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except (OSError, ValueError):
        return True
    return True


def inside(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> bool:
    """True when the real path of ``path`` is ``root``'s real path or below it (symbolic
    links resolved on both sides)."""
    real = os.path.realpath(path)
    base = os.path.realpath(root)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def _opened_path(fd: int) -> str | None:
    """The real path of an open descriptor (Linux), or None where it cannot be read back."""
    if _PROC_FD is None:
        return None
    try:
        target = os.readlink(f"{_PROC_FD}/{fd}")
    except OSError:
        return None
    if target.endswith(" (deleted)"):
        target = target[: -len(" (deleted)")]
    return target if target.startswith(os.sep) else None


def open_regular(
    path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None
) -> int:
    """Open ``path`` for reading and return the descriptor, only if it is a regular file
    (and, with ``root``, only if the file opened lies inside ``root``).

    Never blocks on a FIFO or device (``O_NONBLOCK``; a regular file ignores it). The caller
    closes the descriptor.

    Raises:
        FileNotFoundError, PermissionError, OSError: as ``os.open`` does.
        UnsafeFileError: not a regular file, or outside ``root``.
    """
    flags = _FLAGS
    if root is not None and _PROC_FD is None:
        flags |= _NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and flags & _NOFOLLOW:
            raise UnsafeFileError(path, "a symbolic link", errno.ELOOP) from None
        if exc.errno == errno.ENXIO:  # a socket file
            raise UnsafeFileError(path, "a socket, not a regular file", errno.ENXIO) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafeFileError(path, f"{_kind(mode)}, not a regular file")
        if root is not None:
            real = _opened_path(fd)
            if real is None:
                real = os.path.join(
                    os.path.realpath(os.path.dirname(os.path.abspath(path))), os.path.basename(path)
                )
            base = os.path.realpath(root)
            if not (real == base or real.startswith(base.rstrip(os.sep) + os.sep)):
                raise UnsafeFileError(path, f"outside {base} (a symbolic link?)", errno.EXDEV)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(
    path: str | os.PathLike[str],
    *,
    root: str | os.PathLike[str] | None = None,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> bytes:
    """The whole content of a regular file, opened as :func:`open_regular` does.

    Raises what :func:`open_regular` raises, and :class:`UnsafeFileError` when the file holds
    more than ``max_bytes`` (None: no bound; use it only for files read in blocks).
    """
    fd = open_regular(path, root=root)
    try:
        size = os.fstat(fd).st_size
        if max_bytes is not None and size > max_bytes:
            raise UnsafeFileError(
                path, f"{size:,} bytes, larger than the {max_bytes:,} read whole", errno.EFBIG
            )
        chunks = []
        got = 0
        while True:
            want = (max_bytes + 1 - got) if max_bytes is not None else (1 << 20)
            if want <= 0:
                raise UnsafeFileError(
                    path, f"grew past the {max_bytes:,} bytes read whole", errno.EFBIG
                )
            data = os.read(fd, min(want, 1 << 20))
            if not data:
                break
            chunks.append(data)
            got += len(data)
        return b"".join(chunks)
    finally:
        os.close(fd)


def load_json_bytes(data: bytes | str) -> Any:
    """Decode one JSON document; ``NaN``/``Infinity`` tokens are accepted (the standard
    module's dialect, which our writers use for non-finite values).

    Raises ``ValueError`` for anything that is not such a document: bad syntax, invalid
    UTF-8, a lone surrogate escape, nesting deeper than 1,024 levels.
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as first:
        if isinstance(data, (bytes, bytearray, memoryview)):
            try:
                text = bytes(data).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"not UTF-8: {exc}") from None
        else:
            text = data
        if "NaN" not in text and "Infinity" not in text:
            raise ValueError(str(first)) from None
        try:
            value = json.loads(text)
        except RecursionError:
            raise ValueError("nested too deeply") from None
        except ValueError as exc:
            raise ValueError(str(exc)) from None
        if _SURROGATE.search(text):  # orjson refuses a lone surrogate escape; so do we
            try:
                json.dumps(value, ensure_ascii=False).encode("utf-8")
            except (UnicodeEncodeError, RecursionError):
                raise ValueError("holds a lone surrogate escape") from None
        return value


def read_json(
    path: str | os.PathLike[str],
    *,
    root: str | os.PathLike[str] | None = None,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> Any:
    """A small JSON file (``run.json``, ``summary.json``, a manifest), read as
    :func:`read_regular` reads it and decoded as :func:`load_json_bytes` decodes it.

    Raises ``OSError`` (:class:`UnsafeFileError` included) when it cannot be read and
    ``ValueError`` when it is not JSON.
    """
    return load_json_bytes(read_regular(path, root=root, max_bytes=max_bytes))
