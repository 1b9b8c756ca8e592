"""Reading media back (docs/media.md "Reading media"): a reference from a row -> the file
inside the run's ``media/`` folder, checked as every reader checks a file that may come
from anyone (``history/untrusted.py``): the name must be ``media/<64 hex>.<ext>`` with a
known extension, the file opened must be a regular file inside the run's media folder (no
``..``, no symbolic link out), bounded in size, and its SHA-256 must match its name.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from expr_tracker.history.codec import decode_line
from expr_tracker.history.untrusted import UnsafeFileError, read_regular


def _sha256(data: bytes) -> Any:
    """``hashlib.sha256(data)``, hashlib loaded on first use (a run's start does not need
    OpenSSL, docs/architecture.md "Cold start")."""
    import hashlib

    return hashlib.sha256(data)


__all__ = [
    "CONTENT_TYPES",
    "MAX_READ_BYTES",
    "load_image",
    "load_table",
    "media_path",
    "read_media",
]

#: extension -> Content-Type of the files a media folder may hold
CONTENT_TYPES = {
    "png": "image/png",
    "jpg": "image/jpeg",
    "gif": "image/gif",
    "table.json": "application/json",
}
_NAME = re.compile(r"^media/([0-9a-f]{64})\.(png|jpg|gif|table\.json)$")
#: the largest media file read whole
MAX_READ_BYTES = 256 << 20


def media_path(run_dir: str | os.PathLike[str], ref: Any) -> tuple[Path, str, str]:
    """(path, sha256, extension) of a reference's file (a reference dict or its ``path``).

    Raises:
        ValueError: the reference has no path or a name that is not ``media/<sha256>.<ext>``.
    """
    rel = ref.get("path") if isinstance(ref, dict) else ref
    if not isinstance(rel, str):
        raise ValueError(f"a media reference without a path: {str(ref)[:80]!r}")
    m = _NAME.match(rel)
    if m is None:
        raise ValueError(
            f"media path {rel[:80]!r} is not valid: media/<sha256>.<png|jpg|gif|table.json>"
        )
    return Path(run_dir) / rel, m.group(1), m.group(2)


def read_media(run_dir: str | os.PathLike[str], ref: Any) -> tuple[bytes, str]:
    """The bytes of a reference's file and its Content-Type, checked (module docstring).

    Raises:
        ValueError: a bad name, or content whose SHA-256 is not its name.
        OSError: missing, unreadable, not a regular file, outside the media folder
            (:class:`~expr_tracker.history.untrusted.UnsafeFileError`), or too large.
    """
    path, sha, ext = media_path(run_dir, ref)
    root = Path(run_dir) / "media"
    if root.is_symlink():
        raise UnsafeFileError(root, "a symbolic link, not the run's media folder")
    data = read_regular(path, root=root, max_bytes=MAX_READ_BYTES)
    if _sha256(data).hexdigest() != sha:
        raise ValueError(f"{path}: its content does not match its SHA-256 name")
    return data, CONTENT_TYPES[ext]


def load_image(run_dir: str | os.PathLike[str], ref: Any) -> Any:
    """The pixels of an image reference as a ``uint8`` NumPy array (H, W, C).

    PNG files are decoded here; JPEG and GIF need Pillow.

    Raises: what :func:`read_media` raises; ValueError for a file that cannot be decoded.
    """
    data, ctype = read_media(run_dir, ref)
    if ctype == "image/png":
        from expr_tracker.media.png import decode_png

        return decode_png(data)
    import io

    import numpy as np
    from PIL import Image as PILImage

    with PILImage.open(io.BytesIO(data)) as img:
        a = np.asarray(img.convert("RGBA" if "A" in img.mode else "RGB"))
    return a


def load_table(run_dir: str | os.PathLike[str], ref: Any, output_type: str = "pandas") -> Any:
    """A table reference's content: a pandas DataFrame (``output_type="pandas"``) or the
    dict ``{"columns": [...], "data": [[...], ...]}`` (``"dict"``); image cells are their
    reference dicts.

    Raises: what :func:`read_media` raises; ValueError for a bad ``output_type`` or a file
    that is not a table.
    """
    if output_type not in ("pandas", "dict"):
        raise ValueError(f"output_type={output_type!r} is not valid: 'pandas' or 'dict'")
    data, ctype = read_media(run_dir, ref)
    if ctype != "application/json":
        raise ValueError(f"{ref.get('path') if isinstance(ref, dict) else ref}: not a table")
    table = decode_line(data)
    if (
        not isinstance(table, dict)
        or not isinstance(table.get("columns"), list)
        or not isinstance(table.get("data"), list)
    ):
        raise ValueError("a table file without columns and data")
    if output_type == "dict":
        return table
    import pandas as pd

    return pd.DataFrame(table["data"], columns=table["columns"])
