"""zscore(m[N]) from running sums (alerts/running.py) against the recompute it replaces.

The running closure must give what ``functions._zscore`` gives on the window, within 1e-9
(relative to the z-score, absolute below 1), and exactly its None/NaN answers, whatever
the values (NaN, infinities, huge and tiny values entering and leaving the window), however
the rule is called (every step, skipped steps, a row rolled back and replaced), and with the
series trimmed under it. The engine-level test interrupts ``on_step`` at every point.
"""

from __future__ import annotations

import gc
import math
from operator import gt

from helpers import Injector, count_events, needs_python
from hypothesis import given, settings
from hypothesis import strategies as st

from expr_tracker.alerts import engine as engine_mod
from expr_tracker.alerts.engine import AlertEngine
from expr_tracker.alerts.evaluate import EvalContext
from expr_tracker.alerts.functions import _zscore
from expr_tracker.alerts.running import zscore_call
from expr_tracker.history.series import MetricSeries

VALUES = st.one_of(
    st.floats(-10.0, 10.0),
    st.floats(0.999, 1.001),  # close together: the conditioning checks
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e300, -1e300, 1e-200, 0.0, 5.0]),
)
# what happens between two evaluations: append one value (1), two (a skipped evaluation),
# or roll the last value back and append another (an interrupted row)
OPS = st.lists(st.tuples(st.sampled_from(["one", "one", "one", "two", "undo"]), VALUES, VALUES))


def same(got, want) -> bool:
    if want is None or got is None:
        return got is want
    if want != want:
        return got != got
    return abs(got - want) <= 1e-9 * max(1.0, abs(want))


def closure(series: MetricSeries, n: int, op=None, c: float = 0.0):
    ctx = EvalContext({"m": series})
    fn = zscore_call(lambda _ctx: series, n, _zscore, None, op, c)
    return lambda: fn(ctx)


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(2, 40),
    capacity_extra=st.integers(0, 3),
    start=st.lists(VALUES, max_size=60),
    ops=OPS,
)
def test_running_zscore_equals_the_recompute(n, capacity_extra, start, ops):
    s = MetricSeries("m", n + capacity_extra)  # trimmed often: the leaving value may be gone
    z = closure(s, n)
    zc = closure(s, n, gt, 1.5)
    for x in start:
        s.append(x, 0.0, s.count)
    for kind, a, b in [("one", 0.0, 0.0), *ops]:
        if kind == "undo" and s.values:  # as the engine's roll-back: drop the last, append
            del s.values[-1:]
            del s.times[-1:]
            del s.steps[-1:]
            s.count -= 1
        if kind != "one" or s.count == 0:
            s.append(a, 0.0, s.count)
        s.append(b, 0.0, s.count)
        window = s.values[-n:] if len(s.values) >= n else None
        want = None if window is None else _zscore(window)
        got = z()
        assert same(got, want), (window, got, want)
        want_c = None if want is None or want != want else want > 1.5
        got_c = zc()
        if want_c is None or want is None or abs(want - 1.5) > 1e-8:  # not at the edge
            assert got_c is want_c, (window, got_c, want_c)
        assert same(z(), want)  # asked again without a new value: the same answer


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(2, 60),
    level=st.floats(-1e6, 1e6),
    spread=st.floats(1e-3, 1e3),
    steps=st.lists(st.floats(-1.0, 1.0), min_size=1, max_size=400),
)
def test_long_runs_of_drifting_values_stay_within_1e9(n, level, spread, steps):
    """Many slides (rounding carried between rebuilds) and a mean that drifts away from the
    shift: still within 1e-9 of the recompute."""
    s = MetricSeries("m", n)
    z = closure(s, n)
    x = level
    for i, d in enumerate(steps):
        x += d * spread
        s.append(x + (i % 7) * spread, 0.0, i)
        want = _zscore(s.values[-n:]) if len(s.values) >= n else None
        assert same(z(), want)


def test_a_spike_leaving_the_window_rebuilds_and_a_flat_window_is_unknown():
    s = MetricSeries("m", 5)
    z = closure(s, 5)
    for x in [1.0, 2.0, 3.0, 4.0, 1e140]:
        s.append(x, 0.0, s.count)
        z()
    for _ in range(5):
        s.append(7.0, 0.0, s.count)
        assert same(z(), _zscore(s.values[-5:]))
    assert z() is None  # five equal values: std 0, not a z-score left over from the spike


@needs_python(engine_mod, why="interrupts each line of")
def test_interrupting_on_step_anywhere_leaves_the_running_sums_right():
    """on_step interrupted at each of its points (the row rolled back and processed by the
    next call, or retried when it was not taken yet): after every call the rule's running
    z-score is the recompute over the engine's series, never sums describing a value that
    is no longer there."""
    rules = ["zscore(loss[8]) > 2 => error: spike", "isnan(loss) => critical: nan"]
    values = [1.0 + (i % 5) * 0.1 for i in range(40)] + [9.0, math.nan, 1.0, 1.2, 1.1]
    engine = AlertEngine(rules, clock=lambda: 0.0)
    zscore = engine._rules[0].expr.fn

    def check() -> None:
        s = engine._series["loss"]  # values, times and steps stay aligned whatever was cut
        assert len(s.values) == len(s.times) == len(s.steps), (s.values, s.steps)
        w = s.values[-8:]
        want = _zscore(w) if len(w) == 8 else None
        want = None if want is None or want != want else want > 2
        assert zscore(engine._ctx) is want, w

    for i, v in enumerate(values[:20]):
        engine.on_step({"_step": i, "_time": 0.0, "loss": v, "lr": 1e-3})
    # no collection while injecting: a finalizer of an earlier test's object (a store, a
    # writer) would run traced and could be interrupted holding its own lock
    gc.collect()
    gc.disable()
    try:
        _interrupt_everywhere(engine, values, check)
    finally:
        gc.enable()


def _interrupt_everywhere(engine: AlertEngine, values: list, check) -> None:
    n = count_events(engine.on_step, {"_step": 20, "_time": 0.0, "loss": 1.0, "lr": 1e-3})
    fired = 0
    step = 21
    for at in range(1, n + 1):
        row = {"_step": step, "_time": 0.0, "loss": values[step % len(values)] * 1.01}
        inj = Injector(at, stdlib=False)
        try:
            inj.run(engine.on_step, row)
        except KeyboardInterrupt:
            fired += 1
            if engine._last_row is not row and not any(r is row for r in engine._rows):
                engine.on_step(row)  # interrupted before it was taken: the caller's retry
        step += 1
        nxt = {"_step": step, "_time": 0.0, "loss": values[step % len(values)] * 1.5}
        engine.on_step(nxt)  # processes a row left behind first
        check()
        step += 1
    assert fired > n // 2
    assert engine._series["loss"].steps == sorted(set(engine._series["loss"].steps))
