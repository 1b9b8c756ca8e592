"""``et.Image``, ``et.Histogram``, ``et.Table``: values for ``et.log`` that are more than a
number (docs/media.md).

Each object does its expensive work on the caller's thread (an image is encoded to PNG
bytes when made, a histogram's counts computed when made and packed into a small ``.npz``
when logged, a table written as Parquet when logged), so logging it costs the store a file
write handed to a background thread and a small reference in the row. The reference is a
plain dict with a ``_type`` (``image``, ``histogram``, ``table``), which is what
``et.history()`` and every reader hand back (docs/media.md "Storage layout").

NumPy is imported when an object is made; pyarrow when a table is logged; torch and Pillow
only when given one of theirs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from expr_tracker.media.npz import MAX_BINS, encode_histogram
from expr_tracker.media.png import encode_png, png_size


def _sha256(data: bytes) -> Any:
    """``hashlib.sha256(data)``, hashlib loaded on first use (a run's start does not need
    OpenSSL, docs/architecture.md "Cold start")."""
    import hashlib

    return hashlib.sha256(data)


__all__ = [
    "MAX_BINS",
    "Histogram",
    "Image",
    "Media",
    "MediaSink",
    "Table",
]

#: the file kinds an image given as a path may be, by their first bytes -> extension
_MAGIC = {
    b"\x89PNG\r\n\x1a\n": "png",
    b"\xff\xd8\xff": "jpg",
    b"GIF87a": "gif",
    b"GIF89a": "gif",
}
#: Pillow's modes an image may be converted to (``mode=``)
_MODES = ("L", "LA", "RGB", "RGBA")


class MediaSink(Protocol):
    """Where a logged media object puts its file (the run's :class:`MediaStore`)."""

    def put(self, data: bytes, ext: str) -> tuple[str, str] | None:
        """Store ``data``; returns (path relative to the run folder, sha256) or None
        when it was refused (the media bound)."""
        ...


class Media:
    """Base class of the media types: :meth:`to_ref` gives what the row holds."""

    _type = "media"

    def to_ref(self, sink: MediaSink | None) -> dict[str, Any] | None:
        raise NotImplementedError


def _np() -> Any:
    import numpy as np

    return np


def _to_numpy(data: Any) -> Any:
    """NumPy view of a NumPy array, torch tensor, jax/cupy array-like or nested sequence."""
    np = _np()
    mod = type(data).__module__ or ""
    if mod.startswith("torch") and hasattr(data, "detach"):
        t = data.detach()
        if hasattr(t, "float") and str(t.dtype) in ("torch.bfloat16", "torch.float16"):
            t = t.float()
        return t.cpu().numpy()
    return np.asarray(data)


def _rescale(a: Any, field: str) -> Any:
    """uint8 pixels from an array of any numeric dtype (docs/media.md "Images")."""
    np = _np()
    if a.dtype == np.uint8:
        return a
    if a.dtype == np.bool_:
        return a.astype(np.uint8) * 255
    if a.dtype.kind == "f":
        if not np.isfinite(a).all():
            raise ValueError(f"{field}: the image holds NaN or infinite values")
        lo = float(a.min()) if a.size else 0.0
        hi = float(a.max()) if a.size else 0.0
        if lo >= 0.0 and hi <= 1.0:
            a = a * 255.0
        elif lo >= -1.0 and hi <= 1.0:
            a = (a + 1.0) * 127.5
        return np.clip(np.rint(a), 0, 255).astype(np.uint8)
    if a.dtype.kind in "iu":
        return np.clip(a, 0, 255).astype(np.uint8)
    raise ValueError(
        f"{field}: pixels of dtype {a.dtype} are not valid: uint8, bool, ints in 0..255 or "
        "floats in [0, 1] (or [-1, 1])"
    )


def _hwc(a: Any, field: str) -> Any:
    """(H, W) or (H, W, C) from HW, HWC or CHW (C in 1, 3, 4; a leading batch of 1 dropped)."""
    shape = tuple(a.shape)
    if a.ndim == 4 and shape[0] == 1:
        a = a[0]
    if a.ndim == 3:
        c_last, c_first = a.shape[2] in (1, 2, 3, 4), a.shape[0] in (1, 2, 3, 4)
        if c_first and not c_last:
            a = a.transpose(1, 2, 0)
        elif not c_last:
            raise ValueError(
                f"{field}: an image of shape {shape} is not valid: (H, W), (H, W, C) or "
                "(C, H, W) with C in 1 (grey), 2 (grey+alpha), 3 (RGB), 4 (RGBA)"
            )
        if a.shape[2] == 1:
            a = a[:, :, 0]
    elif a.ndim != 2:
        raise ValueError(
            f"{field}: an image of shape {shape} is not valid: (H, W), (H, W, C) or "
            "(C, H, W) with C in 1 (grey), 2 (grey+alpha), 3 (RGB), 4 (RGBA)"
        )
    if a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"{field}: an image of shape {shape} has no pixels")
    return a


class Image(Media):
    """An image for ``et.log`` (as ``wandb.Image``).

    Args:
        data_or_path: a NumPy array or torch tensor of shape (H, W), (H, W, C) or (C, H, W)
            (C in 1, 2, 3, 4; torch's CHW is recognised by its small first dimension), dtype
            uint8 (as is), float in [0, 1] (× 255) or [-1, 1], bool, or ints clipped to
            0..255; a PIL image; or the path of a PNG, JPEG or GIF file (its bytes stored as
            they are).
        caption: text shown under the image.
        mode: a Pillow mode (``L``, ``LA``, ``RGB``, ``RGBA``) to convert to (needs Pillow
            for anything but an array already in that number of channels).
        file_type: accepted for wandb compatibility; images are stored as PNG (a path keeps
            its own format).

    Raises:
        ValueError: a shape, dtype, value range, mode or file kind that is not valid (the
            message names it and what is valid).
        FileNotFoundError: a path that does not exist.
    """

    _type = "image"
    __slots__ = ("caption", "data", "ext", "height", "sha256", "width")
    data: bytes
    ext: str
    width: int
    height: int

    def __init__(
        self,
        data_or_path: Any,
        caption: str | None = None,
        mode: str | None = None,
        file_type: str | None = None,
        **kwargs: Any,
    ) -> None:
        if caption is not None and not isinstance(caption, str):
            caption = str(caption)
        if mode is not None and mode not in _MODES:
            raise ValueError(f"Image(mode={mode!r}) is not valid: one of {', '.join(_MODES)}")
        self.caption = caption
        if isinstance(data_or_path, Image):
            self.data, self.ext = data_or_path.data, data_or_path.ext
            self.width, self.height = data_or_path.width, data_or_path.height
        elif isinstance(data_or_path, (str, os.PathLike)):
            self._from_path(Path(data_or_path), mode)
        elif type(data_or_path).__module__.startswith("PIL."):
            self._from_pil(data_or_path, mode)
        else:
            a = _hwc(_to_numpy(data_or_path), "Image(data)")
            a = _rescale(a, "Image(data)")
            if mode is not None:
                a = _convert_mode(a, mode)
            self.data, self.ext = encode_png(a), "png"
            self.height, self.width = int(a.shape[0]), int(a.shape[1])
        self.sha256 = _sha256(self.data).hexdigest()

    def _from_pil(self, img: Any, mode: str | None) -> None:
        if mode is not None:
            img = img.convert(mode)
        elif img.mode not in _MODES:
            img = img.convert("RGBA" if "A" in img.mode or "transparency" in img.info else "RGB")
        a = _np().asarray(img)
        self.data, self.ext = encode_png(a), "png"
        self.height, self.width = int(a.shape[0]), int(a.shape[1])

    def _from_path(self, path: Path, mode: str | None) -> None:
        if not path.is_file():
            if path.exists():  # a device, a FIFO, a folder: never read (it may not end)
                raise ValueError(f"Image({str(path)!r}): not a regular file")
            raise FileNotFoundError(f"Image({str(path)!r}): no such file")
        data = path.read_bytes()
        ext = next((e for m, e in _MAGIC.items() if data.startswith(m)), None)
        if ext is None:
            raise ValueError(
                f"Image({str(path)!r}): the file is not a PNG, JPEG or GIF (by its first bytes)"
            )
        if mode is not None or ext != "png":
            try:
                from PIL import Image as PILImage
            except ImportError:
                if mode is not None:
                    raise ValueError(f"Image(mode={mode!r}) of a file needs Pillow") from None
                raise ValueError(
                    f"Image({str(path)!r}): reading a {ext.upper()} file needs Pillow "
                    "(pip install pillow); PNG files are read without it"
                ) from None
            try:
                with PILImage.open(path) as img:
                    if mode is not None:
                        self._from_pil(img, mode)
                        return
                    self.width, self.height = img.size
            except (OSError, SyntaxError, ValueError) as exc:  # Pillow's errors of a bad file
                if isinstance(exc, FileNotFoundError):
                    raise
                raise ValueError(
                    f"Image({str(path)!r}): a damaged {ext.upper()} file ({exc})"
                ) from None
            self.data, self.ext = data, ext
            return
        self.data, self.ext = data, ext
        self.width, self.height = png_size(data)

    def to_ref(self, sink: MediaSink | None) -> dict[str, Any] | None:
        ref: dict[str, Any] = {
            "_type": "image",
            "path": None,
            "sha256": self.sha256,
            "format": self.ext,
            "width": self.width,
            "height": self.height,
        }
        if sink is not None:
            put = sink.put(self.data, self.ext)
            if put is None:
                return None
            ref["path"] = put[0]
        if self.caption is not None:
            ref["caption"] = self.caption
        return ref

    def __repr__(self) -> str:
        return f"et.Image({self.width}x{self.height} {self.ext}, sha256={self.sha256[:12]})"


def _convert_mode(a: Any, mode: str) -> Any:
    channels = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4}[mode]
    have = 1 if a.ndim == 2 else a.shape[2]
    if have == channels:
        return a
    try:
        from PIL import Image as PILImage
    except ImportError:
        raise ValueError(
            f"Image(mode={mode!r}) of {have}-channel pixels needs Pillow (pip install pillow)"
        ) from None
    return _np().asarray(PILImage.fromarray(a).convert(mode))


class Histogram(Media):
    """A histogram for ``et.log`` (as ``wandb.Histogram``), stored as
    ``media/<sha256>.npz``.

    Args:
        sequence: values (a sequence, NumPy array or torch tensor of any shape, flattened);
            NaN and ±inf are left out and counted (``nonfinite`` in the row).
        np_histogram: ``(counts, edges)`` as ``numpy.histogram`` returns them
            (``len(edges) == len(counts) + 1``), instead of ``sequence``.
        num_bins: bins between the finite minimum and maximum, 1..512 (default 64).

    ``counts`` (int64, or float64 when ``np_histogram`` gave fractional counts) and ``edges``
    (float64) are NumPy arrays of N and N + 1 values. The row holds a reference
    ``{"_type": "histogram", "path", "sha256", "num_bins", "count", "min", "max"}`` (plus
    ``nonfinite`` when values were left out); the arrays are in the file
    (:func:`expr_tracker.media.load_histogram` reads them back).

    Raises:
        ValueError: both or neither of ``sequence`` and ``np_histogram``, a bad
            ``num_bins``, or counts and edges that do not fit together.
    """

    _type = "histogram"
    __slots__ = ("_data", "counts", "edges", "nonfinite")

    def __init__(
        self,
        sequence: Any = None,
        np_histogram: tuple[Any, Any] | None = None,
        num_bins: int = 64,
    ) -> None:
        np = _np()
        if (sequence is None) == (np_histogram is None):
            raise ValueError("Histogram takes one of sequence= or np_histogram=(counts, edges)")
        self.nonfinite = 0
        self._data: bytes | None = None
        if np_histogram is not None:
            if not isinstance(np_histogram, (tuple, list)) or len(np_histogram) != 2:
                raise ValueError("Histogram(np_histogram=) must be a pair (counts, edges)")
            counts = _to_numpy(np_histogram[0]).ravel()
            edges = _to_numpy(np_histogram[1]).ravel().astype(np.float64)
            if len(edges) != len(counts) + 1 or len(counts) == 0:
                raise ValueError(
                    f"Histogram(np_histogram=): {len(counts)} counts need {len(counts) + 1} "
                    f"edges, got {len(edges)}"
                )
            if len(counts) > MAX_BINS:
                raise ValueError(
                    f"Histogram(np_histogram=): {len(counts)} bins; at most {MAX_BINS}"
                )
            if not np.isfinite(edges).all() or (np.diff(edges) < 0).any():
                raise ValueError("Histogram(np_histogram=): edges must be finite and increasing")
            self.counts = _counts(counts)
            self.edges = edges
            return
        if type(num_bins) is not int or not 1 <= num_bins <= MAX_BINS:
            raise ValueError(
                f"Histogram(num_bins={num_bins!r}) is not valid: an int in 1..{MAX_BINS}"
            )
        a = _to_numpy(sequence).ravel()
        if a.dtype.kind not in "biuf":
            try:
                a = a.astype(float)
            except (TypeError, ValueError):
                raise ValueError(
                    f"Histogram(sequence): values of dtype {a.dtype} are not numbers"
                ) from None
        if a.dtype.kind == "f":
            finite = np.isfinite(a)
            if not finite.all():
                self.nonfinite = int(a.size - int(finite.sum()))
                a = a[finite]
        if a.size == 0:
            counts, edges = np.zeros(num_bins, dtype=np.int64), np.linspace(0.0, 1.0, num_bins + 1)
        else:
            a = a.astype(np.float64, copy=False)
            lo, hi = float(a.min()), float(a.max())
            if np.isfinite(hi - lo):
                try:
                    counts, edges = np.histogram(a, bins=num_bins)
                except ValueError:  # values a few ulps apart: no num_bins finite-sized bins
                    # between them; widened as NumPy widens a constant (lo - 0.5, hi + 0.5),
                    # or by enough ulps for the bins where 0.5 is below the spacing
                    half = max(0.5, 4.0 * num_bins * float(np.spacing(max(abs(lo), abs(hi)))))
                    mid = lo / 2.0 + hi / 2.0
                    counts, edges = np.histogram(a, bins=num_bins, range=(mid - half, mid + half))
            else:  # a range past float64's largest: bin halved values, double the edges
                counts, edges = np.histogram(a / 2.0, bins=num_bins)
                edges = np.clip(edges * 2.0, lo, hi)
        self.counts = counts.astype(np.int64, copy=False)
        self.edges = edges.astype(np.float64, copy=False)

    @property
    def values(self) -> list[Any]:
        """The counts as a list (ints, or floats for fractional counts)."""
        return self.counts.tolist()

    @property
    def histogram(self) -> list[Any]:
        """The counts as a list (``wandb.Histogram``'s name)."""
        return self.counts.tolist()

    @property
    def bins(self) -> list[float]:
        """The edges as a list of floats (wandb's name)."""
        return self.edges.tolist()

    @property
    def data(self) -> bytes:
        """The ``.npz`` file's bytes (deterministic: the same histogram, the same bytes)."""
        if self._data is None:
            self._data = encode_histogram(self.counts, self.edges)
        return self._data

    def to_ref(self, sink: MediaSink | None) -> dict[str, Any] | None:
        data = self.data
        total = self.counts.sum()
        ref: dict[str, Any] = {
            "_type": "histogram",
            "path": None,
            "sha256": _sha256(data).hexdigest(),
            "num_bins": int(self.counts.shape[0]),
            "count": int(total) if self.counts.dtype.kind == "i" else float(total),
            "min": float(self.edges[0]),
            "max": float(self.edges[-1]),
        }
        if sink is not None:
            put = sink.put(data, "npz")
            if put is None:
                return None
            ref["path"] = put[0]
        if self.nonfinite:
            ref["nonfinite"] = self.nonfinite
        return ref

    def __repr__(self) -> str:
        return f"et.Histogram({len(self.counts)} bins, {self.counts.sum()} values)"


def _counts(c: Any) -> Any:
    """Counts as int64 when they are whole numbers, else float64 (np_histogram may be a
    density); NaN or ±inf is an error."""
    np = _np()
    if c.dtype.kind in "biu":
        return c.astype(np.int64)
    try:
        f = c.astype(np.float64)
    except (TypeError, ValueError):
        raise ValueError(
            f"Histogram(np_histogram=): counts of dtype {c.dtype} are not numbers"
        ) from None
    if not np.isfinite(f).all():
        bad = f[~np.isfinite(f)][0]
        raise ValueError(f"Histogram(np_histogram=): count {bad!r} is not finite")
    whole = np.all(f == np.rint(f)) and np.all(np.abs(f) < 2.0**63)
    return f.astype(np.int64) if whole else f


#: column names a table's reference lists
_REF_COLUMNS = 64


def _kept_dtype(t: Any) -> Any:
    """A DataFrame column's NumPy dtype when Parquet keeps it (numbers, bools), else None."""
    np = _np()
    return t if isinstance(t, np.dtype) and t.kind in "biuf" and t.itemsize <= 8 else None


def _cell(v: Any, field: str) -> Any:
    """A table cell: a JSON scalar, or an Image (encoded now, stored when logged)."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)  # NaN and ±inf written as NaN/Infinity, as in rows
    if isinstance(v, (Image, Histogram)):
        return v
    mod = type(v).__module__ or ""
    if mod.startswith(("numpy", "torch")) and hasattr(v, "item"):
        try:
            return _cell(v.item(), field)
        except (ValueError, RuntimeError):  # an array of more than one element
            pass
    if mod.startswith("pandas") and type(v).__name__ in ("NAType", "NaTType"):
        return None  # a nullable column's missing value
    if mod.startswith("pandas") and type(v).__name__ in ("Timestamp", "Timedelta"):
        return str(v)
    if mod.startswith("PIL."):
        return Image(v)
    raise ValueError(
        f"{field}: a cell of type {type(v).__name__} is not valid: numbers, strings, bools, "
        "None, et.Image or et.Histogram"
    )


class Table(Media):
    """A table for ``et.log`` (as ``wandb.Table``), stored as ``media/<sha256>.parquet``
    (needs pyarrow).

    Args:
        columns: column names (strings; default ``col0``, ``col1`` ... from the first row).
        data: rows, each a sequence of as many cells as there are columns. A cell is a
            number, string, bool, None, an ``et.Image`` (stored as its own file, the table
            holding its reference) or an ``et.Histogram``; NumPy and torch scalars become
            numbers, PIL images become ``et.Image``.
        dataframe: a pandas DataFrame instead of ``columns`` and ``data``; its numeric and
            bool columns keep their dtypes in the file (``int32`` reads back as ``int32``).
        rows: wandb's other name of ``data``.

    The row holds ``{"_type": "table", "path", "sha256", "nrows", "ncols", "columns"}``
    (``columns``: the first 64 names); :func:`expr_tracker.media.load_table` reads the
    table back.

    Raises:
        ValueError: both ``data`` and ``dataframe``, a row of the wrong length, a column
            name that is not a string, or a cell of a type not listed above (named with
            its row and column).
    """

    _type = "table"
    __slots__ = ("columns", "data", "dtypes")

    def __init__(
        self,
        columns: Sequence[str] | None = None,
        data: Sequence[Sequence[Any]] | None = None,
        rows: Sequence[Sequence[Any]] | None = None,
        dataframe: Any = None,
        **kwargs: Any,
    ) -> None:
        if rows is not None:
            if data is not None:
                raise ValueError("Table takes data= or rows=, not both")
            data = rows
        dtypes: list[Any] | None = None
        if dataframe is not None:
            if data is not None:
                raise ValueError("Table takes data= or dataframe=, not both")
            columns = [str(c) for c in dataframe.columns]
            dtypes = [_kept_dtype(t) for t in dataframe.dtypes]
            data = dataframe.itertuples(index=False, name=None)
        # a string is a sequence too: "abc" would be three rows of one letter each
        if isinstance(data, (str, bytes)):
            raise ValueError(
                f"Table(data): rows are sequences of cells (a list of lists), got a "
                f"{type(data).__name__}"
            )
        self.dtypes = dtypes
        rows_in = []
        for i, r in enumerate(data or []):
            if isinstance(r, (str, bytes)):
                raise ValueError(
                    f"Table(data): row {i} is a {type(r).__name__}; a row is a sequence of "
                    "cells (a list), one per column"
                )
            rows_in.append(list(r))
        if columns is None:
            columns = [f"col{i}" for i in range(len(rows_in[0]) if rows_in else 0)]
        cols = list(columns)
        for c in cols:
            if not isinstance(c, str):
                raise ValueError(f"Table(columns): {c!r} is not a string")
        if len(set(cols)) != len(cols):
            raise ValueError(f"Table(columns): names repeat in {cols!r}")
        self.columns = cols
        self.data: list[list[Any]] = []
        for i, r in enumerate(rows_in):
            if len(r) != len(cols):
                raise ValueError(
                    f"Table(data): row {i} has {len(r)} cells; the table has {len(cols)} columns"
                )
            self.data.append(
                [_cell(v, f"Table(data) row {i} column {cols[j]!r}") for j, v in enumerate(r)]
            )

    def add_data(self, *cells: Any) -> None:
        """Append one row (as ``wandb.Table.add_data``).

        Raises:
            ValueError: the wrong number of cells or a cell type that is not valid.
        """
        i = len(self.data)
        if len(cells) != len(self.columns):
            raise ValueError(
                f"Table.add_data: {len(cells)} cells; the table has {len(self.columns)} columns"
            )
        self.data.append(
            [_cell(v, f"Table row {i} column {self.columns[j]!r}") for j, v in enumerate(cells)]
        )

    def to_ref(self, sink: MediaSink | None) -> dict[str, Any] | None:
        from expr_tracker.media.parquet import encode_table

        out = []
        for r in self.data:
            out.append([v.to_ref(sink) if isinstance(v, Media) else v for v in r])
        ext = "parquet"
        try:
            body = encode_table(self.columns, out, self.dtypes)
        except ImportError:
            # without pyarrow the table is kept, in the JSON file every reader still reads
            # (docs/media.md "Storage layout"): a logged table is never dropped for a library
            import json

            body = json.dumps(
                {"columns": self.columns, "data": out}, ensure_ascii=False, separators=(",", ":")
            ).encode("utf-8")
            ext = "table.json"
        from expr_tracker.media import read

        if len(body) > read.MAX_READ_BYTES:  # every reader refuses a larger file
            raise ValueError(
                f"a table file of {len(body)} bytes is not kept: at most {read.MAX_READ_BYTES} "
                "can be read back"
            )
        sha = _sha256(body).hexdigest()
        ref: dict[str, Any] = {
            "_type": "table",
            "path": None,
            "sha256": sha,
            "nrows": len(self.data),
            "ncols": len(self.columns),
            "columns": self.columns[:_REF_COLUMNS],
        }
        if sink is not None:
            put = sink.put(body, ext)
            if put is None:
                return None
            ref["path"] = put[0]
        return ref

    def __repr__(self) -> str:
        return f"et.Table({len(self.data)} rows x {len(self.columns)} columns)"
