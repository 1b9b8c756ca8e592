"""``baseline(metric, runs="sweep/*", q=0.5)``: a metric of other runs, per step
(docs/alerts.md "Comparing with other runs").

:class:`Baselines` is what an engine asks for the table of one ``baseline()`` call. It is
handed to the engine by the composition root; :meth:`Baselines.open` (at ``et.init``, once
the run directory is chosen) reads every finished peer run once: the runs under the runs
root whose ``project/name`` matches the glob, whose ``run.json`` says ``finished``, the
current run excluded. A table asked for after ``open`` (``et.add_alert_rule``) is read at
once; before it (``et rules check``, ``et config validate``) a table stays empty, so
``baseline()`` is UNKNOWN there.

:func:`quantile_table` is the arithmetic: on the union of the peers' steps, each peer
contributes its latest value at or before the step, as long as the step is within the
steps it logged (a peer that ended at step 500 does not vote at step 600); the
``q``-quantile of those votes (NumPy's default, linear interpolation; NaN votes are left
out) is the value of the step, UNKNOWN where fewer than ``min_runs`` peers vote.

:class:`BaselineTable` answers a step in O(1) while steps move forward (a cursor; a step
going back is found by bisection): the value of the last known step at or before it,
UNKNOWN before the first one.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import threading
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["BaselineTable", "Baselines", "find_peers", "quantile_table"]

log = logging.getLogger("expr_tracker.alerts")

#: rows of the per-step vote matrix computed at once (bounded memory for long runs)
_BLOCK = 8192


class BaselineTable:
    """The per-step value of one ``baseline()`` call: ``steps`` ascending, ``values``
    (float, NaN for UNKNOWN), replaced together (``data``) so a reader never sees one
    without the other. ``runs``: the peer runs read (their directories)."""

    __slots__ = ("key", "data", "runs", "_i")

    def __init__(self, key: tuple) -> None:
        self.key = key
        self.data: tuple[list[int], list[float]] = ([], [])
        self.runs: list[str] = []
        self._i = 0

    @property
    def steps(self) -> list[int]:
        return self.data[0]

    @property
    def values(self) -> list[float]:
        return self.data[1]

    def fill(self, steps: Sequence[int], values: Sequence[float], runs: list[str]) -> None:
        self._i = 0
        self.data = ([int(s) for s in steps], [float(v) for v in values])
        self.runs = runs

    def at(self, step: int | None) -> float | None:
        """The value at ``step`` (the last known step <= it); None (UNKNOWN) before the first
        step, for a step of None, and where too few peers voted."""
        steps, values = self.data
        n = len(steps)
        if step is None or not n:
            return None
        i = self._i
        if i < n and steps[i] <= step:
            j = i + 1
            if j < n and steps[j] <= step:  # moved on: usually to the next step
                i = j if j + 1 == n or step < steps[j + 1] else bisect_right(steps, step) - 1
                self._i = i
        else:
            i = bisect_right(steps, step) - 1
            if i < 0:
                return None
            self._i = i
        v = values[i]
        return None if v != v else v


def quantile_table(
    peers: Sequence[tuple[Any, Any]], q: float, min_runs: int = 1
) -> tuple[Any, Any]:
    """``(steps, values)``: the ``q``-quantile per step across ``peers`` (each ``(steps,
    values)``, steps ascending), as the module docstring says; NaN where fewer than
    ``min_runs`` peers vote. Arrays are NumPy (int64, float64)."""
    import numpy as np

    peers = [(np.asarray(s, dtype=np.int64), np.asarray(v, dtype=np.float64)) for s, v in peers]
    peers = [(s, v) for s, v in peers if len(s)]
    if not peers:
        return np.empty(0, np.int64), np.empty(0, np.float64)
    steps = np.unique(np.concatenate([s for s, _ in peers]))
    out = np.full(len(steps), np.nan)
    for lo in range(0, len(steps), _BLOCK):
        block = steps[lo : lo + _BLOCK]
        votes = np.full((len(block), len(peers)), np.nan)
        for j, (s, v) in enumerate(peers):
            at = np.searchsorted(s, block, side="right") - 1
            ok = (at >= 0) & (block <= s[-1])
            votes[ok, j] = v[at[ok]]
        counts = np.count_nonzero(~np.isnan(votes), axis=1)
        enough = counts >= max(int(min_runs), 1)
        if enough.any():
            out[lo : lo + len(block)][enough] = _row_quantiles(votes[enough], counts[enough], q)
    return steps, out


def _row_quantiles(votes: Any, counts: Any, q: float) -> Any:
    """The ``q``-quantile of each row's non-NaN values (``counts`` of them, >= 1), NumPy's
    linear method (``np.nanquantile``'s answer), vectorised: ``np.nanquantile`` along an axis
    goes row by row in Python when NaNs are present."""
    import numpy as np

    ordered = np.sort(votes, axis=1)  # NaN last
    pos = q * (counts - 1)
    below = np.floor(pos).astype(np.int64)
    above = np.minimum(below + 1, counts - 1)
    frac = pos - below
    rows = np.arange(len(ordered))
    a, b = ordered[rows, below], ordered[rows, above]
    with np.errstate(invalid="ignore"):  # inf - inf where frac is 0: not used
        return np.where(frac == 0, a, a + (b - a) * frac)


def find_peers(root: Path, pattern: str, exclude: Path | None = None) -> list[Path]:
    """Run directories ``<root>/<project>/<name>`` whose ``project/name`` matches
    ``pattern`` (``fnmatch``: ``*``, ``?``, ``[...]``; a ``*`` stops at ``/``), whose
    ``run.json`` says ``finished``; ``exclude`` (the current run) left out. Sorted."""
    from expr_tracker.history.runinfo import load_run_info

    head, sep, tail = pattern.partition("/")
    if not sep:  # "sweep" alone: every run of that project
        tail = "*"
    out: list[Path] = []
    try:
        projects = sorted(
            (p for p in os.scandir(root) if p.is_dir(follow_symlinks=False)), key=lambda p: p.name
        )
    except OSError:
        return out
    skip = os.path.realpath(exclude) if exclude is not None else None
    for project in projects:
        if project.name.startswith(".") or not fnmatch.fnmatchcase(project.name, head):
            continue
        try:
            names = sorted(
                (p for p in os.scandir(project.path) if p.is_dir()), key=lambda p: p.name
            )
        except OSError:
            continue
        for entry in names:
            if entry.name.startswith(".") or not fnmatch.fnmatchcase(entry.name, tail):
                continue
            path = Path(entry.path)
            if skip is not None and os.path.realpath(path) == skip:
                continue
            try:
                info = load_run_info(path / "run.json")
            except (OSError, ValueError):
                continue
            if info.get("status") == "finished":
                out.append(path)
    return out


def _peer_column(run_dir: Path, metric: str) -> tuple[Any, Any] | None:
    """``(steps, values)`` of ``metric`` (exact, else ``.`` -> ``/``) in the run's main
    metrics file, in step order; None when it cannot be read or lacks the metric."""
    from expr_tracker.history.columns import read_columns

    alt = metric.replace(".", "/")
    try:
        cols = read_columns(run_dir / "metrics.jsonl", lambda k: k == metric or k == alt)
    except (OSError, ValueError):
        return None
    col = cols.columns.get(metric) or cols.columns.get(alt)
    if col is None or not len(col):
        return None
    col = col.ordered()
    return col.steps, col.values


class Baselines:
    """The tables of an engine's ``baseline()`` calls, read from the runs root.

    ``table(metric, runs, q, min_runs)`` is called when a rule is compiled (the same
    arguments share one table); :meth:`open` reads them all. ``runs`` None means the current
    run's project (``"<project>/*"``).
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        project: str | None = None,
        *,
        peers: Mapping[str, Mapping[str, tuple[Sequence[int], Sequence[float]]]] | None = None,
    ) -> None:
        self.root = Path(root) if root is not None else None
        self.project = project
        self.exclude: Path | None = None
        #: in-memory peer runs instead of a runs root (``et rules test``'s ``peer_runs``):
        #: ``"project/name"`` -> metric -> ``(steps, values)``; open from the start
        self.peers = peers
        self.opened = peers is not None
        self._tables: dict[tuple, BaselineTable] = {}
        self._lock = threading.Lock()

    def table(self, metric: str, runs: str | None, q: float, min_runs: int) -> BaselineTable:
        key = (metric, runs, float(q), int(min_runs))
        with self._lock:
            table = self._tables.get(key)
            if table is None:
                table = self._tables[key] = BaselineTable(key)
                if self.opened:
                    self._load(table)
        return table

    def open(self, root: str | os.PathLike[str], project: str, exclude: Path | None) -> None:
        """Read every table asked for so far (and, from now on, each new one at once)."""
        with self._lock:
            self.root, self.project, self.exclude = Path(root), project, exclude
            self.opened = True
            peers: dict[tuple, list] = {}
            for table in self._tables.values():
                self._load(table, peers)

    def _load(self, table: BaselineTable, cache: dict | None = None) -> None:
        metric, runs, q, min_runs = table.key
        pattern = runs if runs is not None else f"{self.project}/*"
        key = (metric, pattern)
        got = cache.get(key) if cache is not None else None
        if got is None and self.peers is not None:
            got = []
            alt = metric.replace(".", "/")
            for name, columns in sorted(self.peers.items()):
                if runs is not None or self.project is not None:
                    if not fnmatch.fnmatchcase(name, pattern):
                        continue
                column = columns.get(metric) or columns.get(alt)
                if column is not None:
                    got.append((name, column))
        if got is None:
            if self.root is None:
                return
            got = []
            for run_dir in find_peers(self.root, pattern, self.exclude):
                column = _peer_column(run_dir, metric)
                if column is not None:
                    got.append((str(run_dir), column))
            if cache is not None:
                cache[key] = got
        steps, values = quantile_table([c for _, c in got], q, min_runs)
        table.fill(steps.tolist(), values.tolist(), [d for d, _ in got])

    def stats(self) -> dict[str, Any]:
        """Per table (``baseline(metric, runs=..., q=...)``): the peer runs read and the steps
        known; ``et.info()["alerts"]["baselines"]``."""
        out = {}
        for (metric, runs, q, min_runs), t in list(self._tables.items()):
            label = f"baseline({metric}, runs={runs or f'{self.project}/*'}, q={q:g}"
            label += f", min_runs={min_runs})" if min_runs != 1 else ")"
            out[label] = {"runs": len(t.runs), "steps": len(t.steps)}
        return out
