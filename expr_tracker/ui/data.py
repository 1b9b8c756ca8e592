"""What the dashboard shows, as plain JSON-able values (no web stack here).

Runs are found with :func:`expr_tracker.query.catalog.discover` and looked up by their
``run_id`` in that list (:class:`Catalog`): a run identifier from a request is never joined
into a path, so nothing outside the served folder can be named. Metric and span rows are
read through the per-producer columnar cache (:func:`expr_tracker.query.cache.refresh`:
only bytes appended since the last request are parsed) with DuckDB, a series is cut to the
chart's width by :func:`expr_tracker.history.downsample.m4` (first, last, min, max per
bucket and every NaN/±inf point). Status is judged as ``et runs`` does
(:mod:`expr_tracker.history.rundirs`).

Every run file is untrusted input (docs/ui.md "Security"): the files read here are opened
with :mod:`expr_tracker.history.untrusted` (regular files only, never blocking on a FIFO,
inside the served folder's real path even when swapped for a link after discovery, JSON
depth-limited, small files bounded), the columnar cache is asked to do the same
(``refresh(root=)``). A file that cannot be read is named with its reason: a run is listed
``unreadable`` with its ``error``, never dropped, and one bad run never empties the table.

The runs table is incremental (:class:`Catalog`): a run directory is listed again only
when its listing or identity files changed, a run's line read again only when its
``run*.json``, metrics files or their sidecars changed (size, mtime, inode), and it reads a
metrics file's last line and sidecar, never the columnar cache: one huge or wide run costs
the table what its last line costs.

Non-finite numbers cannot travel in JSON: a series carries ``y`` with ``None`` there and
lists the point in ``nonfinite`` as ``{"x", "step", "kind": "nan"|"inf"|"-inf"}``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from expr_tracker.history.alertlog import read_alert_log
from expr_tracker.history.chartprep import ChartPoints, chart_points, kept_points
from expr_tracker.history.metricdefs import MetricDefs, defs_path_for
from expr_tracker.history.paths import file_name
from expr_tracker.history.reader import meta_path_for
from expr_tracker.history.rundirs import worst_status
from expr_tracker.history.runinfo import is_dead, run_life
from expr_tracker.history.untrusted import (
    UnsafeFileError,
    load_json_bytes,
    open_regular,
    read_json,
)
from expr_tracker.history.values import flatten, json_safe
from expr_tracker.query.catalog import Producer, discover, match_runs, producers_of, run_entries
from expr_tracker.query.views import import_duckdb, metrics_select, path_literal, sql_literal

#: seconds a discovered run list is reused before the folder is searched again
DISCOVER_TTL = 2.0
#: most chart buckets a request may ask for (``width``)
MAX_WIDTH = 4000
#: a live poll returning more new rows than this tells the page to reload the charts
MAX_NEW_ROWS = 20_000
#: a file changed less than this before it was read may change again within the same
#: timestamp tick: what was read from it is not reused (read again next time)
RACY_NS = 2_000_000_000
#: the most bytes read back from the end of a metrics file for its last row
TAIL_MAX = 16 << 20
#: the most bytes of a small JSON file (run.json, config.json, summary.json) read whole
SMALL_MAX = 16 << 20
#: the most bytes of an alerts file read
ALERTS_MAX = 64 << 20
#: status of a run one of whose ``run*.json`` could not be read
UNREADABLE = "unreadable"


class NotFound(LookupError):
    """A run, metric or file the request names does not exist (HTTP 404)."""


class BadRequest(ValueError):
    """A malformed query parameter (HTTP 400)."""


class Unreadable(Exception):
    """A run file the request needs cannot be read: permissions, not a regular file, outside
    the served folder, damaged (HTTP 422); ``str()`` names the file and why."""


def producer_label(p: Producer) -> str:
    """``main``, ``S``, ``main/rank1``, ``S/rank2``: the producer's short name."""
    base = p.stream or "main"
    return base if p.rank == 0 else f"{base}/rank{p.rank}"


#: the file fields of a Producer
FILE_FIELDS = ("metrics", "spans", "alerts", "run_file", "summary", "config", "artifacts")


def _inside(path: Path, root_real: str) -> bool:
    real = os.path.realpath(path)
    return real == root_real or real.startswith(root_real.rstrip(os.sep) + os.sep)


def contained(p: Producer, root: str | os.PathLike[str]) -> Producer | None:
    """``p`` as served from ``root``: None when its run directory resolves outside ``root``
    (a symbolic link out of it), and without the files that resolve outside (a linked
    ``metrics.jsonl``). Discovery follows links, as ``et runs`` does; the dashboard serves
    only what lies inside the folder it was given. (Files are opened with
    :func:`~expr_tracker.history.untrusted.open_regular` inside the folder as well: a file
    swapped for a link after this check is refused when read.)"""
    root_real = os.path.realpath(root)
    if not _inside(p.run_dir, root_real):
        return None
    outside = {
        f: None
        for f in FILE_FIELDS
        if getattr(p, f) is not None and not _inside(getattr(p, f), root_real)
    }
    return dataclasses.replace(p, **outside) if outside else p


def _gone(prods: list[Producer]) -> None:
    """FileNotFoundError when the run's directory was deleted since it was found."""
    if not prods[0].run_dir.is_dir():
        raise FileNotFoundError(f"run directory {str(prods[0].run_dir)!r} is gone")


def why(exc: BaseException) -> str:
    """A short reason for a file that could not be read (no traceback, no path)."""
    if isinstance(exc, UnsafeFileError):
        return exc.reason
    if isinstance(exc, PermissionError):
        return "permission denied"
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if isinstance(exc, ValueError):
        return f"not valid JSON ({exc})"[:200]
    return f"{type(exc).__name__}: {exc}"[:200]


def _sig(path: str | Path | None) -> tuple[int, ...] | None:
    """What says a file changed: (mtime_ns, size, inode, device), None when absent."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)


def _stable(sigs: Sequence[tuple[int, ...] | None], read_at_ns: int) -> bool:
    """Every file was last changed well before it was read (see :data:`RACY_NS`)."""
    return all(s is None or s[0] < read_at_ns - RACY_NS for s in sigs)


@dataclasses.dataclass
class _DirSeen:
    """A run directory's producers as discovery found them (only what lies inside the
    served folder, see :func:`contained`), what they came from, and the files its line
    of the runs table is read from."""

    sig: tuple[Any, ...]
    stable: bool
    producers: list[Producer]
    row_files: tuple[str | None, ...]
    error: str | None = None  # why its producers could not be found (listed as unreadable)


def _row_files(prods: list[Producer]) -> tuple[str | None, ...]:
    """Per producer: its ``run*.json``, metrics file and the metrics file's sidecar."""
    out: list[str | None] = []
    for p in prods:
        meta = meta_path_for(p.metrics) if p.metrics is not None else None
        out += [str(f) if f is not None else None for f in (p.run_file, p.metrics, meta)]
    return tuple(out)


@dataclasses.dataclass
class _RowSeen:
    """What the runs table read of one run, and the signature of the files it came from."""

    sig: tuple[Any, ...]
    stable: bool
    infos: list[tuple[str, dict[str, Any] | None]]  # run*.json name -> content (None: unread)
    steps: dict[str, int]  # producer label -> highest step
    last_time: float | None
    errors: list[str]
    unreadable: bool = False  # nothing could be read (its run*.json could not be parsed)


def _identity_files(row_files: tuple[str | None, ...]) -> list[str]:
    """The ``run*.json`` files and sidecars among ``row_files`` (what names a run)."""
    return [f for i, f in enumerate(row_files) if f is not None and i % 3 != 1]


def _dir_sig(run_dir: Path, files: list[str]) -> tuple[Any, ...]:
    try:
        st = os.stat(run_dir)
        own: tuple[int, ...] | None = (st.st_mtime_ns, st.st_ino, st.st_dev)
    except OSError:
        own = None
    return (own, *(_sig(f) for f in files))


class Catalog:
    """The runs under ``root``, re-discovered at most every :data:`DISCOVER_TTL` seconds,
    and the runs table, both incremental: a run directory whose listing and identity files
    did not change is not read again, nor a run whose ``run*.json``, metrics files and
    their sidecars did not change (the status of a ``running`` run is judged again every
    time: its process may have died)."""

    def __init__(self, root: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None):
        self.root = Path(root)
        self.root_real = os.path.realpath(self.root)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._lock = threading.Lock()
        self._runs: dict[str, list[Producer]] = {}
        self._at = -1e18
        self._dirs: dict[Path, _DirSeen] = {}
        self._walked: set[Path] = set()
        self._rows_lock = threading.Lock()
        self._rows: dict[Path, _RowSeen] = {}

    def _per_dir(self, run_dir: Path) -> list[Producer]:
        """The producers of ``run_dir`` that lie inside the served folder (reused while
        the directory's listing and its ``run*.json`` and sidecars are unchanged)."""
        self._walked.add(run_dir)
        seen = self._dirs.get(run_dir)
        if seen is not None and seen.stable:
            if _dir_sig(run_dir, _identity_files(seen.row_files)) == seen.sig:
                return seen.producers
        started = time.time_ns()
        error = None
        try:
            found = producers_of(run_dir)
        except Exception as exc:  # noqa: BLE001 - one damaged run never hides the others
            error = why(exc)
            found = [Producer(run_dir, run_dir.parent.name or None, run_dir.name, None, 0)]
        prods = [q for q in map(self._contained, found) if q is not None]
        files = _row_files(prods)
        sig = _dir_sig(run_dir, _identity_files(files))
        stable = sig[0] is not None and sig[0][0] < started - RACY_NS and _stable(sig[1:], started)
        self._dirs[run_dir] = _DirSeen(sig, stable, prods, files, error)
        return prods

    def _contained(self, p: Producer) -> Producer | None:
        return contained(p, self.root_real)

    def runs(self) -> dict[str, list[Producer]]:
        """run_id -> its producers (sorted as :func:`discover` sorts)."""
        with self._lock:
            now = time.monotonic()
            if now - self._at > DISCOVER_TTL:
                runs: dict[str, list[Producer]] = {}
                self._walked = set()
                for p in discover(self.root, per_dir=self._per_dir, include_unlisted=True):
                    if p.unlisted is not None and self._contained(p) is None:
                        continue  # a folder linked from outside: not served, not named
                    runs.setdefault(p.run_id, []).append(p)
                for d in [d for d in self._dirs if d not in self._walked]:
                    del self._dirs[d]
                self._runs, self._at = runs, now
            return self._runs

    def get(self, run_id: str) -> list[Producer]:
        """The producers of ``run_id`` (the id the runs table gives, else a name by the rule
        of every command: ``catalog.match_runs``, docs/cli.md "Naming a run");
        :class:`NotFound` when it names no discovered run, or several."""
        prods = self.runs().get(run_id)
        if prods is None:
            self._at = -1e18  # a run created since: look again once
            prods = self.runs().get(run_id)
        if prods is None:
            runs = self.runs()
            found = match_runs(
                run_id, run_entries([p for ps in runs.values() for p in ps], self.root)
            )
            if len(found) != 1:
                how = "several runs" if found else "no run"
                raise NotFound(f"{run_id!r} names {how} under the served folder")
            prods = runs[found[0].run_id]
        return prods

    # ------------------------------------------------------------------ the runs table

    def row(self, run_id: str, prods: list[Producer] | None = None) -> dict[str, Any]:
        """One line of the runs table (see :func:`table_row`); FileNotFoundError when the
        run's directory is gone."""
        prods = self.get(run_id) if prods is None else prods
        _gone(prods)
        with self._rows_lock:
            seen = self._seen(prods)
        return table_row(run_id, prods, seen)

    def table(self) -> list[dict[str, Any]]:
        """Every run's line, newest first (by first start; a run deleted meanwhile left out,
        a run that cannot be read listed with its reason)."""
        runs = self.runs()
        rows = []
        live = set()
        for rid, prods in runs.items():
            live.add(prods[0].run_dir)
            try:
                _gone(prods)
                with self._rows_lock:  # per run: a run page asking meanwhile waits for one
                    seen = self._seen(prods)
                rows.append(table_row(rid, prods, seen))
            except FileNotFoundError:  # deleted since it was found: not listed
                continue
            except Exception as exc:  # noqa: BLE001 - one run never empties the table
                rows.append(unreadable_row(rid, prods, why(exc)))
        with self._rows_lock:
            for d in [d for d in self._rows if d not in live]:
                del self._rows[d]
        rows.sort(key=lambda r: (-(r["first_started_at"] or r["started_at"] or 0.0), r["run"]))
        return rows

    def _seen(self, prods: list[Producer]) -> _RowSeen:
        if prods[0].unlisted is not None:  # a colleague's 0700 folder: listed, with why
            why = f"the folder cannot be listed: {prods[0].unlisted}"
            return _RowSeen((), False, [], {}, None, [why], unreadable=True)
        d = self._dirs.get(prods[0].run_dir)
        if d is not None and d.error is not None:
            return _RowSeen((), False, [], {}, None, [d.error], unreadable=True)
        files = d.row_files if d is not None else _row_files(prods)
        key = (files,)
        sig = key + tuple(_sig(f) for f in files)
        seen = self._rows.get(prods[0].run_dir)
        if seen is not None and seen.stable and seen.sig == sig:
            return seen
        started = time.time_ns()
        seen = read_row(prods, self.root_real)
        seen.sig = key + tuple(_sig(f) for f in files)
        seen.stable = _stable(seen.sig[1:], started) and seen.sig == sig
        self._rows[prods[0].run_dir] = seen
        return seen


def last_row(path: Path, root: str) -> dict[str, Any] | None:
    """The last complete line of a metrics file that is a row with an integer ``_step``
    (a torn last line, blank or undecodable lines are passed over), reading back from the
    end at most :data:`TAIL_MAX` bytes; None when there is none in that reach."""
    fd = open_regular(path, root=root)
    try:
        size = os.fstat(fd).st_size
        want = 1 << 16
        while True:
            start = max(0, size - want)
            buf = os.pread(fd, size - start, start)
            lines = buf.split(b"\n")[:-1]  # the piece after the last newline is torn
            if start > 0 and lines:
                lines = lines[1:]  # may begin mid-line
            for line in reversed(lines):
                if not line.strip():
                    continue
                try:
                    r = load_json_bytes(line)
                except ValueError:
                    continue
                if isinstance(r, dict) and type(r.get("_step")) is int:
                    return r
            if start == 0 or want >= TAIL_MAX:
                return None
            want *= 4
    finally:
        os.close(fd)


def _num(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        f = float(v)
        return f if math.isfinite(f) else None
    return None


def read_row(prods: list[Producer], root: str) -> _RowSeen:
    """Read what the runs table shows of a run: its ``run*.json`` files and, per producer,
    the last row of its metrics file and the sidecar's ``max_step`` (not the columnar cache:
    a wide or huge run costs its last line). Files that cannot be read are named in
    ``errors``; nothing raises but a vanished run directory."""
    infos: list[tuple[str, dict[str, Any] | None]] = []
    errors: list[str] = []
    steps: dict[str, int] = {}
    last_time: float | None = None
    for p in prods:
        if p.run_file is not None:
            try:
                info = read_json(p.run_file, root=root, max_bytes=SMALL_MAX)
                if not isinstance(info, dict):
                    raise ValueError("not a JSON object")
            except FileNotFoundError:
                info = None
                errors.append(f"{p.run_file.name}: gone")
            except (OSError, ValueError, RecursionError) as exc:
                info = None
                errors.append(f"{p.run_file.name}: {why(exc)}")
            infos.append((p.run_file.name, info))
        if p.metrics is None:
            continue
        cands: list[int] = []
        try:
            r = last_row(p.metrics, root)
        except FileNotFoundError:
            r = None
        except (OSError, ValueError, RecursionError) as exc:
            errors.append(f"{p.metrics.name}: {why(exc)}")
            continue
        if r is not None:
            cands.append(r["_step"])
            t = _num(r.get("_time"))
            if t is not None and (last_time is None or t > last_time):
                last_time = t
        try:
            meta = read_json(meta_path_for(p.metrics), root=root, max_bytes=SMALL_MAX)
        except (OSError, ValueError, RecursionError):
            meta = None  # the sidecar is an index, not the truth: without it, the tail
        ms = meta.get("max_step") if isinstance(meta, dict) else None
        if type(ms) is int:
            cands.append(ms)
        if cands:
            steps[producer_label(p)] = max(cands)
    return _RowSeen((), False, infos, steps, last_time, errors)


def _status(info: dict[str, Any]) -> str:
    st = info.get("status")
    if not isinstance(st, str):
        return "unknown"
    if st == "running" and is_dead(info):
        return "crashed"  # as et runs judges it: its process is gone
    return st


def table_row(run_id: str, prods: list[Producer], seen: _RowSeen) -> dict[str, Any]:
    """The runs table's line of a run from what :func:`read_row` read: ``status`` the worst
    of its producers' as ``et runs`` judges it (``unreadable`` when a ``run*.json`` could
    not be read), ``steps`` (highest step + 1), ``started_at`` and ``duration_s`` of the
    latest attempt (ended - started, or the last row's time - started while running), the
    run's whole life over every attempt (``first_started_at``, ``wall_duration_s``,
    ``active_duration_s``: :func:`~expr_tracker.history.runinfo.run_life`), ``error`` (None,
    or each file that could not be read and why)."""
    main = prods[0]
    by_name = dict(seen.infos)
    statuses = [_status(i) for i in by_name.values() if i is not None]
    status = worst_status(statuses)
    if seen.unreadable or any(i is None for i in by_name.values()):
        status = UNREADABLE
    info = by_name.get(main.run_file.name) if main.run_file is not None else None
    info = info or {}
    max_step = max(seen.steps.values()) if seen.steps else None
    started = _num(info.get("started_at"))
    ended = _num(info.get("ended_at"))
    if started is not None and ended is not None:
        duration = ended - started
    elif started is not None and seen.last_time is not None:
        duration = seen.last_time - started
    else:
        duration = None
    life = run_life([i for i in by_name.values() if i], last_time=seen.last_time)
    tags = info.get("tags")
    group = info.get("group")
    return {
        "run": run_id,
        "project": main.project,
        "name": main.name,
        "status": status,
        "steps": int(max_step) + 1 if max_step is not None else None,
        "started_at": started,
        "duration_s": duration,
        **life,
        "tags": [str(t) for t in tags] if isinstance(tags, list) else [],
        "group": group if isinstance(group, str) else None,
        "producers": [producer_label(p) for p in prods],
        "producer_steps": dict(seen.steps),
        "error": "; ".join(seen.errors) or None,
    }


def unreadable_row(run_id: str, prods: list[Producer], reason: str) -> dict[str, Any]:
    """The line of a run that could not be read at all."""
    main = prods[0]
    return {
        "run": run_id,
        "project": main.project,
        "name": main.name,
        "status": UNREADABLE,
        "steps": None,
        "started_at": None,
        "duration_s": None,
        "first_started_at": None,
        "wall_duration_s": None,
        "active_duration_s": None,
        "tags": [],
        "group": None,
        "producers": [producer_label(p) for p in prods],
        "producer_steps": {},
        "error": reason,
    }


# ----------------------------------------------------------------------------- DuckDB


_base: Any = None
_base_lock = threading.Lock()


def duckdb_cursor() -> Any:
    """A DuckDB connection (a cursor of one in-memory database of this process: opening a
    database costs milliseconds, a cursor nothing) that reads NaN in Parquet parts."""
    global _base
    with _base_lock:
        if _base is None:
            duckdb = import_duckdb()
            base = duckdb.connect(":memory:")
            try:
                base.execute("SET GLOBAL parquet_can_have_nan = true")
            except Exception:  # noqa: BLE001 - older DuckDB: no pushdown, still right
                base.execute(
                    "SET GLOBAL disabled_optimizers = 'filter_pushdown,statistics_propagation'"
                )
            _base = base
        return _base.cursor()


_names = itertools.count(1)


class _Source:
    """FROM text for Parquet parts (a pyarrow dataset where a path literal cannot be made),
    or, when ``cached`` holds its rows in memory (no cache folder could be written: a full
    disk), for those."""

    def __init__(self, con: Any, cached: Any = None) -> None:
        self.con = con
        self.cached = cached

    def __call__(self, parts: Sequence[Path]) -> str:
        if self.cached is not None and self.cached.memory:
            import pyarrow as pa
            import pyarrow.parquet as pq

            name = f"_ui_parts_{next(_names)}"
            tables = [pq.read_table(pa.BufferReader(b)) for b in self.cached.memory]
            self.con.register(name, pa.concat_tables(tables))
            return name
        lits = [path_literal(Path(p)) for p in parts]
        if all(lit is not None for lit in lits):
            return f"read_parquet([{', '.join(lits)}])"  # type: ignore[arg-type]
        import pyarrow.dataset as ds

        name = f"_ui_parts_{next(_names)}"
        self.con.register(name, ds.dataset([os.path.abspath(p) for p in parts], format="parquet"))
        return name


_read = threading.local()


@contextlib.contextmanager
def parts_read() -> Iterator[list[Path]]:
    """The cache parts handed to DuckDB on this thread while inside (a request's): when
    reading fails without naming one (a damaged footer), the server checks them
    (:func:`expr_tracker.query.api.recover_cache`) and answers again."""
    prev = getattr(_read, "parts", None)
    _read.parts = parts = []
    try:
        yield parts
    finally:
        _read.parts = prev


def _cached(catalog: Catalog, p: Producer, kind: str) -> Any:
    """The producer's columnar cache of ``kind`` (None: no such file, or gone); the source
    opened only as a regular file inside the served folder (:class:`Unreadable` else)."""
    from expr_tracker.query.cache import refresh

    path = p.metrics if kind == "metrics" else p.spans
    if path is None:
        return None
    try:
        c = refresh(path, kind, cache_dir=catalog.cache_dir, root=catalog.root_real)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:
        raise Unreadable(f"{path.name} of {p.run_id!r}: {why(exc)}") from None
    seen = getattr(_read, "parts", None)
    if seen is not None:
        seen.extend(c.parts)
    return c if c.parts or c.memory else None


def _metrics_sql(con: Any, catalog: Catalog, p: Producer) -> str | None:
    """A SELECT of the producer's metric rows (the ``metrics`` view's columns), or None."""
    c = _cached(catalog, p, "metrics")
    if c is None:
        return None
    return metrics_select(p, c.parts, c.merged, _Source(con, c))


# ----------------------------------------------------------------------------- runs


def runs_list(catalog: Catalog) -> list[dict]:
    """Every run under the folder (see :func:`table_row`), newest first (by first start);
    a run deleted since it was found is left out, one that cannot be read is listed with
    ``status`` ``unreadable`` and its ``error``."""
    return catalog.table()


def _small(path: Path | None, root: str, errors: list[str]) -> Any:
    """A small JSON file of a run read as untrusted; None (with the reason in ``errors``
    unless it is simply absent) when it cannot be read."""
    if path is None:
        return None
    try:
        return read_json(path, root=root, max_bytes=SMALL_MAX)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:
        errors.append(f"{path.name}: {why(exc)}")
        return None


def _pairs(value: Any) -> list[list[Any]]:
    """``[[dotted key, value], ...]`` of a config or summary (a nested dict; anything else
    has none), values as the page's JSON takes them (NaN and ±inf as strings)."""
    if not isinstance(value, dict):
        return []
    return [[".".join(k), json_safe(v, "string")] for k, v in flatten(value).items()]


def run_detail(catalog: Catalog, run_id: str) -> dict:
    """The run page's data but the series: the runs table's line, metrics, step metrics,
    config and summary (flattened), alert events; ``producer_steps`` as far as the
    columnar cache (which the charts read) reaches; ``error`` names every file that could
    not be read (the rest is shown)."""
    prods = catalog.get(run_id)
    row = catalog.row(run_id, prods)
    root = catalog.root_real
    errors: list[str] = [row["error"]] if row["error"] else []
    con = duckdb_cursor()
    metrics: dict[str, set[str]] = {}
    producer_steps: dict[str, int] = {}
    try:
        for p in prods:
            try:
                c = _cached(catalog, p, "metrics")
            except Unreadable as exc:
                if p.metrics is not None and not any(e.startswith(p.metrics.name) for e in errors):
                    errors.append(str(exc))
                continue
            if c is None:
                continue
            (top,) = con.execute(f"SELECT max(step) FROM {_Source(con, c)(c.parts)}").fetchall()[0]
            if top is not None:
                producer_steps[producer_label(p)] = int(top)
            sql = metrics_select(p, c.parts, c.merged, _Source(con, c))
            for (m,) in con.execute(
                f"SELECT DISTINCT metric FROM ({sql}) WHERE value IS NOT NULL OR text IS NULL"
            ).fetchall():
                metrics.setdefault(m, set()).add(producer_label(p))
    finally:
        con.close()
    step_metrics: dict[str, str] = {}
    for p in prods:
        if p.metrics is not None:
            defs = MetricDefs()
            raw = _small(defs_path_for(p.metrics), root, errors)
            if raw is not None:
                try:
                    defs.load(raw)
                except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
                    errors.append(f"{defs_path_for(p.metrics).name}: not metric definitions")
            for m in metrics:
                sm = defs.step_metric_of(m)
                if sm and sm in metrics:
                    step_metrics[m] = sm
    main = prods[0]
    config = _small(main.config, root, errors)
    summary = _small(main.summary, root, errors)
    alerts = alert_events(prods, root, errors)
    if producer_steps:
        row["producer_steps"] = producer_steps
    return {
        **row,
        "path": str(main.run_dir),
        "metrics": sorted(metrics),
        "step_metrics": step_metrics,
        "x_options": sorted(set(step_metrics.values())),
        "config": _pairs(config),
        "summary": [kv for kv in _pairs(summary) if kv[0][:1] != "_"],
        "alerts": alerts,
        "has_spans": any(p.spans is not None for p in prods),
        "error": "; ".join(dict.fromkeys(errors)) or None,
    }


def alert_events(prods: list[Producer], root: str, errors: list[str] | None = None) -> list[dict]:
    """The alert transitions (firing, recovered) of the run's producers, in file order (each
    alert log read as :func:`~expr_tracker.history.alertlog.read_alert_log` reads it, inside
    ``root``; what cannot be read is named in ``errors``, a line that is no record skipped)."""
    out: list[dict] = []
    for p in prods:
        if p.alerts is None:
            continue
        try:
            lines = read_alert_log(p.alerts, root=root, max_bytes=ALERTS_MAX)
        except OSError as exc:
            if errors is not None:
                errors.append(f"{p.alerts.name}: {why(exc)}")
            continue
        for line in lines.records:
            rec = line.record
            if rec.get("kind") != "transition":
                continue  # deliveries are not drawn
            step = rec.get("step", rec.get("_step"))
            metrics = rec.get("metrics")
            out.append(
                {
                    "producer": producer_label(p),
                    "rule": _str(rec.get("rule")),
                    "event": _str(rec.get("event")),
                    "state": _str(rec.get("state")),
                    "level": _str(rec.get("level")),
                    "step": step if type(step) is int else None,
                    "time": _num(rec.get("time")),
                    "message": _str(rec.get("message") or rec.get("title")),
                    "metrics": sorted(str(m) for m in metrics) if isinstance(metrics, dict) else [],
                }
            )
    return out


def _str(v: Any) -> str | None:
    return None if v is None else str(v)


# ----------------------------------------------------------------------------- series


def _xsql(x: str) -> tuple[str, str]:
    """(x expression, extra join) for the x axis ``x``."""
    if x == "step":
        return "m.step::DOUBLE", ""
    if x == "time":
        return "m.time", ""
    return "s.value", (
        f" JOIN (SELECT step, value FROM src WHERE metric = {sql_literal(x)}) s ON s.step = m.step"
    )


def parse_float(name: str, v: str | None) -> float | None:
    if v is None or v == "":
        return None
    try:
        f = float(v)
    except ValueError:
        raise BadRequest(f"{name}={v!r} is not a number") from None
    if not math.isfinite(f):
        raise BadRequest(f"{name}={v!r} is not a finite number")
    return f


def _span(lo: float, hi: float, width: int) -> None:
    """BadRequest when ``[lo, hi]`` cannot be cut into ``width`` buckets with finite
    numbers: ``hi - lo`` overflows (``lo=-1e308&hi=1e308``: a point's offset from ``lo``
    may too) or ``width / (hi - lo)`` does (``lo=0&hi=5e-324``: an infinite scale)."""
    span = hi - lo
    if not math.isfinite(span):
        raise BadRequest(
            f"the x range [{lo!r}, {hi!r}] is wider than a float holds: ask a narrower lo/hi"
        )
    if span > 0 and not math.isfinite(width / span):
        raise BadRequest(
            f"the x range [{lo!r}, {hi!r}] is too narrow to cut into {width} buckets: "
            "ask a wider lo/hi"
        )


def series(
    catalog: Catalog,
    run_id: str,
    metric: str,
    *,
    x: str = "step",
    width: int = 1000,
    lo: float | None = None,
    hi: float | None = None,
    sql_min: int = 100_000,
) -> dict:
    """One metric of a run, one trace per producer holding it, downsampled to ``width``
    buckets over ``[lo, hi]`` (default: all of it).

    Returns ``{"metric", "x", "traces": [{"producer", "x", "y", "step", "nonfinite",
    "total"}]}``: ``total`` counts the points in range before downsampling; ``x`` is the
    step, epoch seconds (``time``) or the step metric's value. Up to ``sql_min`` points are
    cut by :func:`expr_tracker.history.downsample.m4`; more by the same M4 in DuckDB (the
    rows never leave it; first and last by step, a tie for min or max may pick another of
    the equal points).
    """
    if not 1 <= width <= MAX_WIDTH:
        raise BadRequest(f"width={width} is not valid: 1..{MAX_WIDTH}")
    if lo is not None and hi is not None and lo > hi:
        raise BadRequest(f"lo={lo} > hi={hi}")
    if lo is not None and hi is not None:
        _span(lo, hi, width)
    prods = catalog.get(run_id)
    con = duckdb_cursor()
    traces = []
    try:
        for p in prods:
            sql = _metrics_sql(con, catalog, p)
            if sql is None:
                continue
            xexpr, join = _xsql(x)
            where = [f"m.metric = {sql_literal(metric)}", "m.value IS NOT NULL"]
            where.append(f"{xexpr} IS NOT NULL AND isfinite({xexpr})")
            if lo is not None:
                where.append(f"{xexpr} >= {lo!r}")
            if hi is not None:
                where.append(f"{xexpr} <= {hi!r}")
            sel = (
                f"WITH src AS ({sql}) SELECT {xexpr} AS x, m.value AS y, m.step AS step "
                f"FROM src m{join} WHERE {' AND '.join(where)}"
            )
            pts = f"WITH pts AS ({sel}) "
            n, xmin, xmax = con.execute(f"{pts}SELECT count(*), min(x), max(x) FROM pts").fetchone()
            if n == 0:
                continue
            a = float(xmin) if lo is None else lo
            b = float(xmax) if hi is None else hi
            _span(a, b, width)
            if n <= sql_min:
                cols = con.execute(f"{pts}SELECT x, y, step FROM pts ORDER BY step").fetchnumpy()
                xs, ys, steps = cols["x"], cols["y"], cols["step"]
                kept = chart_points(xs, ys, width, lo, hi)
            else:
                cols = _m4_sql(con, pts, width, a, b)
                xs, ys, steps = cols["x"], cols["y"], cols["step"]
                kept = kept_points(xs, ys, range(len(xs)))
            traces.append(_trace(p, kept, steps, int(n)))
    finally:
        con.close()
    if not traces and metric not in _metric_names(catalog, prods):
        raise NotFound(f"run {run_id!r} has no metric {metric!r}")
    return {"metric": metric, "x": x, "traces": traces}


def _m4_sql(con: Any, pts: str, width: int, lo: float, hi: float) -> dict:
    """M4 of the rows of the CTE ``pts`` (x, y, step; ``pts`` is its ``WITH`` clause) over
    ``[lo, hi]`` in ``width`` buckets, bucketed as
    :func:`~expr_tracker.history.downsample.m4` does, plus every non-finite ``y``, in one
    scan; ``{"x", "y", "step"}`` lists ordered by step."""
    scale = width / (hi - lo) if hi > lo else 0.0
    bucket = f"LEAST(CAST(floor((x - {lo!r}) * {scale!r}) AS BIGINT), {width - 1})"
    row = "{'x': x, 'y': y, 's': step}"
    fin = "FILTER (WHERE isfinite(y))"
    q = (
        f"{pts}SELECT arg_min({row}, step) {fin}, arg_max({row}, step) {fin}, "
        f"arg_min({row}, y) {fin}, arg_max({row}, y) {fin}, "
        f"list({row}) FILTER (WHERE NOT isfinite(y)) "
        f"FROM pts WHERE x BETWEEN {lo!r} AND {hi!r} GROUP BY {bucket}"
    )
    keep: dict[int, tuple[float, float]] = {}
    for first, last, lo_pt, hi_pt, bad in con.execute(q).fetchall():
        for pt in (first, last, lo_pt, hi_pt, *(bad or ())):
            if pt is not None:
                keep[pt["s"]] = (pt["x"], pt["y"])
    steps = sorted(keep)
    return {"x": [keep[st][0] for st in steps], "y": [keep[st][1] for st in steps], "step": steps}


def _metric_names(catalog: Catalog, prods: list[Producer]) -> set[str]:
    con = duckdb_cursor()
    names: set[str] = set()
    try:
        for p in prods:
            sql = _metrics_sql(con, catalog, p)
            if sql is not None:
                names.update(
                    r[0] for r in con.execute(f"SELECT DISTINCT metric FROM ({sql})").fetchall()
                )
    finally:
        con.close()
    return names


def _trace(p: Producer, pts: ChartPoints, steps: Any, total: int) -> dict:
    """One producer's trace of a chart: the kept points (``y`` None where the value is not
    finite: a gap in the line) and each non-finite point in ``nonfinite``."""
    step = [int(steps[i]) for i in pts.index]
    return {
        "producer": producer_label(p),
        "x": pts.x,
        "y": pts.y,
        "step": step,
        "nonfinite": [{"x": pts.x[j], "step": step[j], "kind": k} for j, k in pts.nonfinite],
        "total": total,
    }


def new_points(
    catalog: Catalog,
    run_id: str,
    after: int,
    x: str = "step",
    since: dict[str, int] | None = None,
) -> dict:
    """Rows of every metric with a step above ``after`` (a live page's poll), per metric
    and producer: ``{"max_step", "max_steps", "reset", "metrics": {metric: [trace]}}``.
    ``since`` maps a producer label to its own last step (a rank or stream that lags the
    others, or a stream that stopped, is asked from where it is, not from the run's
    highest step); producers not in it use ``after``. ``max_steps``: each producer's
    highest step (as far as read). ``reset``: more than :data:`MAX_NEW_ROWS` new rows
    (the page reloads its charts instead; ``max_steps`` are then the producers' last
    steps, so the next poll asks only for what comes after the reload). Rows whose x is
    not finite (a NaN step metric) are left out, as :func:`series` leaves them out."""
    prods = catalog.get(run_id)
    since = since or {}
    con = duckdb_cursor()
    out: dict[str, list[dict]] = {}
    max_steps: dict[str, int] = {}
    reset = False
    try:
        for p in prods:
            sql = _metrics_sql(con, catalog, p)
            if sql is None:
                continue
            label = producer_label(p)
            start = int(since.get(label, after))
            max_steps[label] = start
            xexpr, join = _xsql(x)
            q = (
                f"WITH src AS ({sql}) SELECT m.metric AS metric, {xexpr} AS x, m.value AS y, "
                f"m.step AS step FROM src m{join} WHERE m.step > {start} "
                f"AND m.value IS NOT NULL AND {xexpr} IS NOT NULL AND isfinite({xexpr}) "
                f"ORDER BY m.metric, m.step LIMIT {MAX_NEW_ROWS + 1}"
            )
            rows = con.execute(q).fetchall()
            if len(rows) > MAX_NEW_ROWS:
                reset = True
                break
            by: dict[str, list[tuple]] = {}
            for r in rows:
                by.setdefault(r[0], []).append(r)
                max_steps[label] = max(max_steps[label], int(r[3]))
            for m, rs in by.items():
                xs = [r[1] for r in rs]
                ys = [r[2] for r in rs]
                steps = [r[3] for r in rs]
                kept = kept_points(xs, ys, range(len(rs)))
                out.setdefault(m, []).append(_trace(p, kept, steps, len(rs)))
        if reset:  # the page reloads everything: the next poll starts at each one's end
            out = {}
            for p in prods:
                sql = _metrics_sql(con, catalog, p)
                if sql is None:
                    continue
                (top,) = con.execute(f"SELECT max(step) FROM ({sql})").fetchone()
                if top is not None:
                    max_steps[producer_label(p)] = int(top)
    finally:
        con.close()
    status = catalog.row(run_id, prods)["status"]  # FileNotFoundError: deleted
    max_step = max([after, *max_steps.values()])
    return {
        "max_step": max_step,
        "max_steps": max_steps,
        "reset": reset,
        "metrics": out,
        "status": status,
    }


# ----------------------------------------------------------------------------- spans


def span_breakdown(
    catalog: Catalog, run_id: str, start: int | None = None, stop: int | None = None
) -> dict:
    """Mean, total and count of ``dur_ms`` per span path over steps ``[start, stop)``
    (either bound optional), slowest mean first: ``{"rows": [{"name", "count", "mean_ms",
    "total_ms", "max_ms"}], "start", "stop"}``."""
    prods = catalog.get(run_id)
    con = duckdb_cursor()
    selects = []
    try:
        for p in prods:
            c = _cached(catalog, p, "spans")
            if c is not None:
                selects.append(f"SELECT name, dur_ms, step FROM {_Source(con, c)(c.parts)}")
        if not selects:
            return {"rows": [], "start": start, "stop": stop}
        where = ["dur_ms IS NOT NULL"]
        if start is not None:
            where.append(f"step >= {int(start)}")
        if stop is not None:
            where.append(f"step < {int(stop)}")
        q = (
            f"SELECT name, count(*), avg(dur_ms), sum(dur_ms), max(dur_ms) FROM "
            f"({' UNION ALL '.join(selects)}) WHERE {' AND '.join(where)} "
            f"GROUP BY name ORDER BY avg(dur_ms) DESC, name"
        )
        rows = [
            {"name": r[0], "count": r[1], "mean_ms": r[2], "total_ms": r[3], "max_ms": r[4]}
            for r in con.execute(q).fetchall()
        ]
    finally:
        con.close()
    return {"rows": json_safe(rows, "string"), "start": start, "stop": stop}


def trace_chunks(
    catalog: Catalog, run_id: str, start: int | None, stop: int | None
) -> Iterator[bytes]:
    """The run's Chrome Trace over steps ``[start, stop)`` as chunks of JSON text, streamed
    as ``et trace`` writes it (:func:`expr_tracker.trace.iter_trace`: spooled in SQLite,
    memory independent of the number of spans). The span files are read (only regular
    files inside the served folder) before this returns, so a bad file is an error here
    (:class:`Unreadable`), not a broken download; the rest is made as it is consumed."""
    from expr_tracker.trace import iter_trace

    prods = catalog.get(run_id)
    if not any(p.spans is not None for p in prods):
        raise NotFound(f"run {run_id!r} has no span file")
    rng = None if start is None and stop is None else (start, stop)
    it = iter_trace(prods[0].run_dir, step_range=rng, root=catalog.root_real)
    try:
        first = next(it)
    except (OSError, ValueError, RecursionError) as exc:
        it.close()
        if isinstance(exc, FileNotFoundError):
            raise
        raise Unreadable(f"the span files of {run_id!r}: {why(exc)}") from None

    def chunks() -> Iterator[bytes]:
        try:
            yield first
            yield from it
        finally:
            it.close()  # the spool is removed

    return chunks()


# ----------------------------------------------------------------------------- compare


def _check_compare_files(run_id: str, prods: list[Producer], root: str) -> None:
    """:class:`Unreadable` unless every file :func:`~expr_tracker.query.compare.compare_runs`
    reads of the run is a regular file inside ``root`` (opened and closed here: a FIFO, a
    link out of the folder or a file this user may not read is refused before compare
    reads it)."""
    files: list[Path] = []
    for p in prods:
        files += [f for f in (p.config, p.summary, p.run_file, p.metrics) if f is not None]
        if p.metrics is not None:
            files.append(meta_path_for(p.metrics))
        files.append(p.run_dir / file_name("metric_defs", p.stream, p.rank))
    for f in files:
        try:
            os.close(open_regular(f, root=root))
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise Unreadable(f"{f.name} of {run_id!r}: {why(exc)}") from None


def compare(catalog: Catalog, run_ids: list[str]) -> dict:
    """Config and summary differences of the runs (:func:`expr_tracker.query.compare.compare_runs`,
    every key, ``equal`` telling which differ) plus the metrics each run has."""
    from expr_tracker.query.compare import CompareError, compare_runs

    if len(run_ids) < 2:
        raise BadRequest(f"compare needs at least two runs, got {len(run_ids)}")
    if len(set(run_ids)) != len(run_ids):
        raise BadRequest("a run is given twice")
    prods = [catalog.get(r) for r in run_ids]
    for rid, ps in zip(run_ids, prods, strict=True):
        _check_compare_files(rid, ps, catalog.root_real)
    try:
        res = compare_runs([p[0].run_dir for p in prods], root=catalog.root, include_equal=True)
    except CompareError as exc:
        raise BadRequest(str(exc)) from None
    for r, rid in zip(res["runs"], run_ids, strict=True):
        r["run"] = rid
    metrics: set[str] = set()
    for ps in prods:
        metrics |= _metric_names(catalog, ps)
    res["metrics"] = sorted(metrics)
    return json_safe(res, "string")
