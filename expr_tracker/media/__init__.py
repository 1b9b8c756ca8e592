"""Media for ``et.log``: images, histograms, tables, and ``et.watch`` (docs/media.md).

Imports only leaves and ``history`` (the codec, the untrusted-file reader); NumPy when a
media object is made, pyarrow when a table is logged or read, torch and Pillow only when
given theirs. The names below are imported on first use: a run's start needs only
``MediaStore`` (docs/architecture.md "Cold start").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the lazy names are, for type checkers
    from expr_tracker.media.read import (
        load_histogram,
        load_image,
        load_table,
        media_path,
        read_media,
    )
    from expr_tracker.media.store import MediaStore
    from expr_tracker.media.types import Histogram, Image, Media, Table
    from expr_tracker.media.watch import unwatch, watch

#: public name -> the module that defines it (PEP 562: imported on first use)
_LAZY = {
    "Histogram": "expr_tracker.media.types",
    "Image": "expr_tracker.media.types",
    "Media": "expr_tracker.media.types",
    "MediaStore": "expr_tracker.media.store",
    "Table": "expr_tracker.media.types",
    "load_histogram": "expr_tracker.media.read",
    "load_image": "expr_tracker.media.read",
    "load_table": "expr_tracker.media.read",
    "media_path": "expr_tracker.media.read",
    "read_media": "expr_tracker.media.read",
    "unwatch": "expr_tracker.media.watch",
    "watch": "expr_tracker.media.watch",
}

__all__ = [
    "Histogram",
    "Image",
    "Media",
    "MediaStore",
    "Table",
    "load_histogram",
    "load_image",
    "load_table",
    "media_path",
    "read_media",
    "unwatch",
    "watch",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
