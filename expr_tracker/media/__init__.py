"""Media for ``et.log``: images, histograms, tables, and ``et.watch`` (docs/media.md).

Imports only leaves and ``history`` (the codec, the untrusted-file reader); NumPy when a
media object is made, pyarrow when a table is logged or read, torch and Pillow only when
given theirs.
"""

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
