"""The runs the dashboard serves, and the one lookup of a run a request names.

Runs are found with :func:`expr_tracker.query.catalog.discover` and looked up by their
``run_id`` in that list (:class:`Catalog`), else by name as every command names a run
(``query/catalog.py``'s ``match_runs``, docs/cli.md "Naming a run"): a run identifier from
a request is never joined into a path, so nothing outside the served folder can be named.
Discovery follows links, as ``et runs`` does; only what lies inside the served folder is
served (:func:`contained`).

The catalog is shared by every page (``ui/runs.py``, ``ui/runpage.py``, ``ui/series.py``,
``ui/spans.py``, ``ui/compare.py``); it owns the runs table's reading
(:class:`~expr_tracker.ui.runs.RunsTable`), which reuses what discovery learnt of a run
directory.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import Any

from expr_tracker.query.catalog import Producer, discover, match_runs, producers_of, run_entries
from expr_tracker.ui.errors import NotFound, why
from expr_tracker.ui.runs import RACY_NS, RowFiles, RunsTable, file_sig, row_files, settled

__all__ = ["DISCOVER_TTL", "FILE_FIELDS", "Catalog", "contained"]

#: seconds a discovered run list is reused before the folder is searched again
DISCOVER_TTL = 2.0
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


def _identity_files(files: tuple[str | None, ...]) -> list[str]:
    """The ``run*.json`` files and sidecars among ``files`` (a :func:`row_files`: what names
    a run)."""
    return [f for i, f in enumerate(files) if f is not None and i % 3 != 1]


def _dir_sig(run_dir: Path, files: list[str]) -> tuple[Any, ...]:
    try:
        st = os.stat(run_dir)
        own: tuple[int, ...] | None = (st.st_mtime_ns, st.st_ino, st.st_dev)
    except OSError:
        own = None
    return (own, *(file_sig(f) for f in files))


class Catalog:
    """The runs under ``root``, re-discovered at most every :data:`DISCOVER_TTL` seconds,
    incrementally: a run directory whose listing and identity files did not change is not
    read again. A run is looked up by id or by name (:meth:`get`); the runs table
    (:attr:`rows`, a :class:`~expr_tracker.ui.runs.RunsTable`) is kept here, told what
    discovery found of each run directory (:meth:`found`)."""

    def __init__(self, root: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None):
        self.root = Path(root)
        self.root_real = os.path.realpath(self.root)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._lock = threading.Lock()
        self._runs: dict[str, list[Producer]] = {}
        self._at = -1e18
        self._dirs: dict[Path, _DirSeen] = {}
        self._walked: set[Path] = set()
        self.rows = RunsTable(self.root_real, self.found)

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
        files = row_files(prods)
        sig = _dir_sig(run_dir, _identity_files(files))
        stable = sig[0] is not None and sig[0][0] < started - RACY_NS and settled(sig[1:], started)
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

    def invalidate(self) -> None:
        """Search the folder again at the next look (runs added since, e.g. by a refresh
        of a bucket's copy), however recent the last search."""
        with self._lock:
            self._at = -1e18

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

    def found(self, run_dir: Path) -> RowFiles | None:
        """What discovery found of ``run_dir`` that its line of the runs table needs (None:
        not seen)."""
        d = self._dirs.get(run_dir)
        return None if d is None else RowFiles(d.row_files, d.error)

    def row(self, run_id: str, prods: list[Producer] | None = None) -> dict[str, Any]:
        """The run's line of the runs table (:meth:`RunsTable.line
        <expr_tracker.ui.runs.RunsTable.line>`); FileNotFoundError when the run's directory
        is gone."""
        return self.rows.line(run_id, self.get(run_id) if prods is None else prods)

    def table(self) -> list[dict[str, Any]]:
        """Every run's line, newest first (:meth:`RunsTable.lines
        <expr_tracker.ui.runs.RunsTable.lines>`)."""
        return self.rows.lines(self.runs())
