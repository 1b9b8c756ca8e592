"""The store's direct hand-off to a single sink (docs/alerts.md "Cost"): the same rows give
the same events as the fan-out queue, every committed row is evaluated exactly once and in
commit order (two logging threads, a sink that logs, an interrupt at every point of
``log()``)."""

from __future__ import annotations

import inspect
import threading

from helpers import Injector, count_events, needs_python

import expr_tracker as et
from expr_tracker.alerts.engine import AlertEngine
from expr_tracker.history import store as store_mod
from expr_tracker.history.store import HistoryStore

RULES = ["zscore(loss[50]) > 3 => error: spike", "isnan(loss) => critical: nan"]


def _rows(n: int) -> list[dict]:
    out = []
    for i in range(n):
        loss = 1.0 + (i % 7) * 1e-3
        if i % 97 == 60:
            loss = 50.0  # a spike
        if i % 131 == 70:
            loss = float("nan")
        out.append({"loss": loss, "lr": 1e-3, "acc": 0.5})
    return out


def _events(extra_sink: bool) -> list[tuple]:
    t = [0.0]
    got: list = []
    eng = AlertEngine(RULES, record=got.append, clock=lambda: t[0], wall_clock=lambda: 0.0)
    store = HistoryStore(None)
    store.sinks.append(eng.on_step)
    if extra_sink:  # two sinks: the fan-out queue, as before the direct path
        store.sinks.append(lambda row: None)
    for i, row in enumerate(_rows(400)):
        t[0] = float(i)
        store.ingest(row)
    store.close()
    return [(e.rule, e.kind, e.step) for e in got]


def test_direct_path_gives_the_events_of_the_fan_out_queue():
    direct = _events(False)
    assert direct == _events(True)
    assert {k for _, k, _ in direct} >= {"firing", "resolved"}


def test_one_sink_two_threads_and_a_sink_that_logs_keep_commit_order():
    store = HistoryStore(None)
    seen: list[int] = []

    def sink(row):
        seen.append(row["_step"])
        if row.get("x") == 7:  # a sink that logs: its row is delivered after this one
            store.ingest({"y": 1.0})

    store.sinks.append(sink)

    def worker():
        for i in range(2000):
            store.ingest({"x": i})

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    store.close()
    assert seen == list(range(store.rows_committed))  # every row once, in commit order
    assert store.rows_committed == 4002


def _sink_call_line() -> int:
    src, first = inspect.getsourcelines(HistoryStore._log_direct)
    return first + next(i for i, line in enumerate(src) if line.strip() == "sink(row)")


@needs_python(store_mod, why="interrupts each line of")
def test_interrupt_at_every_point_of_log_with_rules(tmp_path):
    """Each point of one ``log()`` interrupted in turn: no lock left held, no row evaluated
    twice (the series' steps strictly increase), and between the commit and the sink's call
    the direct path loses no row (an interrupt there queues it for the next call). Known
    and not this path's: an interrupt inside the commit itself or in ``on_step`` before it
    takes the row, and at the line of the sink's call, loses the row's evaluation (the
    queue path has the same points)."""
    run = et.init(project="p", name="r", dir=str(tmp_path), alert_rules=RULES)
    call_line = f"_log_direct:{_sink_call_line()}"
    try:
        for i in range(60):
            et.log({"loss": 1.0 + i * 1e-3})
        n = count_events(et.log, {"loss": 1.0}) + 10
        lost_here = []
        points = 0
        for at in range(1, n):
            inj = Injector(at)
            before = run.history.rows_committed
            try:
                inj.run(et.log, {"loss": 1.0 + at * 1e-3})
            except KeyboardInterrupt as exc:
                where = str(exc).split()[-1]
            else:
                where = ""
            et.log({"loss": 1.0})  # the next call works and delivers what was left
            series = run.alerts._series["loss"]
            steps = list(series.steps)
            assert steps == sorted(set(steps)), (at, where)  # never twice
            committed = run.history.rows_committed - before
            delivered = sum(1 for s in steps if s >= run.history.rows_committed - committed)
            if where.startswith("_log_direct") and where != call_line:
                points += 1
                if delivered < committed:
                    lost_here.append((where, committed - delivered))
        assert points >= 8  # the direct path's own points were interrupted
        assert lost_here == []
    finally:
        et.finish()
