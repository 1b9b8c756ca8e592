"""MediaStore: a run's ``media/`` folder, and the conversion of logged values that are not
plain scalars (docs/media.md "What a row holds").

The history store calls :meth:`MediaStore.convert` only for values whose type is not
float, int, str, bool or None, so logging numbers costs what it did. ``convert`` turns

- ``et.Image`` / ``et.Histogram`` / ``et.Table`` into a reference whose file (PNG, ``.npz``,
  Parquet) is written content-addressed, ``media/<sha256>.<ext>``, by this store's own
  thread (never the training thread, never under the history lock);
- a list or tuple of ``et.Image`` (a gallery) into a list of references;
- a NumPy array or torch tensor: one element -> a float (or int/bool); more -> a
  histogram of 64 bins, with one warning per process saying so (as wandb does); beyond
  ``MAX_AUTO_ELEMENTS`` elements it is dropped with one warning (wrap it in
  ``et.Histogram`` to mean it);
- a pair ``(counts, edges)`` as ``numpy.histogram`` returns it -> a histogram;
- ``wandb.Image`` / ``wandb.Histogram`` / ``wandb.Table`` objects -> ours;
- anything else -> :func:`expr_tracker.history.codec.normalize_value`.

The folder is bounded (``max_bytes``, 10 GiB by default): a file past the bound is not
written, the value is dropped from the row, with one loud warning, counted in
``et.info()["media"]``. Files are written to a temporary name and renamed, so a reader
never sees half a file; one already there (the same content) is not written again.

Ordering (docs/media.md "Storage layout"): the run's history writer calls
:meth:`MediaStore.wait_written` before it writes a batch of rows, so a row on disk means
the files it references are on disk, unless their write failed or took longer than
``WAIT_TIMEOUT_S`` (then the rows are written anyway, with one warning). A run that logs
no media pays one integer comparison per batch: no thread hop, no lock.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from pathlib import Path
from typing import Any

from expr_tracker._warn import Warner
from expr_tracker.history.codec import normalize_value
from expr_tracker.media.types import Histogram, Image, Media, Table

__all__ = ["DEFAULT_MAX_BYTES", "MAX_AUTO_ELEMENTS", "MEDIA_DIR", "WAIT_TIMEOUT_S", "MediaStore"]

log = logging.getLogger("expr_tracker")

#: the folder under the run directory
MEDIA_DIR = "media"
#: the media folder's default bound
DEFAULT_MAX_BYTES = 10 << 30
#: the largest array ``log()`` turns into a histogram by itself
MAX_AUTO_ELEMENTS = 1 << 24
#: seconds the history writer waits for queued media files before it writes rows anyway
WAIT_TIMEOUT_S = 5.0
_STOP = object()


class MediaStore:
    """The media of one run folder (shared by its streams and ranks: names are hashes).

    Args:
        run_dir: the run directory; files go to ``run_dir/media``.
        max_bytes: the bound of the folder (files already there count).
        warner: the run's warner (one warning per cause).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        max_bytes: int = DEFAULT_MAX_BYTES,
        warner: Warner | None = None,
    ) -> None:
        self.dir = Path(run_dir) / MEDIA_DIR
        self.max_bytes = int(max_bytes)
        self.warner = warner or Warner()
        self._lock = threading.Lock()
        self._known: set[str] = set()
        self._used: int | None = None  # bytes in the folder (scanned on the first put)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._worker: threading.Thread | None = None  # the thread ever started (kept at close)
        self._closed = False
        # files handed to the thread vs files it finished (written or failed): rows wait
        # for the difference (wait_written); ``_done`` is notified under ``_lock``
        self._queued = 0
        self._done = 0
        self._cond = threading.Condition(self._lock)
        self._stalled_at = -1  # ``_done`` when a wait timed out: no wait until it moves
        self.wait_timeouts = 0
        self.files_written = 0
        self.bytes_written = 0
        self.dropped = 0
        self.write_errors = 0
        self.auto_histograms = 0

    # ------------------------------------------------------------------ files

    def _scan_locked(self) -> int:
        total = 0
        try:
            with os.scandir(self.dir) as it:
                for e in it:
                    if e.is_file(follow_symlinks=False):
                        self._known.add(e.name)
                        total += e.stat(follow_symlinks=False).st_size
        except OSError:
            pass
        return total

    def put(self, data: bytes, ext: str) -> tuple[str, str] | None:
        """Queue ``data`` for ``media/<sha256>.<ext>``; returns (relative path, sha256),
        or None when the folder's bound refuses it (one warning, counted)."""
        import hashlib

        sha = hashlib.sha256(data).hexdigest()
        name = f"{sha}.{ext}"
        rel = f"{MEDIA_DIR}/{name}"
        with self._lock:
            if self._used is None:
                self._used = self._scan_locked()
            if name in self._known:
                return rel, sha
            if self._used + len(data) > self.max_bytes:
                self.dropped += 1
                self.warner.warn(
                    ("media_bound",),
                    "expr_tracker: the run's media folder %s reached its bound of %d bytes "
                    "(media.max_bytes); media logged from now on are dropped from their rows "
                    "(warned once, counted in et.info()['media'])",
                    self.dir,
                    self.max_bytes,
                    level=logging.ERROR,
                )
                return None
            self._known.add(name)
            self._used += len(data)
            if self._closed:  # a late log() after finish: written here and now
                self._write(name, data)
                return rel, sha
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="expr_tracker-media", daemon=True
                )
                self._worker = self._thread
                self._thread.start()
            self._queued += 1  # counted before the row holding the reference is committed
        self._queue.put((name, data))
        return rel, sha

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            try:
                self._write(*item)
            finally:
                with self._cond:
                    self._done += 1
                    self._cond.notify_all()

    def wait_written(self, timeout: float | None = None) -> bool:
        """Block until every file queued before this call is written (or its write
        failed); the history writer calls it before it writes a batch of rows.

        Returns at once, True, when nothing is outstanding (a run that logs no media, or
        whose files are all written): one comparison, no lock. ``timeout`` (seconds, default
        ``WAIT_TIMEOUT_S``) bounds the wait: past it the method returns False, one warning
        is logged (counted in ``stats()["wait_timeouts"]``), and later calls do not wait
        again until the stuck write moves (a hung file system delays rows once, not at
        every flush). Returns False at once too when the media thread is gone (a forked
        child, or a close that timed out)."""
        target = self._queued
        if self._done >= target:
            return True
        worker = self._worker
        if worker is None or not worker.is_alive() or worker is threading.current_thread():
            return self._done >= target
        limit = WAIT_TIMEOUT_S if timeout is None else timeout
        with self._cond:
            if self._done == self._stalled_at:
                return False  # still stuck since the last timeout: write the rows now
            if self._cond.wait_for(lambda: self._done >= target, limit):
                return True
            self._stalled_at = self._done
            self.wait_timeouts += 1
        self.warner.warn(
            ("media_wait",),
            "expr_tracker: media files queued for %s were not written within %.1f s; the "
            "rows referencing them are written anyway and may point to files that are not "
            "on disk yet (warned once, counted in et.info()['media'])",
            self.dir,
            limit,
        )
        return False

    def _write(self, name: str, data: bytes) -> None:
        path = self.dir / name
        tmp = self.dir / f".{name}.{os.getpid()}.tmp"
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            if path.exists():
                return
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
            self.files_written += 1
            self.bytes_written += len(data)
        except OSError as exc:
            self.write_errors += 1
            with self._lock:  # not on disk: the same content logged later is tried again
                self._known.discard(name)
                if self._used is not None:
                    self._used -= len(data)
            self.warner.warn(
                ("media_write", type(exc).__name__),
                "expr_tracker: a media file could not be written to %s (%s); its row keeps "
                "the reference (warned once per cause, counted in et.info()['media'])",
                self.dir,
                exc,
            )
            try:
                tmp.unlink()
            except OSError:
                pass

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until every queued file is written; False when ``timeout`` passed first."""
        with self._lock:
            if self._thread is None:
                return True
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued and stop the thread (run at finish); later puts write
        synchronously."""
        with self._lock:
            self._closed = True
            thread = self._thread
            self._thread = None
        if thread is not None:
            self._queue.put(_STOP)
            thread.join(timeout)

    def stats(self) -> dict[str, Any]:
        """``et.info()["media"]``."""
        return {
            "dir": str(self.dir),
            "files_written": self.files_written,
            "bytes_written": self.bytes_written,
            "bytes_used": self._used or 0,
            "max_bytes": self.max_bytes,
            "dropped": self.dropped,
            "write_errors": self.write_errors,
            "wait_timeouts": self.wait_timeouts,
            "arrays_as_histograms": self.auto_histograms,
        }

    # ------------------------------------------------------------------ values

    def convert(self, value: Any, warner: Warner | None = None) -> Any:
        """What the row holds for a value that is not a plain scalar (the module
        docstring). Never raises: a failure is one warning and the value is dropped
        (None) or converted as ``normalize_value`` does."""
        w = warner or self.warner
        try:
            return self._convert(value, w)
        except Exception as exc:  # noqa: BLE001 - measuring never breaks training
            w.warn(
                ("media_convert", type(value).__name__, type(exc).__name__),
                "expr_tracker: a %s value could not be logged (%s: %s); dropped (warned once "
                "per cause)",
                type(value).__name__,
                type(exc).__name__,
                exc,
            )
            return None

    def _convert(self, value: Any, w: Warner) -> Any:
        if isinstance(value, Media):
            return value.to_ref(self)
        t = type(value)
        if t is list or t is tuple:
            if value and all(isinstance(v, Image) for v in value):
                return [v.to_ref(self) for v in value]
            if t is tuple and len(value) == 2 and _is_np_histogram(value):
                return Histogram(np_histogram=value).to_ref(self)
            return normalize_value(value, w)
        mod = t.__module__ or ""
        if mod == "numpy" or mod.startswith(("numpy.", "torch", "jax", "cupy")):
            if hasattr(value, "shape") and hasattr(value, "dtype") and not _is_type(value):
                return self._array(value, w)
        elif mod.startswith("wandb"):
            ours = _from_wandb(value)
            if ours is not None:
                return ours.to_ref(self)
        return normalize_value(value, w)

    def _array(self, value: Any, w: Warner) -> Any:
        size = 1
        for n in tuple(value.shape):
            size *= int(n)
        if size == 1:  # 0-d or one element: the number
            return normalize_value(value.reshape(()) if hasattr(value, "reshape") else value, w)
        kind = str(value.dtype)
        if not any(k in kind for k in ("float", "int", "bool")):
            return normalize_value(value, w)
        if size > MAX_AUTO_ELEMENTS:
            self.dropped += 1
            w.warn(
                ("array_too_large",),
                "expr_tracker: an array of %d elements given to log() was dropped (more than "
                "%d); wrap it in et.Histogram(...) to log its histogram, or log a summary "
                "of it (warned once)",
                size,
                MAX_AUTO_ELEMENTS,
            )
            return None
        self.auto_histograms += 1
        w.warn(
            ("array_histogram",),
            "expr_tracker: an array of shape %s given to log() is stored as a 64-bin "
            'histogram, as wandb does (docs/media.md "Arrays"); wrap it in et.Histogram(...) '
            "or et.Image(...) to say which you mean, or log .tolist() for the values "
            "(warned once)",
            tuple(int(n) for n in value.shape),
        )
        return Histogram(value).to_ref(self)


def _is_type(value: Any) -> bool:
    return isinstance(value, type)


def _is_np_histogram(pair: tuple[Any, Any]) -> bool:
    """``(counts, edges)`` of ``numpy.histogram``: two 1-D arrays, one more edge than counts."""
    a, b = pair
    for x in (a, b):
        mod = type(x).__module__ or ""
        if not (mod == "numpy" or mod.startswith("torch")) or getattr(x, "ndim", 0) != 1:
            return False
    return int(b.shape[0]) == int(a.shape[0]) + 1 and int(a.shape[0]) > 0


def _from_wandb(value: Any) -> Media | None:
    """A wandb media object as ours (``import wandb`` and ``et.log`` mixed), or None."""
    name = type(value).__name__
    if name == "Image":
        img = getattr(value, "_image", None)
        if img is not None:
            return Image(img, caption=getattr(value, "_caption", None))
        path = getattr(value, "_path", None)
        if path:
            return Image(path, caption=getattr(value, "_caption", None))
    elif name == "Histogram":
        counts, bins = getattr(value, "histogram", None), getattr(value, "bins", None)
        if counts is not None and bins is not None:
            import numpy as np

            return Histogram(np_histogram=(np.asarray(counts), np.asarray(bins)))
    elif name == "Table":
        return Table(columns=list(value.columns), data=[list(r) for r in value.data])
    return None
