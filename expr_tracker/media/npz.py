"""A histogram's file, ``media/<sha256>.npz``, and back (docs/media.md "Storage layout").

The file is an ordinary NumPy ``.npz`` (``numpy.load(path, allow_pickle=False)`` reads it):
two arrays, ``counts`` (int64, or float64 for densities) and ``edges`` (float64, one more
than the counts), little-endian, stored uncompressed: a 64-bin histogram is 1.5 KB, one
file-system block like its 1 KB deflated form, and the file is made on the caller's thread
when the histogram is logged, where zlib (which releases the GIL, handing the training
thread's time to the media writer thread) made ``log()`` slower by 2x at the median and
15x at p90 on a loaded 2-core box. We write the zip ourselves rather than through
``numpy.savez_compressed``, which stamps each member with the current time: here every
member has the same fixed date and attributes, so the same histogram gives the same bytes,
hence the same SHA-256 and file name, whenever and wherever it is logged.

The reader treats the bytes as untrusted (a run folder may be anyone's): at most
:data:`MAX_FILE_BYTES` (checked before the zip's directory is parsed), exactly the two
members, each at most :data:`MAX_MEMBER_BYTES` once inflated (read with a bound, so a zip
bomb of a planted deflated member stops at the bound), parsed by NumPy's ``.npy`` reader with ``allow_pickle=False``
(an object array is refused, never unpickled), then checked: 1-D, numeric dtypes, 1 to
:data:`MAX_BINS` counts, one more edge, all finite, edges increasing. Anything else
raises ``ValueError`` saying what is wrong.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import zipfile

__all__ = ["MAX_BINS", "MAX_FILE_BYTES", "MAX_MEMBER_BYTES", "decode_histogram", "encode_histogram"]

#: the most bins a histogram may have (as wandb)
MAX_BINS = 512
#: the largest member read back: a ``.npy`` header and MAX_BINS + 1 eight-byte values fit
#: many times over
MAX_MEMBER_BYTES = 64 << 10
#: the largest ``.npz`` read: its two members and their zip headers
MAX_FILE_BYTES = 2 * MAX_MEMBER_BYTES + 4096
_MEMBERS = ("counts.npy", "edges.npy")
#: the date every member carries (the zip format's earliest)
_EPOCH = (1980, 1, 1, 0, 0, 0)


def _npy(a: Any) -> bytes:
    import numpy as np

    buf = io.BytesIO()
    np.lib.format.write_array(buf, a, version=(1, 0), allow_pickle=False)
    return buf.getvalue()


def encode_histogram(counts: Any, edges: Any) -> bytes:
    """The ``.npz`` bytes of a histogram (deterministic: the module docstring).

    Args:
        counts: 1-D array of N counts (any integer dtype -> int64; floats -> float64).
        edges: 1-D array of N + 1 edges (-> float64).
    """
    import zipfile  # here: a run's start imports this module, not zipfile

    import numpy as np

    c = np.asarray(counts)
    c = c.astype("<i8") if c.dtype.kind in "iub" else c.astype("<f8")
    e = np.asarray(edges).astype("<f8")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, arr in zip(_MEMBERS, (c, e), strict=True):
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.compress_type = zipfile.ZIP_STORED
            info.create_system = 3  # the same on every platform
            info.external_attr = 0o644 << 16
            zf.writestr(info, _npy(np.ascontiguousarray(arr)))
    return buf.getvalue()


def _read_member(zf: zipfile.ZipFile, name: str) -> Any:
    import numpy as np

    info = zf.getinfo(name)
    if info.file_size > MAX_MEMBER_BYTES:
        raise ValueError(f"{name} is {info.file_size} bytes; at most {MAX_MEMBER_BYTES}")
    with zf.open(info) as f:
        raw = f.read(MAX_MEMBER_BYTES + 1)  # the header's size may lie: read bounded
    if len(raw) > MAX_MEMBER_BYTES:
        raise ValueError(f"{name} inflates past {MAX_MEMBER_BYTES} bytes")
    try:
        a = np.lib.format.read_array(io.BytesIO(raw), allow_pickle=False)
    except ValueError as exc:  # an object array ("allow_pickle=False"), a bad header
        raise ValueError(f"{name}: {exc}") from None
    except (OSError, EOFError, SyntaxError) as exc:
        raise ValueError(f"{name} is not a .npy array ({exc})") from None
    if a.ndim != 1 or a.dtype.kind not in "iuf" or a.dtype.itemsize > 8:
        raise ValueError(
            f"{name} holds a {a.dtype} array of shape {a.shape}; a 1-D int or float array is valid"
        )
    return a


def decode_histogram(data: bytes) -> tuple[Any, Any]:
    """``(counts, edges)`` NumPy arrays from ``.npz`` bytes, checked (the module docstring).

    Raises:
        ValueError: larger than :data:`MAX_FILE_BYTES`, not a zip, other members than ``counts.npy`` and ``edges.npy``, a
            member too large or not a numeric 1-D array (object arrays are never
            unpickled), counts and edges that do not fit, non-finite values or edges that
            decrease.
    """
    import zipfile

    import numpy as np

    if len(data) > MAX_FILE_BYTES:  # zipfile would parse every entry of a planted directory
        raise ValueError(f"a histogram .npz of {len(data)} bytes; at most {MAX_FILE_BYTES}")
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise ValueError(f"not a histogram .npz ({exc})") from None
    with zf:
        names = sorted(i.filename for i in zf.infolist())
        if names != sorted(_MEMBERS):
            shown = ", ".join(repr(n[:40]) for n in names[:5])
            raise ValueError(
                f"a histogram .npz holds counts.npy and edges.npy only, this one: {shown}"
            )
        try:
            counts = _read_member(zf, "counts.npy")
            edges = _read_member(zf, "edges.npy")
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError) as exc:
            raise ValueError(f"a damaged histogram .npz ({exc})") from None
    n = int(counts.shape[0])
    if not 1 <= n <= MAX_BINS or int(edges.shape[0]) != n + 1:
        raise ValueError(
            f"a histogram of {n} counts and {int(edges.shape[0])} edges; valid: 1..{MAX_BINS} "
            "counts and one more edge"
        )
    counts = counts.astype(np.int64) if counts.dtype.kind in "iu" else counts.astype(np.float64)
    edges = edges.astype(np.float64)
    if not (np.isfinite(counts).all() and np.isfinite(edges).all()):
        raise ValueError("a histogram with NaN or infinite counts or edges")
    if (np.diff(edges) < 0).any():
        raise ValueError("a histogram whose edges decrease")
    return counts, edges
