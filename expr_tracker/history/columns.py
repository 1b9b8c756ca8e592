"""Numeric columns of some metrics of one metrics file, read in one pass and extended as the
file grows (``et plot``, ``et plot --follow``).

:class:`MetricColumns` takes rows as the readers return them (``JsonlReader.iter_rows``, or
the lines a follower decodes) and keeps, per selected metric, three compact arrays: the
step, the row's ``_time`` (NaN when absent) and the value as a float. Rows are never kept,
so a file of a million steps costs 24 bytes per point and metric.

Values: int and float as they are (NaN and ±inf kept; an int too large for a float becomes
±inf), ``bool`` as 1.0/0.0; strings, lists, dicts and None are not plotted and are counted
(``Column.skipped``). A step written in several lines (a patch line after
``max_open_seconds``) keeps, per metric, the value of the last line, as every reader merges
it; lines out of step order are put back in step order (:meth:`Column.ordered`).
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["Column", "MetricColumns", "read_columns", "to_float"]

NAN = float("nan")
_NEW: Any = object()  # MetricColumns._known's answer for a key not met yet


def to_float(v: Any) -> float | None:
    """``v`` as a float for a chart (None: not a number: str, list, dict, None)."""
    t = type(v)
    if t is float:
        return v  # type: ignore[no-any-return]  # v is a float
    if t is int or t is bool:
        try:
            return float(v)
        except OverflowError:  # an int beyond the float range
            return float("inf") if v > 0 else float("-inf")
    return None


class Column:
    """One metric's points: ``steps`` (array of int64), ``times`` (``_time``, seconds,
    NaN when the row had none) and ``values`` (float64), in the order read;
    ``skipped`` counts the values that were not numbers."""

    __slots__ = ("name", "steps", "times", "values", "skipped", "_sorted")

    def __init__(self, name: str) -> None:
        self.name = name
        self.steps = array("q")
        self.times = array("d")
        self.values = array("d")
        self.skipped = 0
        self._sorted = True

    def __len__(self) -> int:
        return len(self.steps)

    def add(self, step: int, time: float, value: float) -> None:
        steps = self.steps
        if steps:
            last = steps[-1]
            if step == last:  # a patch line of the same step: the later line wins
                self.times[-1] = time
                self.values[-1] = value
                return
            if step < last:
                self._sorted = False
        steps.append(step)
        self.times.append(time)
        self.values.append(value)

    def ordered(self) -> Column:
        """This column in step order, one point per step (a later line of a step wins);
        itself when it already is."""
        if self._sorted:
            return self
        at: dict[int, int] = {}
        for i, s in enumerate(self.steps):
            at[s] = i  # the last line of each step
        keep = sorted(at.items())
        out = Column(self.name)
        out.skipped = self.skipped
        out.steps = array("q", (s for s, _ in keep))
        out.times = array("d", (self.times[i] for _, i in keep))
        out.values = array("d", (self.values[i] for _, i in keep))
        self.steps, self.times, self.values, self._sorted = out.steps, out.times, out.values, True
        return self


class MetricColumns:
    """The columns of the metrics ``select(name)`` accepts, built from rows.

    Args:
        select: which metric names to keep (called once per distinct name).
        since: skip rows whose ``_step`` is below this (None: none skipped).

    Attributes:
        names: every metric name met (selected or not), in order of first appearance.
        columns: selected name -> :class:`Column`.
        rows: rows taken (after ``since``).
        first_time: the ``_time`` of the first row met (before ``since`` too), or None.
    """

    def __init__(self, select: Callable[[str], bool], since: int | None = None) -> None:
        self.select = select
        self.since = since
        self.names: dict[str, bool] = {}
        self.columns: dict[str, Column] = {}
        self._known: dict[str, Column | None] = {}  # every key met -> its column or None
        self.rows = 0
        self.first_time: float | None = None

    def add_rows(self, rows: Iterable[dict[str, Any]]) -> None:
        """Take rows (dicts with an int ``_step``; others are ignored)."""
        known = self._known
        since = self.since
        for rec in rows:
            step = rec.get("_step")
            if type(step) is not int:
                continue
            t = rec.get("_time")
            if type(t) is not float:
                t = float(t) if type(t) is int else NAN
            if self.first_time is None and t == t:
                self.first_time = t
            if since is not None and step < since:
                continue
            self.rows += 1
            for k, v in rec.items():
                col = known.get(k, _NEW)
                if col is None:
                    continue  # a name not selected (or _step, _time)
                if col is _NEW:
                    col = self._learn(k)
                    if col is None:
                        continue
                if type(v) is not float:
                    v = to_float(v)
                    if v is None:
                        col.skipped += 1
                        continue
                steps = col.steps
                if steps and steps[-1] >= step:
                    col.add(step, t, v)  # a patch line, or a step out of order
                else:
                    steps.append(step)
                    col.times.append(t)
                    col.values.append(v)

    def _learn(self, name: str) -> Column | None:
        """The column of a name met for the first time (None: not selected)."""
        col = None
        if not name.startswith("_"):
            self.names[name] = True
            if self.select(name):
                col = self.columns[name] = Column(name)
        self._known[name] = col
        return col


def read_columns(
    path: str | os.PathLike[str],
    select: Callable[[str], bool],
    *,
    since: int | None = None,
    end: int | None = None,
    into: MetricColumns | None = None,
) -> MetricColumns:
    """The columns of the metrics ``select`` accepts in the metrics file ``path``, read up to
    byte ``end`` (None: the whole file; a torn last line is never read).

    With ``since``, a sorted file with a trustworthy sidecar is read from the sidecar's
    anchor for that step on (``JsonlReader.offset_of_step``), so the steps before it are not
    decoded; ``first_time`` then comes from the file's first row.

    Raises:
        FileNotFoundError / OSError: the file cannot be read.
    """
    from expr_tracker.history.reader import JsonlReader

    cols = into if into is not None else MetricColumns(select, since)
    reader = JsonlReader(path, end=end)
    start = 0
    if since is not None:
        head = next(reader.iter_rows(), None)
        t = head.get("_time") if head is not None else None
        if cols.first_time is None and type(t) in (int, float):
            # the run's start, also when its rows are skipped
            cols.first_time = float(t)  # type: ignore[arg-type]  # an int or a float
        start = reader.offset_of_step(since) if reader.sorted else 0
    cols.add_rows(reader.iter_rows(start))
    return cols
