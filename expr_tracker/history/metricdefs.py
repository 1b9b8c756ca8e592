"""``define_metric``: per-metric summaries (min/max/mean/...) and the step metric readers
index by.

A run's definitions live in :class:`MetricDefs` (held by its ``Summary``). On the row path
the summary calls :meth:`MetricDefs.update` only once some definition asks for an
aggregation, and then each key of the row costs one dict lookup unless it is defined.
The definitions and the aggregation state are saved beside ``summary.json`` in
``metric_defs[.S][.rankN].json`` (same moments: the periodic summary save, ``flush()``,
finish), so a resumed run keeps both: ``{"version": 1, "definitions": [...], "state":
{metric: {"count", "sum", "min", "max", "first", "last"}}, "_step": last step aggregated}``.

Summary shape (as wandb's summary): a metric defined with ``summary="min"`` appears in
``summary.json`` as ``{"val/loss": {"min": 0.31}}``; ``"min,max"`` gives both entries;
``"none"`` keeps the metric out of the summary; no definition (or ``"copy"``) keeps the
plain last value. A value the user assigns to the summary wins over all of this.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from expr_tracker.history.paths import file_name, parse_metrics_name
from expr_tracker.history.untrusted import read_json

__all__ = [
    "AGGREGATIONS",
    "GOALS",
    "SUMMARY_KINDS",
    "MetricDef",
    "MetricDefs",
    "defs_path_for",
    "index_frame",
    "parse_summary",
    "read_step_metrics",
]

#: every value ``define_metric(summary=...)`` takes (a comma list of them)
SUMMARY_KINDS = ("min", "max", "mean", "first", "last", "best", "copy", "none")
#: the kinds that aggregate values (the others keep the plain last value or none)
AGGREGATIONS = frozenset({"min", "max", "mean", "first", "last", "best"})
#: ``goal`` values (``best`` follows it) and their aliases
GOALS = {"minimize": "minimize", "min": "minimize", "maximize": "maximize", "max": "maximize"}

_MISS = object()
_META = ("_step", "_time")
#: bound on the per-key resolution cache (unique keys past it restart it)
_CACHE_LIMIT = 100_000


def parse_summary(summary: Any) -> tuple[str, ...] | None:
    """``"min,max"`` / ``["min", "max"]`` -> ``("min", "max")``; None stays None.

    Raises:
        ValueError: an unknown kind, or ``none`` beside another kind (naming the valid ones).
        TypeError: not a string or a list of strings.
    """
    if summary is None:
        return None
    if isinstance(summary, str):
        parts = [p.strip().lower() for p in summary.split(",") if p.strip()]
    elif isinstance(summary, (list, tuple)) and all(isinstance(p, str) for p in summary):
        parts = [p.strip().lower() for p in summary if p.strip()]
    else:
        raise TypeError(
            f"define_metric summary={summary!r} is not valid ({type(summary).__name__}): a "
            f"string such as 'min' or 'min,max' (one of {', '.join(SUMMARY_KINDS)})"
        )
    bad = [p for p in parts if p not in SUMMARY_KINDS]
    if bad or not parts:
        raise ValueError(
            f"define_metric summary={summary!r} is not valid: "
            f"{'unknown ' + ', '.join(repr(b) for b in bad) if bad else 'empty'}; give one "
            f"of {', '.join(SUMMARY_KINDS)}, or several separated by commas ('min,max')"
        )
    if "none" in parts and len(parts) > 1:
        raise ValueError(
            f"define_metric summary={summary!r} is not valid: 'none' keeps the metric out "
            "of the summary and cannot be combined with other kinds"
        )
    return tuple(dict.fromkeys(parts))


@dataclass(frozen=True)
class MetricDef:
    """One ``define_metric`` call, as recorded (fields None when not given)."""

    name: str
    step_metric: str | None = None
    summary: tuple[str, ...] | None = None
    hidden: bool | None = None
    goal: str | None = None
    step_sync: bool | None = None

    @property
    def is_glob(self) -> bool:
        return any(c in self.name for c in "*?[")

    @property
    def aggregates(self) -> bool:
        return bool(self.summary) and any(k in AGGREGATIONS for k in self.summary or ())

    @property
    def excluded(self) -> bool:
        return self.summary == ("none",)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "step_metric": self.step_metric,
            "summary": ",".join(self.summary) if self.summary else None,
            "hidden": self.hidden,
            "goal": self.goal,
            "step_sync": self.step_sync,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MetricDef:
        return cls(
            name=str(data["name"]),
            step_metric=data.get("step_metric"),
            summary=parse_summary(data.get("summary")),
            hidden=data.get("hidden"),
            goal=data.get("goal"),
            step_sync=data.get("step_sync"),
        )


def _check_name(what: str, value: Any, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(
            f"define_metric {what}={value!r} is not valid: a non-empty metric name "
            "(a glob such as 'val/*' is allowed for name)"
        )
    return value


class MetricDefs:
    """The definitions of one run and the aggregation state of the defined metrics.

    Not thread-safe on its own: the :class:`~expr_tracker.runsummary.Summary` holding it calls
    every method under its lock.
    """

    def __init__(self) -> None:
        self._exact: dict[str, MetricDef] = {}
        self._globs: dict[str, MetricDef] = {}  # in definition order; the latest match wins
        self._cache: dict[str, MetricDef | None] = {}  # key -> aggregating definition or None
        self.state: dict[str, dict[str, Any]] = {}
        self.step: int | None = None  # the last step aggregated
        self.aggregating = False  # some definition aggregates: the row path calls update()

    # -------------------------------------------------------------- definitions

    def define(
        self,
        name: str,
        step_metric: str | None = None,
        summary: Any = None,
        hidden: bool | None = None,
        goal: str | None = None,
        step_sync: bool | None = None,
        overwrite: bool | None = None,
    ) -> MetricDef:
        """Record a definition (see ``Run.define_metric``); returns what is now in force.

        ``overwrite=False`` keeps the earlier definition's values for the arguments left
        None; otherwise the call replaces it.

        Raises:
            ValueError / TypeError: a bad name, summary, goal or flag (naming the valid ones).
        """
        _check_name("name", name)
        _check_name("step_metric", step_metric, optional=True)
        kinds = parse_summary(summary)
        if goal is not None:
            g = GOALS.get(str(goal).lower()) if isinstance(goal, str) else None
            if g is None:
                raise ValueError(
                    f"define_metric goal={goal!r} is not valid: 'minimize' or 'maximize'"
                )
            goal = g
        for flag, value in (("hidden", hidden), ("step_sync", step_sync)):
            if value is not None and not isinstance(value, bool):
                raise TypeError(f"define_metric {flag}={value!r} is not valid: True or False")
        new = MetricDef(name, step_metric, kinds, hidden, goal, step_sync)
        table = self._globs if new.is_glob else self._exact
        old = table.get(name)
        if overwrite is False and old is not None:
            new = MetricDef(
                name,
                step_metric if step_metric is not None else old.step_metric,
                kinds if kinds is not None else old.summary,
                hidden if hidden is not None else old.hidden,
                goal if goal is not None else old.goal,
                step_sync if step_sync is not None else old.step_sync,
            )
        table.pop(name, None)
        table[name] = new
        self._changed()
        return new

    def _changed(self) -> None:
        self._cache.clear()
        self.aggregating = any(d.aggregates for d in (*self._exact.values(), *self._globs.values()))

    def definitions(self) -> list[MetricDef]:
        return [*self._exact.values(), *self._globs.values()]

    def lookup(self, key: str) -> MetricDef | None:
        """The definition in force for ``key``: its exact one, else the latest glob."""
        d = self._exact.get(key)
        if d is not None:
            return d
        for g in reversed(self._globs.values()):
            if fnmatch.fnmatchcase(key, g.name):
                return g
        return None

    def step_metric_of(self, key: str) -> str | None:
        d = self.lookup(key)
        return d.step_metric if d is not None else None

    # -------------------------------------------------------------- the row path

    def update(self, row: dict[str, Any]) -> None:
        """Fold one committed row into the state of its defined metrics."""
        cache = self._cache
        state = self.state
        for k, v in row.items():
            d = cache.get(k, _MISS)
            if d is _MISS:
                d = None if k in _META else self.lookup(k)
                if d is not None and not d.aggregates:
                    d = None
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                cache[k] = d
            if d is None:
                continue
            s = state.get(k)
            if s is None:
                s = state[k] = {"count": 0, "sum": 0.0, "min": None, "max": None, "first": v}
            s["last"] = v
            if (type(v) is float or type(v) is int) and v == v and abs(v) != math.inf:
                s["count"] += 1
                s["sum"] += v
                if s["min"] is None or v < s["min"]:
                    s["min"] = v
                if s["max"] is None or v > s["max"]:
                    s["max"] = v
        step = row.get("_step")
        if type(step) is int:
            self.step = step

    def apply(self, summary: dict[str, Any]) -> dict[str, Any]:
        """``summary`` (last values) with defined metrics shown as their aggregations and
        ``none`` metrics left out (a new dict; assignments are applied by the caller)."""
        if not self._exact and not self._globs:
            return summary
        out = {}
        for k, v in summary.items():
            d = None if k in _META else self.lookup(k)
            if d is None or d.summary is None or d.summary == ("copy",):
                out[k] = v
            elif d.excluded:
                continue
            elif d.aggregates:
                view = self._view(k, d)
                if view:
                    out[k] = view
            else:
                out[k] = v
        for k in self.state:  # defined metrics absent from the last values
            if k not in out and k not in summary:
                d = self.lookup(k)
                if d is not None and d.aggregates:
                    view = self._view(k, d)
                    if view:
                        out[k] = view
        return out

    def _view(self, key: str, d: MetricDef) -> dict[str, Any]:
        s = self.state.get(key)
        if s is None:
            return {}
        view: dict[str, Any] = {}
        for kind in d.summary or ():
            if kind in ("min", "max") and s["min"] is not None:
                view[kind] = s[kind]
            elif kind == "mean" and s["count"]:
                view["mean"] = s["sum"] / s["count"]
            elif kind == "best" and s["min"] is not None:
                view["best"] = s["max"] if d.goal == "maximize" else s["min"]
            elif kind in ("first", "last") and kind in s:
                view[kind] = s[kind]
        return view

    # -------------------------------------------------------------- persistence

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "definitions": [d.to_json() for d in self.definitions()],
            "state": {k: dict(s) for k, s in self.state.items()},
            "_step": self.step,
        }

    def load(self, data: Any) -> None:
        """Take the definitions and state saved by an earlier attempt (bad entries skipped)."""
        if not isinstance(data, dict):
            return
        items = data.get("definitions")
        for item in items if isinstance(items, list) else ():
            try:
                d = MetricDef.from_json(item)
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
            if d.step_metric is not None and not isinstance(d.step_metric, str):
                continue
            (self._globs if d.is_glob else self._exact)[d.name] = d
        state = data.get("state")
        if isinstance(state, dict):
            for k, s in state.items():
                if isinstance(s, dict) and {"count", "sum", "min", "max"} <= set(s):
                    self.state[str(k)] = dict(s)
        step = data.get("_step")
        self.step = step if type(step) is int else None
        self._changed()


def defs_path_for(metrics_path: str | Path) -> Path:
    """``metric_defs[.S][.rankN].json`` beside a metrics file."""
    p = Path(metrics_path)
    parsed = parse_metrics_name(p.name)
    stream, rank = parsed if parsed is not None else (None, 0)
    return p.with_name(file_name("metric_defs", stream, rank))


def read_step_metrics(metrics_path: str | Path) -> Callable[[str], str | None]:
    """The ``step_metric`` lookup of a run on disk (no definitions: always None). The file
    is read as untrusted input (``history.untrusted``: a regular file beside the metrics
    file, JSON with a depth limit); one that cannot be read is no definitions."""
    defs = MetricDefs()
    path = defs_path_for(metrics_path)
    try:
        defs.load(read_json(path, root=path.parent))
    except (OSError, ValueError):
        pass
    return defs.step_metric_of


def index_column(
    index: Any, columns: Iterable[str] | None, step_metric_of: Callable[[str], str | None]
) -> str | None:
    """The column ``history(index=...)`` names: a metric name as given, or with ``True``
    the ``step_metric`` defined for the selected ``columns`` (every one the same).

    Raises:
        ValueError: ``True`` without ``metrics``, or the selected metrics have no (or
            different) step metrics.
        TypeError: ``index`` is not a string, True or None.
    """
    if index is None or index is False:
        return None
    if isinstance(index, str) and index:
        return index
    if index is not True:
        raise TypeError(
            f"index={index!r} is not valid: a metric name, True (the step_metric given to "
            "define_metric for the selected metrics) or None"
        )
    cols = list(columns or ())
    if not cols:
        raise ValueError(
            "index=True needs metrics=[...]: the step_metric is the one define_metric "
            "recorded for the selected metrics"
        )
    found = {c: step_metric_of(c) for c in cols}
    names = {v for v in found.values() if v is not None}
    if len(names) != 1 or None in found.values():
        detail = ", ".join(f"{c!r} -> {v!r}" for c, v in found.items())
        raise ValueError(
            f"index=True: the selected metrics do not share one step_metric ({detail}); "
            "call define_metric(name, step_metric=...) for each, or give index='<metric>'"
        )
    return names.pop()


def index_frame(result: Any, name: str) -> Any:
    """A pandas frame indexed by column ``name``; a polars frame (no index) with ``name``
    as its first column. Rows keep their step order.

    Raises:
        ValueError: a list of dicts (an index needs a frame), or ``name`` not a column.
    """
    module = type(result).__module__.split(".")[0]
    if module not in ("pandas", "polars"):
        raise ValueError(
            f"index={name!r} needs output_type='pandas' or 'polars' (a list of rows has no index)"
        )
    columns = list(result.columns)
    if name not in columns:
        raise ValueError(
            f"index={name!r}: no such column in the rows read (columns: {', '.join(columns)})"
        )
    if module == "pandas":
        return result.set_index(name)
    return result.select([name, *[c for c in columns if c != name]])
