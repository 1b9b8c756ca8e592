"""Crash recovery of a producer file: the one-writer lock, torn-tail repair and rescan.

- an exclusive ``flock`` on ``<file>.lock`` (holding the pid) keeps a second live process
  from appending to the same file (:class:`~expr_tracker.errors.RunLockedError`); lock
  descriptors are tracked and a forked child closes its copies (never ``LOCK_UN``, so the
  parent's lock stays held);
- opening an existing file repairs a torn last line and rescans from the last trusted
  index anchor when the sidecar disagrees with the file size; a file found shorter than
  written (truncated by another process) is repaired and rescanned the same way
  (:func:`repair_truncated`), and a file deleted under the writer is recreated with its
  directory and lock (:func:`recreate`).

The functions taking a :class:`FileState` (what a
:class:`~expr_tracker.history.writer.JsonlWriter` knows of its file, owned by the writer)
update it in place: descriptors, ``size``, ``lines``, steps, ``index``.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
from dataclasses import dataclass, field
from itertools import accumulate, islice
from operator import le, lt
from pathlib import Path
from typing import Any, cast

from expr_tracker._warn import Warner
from expr_tracker.errors import RunLockedError
from expr_tracker.history.codec import decode_line, is_step
from expr_tracker.history.paths import hostname
from expr_tracker.history.reader import META_SCHEMA, last_line_end

log = logging.getLogger("expr_tracker")

try:  # POSIX only; elsewhere the one-writer rule is not enforced
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


# --------------------------------------------------------------------------- lock

#: descriptors of the one-writer locks this process holds -> (st_dev, st_ino) of the lock file
_LOCK_FDS: dict[int, tuple[int, int]] = {}


def track_lock_fd(fd: int | None) -> None:
    """Remember ``fd`` as holding a one-writer lock, so a forked child closes its copy."""
    if fd is None:
        return
    try:
        st = os.fstat(fd)
    except OSError:
        return
    _LOCK_FDS[fd] = (st.st_dev, st.st_ino)


def release_lock_fd(fd: int) -> None:
    """Close a lock descriptor from :func:`acquire_lock` (the lock is released once no
    descriptor of its open file is left). Never raises."""
    _LOCK_FDS.pop(fd, None)
    try:
        os.close(fd)
    except OSError:
        pass


def _close_inherited_locks() -> None:
    """In a forked child: close the copies of the parent's lock descriptors, so a child that
    outlives a killed parent does not keep the run locked. ``flock`` locks belong to the
    open file description both descriptors share: closing the child's copy leaves the
    parent's lock held (nothing here calls ``LOCK_UN``, which would release it for both)."""
    for fd, ident in list(_LOCK_FDS.items()):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == ident:  # still the lock file, not a reused number
            try:
                os.close(fd)
            except OSError:
                pass
    _LOCK_FDS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_inherited_locks)


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def lock_path_of(path: str | os.PathLike[str]) -> Path:
    """The one-writer lock file of a producer file: ``<path>.lock``."""
    p = Path(path)
    return p.with_name(p.name + ".lock")


def acquire_lock(path: str | os.PathLike[str]) -> tuple[int | None, bool]:
    """Take the one-writer lock of ``path``: an exclusive, non-blocking ``flock`` on
    ``<path>.lock``, which then holds ``pid=... host=...``.

    Returns ``(fd, created)``: the descriptor holding the lock (closing it releases the
    lock) and whether this call created the lock file; ``(None, False)`` where ``flock``
    does not exist. A lock file removed between opening and locking it (an undone attempt
    removes the lock file it created) is opened again, so two processes never hold locks
    on two different files of one name.

    Raises:
        RunLockedError: another live process holds the lock; nothing was written.
        FileNotFoundError: the directory does not exist.
        OSError: the lock file cannot be created or opened.
    """
    if fcntl is None:
        return None, False
    lock_path = lock_path_of(path)
    for _ in range(100):
        created = False
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            created = True
        except FileExistsError:
            # a runs folder may come from someone else: a lock file planted as a symlink (to
            # a file of the writer's) is never followed, a FIFO never blocks, and neither is
            # truncated (docs/streams.md "Run identity")
            try:
                fd = os.open(lock_path, os.O_RDWR | _NOFOLLOW | _NONBLOCK)
            except FileNotFoundError:
                continue  # removed in between: create it again
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
                raise OSError(
                    errno.ELOOP,
                    f"the lock file {lock_path} is not a regular file (a symbolic link); "
                    "it was left alone: remove it if this run folder is yours",
                ) from None
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise OSError(
                    errno.EINVAL,
                    f"the lock file {lock_path} is not a regular file; it was left alone: "
                    "remove it if this run folder is yours",
                ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            try:
                holder = os.pread(fd, 256, 0).decode("utf-8", "replace").strip() or "?"
            except OSError:
                holder = "?"
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                if _held_here(holder):
                    raise RunLockedError(
                        f"{path} is being written by a run open in this process (pid="
                        f"{os.getpid()}: the current run, or an et.Run); nothing of it was "
                        "touched. Finish that run first (run.finish()), or give this one "
                        "another name (name=...) or its own stream (stream=...)"
                    ) from None
                raise RunLockedError(
                    f"{path} is being written by another live process "
                    f"({_describe_holder(holder, lock_path)}); nothing "
                    "of it was touched. A different experiment needs another name "
                    "(et.init(name=...)); for this same run, wait for that process to finish "
                    "(a later start resumes it); a second producer of the same experiment "
                    "(an evaluator, a data worker) logs to its own stream "
                    "(et.init(stream=...))"
                ) from None
            raise
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lock_path))
        except OSError:
            same = False
        if not same:  # we locked a file that was removed meanwhile: not the lock any more
            os.close(fd)
            continue
        track_lock_fd(fd)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid={os.getpid()} host={hostname()}\n".encode(), 0)
        except OSError:
            pass
        return fd, created
    raise OSError(errno.EAGAIN, f"the lock file {lock_path} keeps being replaced")


def _held_here(holder: str) -> bool:
    """True when the lock file names this very process (``pid=N host=H``)."""
    fields = dict(part.split("=", 1) for part in holder.split() if "=" in part)
    return fields.get("pid") == str(os.getpid()) and fields.get("host") == hostname()


def _describe_holder(holder: str, lock_path: Path) -> str:
    """``pid=N host=H`` from the lock file; where that pid is dead on this host, the lock is
    held by a process that inherited the descriptor (a forked child still running)."""
    fields = dict(part.split("=", 1) for part in holder.split() if "=" in part)
    try:
        pid = int(fields.get("pid", ""))
    except ValueError:
        return holder
    if fields.get("host") != hostname():
        return holder
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return (
            f"{holder}, which has exited: the lock is held by a process that inherited it "
            f"from pid {pid} (a forked child still running?); find it with "
            f"`fuser -v {lock_path}` or `lsof {lock_path}`"
        )
    except OSError:
        pass
    return holder


def take_lock(path: Path, warner: Warner) -> int | None:
    """:func:`acquire_lock` for a writer: an ``OSError`` (the lock file cannot be
    created) is warned about once and no lock is held (None); ``RunLockedError``
    propagates."""
    try:
        return acquire_lock(path)[0]
    except OSError as exc:
        warn_io(warner, path, exc, "create the lock file for")
        return None


def warn_io(warner: Warner, path: Path, exc: OSError, what: str) -> None:
    """The one warning (once per file and action) of a writer that cannot do ``what``."""
    warner.warn(
        ("io", str(path), what),
        "expr_tracker: cannot %s %s (%s); training continues, records stay in memory "
        "and are retried (warned once)",
        what,
        path,
        exc.strerror or exc,
    )


# --------------------------------------------------------------------------- the file's state


@dataclass(slots=True)
class FileState:
    """What a writer knows of its file: the descriptors it holds, and what is on disk.

    Owned by the writer, changed under its I/O lock (or while it is made): ``fd`` (the
    append descriptor; None until the first write creates the file), ``lock_fd`` (the
    one-writer lock), ``size`` and ``lines`` written so far, the steps seen (``last_step``,
    ``max_step``, ``sorted``, ``has_duplicate_steps``), ``index`` (one ``[step, line,
    offset]`` anchor every ``index_every`` lines), ``meta_dirty`` (the sidecar is behind),
    and the repairs counted (``recreated``, ``truncations``).
    """

    path: Path
    index_every: int
    fd: int | None = None
    lock_fd: int | None = None
    size: int = 0
    lines: int = 0
    last_step: int | None = None
    max_step: int | None = None
    sorted: bool = True
    has_duplicate_steps: bool = False
    index: list[list[int]] = field(default_factory=list)
    meta_dirty: bool = False
    recreated: int = 0  # times the file was recreated after being deleted
    truncations: int = 0  # times the file was found shorter than written

    def note_step(self, step: int | None, line_no: int, offset: int) -> None:
        """Line ``line_no`` (at byte ``offset``) holds ``step``."""
        if line_no % self.index_every == 0 and step is not None:
            self.index.append([step, line_no, offset])
        if step is None:
            return
        if self.max_step is not None:
            if step <= self.max_step:
                self.has_duplicate_steps = self.has_duplicate_steps or step == self.last_step
                if step < self.max_step:
                    self.sorted = False
                    self.has_duplicate_steps = True  # conservative: it may repeat one
            if step > self.max_step:
                self.max_step = step
        else:
            self.max_step = step
        self.last_step = step

    def note_batch(
        self, batch: list[bytes], steps: list[int | None], line_no: int, offset: int
    ) -> tuple[int, int]:
        """:meth:`note_step` for each line of ``batch`` (written from line ``line_no``, byte
        ``offset``, one newline after each); returns the line number and byte offset after
        it. Steps that never fall, from ``max_step`` on (a metrics file's rising steps, a
        span file's records, several a step), are noted without a Python call per line:
        the writer thread then holds the GIL a shorter while. A step equal to the one
        before it marks ``has_duplicate_steps``, as :meth:`note_step` does."""
        k = len(batch)
        if k and None not in steps:
            known = cast("list[int]", steps)  # no None among them
            top = self.max_step
            first_step = known[0]
            if top is None or first_step >= top:
                rising = k == 1 or all(map(lt, known, islice(known, 1, None)))
                if not rising and all(map(le, known, islice(known, 1, None))):
                    self.has_duplicate_steps = True  # a step repeats in the batch
                    rising = True
                if rising and top is not None and first_step == top:
                    self.has_duplicate_steps = True  # the batch goes on with the last step
            else:
                rising = False
            if rising:
                every = self.index_every
                first = -line_no % every  # the batch's first anchor line (relative)
                if first < k:
                    ends = list(accumulate(map(len, batch), initial=0))
                    index = self.index
                    for j in range(first, k, every):
                        index.append([known[j], line_no + j, offset + ends[j] + j])
                self.max_step = self.last_step = known[-1]
                return line_no + k, offset + sum(map(len, batch)) + k
        note = self.note_step
        for line, step in zip(batch, steps, strict=True):
            note(step, line_no, offset)
            offset += len(line) + 1
            line_no += 1
        return line_no, offset

    def saved(self) -> tuple[Any, ...]:
        """What a write changes, to :meth:`restore` if it does not complete."""
        return (
            self.size,
            self.lines,
            len(self.index),
            self.last_step,
            self.max_step,
            self.sorted,
            self.has_duplicate_steps,
            self.meta_dirty,
        )

    def restore(self, saved: tuple[Any, ...]) -> None:
        """Back to :meth:`saved` (the caller cuts the file back to ``size``)."""
        (
            self.size,
            self.lines,
            nindex,
            self.last_step,
            self.max_step,
            self.sorted,
            self.has_duplicate_steps,
            self.meta_dirty,
        ) = saved
        del self.index[nindex:]

    def forget(self) -> None:
        """Nothing of the file is known: it is new (recreated)."""
        self.size = self.lines = 0
        self.index = []
        self.last_step = self.max_step = None
        self.sorted, self.has_duplicate_steps = True, False
        self.meta_dirty = True


# --------------------------------------------------------------------------- open / repair / rescan


def open_existing(f: FileState, meta_path: Path | None, warner: Warner) -> None:
    """Repair, measure and open an existing file for appending (a new one waits for the
    first write)."""
    if f.path.exists():
        size = f.path.stat().st_size
        meta = read_meta(meta_path)
        try:
            size = repair_torn_tail(f.path, size)
        except OSError as exc:
            # the file cannot be written now (a read-only mount): measure its complete
            # lines without repairing it, so a resume continues after the last step on
            # disk; the fd stays closed and the first write reopens, repairs and rescans
            measure_unrepaired(f, size, meta)
            warn_io(warner, f.path, exc, "repair the torn last line of")
            return
        if meta is not None and meta.get("size") == size and meta.get("schema") == META_SCHEMA:
            f.size = size
            f.lines = int(meta.get("lines", 0))
            f.last_step = meta.get("last_step")
            f.max_step = meta.get("max_step")
            f.sorted = bool(meta.get("sorted", True))
            f.has_duplicate_steps = bool(meta.get("has_duplicate_steps", False))
            f.index = [list(a) for a in meta.get("index", [])]
        else:
            rescan(f, size, meta)
        f.fd = os.open(f.path, os.O_WRONLY | os.O_APPEND)
    # a new file is created by the first write, so a producer that records nothing
    # (a stream without spans) leaves no empty file behind


def measure_unrepaired(f: FileState, size: int, meta: dict[str, Any] | None) -> None:
    """Line count and steps of the complete lines of a file whose torn last line could
    not be repaired; a last line that is a whole record without its newline counts."""
    with open(f.path, "rb") as fh:
        fh.seek(max(0, size - 1))
        if size == 0 or fh.read(1) == b"\n":
            complete, fragment = size, b""
        else:
            complete = last_line_end(fh, size)
            fh.seek(complete)
            fragment = fh.read(size - complete)
    rescan(f, complete, meta)
    try:
        whole = isinstance(decode_line(fragment), dict) if fragment else False
    except ValueError:
        whole = False
    if whole:
        f.note_step(step_of(fragment), f.lines, complete)
        f.lines += 1
    f.size = complete  # the first write finds the file longer and measures it again


def read_meta(meta_path: Path | None) -> dict[str, Any] | None:
    if meta_path is None or not meta_path.exists():
        return None
    try:
        data = json.loads(meta_path.read_text("utf-8"))
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def repair_torn_tail(path: Path, size: int) -> int:
    """Terminate or cut an unterminated last line (left by a crash). Returns the size."""
    if size == 0:
        return 0
    with open(path, "rb") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return size
        start = last_line_end(f, size)  # where the torn line begins
        f.seek(start)
        fragment = f.read(size - start)
    try:
        ok = isinstance(decode_line(fragment), dict)
    except ValueError:
        ok = False
    if ok:
        with open(path, "ab") as f:
            f.write(b"\n")
        log.warning(
            "expr_tracker: %s ended without a newline (a crash mid-write); the last "
            "record was complete and is kept",
            path,
        )
        return size + 1
    os.truncate(path, start)
    log.warning(
        "expr_tracker: repaired a torn last line in %s (%d bytes of an incomplete record "
        "left by a crash were removed)",
        path,
        size - start,
    )
    return start


def rescan(f: FileState, size: int, meta: dict[str, Any] | None) -> None:
    """Recompute line count, steps and index from the last anchor that still fits."""
    anchors = [list(a) for a in (meta or {}).get("index", []) if len(a) == 3]
    start_line = start_off = 0
    kept: list[list[int]] = []
    trusted = meta is not None and meta.get("schema") == META_SCHEMA and meta.get("size", 0) <= size
    if trusted and anchors:
        with open(f.path, "rb") as fh:
            for a in anchors:
                if a[2] > size:
                    break
                if a[2] > 0:
                    fh.seek(a[2] - 1)
                    if fh.read(1) != b"\n":
                        break
                kept.append(a)
        if kept:
            start_line, start_off = kept[-1][1], kept[-1][2]
            kept = kept[:-1]
    f.index = kept
    if trusted and meta is not None and start_line > 0:
        f.last_step = None
        f.max_step = meta.get("max_step")
        f.sorted = bool(meta.get("sorted", True))
        f.has_duplicate_steps = bool(meta.get("has_duplicate_steps", False))
    else:
        f.last_step = None
        f.max_step = None
        f.sorted = True
        f.has_duplicate_steps = False
    line_no = start_line
    off = start_off
    with open(f.path, "rb") as fh:
        fh.seek(start_off)
        for raw in fh:
            if off + len(raw) > size:
                break  # a torn tail past ``size`` that could not be repaired
            step = step_of(raw)
            f.note_step(step, line_no, off)
            off += len(raw)
            line_no += 1
    f.lines = line_no
    f.size = off
    f.meta_dirty = True


def recreate(f: FileState, warner: Warner) -> None:
    """The file was unlinked under us (its run directory deleted): open a new one."""
    lost = f.lines
    if f.fd is not None:
        try:
            os.close(f.fd)
        except OSError:
            pass
    f.fd = None
    f.path.parent.mkdir(parents=True, exist_ok=True)
    if f.lock_fd is not None:  # the lock file went with the directory
        release_lock_fd(f.lock_fd)
        f.lock_fd = None
        try:
            f.lock_fd = take_lock(f.path, warner)
        except RunLockedError as exc:  # another process took the path meanwhile
            log.error("expr_tracker: %s", exc)
    f.fd = os.open(f.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    f.recreated += 1
    size = os.fstat(f.fd).st_size
    f.forget()
    if size:  # someone else created it meanwhile: measure what is there
        rescan(f, repair_torn_tail(f.path, size), None)
    warner.warn(
        ("recreated", str(f.path)),
        "expr_tracker: %s was deleted while the run was writing it (its directory was "
        "removed?); recreated it: the %d lines the deleted file held are lost, records "
        "still queued and later ones go to the new file (warned once)",
        f.path,
        lost,
    )


def repair_truncated(f: FileState, actual: int, warner: Warner) -> None:
    """The file is not as long as the writer believes: repair it and rescan."""
    believed, lines = f.size, f.lines
    rescan(f, repair_torn_tail(f.path, actual), None)
    f.truncations += 1
    warner.warn(
        ("truncated", str(f.path)),
        "expr_tracker: %s was truncated by another process (%d bytes written, %d found); "
        "repaired its last line and rescanned it (%d of %d lines left); new records "
        "are appended after it (warned once)",
        f.path,
        believed,
        actual,
        f.lines,
        lines,
    )


def step_of(raw: bytes) -> int | None:
    """The step of a line of a file (``is_step``: an int in [0, 2**63-1]), else None: a line
    written by hand with ``_step`` -7 or 2**63 is no row to a reader, nor a step to resume
    after (2**63 would leave the resumed run no step to log at)."""
    try:
        rec = decode_line(raw)
    except ValueError:
        return None
    if isinstance(rec, dict):
        s = rec.get("_step")
        if is_step(s):
            return s
    return None
