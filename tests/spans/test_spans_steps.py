"""Which row a span joins (docs/spans.md): span time since the last log() joins the row the
next log() writes, with explicit steps as with plain log(d); each span record names that row.

Durations are deterministic: the span clock (``spans.core.perf_counter_ns``) is replaced by
a counter the test advances, so no test depends on how long anything really took.
"""

from __future__ import annotations

import json

import pytest

import expr_tracker as et
from expr_tracker.history.reader import read_rows
from expr_tracker.history.store import HistoryStore
from expr_tracker.spans import core, span, start_span
from expr_tracker.spans.core import AGGREGATION

MS = 1_000_000  # ns


class FakeClock:
    """``perf_counter_ns`` for spans: time moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 10**12

    def __call__(self) -> int:
        return self.now

    def sleep_ms(self, ms: float) -> None:
        self.now += int(ms * MS)


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(core, "perf_counter_ns", c)
    return c


def start(tmp_path, **kw):
    return et.init(project="p", name="r", dir=str(tmp_path), **kw)


def spans_file(run):
    return [json.loads(x) for x in (run.dir / "spans.jsonl").read_text().splitlines()]


def check_records_name_their_rows(run):
    """Every record's time is in the row its ``_step`` names: per step and span path, the
    records' durations sum to the row's ``time_ms/<path>``, and no row has time without
    records."""
    rows = {r["_step"]: r for r in read_rows(run.dir / "metrics.jsonl")}
    sums: dict[tuple[int, str], float] = {}
    for rec in spans_file(run):
        key = (rec["_step"], rec["name"])
        sums[key] = sums.get(key, 0.0) + rec["dur_ms"]
    for (step, name), total in sums.items():
        assert rows[step]["time_ms/" + name] == pytest.approx(total), (step, name)
    for step, row in rows.items():
        for k in row:
            if k.startswith("time_ms/"):
                assert (step, k[len("time_ms/") :]) in sums, (step, k)


# ---------------------------------------------------------------- the two loops


def test_wandb_loop_spans_then_log_with_step(tmp_path, clock):
    """The loop users write after wandb: each row carries its own iteration's span time
    (base code: 30/30/none, the time shifted one row)."""
    run = start(tmp_path)
    for i in range(3):
        with span("work"):
            clock.sleep_ms(10 * (i + 1))
        et.log({"loss": 1.0 / (i + 1)}, step=i)
    et.finish()
    rows = read_rows(run.dir / "metrics.jsonl")
    assert [r["_step"] for r in rows] == [0, 1, 2]
    assert [r.get("time_ms/work") for r in rows] == [10.0, 20.0, 30.0]
    assert [r["_step"] for r in spans_file(run)] == [0, 1, 2]
    check_records_name_their_rows(run)


def test_wandb_loop_starting_at_step_one(tmp_path, clock):
    """No row of span time alone at step 0 when the loop's first step is 1."""
    run = start(tmp_path)
    for i in range(1, 4):
        with span("work"):
            clock.sleep_ms(i)
        et.log({"i": i}, step=i)
    et.finish()
    rows = read_rows(run.dir / "metrics.jsonl")
    assert [(r["_step"], r["time_ms/work"]) for r in rows] == [(1, 1.0), (2, 2.0), (3, 3.0)]
    check_records_name_their_rows(run)


def test_log_loop_unchanged(tmp_path, clock):
    """Spans then log(d): the behaviour the base code already had, kept exactly."""
    run = start(tmp_path, span_count=True)
    for i in range(3):
        with span("forward"):
            with span("attention"):
                clock.sleep_ms(i + 1)
            clock.sleep_ms(1)
        with span("backward"):
            clock.sleep_ms(5)
        et.log({"loss": i})
    with span("tail"):  # after the last log(): the row finish() commits
        clock.sleep_ms(7)
    et.finish()
    rows = read_rows(run.dir / "metrics.jsonl")
    assert [r["_step"] for r in rows] == [0, 1, 2, 3]
    assert [r["time_ms/forward/attention"] for r in rows[:3]] == [1.0, 2.0, 3.0]
    assert [r["time_ms/forward"] for r in rows[:3]] == [2.0, 3.0, 4.0]
    assert [r["count/forward/attention"] for r in rows[:3]] == [1, 1, 1]
    assert {k: v for k, v in rows[3].items() if k != "_time"} == {
        "time_ms/tail": 7.0,
        "count/tail": 1,
        "_step": 3,
    }
    recs = spans_file(run)
    assert [(r["_step"], r["name"]) for r in recs[:3]] == [
        (0, "forward/attention"),
        (0, "forward"),
        (0, "backward"),
    ]
    assert [r["_step"] for r in recs] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    check_records_name_their_rows(run)


def test_commit_false_without_steps(tmp_path, clock):
    """log(d) with commit=False in between: both spans join the row log(d) commits."""
    run = start(tmp_path)
    with span("a"):
        clock.sleep_ms(1)
    et.log({"x": 1}, commit=False)
    with span("b"):
        clock.sleep_ms(2)
    et.log({"y": 2})
    et.finish()
    (row,) = read_rows(run.dir / "metrics.jsonl")
    assert (row["_step"], row["time_ms/a"], row["time_ms/b"]) == (0, 1.0, 2.0)
    check_records_name_their_rows(run)


def test_several_calls_for_one_explicit_step(tmp_path, clock):
    """log(d, step=N, commit=False) and log(d, step=N, commit=True): span time joins the
    row of the next call, whatever its commit (base code: a row of span time alone at
    step 0, and 3 ms in step 5 that belonged to step 6)."""
    run = start(tmp_path)
    with span("c"):
        clock.sleep_ms(3)
    et.log({"x": 3}, step=5, commit=False)
    with span("c"):
        clock.sleep_ms(4)
    et.log({"y": 4}, step=5)
    with span("c"):
        clock.sleep_ms(5)
    et.log({"z": 5}, step=6, commit=True)
    with span("c"):
        clock.sleep_ms(6)
    et.log({"z": 6}, step=7, commit=True)
    et.finish()
    rows = {r["_step"]: r for r in read_rows(run.dir / "metrics.jsonl")}
    assert sorted(rows) == [5, 6, 7]
    assert [rows[s]["time_ms/c"] for s in (5, 6, 7)] == [7.0, 5.0, 6.0]
    check_records_name_their_rows(run)


def test_switching_from_plain_log_to_explicit_steps(tmp_path, clock):
    """One rule for a run that starts with log(d) and then passes step=: the span joins
    the row of the next log() call (base code: a row of `early` alone at step 1)."""
    run = start(tmp_path)
    et.log({"setup": 1})  # step 0, no step=
    with span("early"):
        clock.sleep_ms(1)
    et.log({"i": 10}, step=10)
    with span("work"):
        clock.sleep_ms(2)
    et.log({"i": 11}, step=11)
    et.finish()
    rows = {r["_step"]: r for r in read_rows(run.dir / "metrics.jsonl")}
    assert sorted(rows) == [0, 10, 11]
    assert rows[10]["time_ms/early"] == 1.0 and rows[11]["time_ms/work"] == 2.0
    check_records_name_their_rows(run)


def test_span_across_a_step_jump_and_span_open_at_log(tmp_path, clock):
    """A span that log() calls reached while it ran joins the step open when it ENDS,
    however many steps it crossed (an epoch); one ending after its step was committed
    joins the next (base code: both in row 4, the row of the first log() after they
    ended)."""
    run = start(tmp_path)
    epoch = start_span("epoch")
    for i in range(3):
        with span("step"):
            clock.sleep_ms(1)
        et.log({"i": i}, step=i)
    inner = start_span("open_at_log")
    clock.sleep_ms(2)
    et.log({"i": 3}, step=3)  # opens step 3 (not committed: step= merges)
    inner.end()  # ... so both end while step 3 is open
    epoch.end()
    et.log({"i": 4}, step=4)
    committed = start_span("after_commit")
    et.log({"i": 5})  # merges into step 4 and commits it
    committed.end()  # ends after step 4 was committed: step 5
    et.finish()
    rows = {r["_step"]: r for r in read_rows(run.dir / "metrics.jsonl")}
    assert rows[3]["time_ms/epoch"] == 5.0 and rows[3]["time_ms/epoch/open_at_log"] == 2.0
    assert not any(k.startswith("time_ms/epoch") for k in rows[4])
    assert [rows[i]["time_ms/epoch/step"] for i in range(3)] == [1.0, 1.0, 1.0]
    assert "time_ms/after_commit" not in rows[4] and "time_ms/after_commit" in rows[5]
    check_records_name_their_rows(run)


def test_a_backward_step_drops_its_span_time_with_it(tmp_path, clock):
    # the span time measured for a dropped log(step=N) (a rerun continuing a run from step
    # 0, a second Trainer) was summed into the next accepted row, which never ran it
    run = start(tmp_path)
    et.log({"a": 1}, step=5)
    with span("s"):
        clock.sleep_ms(3)
    assert et.log({"a": 2}, step=2) == -1  # backward step, dropped (monotonic)
    with span("s"):
        clock.sleep_ms(1)
    et.log({"a": 3}, step=6)
    info = run.info()["history"]["dropped"]
    et.finish()
    rows = {r["_step"]: r for r in read_rows(run.dir / "metrics.jsonl")}
    assert "time_ms/s" not in rows[5] and rows[6]["time_ms/s"] == 1.0
    assert info == {"backward_step": 1, "span_metrics": 1}
    # the record stays in the timeline, naming the step it was measured for
    assert [(r["_step"], r["dur_ms"]) for r in spans_file(run)] == [(2, 3.0), (6, 1.0)]


def test_a_bad_step_leaves_span_time_waiting(tmp_path, clock):
    run = start(tmp_path)
    et.log({"a": 1}, step=5)
    with span("s"):
        clock.sleep_ms(3)
    assert et.log({"a": 2}, step="x") == -1  # not a step: the call is dropped
    et.log({"a": 3}, step=6)
    et.finish()
    rows = {r["_step"]: r for r in read_rows(run.dir / "metrics.jsonl")}
    assert "time_ms/s" not in rows[5] and rows[6]["time_ms/s"] == 3.0
    check_records_name_their_rows(run)


def test_pending_span_time_is_shown_in_the_open_row(tmp_path, clock):
    start(tmp_path)
    et.log({"a": 1}, step=0)
    with span("s"):
        clock.sleep_ms(4)
    (row,) = et.history(1)  # a view: the open row plus what waits for the next log()
    assert row["_step"] == 0 and row["a"] == 1 and row["time_ms/s"] == 4.0
    assert et.history(1, include_open=False) == []
    assert et.info()["spans"]["held"] == 1
    et.log({"a": 2}, step=1)  # ... which places it in step 1
    assert et.info()["spans"]["held"] == 0
    rows = et.history(2)
    assert "time_ms/s" not in rows[0] and rows[1]["time_ms/s"] == 4.0


def test_flush_fixes_pending_records_to_the_open_row(tmp_path, clock):
    """flush() must write completed span records, so it places pending span time in the
    open row first; the record and the row still agree."""
    run = start(tmp_path)
    et.log({"a": 0}, step=0)
    with span("s"):
        clock.sleep_ms(2)
    et.get_run().history.flush()
    assert [r["_step"] for r in spans_file(run)] == [0]
    assert run.history.held_span_records == 0
    et.log({"a": 1}, step=1)
    et.finish()
    rows = read_rows(run.dir / "metrics.jsonl")
    assert rows[0]["time_ms/s"] == 2.0 and "time_ms/s" not in rows[1]
    check_records_name_their_rows(run)


def test_threads_spanning_through_step_jumps_keep_records_and_rows_in_agreement(tmp_path):
    import threading

    run = start(tmp_path)
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            with span("bg"):
                pass

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for i in range(200):
            with span("main"):
                pass
            et.log({"i": i}, step=i)
    finally:
        stop.set()
        for t in threads:
            t.join()
    et.finish()
    check_records_name_their_rows(run)


# ---------------------------------------------------------------- log() inside the span

#: the forms of the log() call in the loops below
LOG_FORMS = {
    "step": lambda i: {"step": i},
    "step_commit_false": lambda i: {"step": i, "commit": False},
    "step_commit_true": lambda i: {"step": i, "commit": True},
    "plain": lambda i: {},
    "commit_false": lambda i: {"commit": False},
}
EACH_ITS_OWN = {0: 10.0, 1: 20.0, 2: 30.0}
#: log() committed the step inside the span: the span ended after its step was committed
#: and belongs to the next (the finish() commits the last one's row)
NEXT_STEP = {0: None, 1: 10.0, 2: 20.0, 3: 30.0}


def _work_times(run):
    return {r["_step"]: r.get("time_ms/work") for r in read_rows(run.dir / "metrics.jsonl")}


@pytest.mark.parametrize(
    "form, expected",
    [
        ("step", EACH_ITS_OWN),
        ("step_commit_false", EACH_ITS_OWN),
        ("step_commit_true", NEXT_STEP),
        ("plain", NEXT_STEP),
        ("commit_false", {0: 60.0}),
    ],
)
def test_log_inside_the_span(tmp_path, clock, form, expected):
    """The loop with log() inside the span: a log() reached the store while the span ran,
    so the span joins the step open when it ends (base code, step=: step 0 no time, step 1
    span 0's, step 2 spans 1 and 2)."""
    run = start(tmp_path)
    for i in range(3):
        with span("work"):
            clock.sleep_ms(10 * (i + 1))
            et.log({"loss": float(i)}, **LOG_FORMS[form](i))
    et.finish()
    assert _work_times(run) == expected
    check_records_name_their_rows(run)


@pytest.mark.parametrize("form", sorted(LOG_FORMS))
def test_log_after_the_span(tmp_path, clock, form):
    """The loop with log() after the span: no log() came while it ran, so its time waits
    for the row the next log() writes, whatever that call's form."""
    run = start(tmp_path)
    for i in range(3):
        with span("work"):
            clock.sleep_ms(10 * (i + 1))
        et.log({"loss": float(i)}, **LOG_FORMS[form](i))
    et.finish()
    assert _work_times(run) == ({0: 60.0} if form == "commit_false" else EACH_ITS_OWN)
    check_records_name_their_rows(run)


def test_a_step_opened_first_and_a_span_alone(tmp_path, clock):
    run = start(tmp_path)
    et.log({}, step=100)
    with span("work"):
        clock.sleep_ms(1)
    et.log({})  # commits step 100, with the span's time
    with span("work"):
        clock.sleep_ms(2)
    et.log({})  # a row of span time alone
    et.finish()
    assert _work_times(run) == {100: 1.0, 101: 2.0}
    check_records_name_their_rows(run)


@pytest.mark.parametrize("attrs", [False, True])  # records as dicts, or encoded at once
def test_nested_spans_around_a_log(tmp_path, clock, attrs):
    """Within one span that saw the log(): a child that ended before it joins the row that
    log() writes, the parent the step open when it ends; a child that starts and ends after
    the log() saw none, like the spans of the loop above, and waits for the next log().
    Records stay children before parents in the file."""
    run = start(tmp_path, span_count=True)
    for i in range(3):
        with span("step", **({"i": i} if attrs else {})):
            with span("fwd"):
                clock.sleep_ms(1)
            et.log({"i": i}, step=i)
            with span("opt"):
                clock.sleep_ms(2)
            clock.sleep_ms(4)
    et.finish()
    rows = {r["_step"]: r for r in read_rows(run.dir / "metrics.jsonl")}
    assert [rows[i]["time_ms/step"] for i in range(3)] == [7.0, 7.0, 7.0]
    assert [rows[i]["time_ms/step/fwd"] for i in range(3)] == [1.0, 1.0, 1.0]
    assert [rows[i].get("count/step/opt") for i in range(3)] == [None, 1, 2]
    check_records_name_their_rows(run)
    recs = spans_file(run)
    where = {r["id"]: n for n, r in enumerate(recs)}
    assert all(where[r["parent"]] > n for n, r in enumerate(recs) if r["parent"])
    steps = [r for r in recs if r["name"] == "step"]
    assert [r["_step"] for r in steps] == [0, 1, 2]
    if attrs:
        assert [r["args"]["i"] for r in steps] == [0, 1, 2]


def test_a_span_on_another_thread_that_saw_a_log(tmp_path, clock):
    """A loader thread's span that a log() on the main thread reached joins the step open
    when it ends; the main thread's own span, which saw no log(), still waits for the next
    log() (base code: both in row 1)."""
    import threading

    run = start(tmp_path)
    started, go = threading.Event(), threading.Event()

    def load() -> None:
        with span("load"):
            started.set()
            go.wait(10)
            clock.sleep_ms(3)

    t = threading.Thread(target=load)
    t.start()
    assert started.wait(10)
    et.log({"i": 0}, step=0)  # reaches the store while `load` runs
    with span("main"):
        clock.sleep_ms(1)
    go.set()
    t.join()
    et.log({"i": 1}, step=1)
    et.finish()
    rows = {r["_step"]: r for r in read_rows(run.dir / "metrics.jsonl")}
    assert rows[0]["time_ms/load"] == 4.0 and "time_ms/main" not in rows[0]
    assert rows[1]["time_ms/main"] == 1.0 and "time_ms/load" not in rows[1]
    check_records_name_their_rows(run)


def test_threads_logging_inside_spans_keep_records_and_rows_in_agreement(tmp_path):
    import threading

    run = start(tmp_path)
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            with span("bg"):
                with span("inner"):
                    pass

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for i in range(200):
            with span("main"):
                et.log({"i": i}, step=i)
            with span("after"):
                pass
    finally:
        stop.set()
        for t in threads:
            t.join()
    et.finish()
    rows = {r["_step"]: r for r in read_rows(run.dir / "metrics.jsonl")}
    assert all("time_ms/main" in rows[i] for i in range(200))
    check_records_name_their_rows(run)


@pytest.mark.slow
def test_a_lone_span_record_is_written_within_about_a_second(tmp_path):
    """The first completed span requests an immediate write (docs/spans.md "Which row a span
    joins"): its record
    is in spans.jsonl within about a second with no log() after it, even with
    max_buffer_seconds=30 (base code: 30 s)."""
    import time

    run = start(tmp_path, span_max_buffer_seconds=30)
    with span("lone"):
        pass
    path = run.dir / "spans.jsonl"
    deadline = time.monotonic() + 3.0  # generous: FIRST_HOLD_SECONDS is 1 s
    while time.monotonic() < deadline and not (path.exists() and path.stat().st_size):
        time.sleep(0.05)
    assert [(r["name"], r["_step"]) for r in spans_file(run)] == [("lone", 0)]
    et.log({"x": 1.0})  # the row its time joined: the one this log(d) commits
    et.finish()
    (row,) = read_rows(run.dir / "metrics.jsonl")
    assert row["_step"] == 0 and row["x"] == 1.0 and "time_ms/lone" in row


# ---------------------------------------------------------------- the store alone


class FakeFlusher:
    def __init__(self) -> None:
        self.due: dict = {}

    def schedule(self, key, due, callback) -> None:
        cur = self.due.get(key)
        if cur is None or due < cur[0]:
            self.due[key] = (due, callback)

    def cancel(self, key) -> None:
        self.due.pop(key, None)

    def run_due(self, now: float) -> None:
        for key, (due, cb) in list(self.due.items()):
            if due <= now:
                del self.due[key]
                cb()


def _store(now: list[float], **kw):
    flusher = FakeFlusher()
    store = HistoryStore(None, clock=lambda: now[0], flusher=flusher, **kw)
    out: list[tuple[int, list]] = []
    store.hold_spans(lambda step, recs: out.append((step, list(recs))), max_seconds=5.0)
    return store, flusher, out


def test_held_records_are_folded_at_the_hold_deadline():
    """Without explicit steps the open row is the one the next log() writes, so records
    wait at most max_seconds (the span file's max_buffer_seconds) once the first record
    went out (that one: test_the_first_span_record_waits_about_a_second)."""
    now = [0.0]
    store, flusher, out = _store(now)
    store.ingest_span({"time_ms/a": 5.0}, 5.0, b"r0")
    store.ingest({"x": 0})  # step 0 committed with r0, 1 open
    store.ingest_span({"time_ms/a": 1.0}, 1.0, b"r1")
    now[0] = 4.0
    flusher.run_due(now[0])
    assert out == [(0, [b"r0"])]
    now[0] = 5.0
    flusher.run_due(now[0])
    assert out[1:] == [(1, [b"r1"])] and store.open_row()["time_ms/a"] == 1.0
    store.ingest({})
    assert store.tail(1)[0]["time_ms/a"] == 1.0


@pytest.mark.parametrize("logged_first", [False, True])
def test_the_first_span_record_waits_about_a_second(logged_first):
    """The first completed span requests a prompt write (docs/spans.md "Which row a span
    joins"): until a record
    went out, and while no log(step=N) came, pending span data is placed in the open row
    within FIRST_HOLD_SECONDS, whatever max_seconds says (base code: max_seconds); later
    records wait as before (and with explicit steps, max_open_seconds: the test below)."""
    from expr_tracker.history.spanfold import FIRST_HOLD_SECONDS

    now = [0.0]
    store, flusher, out = _store(now)
    store.hold_spans(lambda step, recs: out.append((step, list(recs))), max_seconds=30.0)
    if logged_first:
        store.ingest({"x": 0})  # a plain log(d): the open row is the next log(d)'s anyway
    step = 1 if logged_first else 0
    store.ingest_span({"time_ms/a": 1.0}, 1.0, b"r1")
    flusher.run_due(FIRST_HOLD_SECONDS - 0.01)
    assert out == []
    now[0] = FIRST_HOLD_SECONDS
    flusher.run_due(now[0])
    assert out == [(step, [b"r1"])]
    store.ingest_span({"time_ms/a": 2.0}, 2.0, b"r2")  # waits for a log() again
    now[0] = 20.0
    flusher.run_due(now[0])
    assert out == [(step, [b"r1"])] and store.held_span_records == 1


def test_with_explicit_steps_the_hold_deadline_is_max_open_seconds():
    now = [0.0]
    store, flusher, out = _store(now, max_open_seconds=60.0)
    store.ingest({"x": 1}, step=0)
    store.ingest_span({"time_ms/a": 1.0}, 1.0, b"r1")
    now[0] = 30.0
    flusher.run_due(now[0])
    assert out == []  # a long iteration: still waiting for log(step=1)
    store.ingest({"x": 2}, step=1)
    assert out == [(1, [b"r1"])]
    store.ingest_span({"time_ms/a": 2.0}, 2.0, b"r2")
    now[0] = 91.0
    flusher.run_due(now[0])
    assert out[-1] == (1, [b"r2"])  # no log() for 60 s: placed in the open row


def test_held_records_are_bounded(monkeypatch):
    """Few records wait before any log(step=N) (the open row is the next log()'s anyway),
    many once explicit steps are in use; past the bound they are placed in the open row."""
    import expr_tracker.history.spanfold as spanfold

    monkeypatch.setattr(spanfold, "HOLD_RECORDS_BEFORE_STEPS", 2)
    monkeypatch.setattr(spanfold, "HOLD_MAX_RECORDS", 3)
    now = [0.0]
    store, _flusher, out = _store(now)
    for i in range(5):
        store.ingest_span({"time_ms/a": 1.0}, 1.0, b"r%d" % i)
    assert [len(recs) for _, recs in out] == [2, 2] and store.held_span_records == 1
    store.ingest({}, step=4)
    assert out[-1] == (4, [b"r4"])
    for i in range(7):
        store.ingest_span({"time_ms/a": 1.0}, 1.0, b"s%d" % i)
    assert [len(recs) for _, recs in out[3:]] == [3, 3] and store.held_span_records == 1


def test_fold_keeps_the_aggregation_rules():
    """Pending span data folded into a row that already holds span data of its step
    combines as if every span had been ingested there (sum, max, weighted mean)."""
    store = HistoryStore(None, aggregation=AGGREGATION)
    store.ingest_span({"time_ms/f": 2.0, "gpu_mem_peak_mb/f": 10.0, "cpu_percent/f": 100.0}, 2.0)
    store.ingest({}, commit=False)  # folds into the open row
    store.ingest_span({"time_ms/f": 3.0, "gpu_mem_peak_mb/f": 5.0, "cpu_percent/f": 50.0}, 6.0)
    store.ingest_span({"gpu_percent/f": 7.0}, 0.0)
    view = store.open_row()
    store.ingest({})
    (row,) = store.tail(1)
    for r in (view, row):
        assert r["time_ms/f"] == 5.0 and r["gpu_mem_peak_mb/f"] == 10.0
        assert r["cpu_percent/f"] == pytest.approx((100 * 2 + 50 * 6) / 8)
        assert r["gpu_percent/f"] == 7.0
