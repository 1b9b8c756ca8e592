"""The dashboard's runs table: a line per run, read again only when its files changed.

A run's line (:func:`table_row`) is made from what :func:`read_row` reads: its
``run*.json`` files and, per producer, the last row of its metrics file
(:func:`last_row`) and the sidecar's ``max_step``, never the columnar cache: one huge or
wide run costs the table what its last line costs. Status is judged as ``et runs`` does
(:mod:`expr_tracker.history.rundirs`); a run that cannot be read is listed ``unreadable``
with its ``error``, never dropped, and one bad run never empties the table.

:class:`RunsTable` keeps what was read per run directory with the signatures (size, mtime,
inode) of the files it came from (:func:`row_files`: ``run*.json``, metrics files, their
sidecars): a line is read again only when one changed, or when it changed too recently to
trust (:data:`RACY_NS`). The status of a ``running`` run is judged again every time (its
process may have died). The :class:`~expr_tracker.ui.catalog.Catalog` owns one and tells it
what discovery found of each run directory (:class:`RowFiles`).

Every file is opened as untrusted input with :mod:`expr_tracker.history.untrusted`
(docs/ui.md "Security"), inside the served folder's real path.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from expr_tracker.history.codec import is_step
from expr_tracker.history.reader import meta_path_for
from expr_tracker.history.rundirs import worst_status
from expr_tracker.history.runinfo import dead_status, is_dead, run_life
from expr_tracker.history.untrusted import load_json_bytes, open_regular, read_json
from expr_tracker.history.values import dotted
from expr_tracker.query.catalog import Producer
from expr_tracker.query.runselect import (
    RunFilterError,
    parse_column_list,
    parse_sort,
    select_runs,
)
from expr_tracker.ui.errors import BadRequest, why

if TYPE_CHECKING:
    from expr_tracker.ui.catalog import Catalog

__all__ = [
    "RACY_NS",
    "SMALL_MAX",
    "TAIL_MAX",
    "UNREADABLE",
    "RowFiles",
    "RunsTable",
    "extra_files",
    "file_sig",
    "finite_number",
    "last_row",
    "producer_label",
    "read_row",
    "row_files",
    "runs_list",
    "runs_page",
    "settled",
    "table_row",
    "unreadable_row",
]

#: a file changed less than this before it was read may change again within the same
#: timestamp tick: what was read from it is not reused (read again next time)
RACY_NS = 2_000_000_000
#: the most bytes read back from the end of a metrics file for its last row
TAIL_MAX = 16 << 20
#: the most bytes of a small JSON file (run.json, config.json, summary.json) read whole
SMALL_MAX = 16 << 20
#: status of a run one of whose ``run*.json`` could not be read
UNREADABLE = "unreadable"


def producer_label(p: Producer) -> str:
    """``main``, ``S``, ``main/rank1``, ``S/rank2``: the producer's short name."""
    base = p.stream or "main"
    return base if p.rank == 0 else f"{base}/rank{p.rank}"


def file_sig(path: str | Path | None) -> tuple[int, ...] | None:
    """What says a file changed: (mtime_ns, size, inode, device), None when absent."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)


def settled(sigs: Sequence[tuple[int, ...] | None], read_at_ns: int) -> bool:
    """Every file was last changed well before it was read (see :data:`RACY_NS`)."""
    return all(s is None or s[0] < read_at_ns - RACY_NS for s in sigs)


def row_files(prods: list[Producer]) -> tuple[str | None, ...]:
    """Per producer: its ``run*.json``, metrics file and the metrics file's sidecar."""
    out: list[str | None] = []
    for p in prods:
        meta = meta_path_for(p.metrics) if p.metrics is not None else None
        out += [str(f) if f is not None else None for f in (p.run_file, p.metrics, meta)]
    return tuple(out)


class RowFiles(NamedTuple):
    """What discovery found of a run directory that its line needs: the files the line is
    read from (:func:`row_files` of its producers), or why its producers could not be
    found (the run is listed ``unreadable`` with that reason)."""

    files: tuple[str | None, ...]
    error: str | None = None


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
    config: dict[str, Any] = dataclasses.field(default_factory=dict)  # dotted keys
    summary: dict[str, Any] = dataclasses.field(default_factory=dict)  # dotted keys


def _gone(prods: list[Producer]) -> None:
    """FileNotFoundError when the run's directory was deleted since it was found."""
    if not prods[0].run_dir.is_dir():
        raise FileNotFoundError(f"run directory {str(prods[0].run_dir)!r} is gone")


def last_row(path: Path, root: str) -> dict[str, Any] | None:
    """The last complete line of a metrics file that is a row (its ``_step`` a step: ``is_step``)
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
                if isinstance(r, dict) and is_step(r.get("_step")):
                    return r
            if start == 0 or want >= TAIL_MAX:
                return None
            want *= 4
    finally:
        os.close(fd)


def finite_number(v: Any) -> float | None:
    """``v`` as a float when it is a finite number (not a bool), else None."""
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
            t = finite_number(r.get("_time"))
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
    config, summary = (
        _small_dotted(getattr(prods[0], f), root, errors) for f in ("config", "summary")
    )
    return _RowSeen((), False, infos, steps, last_time, errors, config=config, summary=summary)


def _small_dotted(path: Path | None, root: str, errors: list[str]) -> dict[str, Any]:
    """The main producer's ``config.json`` or ``summary.json`` flattened to dotted keys
    (``{}`` when absent; one that cannot be read named in ``errors``)."""
    if path is None:
        return {}
    try:
        return dotted(read_json(path, root=root, max_bytes=SMALL_MAX))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as exc:
        errors.append(f"{path.name}: {why(exc)}")
        return {}


def extra_files(prods: list[Producer]) -> tuple[str | None, ...]:
    """The files a line reads beyond :func:`row_files`: the main producer's
    ``config.json`` and ``summary.json`` (its columns)."""
    return tuple(str(f) if f is not None else None for f in (prods[0].config, prods[0].summary))


def _status(info: dict[str, Any]) -> str:
    st = info.get("status")
    if not isinstance(st, str):
        return "unknown"
    if st == "running" and is_dead(info):
        return dead_status(info)  # as et runs judges it: its process is gone
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
    started = finite_number(info.get("started_at"))
    ended = finite_number(info.get("ended_at"))
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
        "archived": info.get("archived") is True,
        "producers": [producer_label(p) for p in prods],
        "producer_steps": dict(seen.steps),
        "error": "; ".join(seen.errors) or None,
        "config": seen.config,
        "summary": seen.summary,
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
        "archived": False,
        "producers": [producer_label(p) for p in prods],
        "producer_steps": {},
        "error": reason,
        "config": {},
        "summary": {},
    }


class RunsTable:
    """The lines of the runs table, each read again only when its files changed (see the
    module doc). ``found(run_dir)``: what discovery found of a run directory (None: not
    seen, the line's files are those of its producers)."""

    def __init__(self, root_real: str, found: Callable[[Path], RowFiles | None]) -> None:
        self.root_real = root_real
        self.found = found
        self._lock = threading.Lock()
        self._seen: dict[Path, _RowSeen] = {}

    def line(self, run_id: str, prods: list[Producer]) -> dict[str, Any]:
        """One line of the runs table (see :func:`table_row`); FileNotFoundError when the
        run's directory is gone."""
        _gone(prods)
        with self._lock:
            seen = self._read(prods)
        return table_row(run_id, prods, seen)

    def lines(self, runs: dict[str, list[Producer]]) -> list[dict[str, Any]]:
        """Every run's line, newest first (by first start; a run deleted meanwhile left out,
        a run that cannot be read listed with its reason); what was kept of runs no longer
        in ``runs`` is dropped."""
        rows = []
        live = set()
        for rid, prods in runs.items():
            live.add(prods[0].run_dir)
            try:
                _gone(prods)
                with self._lock:  # per run: a run page asking meanwhile waits for one
                    seen = self._read(prods)
                rows.append(table_row(rid, prods, seen))
            except FileNotFoundError:  # deleted since it was found: not listed
                continue
            except Exception as exc:  # noqa: BLE001 - one run never empties the table
                rows.append(unreadable_row(rid, prods, why(exc)))
        with self._lock:
            for d in [d for d in self._seen if d not in live]:
                del self._seen[d]
        rows.sort(key=lambda r: (-(r["first_started_at"] or r["started_at"] or 0.0), r["run"]))
        return rows

    def _read(self, prods: list[Producer]) -> _RowSeen:
        if prods[0].unlisted is not None:  # a colleague's 0700 folder: listed, with why
            reason = f"the folder cannot be listed: {prods[0].unlisted}"
            return _RowSeen((), False, [], {}, None, [reason], unreadable=True)
        found = self.found(prods[0].run_dir)
        if found is not None and found.error is not None:
            return _RowSeen((), False, [], {}, None, [found.error], unreadable=True)
        files = (found.files if found is not None else row_files(prods)) + extra_files(prods)
        key = (files,)
        sig = key + tuple(file_sig(f) for f in files)
        seen = self._seen.get(prods[0].run_dir)
        if seen is not None and seen.stable and seen.sig == sig:
            return seen
        started = time.time_ns()
        seen = read_row(prods, self.root_real)
        seen.sig = key + tuple(file_sig(f) for f in files)
        seen.stable = settled(seen.sig[1:], started) and seen.sig == sig
        self._seen[prods[0].run_dir] = seen
        return seen


def runs_list(catalog: Catalog) -> list[dict]:
    """Every run under the folder (see :func:`table_row`), newest first (by first start);
    a run deleted since it was found is left out, one that cannot be read is listed with
    ``status`` ``unreadable`` and its ``error``."""
    return catalog.table()


def runs_page(
    catalog: Catalog,
    *,
    columns: str | None = None,
    sort: str | None = None,
    where: str | None = None,
    archived: bool = False,
) -> dict[str, Any]:
    """What ``/api/runs`` answers: the runs ``where`` keeps, ordered by ``sort`` (newest
    first between equal ones), archived ones only with ``archived``; each line without its
    config and summary but with ``values``, the shown ``columns`` (``columns`` given, else
    the config keys that differ between the kept runs), their ``labels``, every column
    name (``keys``), how many runs there are in all (``total``) and how many archived ones
    are hidden (``hidden``). The one parser and evaluation of ``et runs``
    (:mod:`expr_tracker.query.runselect`).

    Raises:
        BadRequest: a filter that does not parse, a column no run has (the message names
            the parameter, the text and what is valid).
    """
    rows = runs_list(catalog)
    shown = rows if archived else [r for r in rows if not r.get("archived")]
    try:
        chosen = select_runs(
            shown, columns=parse_column_list(columns), sort=parse_sort(sort), where=where
        )
    except RunFilterError as exc:
        raise BadRequest(str(exc)) from None
    out = []
    for r in chosen.runs:
        line = {k: v for k, v in r.items() if k not in ("config", "summary")}
        line["values"] = chosen.values(r)
        out.append(line)
    return {
        "runs": out,
        "columns": chosen.columns,
        "labels": chosen.labels,
        "keys": chosen.available,
        "total": len(rows),
        "hidden": len(rows) - len(shown),
    }
