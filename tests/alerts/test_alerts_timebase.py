"""The alert time base: live evaluation measures elapsed time (``age``, duration windows,
``elapsed``, ``no_data``) on the engine's monotonic clock, so a wall-clock jump (an NTP
correction) neither fires nor silences a rule; ``_time``/``{time}`` stay wall-clock
(display). Replays drive the clock from the recorded ``_time``."""

from __future__ import annotations

import datetime as dt

from expr_tracker.alerts import AlertEngine, parse_expr
from expr_tracker.alerts.evaluate import render_observed
from expr_tracker.alerts.testing import EventCapture, replay, rows_from_series

HOUR = 3600.0
W0 = 1_700_000_000.0


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Live:
    """An engine on an injected monotonic clock and an injected wall clock that can jump;
    rows are stamped with the wall clock, as the history store does."""

    def __init__(self, rules, *, mono: float = 0.0) -> None:
        self.mono, self.wall = Clock(mono), Clock(W0)
        self.cap = EventCapture()
        self.engine = AlertEngine(rules, record=self.cap, clock=self.mono, wall_clock=self.wall)
        self.step = 0

    def advance(self, seconds: float) -> None:
        """Real time passes: both clocks move."""
        self.mono.t += seconds
        self.wall.t += seconds

    def jump(self, seconds: float) -> None:
        """The wall clock alone is set (NTP); the monotonic clock does not move."""
        self.wall.t += seconds

    def commit(self, **values) -> None:
        self.engine.on_step({"_step": self.step, "_time": self.wall(), **values})
        self.step += 1

    def observe(self, expr: str) -> str:
        """``expr`` rendered with its value as of the last commit: ``age(loss)=12``."""
        return render_observed(parse_expr(expr), self.engine._ctx)

    def fired(self):
        return [(e.rule.name, e.step, e.message) for e in self.cap.fired()]


def test_age_ignores_wall_clock_jumps_back_and_forward():
    live = Live(["age(loss) < 0 => error: negative", "age(loss) > 60 => error: hung {expr}"])
    live.commit(loss=1.0)
    live.advance(11.0)
    live.jump(-HOUR)  # NTP sets the clock back an hour, no new row
    live.engine.check_time()
    assert live.fired() == []  # was: age(loss) = -3589, so age(loss) < 0 fired
    live.advance(1.0)
    live.jump(2 * HOUR)  # and forward again (net +1 h)
    live.engine.check_time()
    assert live.fired() == []  # was: age(loss) = 3612, so age(loss) > 60 fired
    live.commit(y=0.0)  # a row without loss, stamped with the jumped wall clock
    assert live.observe("age(loss)") == "age(loss)=12"
    assert live.fired() == []
    live.advance(49.5)  # 61.5 real seconds since loss was recorded: a real hang
    live.engine.check_time()
    (ev,) = live.cap.fired()
    assert ev.message == "hung age(loss)=61.5 > 60"
    assert ev.time == live.wall()  # the event keeps the (jumped) wall clock for display


def test_age_on_step_after_a_back_jump_with_new_rows():
    live = Live(["age(loss) < 0 => error: negative"])
    live.commit(loss=1.0)
    live.advance(2.0)
    live.jump(-HOUR)
    live.commit(y=1.0)  # was: age(loss) = -3598 on this commit
    assert live.observe("age(loss)") == "age(loss)=2"
    live.advance(3.0)
    live.commit(loss=2.0, y=2.0)
    assert live.observe("age(loss)") == "age(loss)=0"
    assert live.fired() == []


def test_count_over_a_duration_window_ignores_a_back_jump():
    live = Live(["count(loss[10s]) > 100 => info: never"])
    for i in range(20):  # one row a second for 20 s
        live.commit(loss=float(i))
        live.advance(1.0)
    assert live.observe("count(loss[10s])") == "count(loss[10s])=11"  # t = 9..19
    live.advance(11.0)  # quiet for 11 s: every row so far is now older than the window
    live.jump(-HOUR)
    for i in range(5):
        live.commit(loss=100.0 + i)
        if i < 4:
            live.advance(1.0)
    # was: 25 (the 20 old rows, stamped an hour "later", counted as recent)
    assert live.observe("count(loss[10s])") == "count(loss[10s])=5"
    assert live.observe("mean(loss[10s])") == "mean(loss[10s])=102"
    live.jump(2 * HOUR)  # forward: the recent rows must not fall out of the window
    live.advance(1.0)
    live.commit(loss=105.0)
    assert live.observe("count(loss[10s])") == "count(loss[10s])=6"  # was: 1
    assert live.observe("rate(loss[10s])") == "rate(loss[10s])=1"  # 5 over 5 real seconds


def test_elapsed_ignores_wall_clock_jumps():
    live = Live(["elapsed() > 30 => warn: long {expr}"], mono=500.0)
    live.advance(10.0)
    live.jump(-HOUR)
    live.commit(x=1.0)
    assert live.observe("elapsed()") == "elapsed()=10"
    live.jump(2 * HOUR)
    live.engine.check_time()
    assert live.fired() == []
    live.advance(21.0)
    live.engine.check_time()
    assert [m for _, _, m in live.fired()] == ["long elapsed()=31 > 30"]


def test_no_data_ignores_wall_clock_jumps():
    live = Live(["no_data(10s) => critical: hung at {step}"])
    live.commit(x=1.0)
    live.advance(5.0)
    live.jump(HOUR)
    live.engine.check_time()
    live.advance(4.0)
    live.jump(-2 * HOUR)
    live.engine.check_time()
    assert live.fired() == []
    live.advance(2.0)  # 11 real seconds without a commit
    live.engine.check_time()
    assert [m for _, _, m in live.fired()] == ["hung at 0"]


def test_time_placeholder_and_event_time_stay_wall_clock():
    live = Live(["x > 1 => error: at {time}"])
    live.jump(-HOUR)
    live.commit(x=2.0)
    (ev,) = live.cap.fired()
    assert ev.time == W0 - HOUR
    stamp = dt.datetime.fromtimestamp(W0 - HOUR).isoformat(timespec="seconds")
    assert ev.message == f"at {stamp}"


def test_replay_uses_the_recorded_time_as_its_time_base():
    # recorded rows carry epoch _time and no monotonic stamps: the replay clock follows
    # _time, so windows and age measure row time (2 s apart here), whatever the real clock
    rows = rows_from_series({"x": [1, 2, 3, 4, 5], "y": [0] * 5}, interval=2.0, start_time=W0)
    cap = replay(["count(x[5s]) == 3 => info: three"], rows)
    assert [e.step for e in cap.fired()] == [2]
    rows = rows_from_series({"x": [1, None, None, None], "y": [0] * 4}, interval=2.0, start_time=W0)
    cap = replay(["age(x) > 5 => warn: stale {expr}"], rows)
    assert [(e.step, e.message) for e in cap.fired()] == [(3, "stale age(x)=6 > 5")]
