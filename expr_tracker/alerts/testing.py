"""Test doubles for alert rules, for our tests and users' own (docs/alerts.md "For tests in
your own code").

- ``EventCapture``: a sink collecting ``AlertEvent`` objects (``engine.notify``/``record``);
  ``expr_tracker.testing.AlertCapture`` is the other capture, of the messages dispatchers take.
- ``evaluate(condition, series, ...)``: the three-valued result of a condition after the
  given values, one row per index (``None`` in a series = metric absent on that row).
- ``replay(rules, rows, ...)``: runs an engine over rows with a simulated clock that follows
  ``_time``; returns the captured events. Used by ``et rules test``.

Recorded rows carry no monotonic stamps, so both helpers make the recorded ``_time`` (or
``interval`` spacing) the time base a live engine takes from its monotonic clock: ``age()``,
duration windows, ``rate``, ``elapsed()`` and ``no_data()`` measure row time here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from expr_tracker.alerts.engine import AlertEngine, AlertEvent

__all__ = ["EventCapture", "evaluate", "replay", "rows_from_series"]


class EventCapture:
    """Collects events; ``names``/``steps(name)`` summarise them."""

    def __init__(self) -> None:
        self.events: list[AlertEvent] = []

    def __call__(self, event: AlertEvent) -> None:
        self.events.append(event)

    def fired(self) -> list[AlertEvent]:
        """Events of kind ``firing`` or ``repeat``."""
        return [e for e in self.events if e.kind in ("firing", "repeat")]

    def steps(self, name: str | None = None) -> list[int | None]:
        return [e.step for e in self.fired() if name is None or e.rule.name == name]

    def clear(self) -> None:
        self.events.clear()


def __getattr__(name: str) -> object:
    # the name EventCapture had until two captures could no longer share one
    if name == "AlertCapture":
        import warnings

        warnings.warn(
            "expr_tracker.alerts.testing.AlertCapture is now EventCapture",
            DeprecationWarning,
            stacklevel=2,
        )
        return EventCapture
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def rows_from_series(
    series: Mapping[str, Iterable], *, interval: float = 1.0, start_time: float = 0.0
) -> list[dict]:
    """``{"loss": [1, 2, None]}`` -> rows with ``_step`` 0.. and ``_time`` every ``interval``
    seconds; a ``None`` value leaves the metric out of that row."""
    cols = {k: list(v) for k, v in series.items()}
    n = max((len(v) for v in cols.values()), default=0)
    rows = []
    for i in range(n):
        row: dict = {"_step": i, "_time": start_time + i * interval}
        for k, v in cols.items():
            if i < len(v) and v[i] is not None:
                row[k] = v[i]
        rows.append(row)
    return rows


class _SimClock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def replay(
    rules: Iterable,
    rows: Iterable[Mapping],
    *,
    window: int = 4096,
    run_info: Mapping | None = None,
    watchdog_interval: float | None = None,
    baselines: Any = None,
) -> EventCapture:
    """Feed ``rows`` to a fresh engine whose clocks (the monotonic time base and the
    displayed wall clock alike) follow each row's ``_time``; with
    ``watchdog_interval``, time-based rules are also checked between rows at that period.
    ``baselines`` (an ``alerts.baseline.Baselines``, e.g. over in-memory ``peers``) gives
    ``baseline()`` calls their values. Returns the capture of every event (``record`` side,
    so ``notify`` flags are kept)."""
    rows = list(rows)
    t0 = float(rows[0].get("_time", 0.0)) if rows else 0.0
    clock = _SimClock(t0)
    capture = EventCapture()
    engine = AlertEngine(
        rules,
        window=window,
        record=capture,
        clock=clock,
        wall_clock=clock,
        run_info=run_info,
        baselines=baselines,
    )
    last = t0
    for row in rows:
        t = row.get("_time")
        t = last if t is None or not math.isfinite(float(t)) else float(t)
        if watchdog_interval:
            tick = last + watchdog_interval
            while tick < t:
                clock.t = tick
                engine.check_time()
                tick += watchdog_interval
        clock.t = t
        last = t
        engine.on_step(row)
    engine.close()
    capture.engine = engine  # type: ignore[attr-defined]
    return capture


def evaluate(condition, series: Mapping[str, Iterable], *, interval: float = 1.0):
    """True/False/None (UNKNOWN) of ``condition`` (DSL text, node or ``M`` expression)
    after feeding ``series`` row by row."""
    from expr_tracker.alerts.evaluate import EvalContext, compile_expr
    from expr_tracker.alerts.parse import parse_expr
    from expr_tracker.history.series import MetricSeries

    node = parse_expr(condition) if isinstance(condition, str) else condition
    node = getattr(node, "node", node)
    compiled = compile_expr(node)
    ctx = EvalContext()
    for row in rows_from_series(series, interval=interval):
        for k, v in row.items():
            if k.startswith("_"):
                continue
            s = ctx.series.get(k)
            if s is None:
                s = ctx.series[k] = MetricSeries(k, 1 << 20)
            s.append(float(v), row["_time"], row["_step"])
        ctx.now = row["_time"]
        ctx.mono = row["_time"]
        ctx.step = row["_step"]
        ctx.last_commit_mono = row["_time"]
    return compiled.fn(ctx)
