"""PNG bytes from pixels and back, with zlib and NumPy alone (docs/media.md "Images").

Our own encoder, not Pillow's: the same pixels give the same bytes on every machine and
every Pillow version, so an image's SHA-256 (its file name under ``media/``) depends on the
pixels only. Every row uses the "Up" filter (the difference with the row above), which
compresses photographs and plots well at a fraction of an adaptive filter's cost.

The decoder reads any 8-bit, non-interlaced PNG of colour type 0 (grey), 2 (RGB),
4 (grey + alpha) or 6 (RGBA) with any of the five filters: everything this encoder writes,
and most PNGs other tools write. Anything else raises ``ValueError``.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

__all__ = ["decode_png", "encode_png", "png_size"]

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: channels -> PNG colour type
_COLOR_TYPE = {1: 0, 2: 4, 3: 2, 4: 6}
_CHANNELS = {v: k for k, v in _COLOR_TYPE.items()}
#: the largest side accepted (PNG allows 2**31 - 1; a bigger image is a mistake here)
MAX_SIDE = 1 << 15


def _chunk(kind: bytes, data: bytes) -> bytes:
    return (
        struct.pack(">I", len(data))
        + kind
        + data
        + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    )


def encode_png(pixels: Any, level: int = 6) -> bytes:
    """PNG bytes of ``pixels``: a ``uint8`` NumPy array of shape (H, W) or (H, W, C), C in
    1 (grey), 2 (grey + alpha), 3 (RGB), 4 (RGBA).

    Raises:
        ValueError: another dtype, shape or a side of 0 or above 32,768 pixels.
    """
    import numpy as np

    a = np.asarray(pixels)
    if a.dtype != np.uint8:
        raise ValueError(f"encode_png takes uint8 pixels, got dtype {a.dtype}")
    if a.ndim == 2:
        a = a[:, :, None]
    if a.ndim != 3 or a.shape[2] not in _COLOR_TYPE:
        raise ValueError(f"encode_png takes (H, W) or (H, W, C) with C in 1-4, got {a.shape}")
    h, w, c = a.shape
    if not (0 < h <= MAX_SIDE and 0 < w <= MAX_SIDE):
        raise ValueError(f"image size {w}x{h} is not valid: each side in 1..{MAX_SIDE}")
    rows = np.ascontiguousarray(a).reshape(h, w * c)
    up = rows.copy()
    up[1:] -= rows[:-1]  # uint8 wraps modulo 256, as the filter wants
    raw = np.empty((h, w * c + 1), dtype=np.uint8)
    raw[:, 0] = 2  # filter type "Up" on every row
    raw[:, 1:] = up
    header = struct.pack(">IIBBBBB", w, h, 8, _COLOR_TYPE[c], 0, 0, 0)
    return (
        _SIGNATURE
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(raw.tobytes(), level))
        + _chunk(b"IEND", b"")
    )


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's header.

    Raises:
        ValueError: ``data`` does not start like a PNG.
    """
    if len(data) < 24 or not data.startswith(_SIGNATURE) or data[12:16] != b"IHDR":
        raise ValueError("not a PNG file (no PNG signature and IHDR header)")
    w, h = struct.unpack(">II", data[16:24])
    return int(w), int(h)


def _unfilter(raw: Any, h: int, stride: int, bpp: int) -> Any:
    import numpy as np

    out = np.zeros((h, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.uint8)
    for y in range(h):
        ft = raw[y, 0]
        line = raw[y, 1:]
        if ft == 0:
            cur = line.copy()
        elif ft == 2:
            cur = line + prev
        elif ft in (1, 3, 4):
            cur = np.zeros(stride, dtype=np.uint8)
            lp = line.astype(np.int32)
            pv = prev.astype(np.int32)
            for x in range(stride):  # byte-serial filters: slow, only for foreign files
                a = int(cur[x - bpp]) if x >= bpp else 0
                b = int(pv[x])
                if ft == 1:
                    pred = a
                elif ft == 3:
                    pred = (a + b) // 2
                else:
                    cc = int(pv[x - bpp]) if x >= bpp else 0
                    p = a + b - cc
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - cc)
                    pred = a if pa <= pb and pa <= pc else (b if pb <= pc else cc)
                cur[x] = (int(lp[x]) + pred) & 0xFF
        else:
            raise ValueError(f"PNG row {y} has an unknown filter type {int(ft)}")
        out[y] = cur
        prev = cur
    return out


def decode_png(data: bytes, max_pixels: int = 1 << 28) -> Any:
    """The pixels of a PNG as a ``uint8`` array (H, W, C) (see the module docstring for
    what it reads).

    Raises:
        ValueError: not a PNG, a kind it does not read, a damaged file, or more than
            ``max_pixels`` pixels.
    """
    import numpy as np

    w, h = png_size(data)
    pos = 8
    idat = []
    header = None
    while pos + 8 <= len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + n]
        if len(body) != n:
            raise ValueError("PNG chunk truncated")
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        pos += 12 + n
    if header is None:
        raise ValueError("PNG without IHDR")
    _, _, depth, ctype, _, _, interlace = header
    if depth != 8 or ctype not in _CHANNELS or interlace != 0:
        raise ValueError(
            f"PNG kind not read here (bit depth {depth}, colour type {ctype}, "
            f"interlace {interlace}): 8-bit grey/RGB/RGBA, not interlaced"
        )
    if w * h > max_pixels or w == 0 or h == 0:
        raise ValueError(f"PNG size {w}x{h} is outside 1..{max_pixels} pixels")
    c = _CHANNELS[ctype]
    stride = w * c
    d = zlib.decompressobj()
    raw_bytes = d.decompress(b"".join(idat), h * (stride + 1) + 1)
    if len(raw_bytes) != h * (stride + 1):
        raise ValueError("PNG image data has the wrong length")
    raw = np.frombuffer(raw_bytes, dtype=np.uint8).reshape(h, stride + 1)
    return _unfilter(raw, h, stride, c).reshape(h, w, c)
