"""The overlay summaries of a producer's metrics, kept inside its query cache (docs/ui.md
"Overlays of many runs: exact at any zoom").

:func:`metric_pyramid` answers the :class:`~expr_tracker.history.pyramid.Pyramid` of one
metric of one producer, x the step, built from the rows of its columnar cache
(:func:`expr_tracker.query.cache.refresh`) and kept beside the cache's parts, in
``<cache folder>/pyramids/`` (``<run>/.et-cache/metrics.jsonl/pyramids/`` by default; the
cache's own fallback location under ``$XDG_CACHE_HOME`` or a temporary folder when the run
cannot hold it), one set of files per metric named ``<32 hex of the metric's SHA-256>-``
``meta.json`` and ``<gen>-xs.f8``, ``<gen>-ys.f8``, ``<gen>-level<k>.node`` (see
:meth:`~expr_tracker.history.pyramid.Pyramid.save_at`).

What the files cover is recorded in their ``meta.json`` with the cache's own terms: the
source's device and inode, ``covered`` bytes, ``lines`` and the fingerprint of the covered
prefix. On each use:

- the same ``covered`` and fingerprint as the cache now: used as they are (memory-mapped;
  a process keeps the last :data:`MEMO` it opened and only ``stat``\\ s their ``meta.json``);
- the cache grew and its covered prefix is the one summarised (same file, same fingerprint
  of that prefix), every step logged once (``CachedSource.merged``) and the new rows' steps
  above the last one: only the rows of the new lines are read (``line >= lines``) and
  appended in place (:func:`~expr_tracker.history.pyramid.append_at`: the new bytes, then
  ``meta.json`` renamed over, the commit point);
- anything else (the cache rebuilt from a rewritten file, patch lines, steps out of order,
  a file missing, planted or damaged): rebuilt from every row of the metric.

The files are untrusted (:func:`expr_tracker.history.pyramid.load_at`): opened by
descriptor in a folder opened as the cache's are, never through a link, a FIFO never waited
on, every header, size and count checked; one that does not pass is rebuilt (one warning
per folder and cause) as a new generation, never written through. Building holds the
cache's ``flock`` (the one a refresh holds). When no folder can be written (a read-only
run, a cache in memory) the pyramid is built in memory and kept in the memo only, for
that state of the cache.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from expr_tracker._warn import Warner
from expr_tracker.history import pyramid as pm
from expr_tracker.query import cache as qcache
from expr_tracker.query.views import metrics_select

__all__ = ["FOLDER", "MEMO", "forget", "metric_pyramid"]

log = logging.getLogger("expr_tracker")
_warner = Warner(log)

#: the folder of the summaries inside a source's cache folder
FOLDER = "pyramids"
#: pyramids a process keeps open (memory-mapped) between requests
MEMO = 512

_memo: OrderedDict[tuple, tuple[tuple, pm.Pyramid]] = OrderedDict()
_memo_lock = threading.Lock()


def _prefix(metric: str) -> str:
    return hashlib.sha256(metric.encode("utf-8", "surrogatepass")).hexdigest()[:32] + "-"


def _memo_get(key: tuple, token: tuple) -> pm.Pyramid | None:
    with _memo_lock:
        hit = _memo.get(key)
        if hit is None or hit[0] != token:
            return None
        _memo.move_to_end(key)
        return hit[1]


def forget() -> None:
    """Drop the pyramids this process keeps open (the next use reads and checks the files
    again)."""
    with _memo_lock:
        _memo.clear()


def _memo_put(key: tuple, token: tuple, p: pm.Pyramid) -> None:
    with _memo_lock:
        _memo[key] = (token, p)
        _memo.move_to_end(key)
        while len(_memo) > MEMO:
            _memo.popitem(last=False)


def _current(meta: dict[str, Any], cached: qcache.CachedSource, metric: str) -> bool:
    return (
        meta.get("metric") == metric
        and meta.get("covered") == cached.covered
        and meta.get("fingerprint") == cached.fingerprint
        and meta.get("dev") == cached.dev
        and meta.get("ino") == cached.ino
    )


def _meta_token(d: qcache.DerivedFolder, prefix: str) -> tuple | None:
    try:
        st = os.stat(f"{prefix}meta.json", dir_fd=d.fd, follow_symlinks=False)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def metric_pyramid(
    cached: qcache.CachedSource,
    producer: Any,
    metric: str,
    con: Any,
    source: Callable[[Sequence[Path]], str],
    *,
    root: str | os.PathLike[str] | None = None,
    distrust: bool = False,
) -> pm.Pyramid:
    """The summaries of ``metric`` (x: its steps, y: its values; rows without a numeric
    value left out) of the producer whose metrics cache is ``cached`` (a
    :func:`~expr_tracker.query.cache.refresh` just made), kept in the cache folder as the
    module doc says.

    ``con``: a DuckDB connection reading the parts (NaN kept); ``source``: the FROM text of
    parts (as :func:`expr_tracker.query.views.metrics_select` takes it); ``root``: the
    folder the source must lie in (a reader's run directory, the folder ``et ui`` serves).
    ``distrust``: rebuild whatever the files say (a query found them damaged).

    Returns a :class:`~expr_tracker.history.pyramid.Pyramid` (``n`` 0 when the producer
    has no numeric row of ``metric``). Raises what the DuckDB read raises (a part that
    vanished: refresh again), and ``OSError`` when the source cannot be opened.
    """
    prefix = _prefix(metric)
    src = cached.source
    key_base = (str(src), prefix)
    # kept in memory only (no folder of ours, or one that cannot be written): valid for
    # exactly this state of the cache
    mtoken: tuple = ("memory", cached.covered, cached.fingerprint, cached.dev, cached.ino)
    hit = None if distrust else _memo_get(key_base, mtoken)
    if hit is not None:
        return hit
    d = qcache.derived_folder(cached, FOLDER)
    if d is None:
        p = pm.Pyramid(*_all_rows(cached, producer, metric, con, source))
        _memo_put(key_base, mtoken, p)
        return p
    try:
        fst = os.fstat(d.fd)
        key = (*key_base, fst.st_dev, fst.st_ino)
        if not distrust:
            seen = _meta_token(d, prefix)
            hit = _memo_get(key, seen) if seen is not None else None
            if hit is not None and _current(hit.meta, cached, metric):
                return hit
        lock_fd = d.lock()
        try:
            p = _load_or_build(d, prefix, cached, producer, metric, con, source, root, distrust)
            now = _meta_token(d, prefix)
            if not p.meta:  # not written (a read-only folder): in memory
                _memo_put(key_base, mtoken, p)
            elif now is not None:
                _memo_put(key, now, p)
            return p
        finally:
            if lock_fd is not None:
                os.close(lock_fd)
    finally:
        d.close()


def _load_or_build(
    d: qcache.DerivedFolder,
    prefix: str,
    cached: qcache.CachedSource,
    producer: Any,
    metric: str,
    con: Any,
    source: Callable[[Sequence[Path]], str],
    root: Any,
    distrust: bool,
) -> pm.Pyramid:
    _clean_temp(d)
    old: pm.Pyramid | None = None
    why = "asked to rebuild" if distrust else None
    if not distrust:
        try:
            meta = pm.read_meta_at(d.fd, prefix)
            if _current(meta, cached, metric):
                return pm.load_at(d.fd, prefix)
            if _extendable(meta, cached, metric, root):
                old = pm.load_at(d.fd, prefix)
        except pm.PyramidOutdated:  # another release's files: rebuilt without a word
            pass
        except pm.PyramidError as exc:
            if "meta.json: missing" not in str(exc):
                why = str(exc)
    if why is not None and not distrust:
        _warner.warn(
            ("pyramid", str(d.path), why),
            "expr_tracker: the overlay summaries in %s were damaged or not their own (%s): "
            "rebuilt from the query cache",
            d.path,
            why,
        )
    extra = {
        "metric": metric,
        "covered": cached.covered,
        "lines": cached.lines,
        "fingerprint": cached.fingerprint,
        "dev": cached.dev,
        "ino": cached.ino,
        "merged": cached.merged,
    }
    if old is not None:
        x, y = _new_rows(cached, metric, con, source, old.meta["lines"])
        if (not x.size or x[0] > (old.xs[-1] if old.n else -np.inf)) and not (
            x.size > 1 and (np.diff(x) <= 0).any()
        ):
            try:  # in place: the new rows and buckets, then the meta (the commit point)
                pm.append_at(d.fd, prefix, old, x, y, extra)
                return pm.load_at(d.fd, prefix)
            except pm.PyramidError as exc:  # a file planted or cut since it was read
                _warner.warn(
                    ("pyramid", str(d.path), str(exc)),
                    "expr_tracker: the overlay summaries in %s were damaged or not their "
                    "own (%s): rebuilt from the query cache",
                    d.path,
                    exc,
                )
            except OSError:  # nothing committed: a rebuild says why, or keeps it in memory
                pass
    p = pm.Pyramid(*_all_rows(cached, producer, metric, con, source))
    try:
        p.save_at(d.fd, prefix, extra)
    except OSError as exc:
        _warner.warn(
            ("pyramid-write", str(d.path), exc.errno),
            "expr_tracker: cannot write the overlay summaries in %s (%s): kept in memory",
            d.path,
            exc.strerror or exc,
        )
        p.meta = {}
        return p
    p.meta = {**extra, "n": p.n}
    return p


def _extendable(meta: dict[str, Any], cached: qcache.CachedSource, metric: str, root: Any) -> bool:
    """True when ``meta`` summarises a prefix of what ``cached`` covers now: the same
    file, fewer bytes, the fingerprint of those bytes unchanged, every step in one line."""
    covered, lines = meta.get("covered"), meta.get("lines")
    if (
        meta.get("metric") != metric
        or meta.get("dev") != cached.dev
        or meta.get("ino") != cached.ino
        or not meta.get("merged")
        or not cached.merged
        or not isinstance(covered, int)
        or not isinstance(lines, int)
        or not 0 <= covered < cached.covered
        or not 0 <= lines <= cached.lines
    ):
        return False
    from expr_tracker.history.untrusted import open_regular

    try:
        fd = open_regular(cached.source, root=root if root is not None else cached.source.parent)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (cached.dev, cached.ino):
            return False
        return qcache.fingerprint_of(fd, covered) == meta.get("fingerprint")
    except OSError:
        return False
    finally:
        os.close(fd)


def _clean_temp(d: qcache.DerivedFolder) -> None:
    """Remove temporary files of a builder that died (we hold the lock: no one writes)."""
    try:
        names = os.listdir(d.fd)
    except OSError:
        return
    for n in names:
        if pm.TMP_RE.match(n):
            try:
                os.unlink(n, dir_fd=d.fd)
            except OSError:
                pass


def _fetch(con: Any, sql: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
    cols = con.execute(sql, [metric]).fetchnumpy()
    x = np.asarray(cols["x"], dtype=np.float64)
    y = np.asarray(cols["y"], dtype=np.float64)
    return x, y


def _all_rows(
    cached: qcache.CachedSource,
    producer: Any,
    metric: str,
    con: Any,
    source: Callable[[Sequence[Path]], str],
) -> tuple[np.ndarray, np.ndarray]:
    if not (cached.parts or cached.memory):
        return np.empty(0), np.empty(0)
    sel = metrics_select(producer, cached.parts, cached.merged, source)
    sql = (
        f"SELECT step::DOUBLE AS x, value AS y FROM ({sel}) "
        "WHERE metric = $1 AND value IS NOT NULL ORDER BY step"
    )
    return _fetch(con, sql, metric)


def _new_rows(
    cached: qcache.CachedSource,
    metric: str,
    con: Any,
    source: Callable[[Sequence[Path]], str],
    lines: int,
) -> tuple[np.ndarray, np.ndarray]:
    if not (cached.parts or cached.memory):
        return np.empty(0), np.empty(0)
    sql = (
        f"SELECT step::DOUBLE AS x, value AS y FROM {source(cached.parts)} "
        f"WHERE metric = $1 AND step IS NOT NULL AND value IS NOT NULL AND line >= {int(lines)} "
        "ORDER BY line"
    )
    return _fetch(con, sql, metric)
