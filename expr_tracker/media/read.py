"""Reading media back (docs/media.md "Reading media"): a reference from a row -> the file
inside the run's ``media/`` folder, checked as every reader checks a file that may come
from anyone (``history/untrusted.py``): the name must be ``media/<64 hex>.<ext>`` with a
known extension, the file opened must be a regular file inside the run's media folder (no
``..``, no symbolic link out), bounded in size, and its SHA-256 must match its name. The
content is then decoded by its format's own module, which checks it again
(``media/npz.py``, ``media/parquet.py``, ``media/png.py``).

Runs written before histograms and tables had files of their own still read: a histogram
reference holding ``values`` and ``bins`` in the row, a table in ``media/<sha256>.table.json``.
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
    "load_histogram",
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
    "npz": "application/zip",
    "parquet": "application/vnd.apache.parquet",
    "table.json": "application/json",  # tables of runs written before Parquet
}
_NAME = re.compile(r"^media/([0-9a-f]{64})\.(png|jpg|gif|npz|parquet|table\.json)$")
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
            f"media path {rel[:80]!r} is not valid: media/<sha256>.<png|jpg|gif|npz|parquet|table.json>"
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


def load_histogram(run_dir: str | os.PathLike[str], ref: Any) -> tuple[Any, Any]:
    """``(counts, edges)`` of a histogram reference: NumPy arrays of N counts (int64, or
    float64 for fractional counts) and N + 1 float64 edges. A reference of an older run,
    holding ``values`` and ``bins`` itself, is read without a file.

    Raises: what :func:`read_media` raises; ValueError for a reference that is not a
    histogram or a file that is not a valid histogram (``media/npz.py``).
    """
    import numpy as np

    if isinstance(ref, dict) and ref.get("path") is None and "values" in ref:
        counts, edges = ref.get("values"), ref.get("bins")
        if not isinstance(counts, list) or not isinstance(edges, list):
            raise ValueError("a histogram reference whose values and bins are not lists")
        from expr_tracker.media.types import Histogram

        try:
            h = Histogram(np_histogram=(np.asarray(counts), np.asarray(edges)))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"a histogram reference that is not valid: {exc}") from None
        return h.counts, h.edges
    data, ctype = read_media(run_dir, ref)
    if ctype != CONTENT_TYPES["npz"]:
        raise ValueError(f"{_rel(ref)}: not a histogram")
    from expr_tracker.media.npz import decode_histogram

    try:
        return decode_histogram(data)
    except ValueError as exc:
        raise ValueError(f"{_rel(ref)}: {exc}") from None


def _rel(ref: Any) -> str:
    rel = ref.get("path") if isinstance(ref, dict) else ref
    return str(rel)[:100]


def _decode_cell(text: Any) -> Any:
    return None if text is None else decode_line(text)


def load_table(run_dir: str | os.PathLike[str], ref: Any, output_type: str = "pandas") -> Any:
    """A table reference's content: a pandas DataFrame (``output_type="pandas"``) or the
    dict ``{"columns": [...], "data": [[...], ...]}`` (``"dict"``); image and histogram
    cells are their reference dicts. A table logged from a DataFrame comes back with its
    numeric and bool dtypes (``media/parquet.py``); tables of older runs
    (``.table.json``) read as before.

    Raises: what :func:`read_media` raises; ValueError for a bad ``output_type`` or a file
    that is not a table (or passes the bounds of ``media/parquet.py``); ImportError when a
    Parquet table is read without pyarrow.
    """
    if output_type not in ("pandas", "dict"):
        raise ValueError(f"output_type={output_type!r} is not valid: 'pandas' or 'dict'")
    data, ctype = read_media(run_dir, ref)
    if ctype == CONTENT_TYPES["parquet"]:
        from expr_tracker.media.parquet import decode_table

        try:
            table, json_cols = decode_table(data)
            columns = [str(c) for c in table.column_names]
            if output_type == "dict":
                cols = []
                for name, col in zip(columns, table.columns, strict=True):
                    cells = col.to_pylist()
                    cols.append([_decode_cell(c) for c in cells] if name in json_cols else cells)
                return {"columns": columns, "data": [list(r) for r in zip(*cols, strict=True)]}
            df = table.to_pandas()
            for name in json_cols:
                df[name] = [_decode_cell(c) for c in table.column(name).to_pylist()]
            return df
        except ValueError as exc:
            raise ValueError(f"{_rel(ref)}: {exc}") from None
    if ctype != CONTENT_TYPES["table.json"]:
        raise ValueError(f"{_rel(ref)}: not a table")
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
