"""Multi-resolution summaries of one metric, so an overlay of many runs stays exact (docs/ui.md
"Overlays of many runs: exact at any zoom").

A series of ``n`` points ``(x[i], y[i])`` (``x`` ascending: steps or seconds) is summarised at
every power-of-two bucket size from :data:`LEAF` rows up: bucket ``j`` of level ``k`` covers
the rows ``[j * 2**k, (j + 1) * 2**k)`` and keeps, over its rows whose ``y`` is finite, the
minimum and maximum (with the row of each, the first of equal ones), the first and last row,
the count and the sum; and the number of its rows that are NaN, +inf and -inf (:data:`NODE`).
Levels below :data:`LEAF` are the raw rows themselves.

A chart ``P`` pixels wide over ``[lo, hi]`` asks :meth:`Pyramid.query`: the rows of each
pixel are found by binary search on ``x``, and each pixel's row range is covered by at most
two buckets per level (the segment-tree decomposition) plus at most ``2 * LEAF`` raw
rows at its edges. So a query reads ``O(P * log n)`` entries whatever ``n`` is, and each
pixel's minimum, maximum, first, last and non-finite counts are the true ones: nothing is
sampled, no extreme or NaN/inf is dropped.

Growth is append-only: :meth:`Pyramid.extend` recomputes only the buckets the new rows fall
in (the last partial bucket of each level and those after it); the result equals a build
from scratch, array for array.

Files (:meth:`Pyramid.save_at`, :func:`append_at`, :func:`load_at`) are raw columns in a
folder beside the query cache parts: the rows (``xs``, ``ys``) and each level's complete
buckets, which never change as rows are appended, named with a generation; each level's
partial last bucket lives in the small ``meta.json``, the commit point: growth writes only
past the committed lengths, then renames a new ``meta.json`` into place, so a reader or a
crash sees the old state or the new one. They are untrusted input (docs/query.md
"Security"): :func:`load_at` opens them without following links or waiting on FIFOs, checks
the meta and every size against the row count, never unpickles, and any mismatch raises
:class:`PyramidError` so the caller rebuilds.
"""

from __future__ import annotations

import base64
import errno
import json
import os
import re
import secrets
import stat
from pathlib import Path
from typing import Any

import numpy as np

from expr_tracker.history.chartprep import ChartPoints

__all__ = [
    "LEAF_LOG2",
    "LEAF",
    "NODE",
    "Pyramid",
    "PyramidError",
    "PyramidOutdated",
    "append_at",
    "build_or_load",
    "load",
    "load_at",
    "read_meta_at",
    "overlay_points",
    "pixel_points",
    "query_many",
]

#: log2 of the smallest stored bucket (smaller ones are read from the raw rows)
LEAF_LOG2 = 3
#: rows in a bucket of the lowest stored level
LEAF = 1 << LEAF_LOG2
#: runs queried together by :func:`query_many` (fewer numpy calls, arrays still in cache)
CHUNK = 8
#: version of the files; another one is rebuilt
VERSION = 2

#: one bucket: finite min/max (+inf/-inf and row -1 when the bucket has no finite row), their
#: rows (first of equal ones), first/last finite row (-1: none), finite count and sum, and the
#: NaN, +inf and -inf counts
NODE = np.dtype(
    [
        ("min", "<f8"),
        ("max", "<f8"),
        ("sum", "<f8"),
        ("imin", "<i8"),
        ("imax", "<i8"),
        ("ifirst", "<i8"),
        ("ilast", "<i8"),
        ("count", "<i8"),
        ("nan", "<i8"),
        ("pinf", "<i8"),
        ("ninf", "<i8"),
    ]
)


class PyramidError(ValueError):
    """Bad input to a pyramid (unsorted or non-finite x, mismatched lengths) or a pyramid
    folder that does not match what it claims (wrong dtype, shape, version): rebuild it."""


class PyramidOutdated(PyramidError):
    """Files of another version or leaf size (written by another release): rebuild them,
    nothing is wrong."""


def _empty(n: int) -> np.ndarray:
    out = np.zeros(n, dtype=NODE)
    out["min"] = np.inf
    out["max"] = -np.inf
    for f in ("imin", "imax", "ifirst", "ilast"):
        out[f] = -1
    return out


def _from_rows(ys: np.ndarray, idx: np.ndarray, valid: np.ndarray, base: int = 0) -> np.ndarray:
    """Summaries of each row of ``idx`` (shape ``(m, w)``, row numbers, ascending along a
    row; ``valid`` masks the cells that count); ``ys`` holds the rows from ``base`` on."""
    out = _empty(idx.shape[0])
    if idx.shape[0] == 0 or ys.shape[0] == 0:
        return out
    y = ys[np.where(valid, idx - base, 0)]
    fin = valid & np.isfinite(y)
    lo = np.where(fin, y, np.inf)
    hi = np.where(fin, y, -np.inf)
    am = lo.argmin(axis=1)
    ax = hi.argmax(axis=1)
    r = np.arange(idx.shape[0])
    cnt = fin.sum(axis=1)
    has = cnt > 0
    out["count"] = cnt
    out["sum"] = np.where(fin, y, 0.0).sum(axis=1)
    out["min"] = lo[r, am]
    out["max"] = hi[r, ax]
    out["imin"] = np.where(has, idx[r, am], -1)
    out["imax"] = np.where(has, idx[r, ax], -1)
    out["ifirst"] = np.where(has, idx[r, fin.argmax(axis=1)], -1)
    w = idx.shape[1]
    out["ilast"] = np.where(has, idx[r, w - 1 - fin[:, ::-1].argmax(axis=1)], -1)
    out["nan"] = (valid & np.isnan(y)).sum(axis=1)
    out["pinf"] = (valid & (y == np.inf)).sum(axis=1)
    out["ninf"] = (valid & (y == -np.inf)).sum(axis=1)
    return out


def _leaves(ys: np.ndarray, start: int, base: int = 0) -> np.ndarray:
    """Level-``LEAF_LOG2`` buckets from bucket ``start`` to the last row; ``ys`` holds the
    rows from ``base`` (at most ``start * LEAF``) on."""
    n = base + ys.shape[0]
    m = -(-n // LEAF)
    idx = (np.arange(start, m)[:, None] * LEAF) + np.arange(LEAF)[None, :]
    return _from_rows(ys, idx, idx < n, base)


def _merge(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Buckets ``a`` followed (in row order) by buckets ``b``, pairwise; ties keep ``a``."""
    out = a.copy()
    t = b["min"] < a["min"]
    out["min"] = np.where(t, b["min"], a["min"])
    out["imin"] = np.where(t, b["imin"], a["imin"])
    t = b["max"] > a["max"]
    out["max"] = np.where(t, b["max"], a["max"])
    out["imax"] = np.where(t, b["imax"], a["imax"])
    out["ifirst"] = np.where(a["ifirst"] >= 0, a["ifirst"], b["ifirst"])
    out["ilast"] = np.where(b["ilast"] >= 0, b["ilast"], a["ilast"])
    for f in ("sum", "count", "nan", "pinf", "ninf"):
        out[f] = a[f] + b[f]
    merged: np.ndarray = out
    return merged


def _pairs(level: np.ndarray, start: int) -> np.ndarray:
    """Parent buckets ``start ..`` of ``level`` (a last odd bucket is merged with nothing)."""
    child = level[2 * start :]
    if child.shape[0] % 2:
        child = np.concatenate([child, _empty(1)])
    return _merge(child[0::2], child[1::2])


_NF = len(NODE.names or ())  # fields of a bucket, all 8 bytes: a row of a float64 matrix
_COL = {f: k for k, f in enumerate(NODE.names or ())}


def _matrix(level: np.ndarray) -> np.ndarray:
    """``level`` (1-D of :data:`NODE`) as a ``(m, 11)`` float64 matrix (ints as their bits)."""
    return np.asarray(level).view(np.float64).reshape(-1, _NF)


def _reduce(
    rec: np.ndarray, owner: np.ndarray, a: np.ndarray, b: np.ndarray
) -> dict[str, np.ndarray]:
    """Fold the buckets ``rec`` (rows of a :func:`_matrix`) into their pixels ``owner``
    (each pixel owns at least one)."""
    order = np.argsort(owner, kind="stable")
    rec = rec[order]
    own = owner[order]
    starts = np.flatnonzero(np.concatenate(([True], own[1:] != own[:-1])))
    sizes = np.diff(np.append(starts, rec.shape[0]))
    ints = rec[:, 3:].view(np.int64)

    def col(f: str) -> np.ndarray:
        k = _COL[f]
        return rec[:, k] if k < 3 else ints[:, k - 3]

    big = np.iinfo(np.int64).max
    out: dict[str, np.ndarray] = {}
    for f, ext in (("min", np.minimum), ("max", np.maximum)):
        vals = col(f)
        v = ext.reduceat(vals, starts)
        i = col("i" + f)
        cand = np.where((vals == np.repeat(v, sizes)) & (i >= 0), i, big)
        first = np.minimum.reduceat(cand, starts)
        out[f], out["i" + f] = v, np.where(first == big, -1, first)
    i = col("ifirst")
    first = np.minimum.reduceat(np.where(i >= 0, i, big), starts)
    out["ifirst"] = np.where(first == big, -1, first)
    out["ilast"] = np.maximum.reduceat(col("ilast"), starts)
    for f in ("sum", "count", "nan", "pinf", "ninf"):
        out[f] = np.add.reduceat(col(f), starts)
    out["start"], out["stop"] = a, b
    return out


def _as_columns(xs: Any, ys: Any) -> tuple[np.ndarray, np.ndarray]:
    # copies: a view of the caller's buffer (an array.array) would stop it from growing
    x = np.array(xs, dtype=np.float64)
    y = np.array(ys, dtype=np.float64)
    if x.ndim != 1 or y.shape != x.shape:
        raise PyramidError(
            f"x and y must be 1-D of one length (got shapes {x.shape} and {y.shape})"
        )
    if x.size and not np.isfinite(x).all():
        i = int(np.flatnonzero(~np.isfinite(x))[0])
        raise PyramidError(f"x[{i}] = {x[i]!r} is not finite")
    if x.size > 1 and (np.diff(x) < 0).any():
        i = int(np.flatnonzero(np.diff(x) < 0)[0]) + 1
        raise PyramidError(f"x[{i}] = {x[i]!r} < x[{i - 1}] = {x[i - 1]!r}: x must be ascending")
    return x, y


def _tails(
    ytail: np.ndarray, old_n: int, n: int, full: list[np.ndarray]
) -> list[tuple[int, np.ndarray]]:
    """The buckets that change when rows ``[old_n, n)`` are appended, per level ``k``:
    ``(s, buckets)``, the buckets from ``s`` (the number of complete buckets of ``old_n``
    rows at that level) to the last one. ``ytail`` holds the rows from
    ``old_n // LEAF * LEAF`` to ``n``; ``full`` the complete buckets of the old levels
    (only the last of them is read)."""
    start = old_n // LEAF
    t = _leaves(ytail, start, start * LEAF)
    out = [(start, t)]
    for _ in range(1, len(_levels_for(n))):
        s = start // 2
        if 2 * s < start:  # the complete left child of the first changed parent
            t = np.concatenate([np.asarray(full[len(out) - 1][2 * s : start]), t])
        t = _pairs(t, 0)
        out.append((s, t))
        start = s
    return out


def _split(n: int, tails: list[tuple[int, np.ndarray]]) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """``(s, new complete buckets, the partial one)`` per level of ``_tails`` for ``n`` rows."""
    out = []
    for k, (s, t) in enumerate(tails):
        f = n // (LEAF << k)  # complete buckets of n rows at level k
        out.append((s, t[: f - s], t[f - s :]))
    return out


class Pyramid:
    """The summaries of one series (see the module doc).

    Each level is kept as its complete buckets (``full[k]``, which never change as rows are
    appended) and its last, partial bucket (``part[k]``, 0 or 1 of them);
    :attr:`levels` joins them.

    Args:
        xs: x of each row, ascending, finite (steps or seconds); shape ``(n,)``.
        ys: y of each row (NaN and ±inf allowed); shape ``(n,)``.

    Raises:
        PyramidError: lengths differ, an x is not finite, or ``xs`` is not ascending.
    """

    def __init__(self, xs: Any = (), ys: Any = ()) -> None:
        self.xs, self.ys = _as_columns(xs, ys)
        self.full: list[np.ndarray] = []  # full[k]: complete buckets of 2 ** (LEAF_LOG2 + k)
        self.part: list[np.ndarray] = []  # part[k]: the last bucket when partial (0 or 1)
        self.meta: dict[str, Any] = {}  # the meta.json it was loaded with (load_at)
        self._apply(_split(self.n, _tails(self.ys, 0, self.n, [])))

    @property
    def n(self) -> int:
        """Rows summarised."""
        return int(self.xs.shape[0])

    @property
    def levels(self) -> list[np.ndarray]:
        """Every level's buckets (level ``k``: ``ceil(n / 2 ** (LEAF_LOG2 + k))`` of
        :data:`NODE`), joined from :attr:`full` and :attr:`part` (a copy when partial)."""
        return [
            np.concatenate([f, p]) if p.shape[0] else f
            for f, p in zip(self.full, self.part, strict=True)
        ]

    def _apply(self, split: list[tuple[int, np.ndarray, np.ndarray]]) -> None:
        full = []
        for k, (s, new, _) in enumerate(split):
            old = self.full[k][:s] if k < len(self.full) else new[:0]
            full.append(np.concatenate([np.asarray(old), new]) if new.shape[0] else old)
        self.full = full
        self.part = [part for _, _, part in split]

    def extend(self, xs: Any, ys: Any) -> None:
        """Append rows (x ascending and not below the last x); only the buckets they fall
        in are recomputed. Raises :class:`PyramidError` as the constructor does."""
        x, y = _as_columns(xs, ys)
        if not x.size:
            return
        if self.n and x[0] < self.xs[-1]:
            raise PyramidError(f"x = {x[0]!r} < the last x {self.xs[-1]!r}: rows are append-only")
        old = self.n
        ytail = np.concatenate([np.asarray(self.ys[old // LEAF * LEAF :]), y])
        self.xs = np.concatenate([np.asarray(self.xs), x])
        self.ys = np.concatenate([np.asarray(self.ys), y])
        self._apply(_split(self.n, _tails(ytail, old, self.n, self.full)))

    def query(self, lo: float, hi: float, pixels: int) -> dict[str, np.ndarray]:
        """Per-pixel summaries of the rows with ``lo <= x <= hi``.

        Pixel ``p`` holds the rows with ``edge[p] <= x < edge[p + 1]`` where ``edge`` splits
        ``[lo, hi]`` in ``pixels`` equal parts; the last pixel also holds ``x == hi``.

        Returns:
            A dict of arrays of shape ``(pixels,)``: the :data:`NODE` fields (``min``/``max``
            of finite y, ``imin``/``imax``/``ifirst``/``ilast`` row numbers, -1 when the
            pixel has no finite y; ``count``, ``sum``, ``nan``, ``pinf``, ``ninf``) plus
            ``start``/``stop``, the pixel's row range.

        Raises:
            PyramidError: ``pixels`` < 1, or ``lo``/``hi`` not finite or ``lo > hi``.
        """
        return query_many([self], lo, hi, pixels)[0]

    def save(self, folder: str | os.PathLike[str]) -> None:
        """Write the pyramid to ``folder`` (created). See :meth:`save_at`."""
        d = Path(folder)
        d.mkdir(parents=True, exist_ok=True)
        fd = os.open(d, _DIR_FLAGS)
        try:
            self.save_at(fd)
        finally:
            os.close(fd)

    def save_at(self, dir_fd: int, prefix: str = "", extra: dict[str, Any] | None = None) -> None:
        """Write the pyramid whole into the folder open as ``dir_fd`` as a new generation
        ``g`` (16 random hex digits): ``<prefix><g>-xs.f8``, ``-ys.f8`` (the rows, raw
        little-endian float64) and ``-level<k>.node`` (the complete buckets of level ``k``,
        raw :data:`NODE`), then ``<prefix>meta.json`` (``extra``'s keys besides its own: the
        generation, the row count and each level's partial bucket), the commit point. Each
        is written under a temporary name (``.tmp-<pid>-<8 hex>.dat|json``, created
        exclusively, never through a link), synced and renamed into place relative to the
        descriptor, so a link or FIFO planted at a final name is replaced, never followed;
        the files of other generations of ``prefix`` are then removed (a reader that
        opened them keeps them). Raises ``OSError`` when writing fails."""
        gen = secrets.token_hex(8)
        for name, arr in self._columns():
            _write_at(dir_fd, f"{prefix}{gen}-{name}", lambda f, a=arr: _write_raw(f, a))
        _commit(dir_fd, prefix, gen, self.n, self.part, extra)
        _remove_stale(dir_fd, prefix, gen)

    def _columns(self) -> list[tuple[str, np.ndarray]]:
        out = [("xs.f8", self.xs), ("ys.f8", self.ys)]
        out += [(f"level{k}.node", f) for k, f in enumerate(self.full)]
        return out


def append_at(
    dir_fd: int,
    prefix: str,
    p: Pyramid,
    xs: Any,
    ys: Any,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Append rows to the pyramid ``p`` that :func:`load_at` read from ``dir_fd`` and
    ``prefix``, in place: only the new rows and each level's new complete buckets are
    written, past the lengths the current ``meta.json`` records (bytes already there, left
    by an append that died before its commit, are overwritten or cut), each file synced;
    then a new ``meta.json`` (same generation, ``extra``'s keys, the new row count and
    partial buckets) is renamed into place, the commit point. A reader, or a crash, before
    that sees the old state whole: no byte it reads is written. A level the pyramid did not
    have is written whole under a temporary name and renamed. ``p`` itself is not changed
    (read it again with :func:`load_at`).

    Returns the new meta (as :func:`read_meta_at` would read it).

    Raises:
        PyramidError: the rows are not valid (see :class:`Pyramid`), ``p`` was not read
            from these files, or a file to extend is no longer the regular file of this
            user it was (planted since): rebuild.
        OSError: writing failed (nothing committed).
    """
    x, y = _as_columns(xs, ys)
    gen = p.meta.get("gen")
    if not isinstance(gen, str) or not _GEN_RE.match(gen) or p.meta.get("n") != p.n:
        raise PyramidError("the pyramid was not read from these files: rebuild")
    if x.size and p.n and x[0] < p.xs[-1]:
        raise PyramidError(f"x = {x[0]!r} < the last x {p.xs[-1]!r}: rows are append-only")
    old, n = p.n, p.n + x.size
    ytail = np.concatenate([np.asarray(p.ys[old // LEAF * LEAF :]), y])
    split = _split(n, _tails(ytail, old, n, p.full))
    cols = [("xs.f8", old, x), ("ys.f8", old, y)]
    cols += [(f"level{k}.node", s, new) for k, (s, new, _) in enumerate(split)]
    for k, (name, at, new) in enumerate(cols):
        fname = f"{prefix}{gen}-{name}"
        if k - 2 >= len(p.full):  # a new level
            _write_at(dir_fd, fname, lambda f, a=new: _write_raw(f, a))
        else:
            _append_raw_at(dir_fd, fname, at, new)
    return _commit(dir_fd, prefix, gen, n, [part for _, _, part in split], extra)


def _commit(
    dir_fd: int,
    prefix: str,
    gen: str,
    n: int,
    part: list[np.ndarray],
    extra: dict[str, Any] | None,
) -> dict[str, Any]:
    meta = dict(extra or {})
    meta.update(
        {
            "version": VERSION,
            "n": n,
            "leaf_log2": LEAF_LOG2,
            "levels": len(part),
            "gen": gen,
            "part": [base64.b64encode(np.ascontiguousarray(b).tobytes()).decode() for b in part],
        }
    )
    _write_at(dir_fd, f"{prefix}meta.json", lambda f: f.write(json.dumps(meta).encode()))
    return meta


def _remove_stale(dir_fd: int, prefix: str, gen: str) -> None:
    """Remove the files of ``prefix`` of other generations (and of version 1)."""
    try:
        names = os.listdir(dir_fd)
    except OSError:
        return
    for name in names:
        rest = name[len(prefix) :] if name.startswith(prefix) else None
        if rest is None or rest.startswith(gen + "-"):
            continue
        if _STALE_RE.match(rest):
            try:
                os.unlink(name, dir_fd=dir_fd)
            except OSError:
                pass


_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_NEW = (
    os.O_WRONLY
    | os.O_CREAT
    | os.O_EXCL
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
_READ = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
_APPEND = os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
_APPEND |= getattr(os, "O_CLOEXEC", 0)
#: the temporary names :meth:`Pyramid.save_at` writes under (a builder that died leaves them)
TMP_RE = re.compile(r"^\.tmp-[0-9]+-[0-9a-f]{8}\.(?:npy|dat|json)$")
_GEN_RE = re.compile(r"^[0-9a-f]{16}$")
#: the data files of a prefix (after it), of any generation, and version 1's
_STALE_RE = re.compile(
    r"^(?:[0-9a-f]{16}-(?:xs\.f8|ys\.f8|level[0-9]+\.node)|(?:xs|ys|level[0-9]+)\.npy)$"
)


def _write_raw(f: Any, arr: np.ndarray) -> None:
    f.write(np.ascontiguousarray(arr).data.cast("B"))


def _append_raw_at(dir_fd: int, name: str, at: int, arr: np.ndarray) -> None:
    """Write ``arr`` at item ``at`` of the raw file ``name`` (which must hold at least
    ``at`` items: the committed ones), cut what lies past it, sync. Only a regular file of
    this user, opened without following a link or waiting on a FIFO."""
    size = (at + arr.shape[0]) * arr.dtype.itemsize
    try:
        fd = os.open(name, _APPEND, dir_fd=dir_fd)
    except OSError as e:
        why = "a symbolic link" if e.errno == errno.ELOOP else (e.strerror or str(e))
        raise PyramidError(f"{name}: not writable ({why})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PyramidError(f"{name}: not a regular file")
        if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
            raise PyramidError(f"{name}: owned by uid {st.st_uid}, not this user")
        if st.st_size < at * arr.dtype.itemsize:
            raise PyramidError(f"{name}: {st.st_size:,} bytes, shorter than what was committed")
        if arr.shape[0]:
            data = np.ascontiguousarray(arr).data.cast("B")
            off = at * arr.dtype.itemsize
            while data:
                k = os.pwrite(fd, data, off)
                data, off = data[k:], off + k
        if st.st_size > size:
            os.ftruncate(fd, size)  # what an append that died left past it
        if st.st_size > size or arr.shape[0]:
            os.fsync(fd)
    finally:
        os.close(fd)


def _write_at(dir_fd: int, name: str, write: Any) -> None:
    ext = "json" if name.endswith(".json") else "dat"
    tmp = f".tmp-{os.getpid()}-{secrets.token_hex(4)}.{ext}"
    fd = os.open(tmp, _NEW, 0o644, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def _open_regular_at(dir_fd: int, name: str) -> tuple[int, os.stat_result]:
    """``(fd, stat)`` of ``name`` in the folder ``dir_fd``, only a regular file of this user:
    a link is not followed, a FIFO not waited on (:class:`PyramidError` else)."""
    try:
        fd = os.open(name, _READ, dir_fd=dir_fd)
    except FileNotFoundError:
        raise PyramidError(f"{name}: missing") from None
    except OSError as e:
        why = "a symbolic link" if e.errno == errno.ELOOP else (e.strerror or str(e))
        raise PyramidError(f"{name}: not readable ({why})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PyramidError(f"{name}: not a regular file")
        uid = os.geteuid() if hasattr(os, "geteuid") else None
        if uid is not None and st.st_uid != uid:
            raise PyramidError(f"{name}: owned by uid {st.st_uid}, not this user")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _read_raw_at(dir_fd: int, name: str, dtype: np.dtype, length: int, mmap: bool) -> np.ndarray:
    """The first ``length`` items of ``dtype`` in the raw file ``name`` (bytes past them,
    left by an append that died before its commit, are not read): its size checked, then
    memory-mapped (or read)."""
    fd, st = _open_regular_at(dir_fd, name)
    with os.fdopen(fd, "rb") as f:
        need = length * dtype.itemsize
        if st.st_size < need:
            raise PyramidError(f"{name}: {st.st_size:,} bytes, expected at least {need:,}")
        if length == 0:
            return np.empty(0, dtype=dtype)
        if mmap:  # a plain ndarray view (a memmap's indexing costs more per call)
            mm = np.memmap(f, dtype=dtype, mode="r", offset=0, shape=(length,))
            return np.asarray(mm)
        a = np.fromfile(f, dtype=dtype, count=length)
        if a.shape != (length,):  # pragma: no cover - cut short while read
            raise PyramidError(f"{name}: cut short")
        return a


def query_many(
    pyramids: list[Pyramid], lo: float, hi: float, pixels: int
) -> list[dict[str, np.ndarray]]:
    """:meth:`Pyramid.query` of each pyramid over the same window, done together (an overlay
    of many runs costs a few numpy calls per run, not per run and level).

    Returns:
        One dict per pyramid, as :meth:`Pyramid.query` returns.

    Raises:
        PyramidError: as :meth:`Pyramid.query`.
    """
    if not isinstance(pixels, int) or isinstance(pixels, bool) or pixels < 1:
        raise PyramidError(f"pixels={pixels!r} is not valid: an int >= 1")
    if not (np.isfinite(lo) and np.isfinite(hi)) or lo > hi:
        raise PyramidError(f"the range [{lo!r}, {hi!r}] is not valid: finite, lo <= hi")
    out: list[dict[str, np.ndarray]] = []
    for k in range(0, len(pyramids), CHUNK):
        out.extend(_query_chunk(pyramids[k : k + CHUNK], lo, hi, pixels))
    return out


def _query_chunk(
    pyramids: list[Pyramid], lo: float, hi: float, pixels: int
) -> list[dict[str, np.ndarray]]:
    nr = len(pyramids)
    edges = lo + (hi - lo) * (np.arange(pixels + 1, dtype=np.float64) / pixels)
    a = np.empty((nr, pixels), dtype=np.int64)
    b = np.empty((nr, pixels), dtype=np.int64)
    for k, p in enumerate(pyramids):
        a[k] = np.searchsorted(p.xs, edges[:-1], side="left")
        b[k, -1] = np.searchsorted(p.xs, hi, side="right")
    b[:, :-1] = a[:, 1:]
    # rows of all runs in one numbering: run k's rows start at off[k], a multiple of LEAF
    sizes = np.array([-(-p.n // LEAF) * LEAF for p in pyramids], dtype=np.int64)
    off = np.concatenate(([0], np.cumsum(sizes)))
    ga = (a + off[:-1, None]).ravel()
    gb = (b + off[:-1, None]).ravel()
    la = -(-ga // LEAF)
    lb = gb // LEAF
    inner = la < lb  # the pixel holds whole leaf buckets [la, lb)
    recs = [_matrix(_empty(nr * pixels))]
    owners = [np.arange(nr * pixels)]
    # raw rows: those of the leaf buckets holding a pixel's first and last row, less the
    # leaves the pixel holds whole
    ne = gb > ga
    leaves = np.sort(np.concatenate([ga[ne] // LEAF, (gb[ne] - 1) // LEAF]))
    first = np.ones(leaves.size, dtype=bool)
    first[1:] = leaves[1:] != leaves[:-1]
    leaves = leaves[first]
    rows = (leaves[:, None] * LEAF + np.arange(LEAF)[None, :]).ravel()
    q = np.searchsorted(ga, rows, side="right") - 1  # an empty pixel never owns a row
    qc = np.clip(q, 0, ga.size - 1)
    leaf = rows // LEAF
    ok = (q >= 0) & (rows < gb[qc]) & ~(inner[qc] & (la[qc] <= leaf) & (leaf < lb[qc]))
    rows, q = rows[ok], q[ok]
    cut = np.searchsorted(rows, off)
    y = np.concatenate(
        [np.asarray(p.ys[rows[cut[k] : cut[k + 1]] - off[k]]) for k, p in enumerate(pyramids)]
    )
    fin = np.isfinite(y)
    rec = np.empty(rows.size, dtype=NODE)
    rec["min"] = np.where(fin, y, np.inf)
    rec["max"] = np.where(fin, y, -np.inf)
    rec["sum"] = np.where(fin, y, 0.0)
    run_of_row = np.repeat(np.arange(nr), np.diff(cut))
    ri = np.where(fin, rows - off[run_of_row], -1)
    for f in ("imin", "imax", "ifirst", "ilast"):
        rec[f] = ri
    rec["count"] = fin
    rec["nan"] = np.isnan(y)
    rec["pinf"] = y == np.inf
    rec["ninf"] = y == -np.inf
    recs.append(_matrix(rec))
    owners.append(q)
    # whole buckets: the segment-tree walk (two per pixel and level at most), in each run's
    # own bucket numbering
    loff = (off[:-1] // LEAF)[:, None]
    lft = np.where(inner, la - np.repeat(loff.ravel(), pixels), 0)
    r = np.where(inner, lb - np.repeat(loff.ravel(), pixels), 0)
    for level in range(max(len(p.full) for p in pyramids)):
        live = lft < r
        if not live.any():
            break
        tl = live & (lft & 1 == 1)
        pl = np.flatnonzero(tl)
        lft = lft + tl
        tr = (lft < r) & (r & 1 == 1)
        r = r - tr
        pr = np.flatnonzero(tr)
        sel = np.concatenate([pl, pr])
        ids = np.concatenate([lft[pl] - 1, r[pr]])
        order = np.argsort(sel, kind="stable")
        sel, ids = sel[order], ids[order]
        cut = np.searchsorted(sel, np.arange(nr + 1) * pixels)
        for k, p in enumerate(pyramids):
            if cut[k] < cut[k + 1]:
                full, part = p.full[level], p.part[level]
                m = full.shape[0]
                # bounded (a ufunc: np.clip costs more in Python than in numpy here)
                at = np.minimum(np.maximum(ids[cut[k] : cut[k + 1]], 0), m + part.shape[0] - 1)
                if part.shape[0] and at.max() >= m:  # the partial bucket, kept apart
                    got = _matrix(full)[np.minimum(at, m - 1)] if m else np.empty((at.size, _NF))
                    got[at >= m] = _matrix(part)[0]
                    recs.append(got)
                else:
                    recs.append(_matrix(full)[at])
                owners.append(sel[cut[k] : cut[k + 1]])
        lft >>= 1
        r >>= 1
    out = _reduce(np.concatenate(recs), np.concatenate(owners), a.ravel(), b.ravel())
    return [{f: v[k * pixels : (k + 1) * pixels] for f, v in out.items()} for k in range(nr)]


def _levels_for(n: int) -> list[int]:
    sizes = [-(-n // LEAF)]
    while sizes[-1] > 1:
        sizes.append(-(-sizes[-1] // 2))
    return sizes


def load(folder: str | os.PathLike[str], *, mmap: bool = True) -> Pyramid:
    """Read a pyramid written by :meth:`Pyramid.save` (see :func:`load_at`).

    Raises:
        PyramidError: as :func:`load_at`, or the folder cannot be opened.
    """
    d = Path(folder)
    try:
        fd = os.open(d, _DIR_FLAGS)
    except OSError as e:
        raise PyramidError(f"{d}: not an open folder ({e.strerror or e})") from None
    try:
        return load_at(fd, mmap=mmap)
    except PyramidError as e:
        raise type(e)(f"{d}/{e}") from None
    finally:
        os.close(fd)


#: the largest meta.json read (its partial buckets take 120 bytes a level)
MAX_META_BYTES = 16384


def read_meta_at(dir_fd: int, prefix: str = "") -> dict[str, Any]:
    """The ``<prefix>meta.json`` of a pyramid written by :meth:`Pyramid.save_at`, checked
    (version, leaf size, row count, levels, generation, partial buckets). Raises
    :class:`PyramidError` when it is missing, not a regular file of this user, too big, not
    JSON or does not match."""
    name = f"{prefix}meta.json"
    fd, st = _open_regular_at(dir_fd, name)
    try:
        if st.st_size > MAX_META_BYTES:
            raise PyramidError(f"{name} is {st.st_size} bytes (at most {MAX_META_BYTES})")
        raw = os.pread(fd, MAX_META_BYTES + 1, 0)
    except OSError as e:
        raise PyramidError(f"{name}: not readable ({e.strerror or e})") from None
    finally:
        os.close(fd)
    try:
        meta = json.loads(raw)
    except ValueError as e:
        raise PyramidError(f"{name}: not JSON ({e})") from None
    if (
        not isinstance(meta, dict)
        or meta.get("version") != VERSION
        or meta.get("leaf_log2") != LEAF_LOG2
    ):
        if isinstance(meta, dict) and "version" in meta and "leaf_log2" in meta:
            raise PyramidOutdated(f"{name}: version or leaf size differs ({meta!r:.200})")
        raise PyramidError(f"{name}: not a pyramid's meta ({meta!r:.200})")
    n = meta.get("n")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise PyramidError(f"{name}: n={n!r} is not a row count")
    sizes = _levels_for(n)
    if meta.get("levels") != len(sizes):
        raise PyramidError(f"{name}: levels={meta.get('levels')!r}, expected {len(sizes)}")
    gen = meta.get("gen")
    if not isinstance(gen, str) or not _GEN_RE.match(gen):
        raise PyramidError(f"{name}: gen={gen!r:.40} is not 16 hex digits")
    part = meta.get("part")
    if not isinstance(part, list) or len(part) != len(sizes):
        raise PyramidError(f"{name}: part is not a list of {len(sizes)} buckets")
    buckets = []
    for k, b64 in enumerate(part):
        want = 1 if n % (LEAF << k) else 0
        try:
            raw_b = base64.b64decode(b64, validate=True) if isinstance(b64, str) else None
        except ValueError:
            raw_b = None
        if raw_b is None or len(raw_b) != want * NODE.itemsize:
            raise PyramidError(f"{name}: part[{k}] is not {want} bucket(s)")
        buckets.append(np.frombuffer(raw_b, dtype=NODE).copy())
    meta["part"] = buckets
    return meta


def load_at(dir_fd: int, prefix: str = "", *, mmap: bool = True) -> Pyramid:
    """Read the pyramid that :meth:`Pyramid.save_at` (and :func:`append_at`) wrote in the
    folder open as ``dir_fd`` under ``prefix``, memory-mapped (``mmap=True``: a query
    touches only the pages it reads). Its ``meta`` attribute holds the ``meta.json`` read
    (``part``: its partial buckets, decoded).

    The ``meta.json`` is the commit point: the row count and the generation it names bound
    what is read, so bytes an append wrote past them before it died are not read. Every
    file is untrusted (docs/ui.md "Overlays of many runs: exact at any zoom"): opened
    relative to the descriptor without following a link or waiting on a FIFO, only a
    regular file of this user, at least as long as the meta says; the top bucket's counts
    must add up to the row count and its rows lie inside.

    Raises:
        PyramidError: a file is missing, planted (a link, a FIFO, another user's), shorter
            than the meta says, or the meta does not match; the caller rebuilds from the rows.
    """
    meta = read_meta_at(dir_fd, prefix)
    n, gen = meta["n"], meta["gen"]
    f8 = np.dtype("<f8")
    p = Pyramid.__new__(Pyramid)
    p.xs = _read_raw_at(dir_fd, f"{prefix}{gen}-xs.f8", f8, n, mmap)
    p.ys = _read_raw_at(dir_fd, f"{prefix}{gen}-ys.f8", f8, n, mmap)
    p.full = [
        _read_raw_at(dir_fd, f"{prefix}{gen}-level{k}.node", NODE, n // (LEAF << k), mmap)
        for k in range(len(meta["part"]))
    ]
    p.part = meta["part"]
    p.meta = meta
    if n > 1 and not (p.xs[0] <= p.xs[n // 2] <= p.xs[-1]):
        raise PyramidError(f"{prefix}{gen}-xs.f8: not ascending")
    top = p.part[-1] if p.part[-1].shape[0] else p.full[-1]
    if top.shape[0]:
        t = top[0]
        total = int(t["count"]) + int(t["nan"]) + int(t["pinf"]) + int(t["ninf"])
        rows = [int(t[f]) for f in ("imin", "imax", "ifirst", "ilast")]
        if total != n or not all(-1 <= r < n for r in rows):
            raise PyramidError(f"{prefix}meta.json: the top bucket's counts do not add up")
    return p


def build_or_load(folder: str | os.PathLike[str], xs: Any, ys: Any) -> Pyramid:
    """The pyramid of ``(xs, ys)`` kept in ``folder``: loaded when the files there hold a
    prefix of these rows (the rest appended in place, :func:`append_at`), else rebuilt and
    saved. Files whose stored ``x`` at their last row, or last ``LEAF`` ``y``, differ from
    ``xs``/``ys`` are rebuilt. Raises ``OSError`` when the folder cannot be written."""
    x, y = _as_columns(xs, ys)
    try:
        p = load(folder)
    except PyramidError:
        p = None
    if p is not None and (
        p.n > x.size
        or (
            p.n
            and (
                p.xs[-1] != x[p.n - 1]
                or not np.array_equal(p.ys[-LEAF:], y[max(0, p.n - LEAF) : p.n], equal_nan=True)
            )
        )
    ):
        p = None
    if p is not None and p.n < x.size:
        fd = os.open(Path(folder), _DIR_FLAGS)
        try:
            append_at(fd, "", p, x[p.n :], y[p.n :])
            p = load_at(fd)
        except PyramidError:
            p = None
        finally:
            os.close(fd)
    if p is None:
        p = Pyramid(x, y)
        p.save(folder)
    return p


def overlay_points(pyramids: list[Pyramid], lo: float, hi: float, pixels: int) -> list[ChartPoints]:
    """The points to draw of each run of an overlay, ``pixels`` wide over ``[lo, hi]``.

    Per pixel and run: the first, minimum, maximum and last finite point (the true ones,
    from :func:`query_many`), in row order; and, for each kind of non-finite value the
    pixel holds (NaN, +inf, -inf), one marker (``y`` None, a gap in the line) at the
    pixel's first row, so none is hidden. At most ``7 * pixels`` points per run.

    Raises:
        PyramidError: as :meth:`Pyramid.query`.
    """
    return [
        pixel_points(p, q)
        for p, q in zip(pyramids, query_many(pyramids, lo, hi, pixels), strict=True)
    ]


def pixel_points(p: Pyramid, q: dict[str, np.ndarray]) -> ChartPoints:
    """The points to draw of one run from its :func:`query_many` answer ``q`` (see
    :func:`overlay_points`): in row order, a pixel's NaN/±inf markers (at its first row,
    ordered ``-inf``, ``inf``, ``nan``) before a point of the same row. Raises
    :class:`PyramidError` when a row named in ``q`` is not one of ``p``'s (a damaged file:
    rebuild)."""
    # already in order without a sort: a pixel's rows lie before the next pixel's, and
    # first <= min, max <= last inside one (-1 in all four when it has no finite value)
    lo_, hi_ = np.minimum(q["imin"], q["imax"]), np.maximum(q["imin"], q["imax"])
    rows = np.stack([q["ifirst"], lo_, hi_, q["ilast"]], axis=1).ravel()
    rows = rows[rows >= 0]
    rows = rows[np.concatenate(([True], rows[1:] != rows[:-1]))] if rows.size else rows
    if rows.size and (rows.max() >= p.n or (rows.size > 1 and (np.diff(rows) <= 0).any())):
        raise PyramidError(f"rows beyond {p.n} or out of order: the summaries are damaged")
    mrows, mkind = [], []
    for k, f in enumerate(("ninf", "pinf", "nan")):  # the kinds' names in sorted order
        r = q["start"][q[f] > 0]
        mrows.append(r)
        mkind.append(np.full(r.size, k))
    mr = np.concatenate(mrows)
    if not mr.size:  # no NaN/inf in range (the usual case): the rows as they are
        pts = ChartPoints(index=rows.tolist(), x=np.asarray(p.xs[rows]).tolist())
        pts.y = np.asarray(p.ys[rows]).tolist()
        return pts
    all_rows = np.concatenate([mr, rows])
    # order: row, then a marker before a point of the same row, then the marker's kind
    second = np.concatenate([np.zeros(mr.size, dtype=np.int64), np.ones(rows.size, dtype=np.int64)])
    kind = np.concatenate([*mkind, np.zeros(rows.size, dtype=np.int64)])
    order = np.lexsort((kind, second, all_rows))
    idx = all_rows[order]
    pts = ChartPoints()
    pts.index = idx.tolist()
    pts.x = np.asarray(p.xs[idx]).tolist()
    y = np.asarray(p.ys[idx])
    is_mark = second[order] == 0
    ys: list[float | None] = y.tolist()
    names = ("-inf", "inf", "nan")
    kinds = kind[order]
    for j in np.flatnonzero(is_mark).tolist():
        ys[j] = None
        pts.nonfinite.append((j, names[kinds[j]]))
    pts.y = ys
    return pts
