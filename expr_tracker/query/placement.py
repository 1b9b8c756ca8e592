"""An output written under a temporary name beside it, then renamed into place, or refused:
how ``et export`` and ``et query -o`` place what they write.

A :class:`Placement` names the temporary ``.NAME.HOST.PID.partial`` beside the output
(:func:`temp_beside`), removes what a killed writer of the same output on this host left
there (:func:`remove_stale_partials`), and at the end either renames the finished file or
folder into place (:meth:`Placement.commit`) or removes it (:meth:`Placement.abort`), so an
interrupted write never leaves a complete-looking output, nor a half-written one under its
name.

Without ``overwrite``, an output that appeared while it was written is never replaced: a
file is linked into place (which fails when one exists), a folder renamed (which fails onto
a non-empty one), and :class:`OutputAppeared` is raised. With ``overwrite``, a file replaces
a file (``os.replace``); a folder is replaced only when the caller's ``replaceable`` check
allows it (``et export`` replaces an earlier export and nothing else); without one, a
folder is not replaced (``os.replace`` refuses it, an ``OSError``).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

__all__ = ["OutputAppeared", "Placement", "remove", "remove_stale_partials", "temp_beside"]


class OutputAppeared(FileExistsError):
    """The output did not exist when the write began and does now (a write without
    ``overwrite``): it is left as it is."""


def _host() -> str:
    import socket

    return re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname())[:64] or "host"


def temp_beside(path: Path) -> Path:
    """``.NAME.HOST.PID.partial`` beside ``path``: where ``path`` is written.

    Raises:
        IsADirectoryError: ``path`` names no file or folder of its own (``.``, ``..``,
            ``/``): nothing can be renamed onto it.
    """
    if path.name in ("", ".."):
        raise IsADirectoryError(errno.EISDIR, "names no file of its own", str(path))
    return path.with_name(f".{path.name}.{_host()}.{os.getpid()}.partial")


def remove_stale_partials(path: Path) -> list[Path]:
    """Remove what a writer of ``path`` killed before it finished left beside it: entries
    named as :func:`temp_beside` names them (or ``.NAME.PID.partial``, as earlier versions
    did) whose process, on this host, is gone. Nothing else is touched; a writer of another
    host or still running keeps its own. Returns what was removed."""
    pattern = re.compile(
        rf"^\.{re.escape(path.name)}\.(?:(?P<host>[A-Za-z0-9_-]+)\.)?(?P<pid>[0-9]+)\.partial$"
    )
    removed: list[Path] = []
    try:
        names = os.listdir(path.parent if str(path.parent) else ".")
    except OSError:
        return removed
    host = _host()
    for name in names:
        m = pattern.match(name)
        if m is None or (m.group("host") not in (None, host)):
            continue
        pid = int(m.group("pid"))
        if pid == os.getpid() or _alive(pid):
            continue
        stale = path.with_name(name)
        remove(stale)
        removed.append(stale)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    except OSError:
        return False
    return True


def remove(p: Path) -> None:
    """Remove the file, link or folder ``p`` (nothing when there is none)."""
    if not os.path.lexists(p):  # (unlink on a read-only mount fails with EROFS, not ENOENT)
        return
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        try:
            p.unlink()
        except FileNotFoundError:
            pass


class Placement:
    """Writing ``path`` through :attr:`tmp`, a temporary name beside it.

    Made before the write: a stale temporary of this process is removed, and those of
    writers of ``path`` on this host that are gone. ``replaceable(path)``, with
    ``overwrite``, raises when an existing folder at ``path`` may not be replaced; it is
    called again at :meth:`commit` (the folder may have changed meanwhile)."""

    def __init__(
        self,
        path: Path,
        *,
        overwrite: bool,
        replaceable: Callable[[Path], None] | None = None,
    ) -> None:
        self.path = path
        self.overwrite = overwrite
        self.replaceable = replaceable
        self.tmp = temp_beside(path)
        remove(self.tmp)
        remove_stale_partials(path)

    def commit(self) -> None:
        """Move the finished :attr:`tmp` to ``path`` (see the module doc).

        Raises:
            OutputAppeared: without ``overwrite``, ``path`` appeared during the write.
            OSError: the rename failed (a folder in the way of a file, without
                ``replaceable``).
        """
        tmp, path = self.tmp, self.path
        if not self.overwrite:
            if tmp.is_file():
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    raise OutputAppeared(f"{path} appeared during the write") from None
                except OSError:  # no hard links here (some network file systems): rename
                    if os.path.lexists(path):
                        raise OutputAppeared(f"{path} appeared during the write") from None
                    os.rename(tmp, path)
                    return
                tmp.unlink()
                return
            try:
                os.rename(tmp, path)  # a directory: fails onto an existing non-empty one
            except OSError:
                raise OutputAppeared(f"{path} appeared during the write") from None
            return
        if not os.path.lexists(path):
            os.rename(tmp, path)
            return
        if (tmp.is_file() and path.is_file()) or self.replaceable is None:
            os.replace(tmp, path)
            return
        self.replaceable(path)  # again: it may have changed during the write
        old = path.with_name(f".{path.name}.{os.getpid()}.old")
        os.rename(path, old)
        os.rename(tmp, path)
        remove(old)

    def abort(self) -> None:
        """Remove :attr:`tmp` (what was written so far)."""
        remove(self.tmp)
