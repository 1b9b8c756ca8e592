"""Media references in mirrored rows -> the backend library's own media types (docs/media.md
"Mirrors").

A row reaches a mirror as it was written: an image is ``{"_type": "image", "path":
"media/<sha256>.png", ...}``, a histogram ``{"_type": "histogram", "path":
"media/<sha256>.npz", ...}``, a table ``{"_type": "table", "path": "media/<sha256>.parquet",
...}`` (older runs: a histogram's ``values`` and ``bins`` in the row, a table in
``.table.json``). :class:`MediaConverter` reads the files and turns them into the
library's ``Image(path, caption=)`` (the file in the run's media folder), ``Histogram(
np_histogram=(values, bins))`` and ``Table(columns=, data=)`` (image cells as ``Image``,
histogram cells as ``Histogram``); a list of image references (a gallery) into a list of
``Image``. wandb and trackio 0.43 both have these three types, with these arguments.

Files are read as every media reader reads them (:func:`expr_tracker.media.read_media`: a
``media/<sha256>.<ext>`` name, a regular file inside the run's media folder, its SHA-256
its name). The run's media thread writes a file shortly after its row: a missing file is
waited for up to :data:`FILE_WAIT_S` (on the mirror's thread, never the training loop's).
A reference that cannot be sent (a refused or missing file, a type the library lacks) is
left out of that row, with one warning per key; numbers pass through untouched (only dict
and list values are looked at).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["FILE_WAIT_S", "MediaConverter"]

#: seconds a mirror waits for a media file the run's media thread has not written yet
FILE_WAIT_S = 5.0
_KINDS = ("image", "histogram", "table")


class MediaConverter:
    """Converts one backend's rows (see the module docstring).

    Args:
        library: the imported library (``wandb``, ``trackio``): its ``Image``,
            ``Histogram`` and ``Table`` are used when it has them.
        run_dir: the run directory whose ``media/`` folder holds the files.
        warn: called with a message, once per key that cannot be sent.
        label: the backend's name, for the messages.
    """

    def __init__(
        self, library: Any, run_dir: str | Path, warn: Callable[[str], None], label: str
    ) -> None:
        self.types = {
            "image": getattr(library, "Image", None),
            "histogram": getattr(library, "Histogram", None),
            "table": getattr(library, "Table", None),
        }
        self.run_dir = Path(run_dir)
        self.warn = warn
        self.label = label
        self._warned: set[str] = set()

    def row(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """``metrics`` with its media references converted; keys that cannot be sent left
        out (one warning per key). Returns ``metrics`` itself when it holds no reference."""
        out: dict[str, Any] | None = None
        for key, value in metrics.items():
            if not isinstance(value, (dict, list)) or not _is_media(value):
                continue
            if out is None:
                out = dict(metrics)
            try:
                out[key] = self._convert(value)
            except (OSError, ValueError, TypeError, ImportError) as exc:
                del out[key]
                if key not in self._warned:
                    self._warned.add(key)
                    self.warn(
                        f"expr_tracker: the {self.label} mirror leaves {key!r} out ({exc}); "
                        "the run's own files keep it"
                    )
        return metrics if out is None else out

    def _convert(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self._convert(v) for v in value]
        kind = value["_type"]
        make = self.types[kind]
        if make is None:
            raise TypeError(f"{self.label} has no {kind.capitalize()} type")
        if kind == "histogram":
            from expr_tracker.media import load_histogram

            counts, bins = self._wait(lambda: load_histogram(self.run_dir, value))
            return make(np_histogram=(counts.astype("float64"), bins))
        if kind == "image":
            from expr_tracker.media import media_path, read_media

            self._wait(lambda: read_media(self.run_dir, value))  # name, place, SHA-256
            path = media_path(self.run_dir, value)[0]
            caption = value.get("caption")
            return make(str(path), caption=caption) if caption else make(str(path))
        from expr_tracker.media import load_table

        table = self._wait(lambda: load_table(self.run_dir, value, output_type="dict"))
        rows = [
            [self._convert(c) if isinstance(c, dict) and _is_media(c) else c for c in row]
            for row in table["data"]
        ]
        return make(columns=table["columns"], data=rows)

    def _wait(self, read: Callable[[], Any]) -> Any:
        """``read()`` (a checked read of a reference's file), retried while the file is
        missing: the run's media thread writes it shortly after the row."""
        deadline = time.monotonic() + FILE_WAIT_S
        while True:
            try:
                return read()
            except FileNotFoundError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.02)


def _is_media(value: Any) -> bool:
    if isinstance(value, list):
        return bool(value) and all(isinstance(v, dict) and _is_media(v) for v in value)
    return (
        isinstance(value, dict)
        and value.get("_type") in _KINDS
        and ("path" in value or value.get("_type") == "histogram")
    )
