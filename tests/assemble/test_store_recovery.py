"""The history store and writer after a failure (issue 10, tester round 2).

- A disk that comes back stops the loss at once: at ``max_pending_records`` the writer
  tries the disk before dropping the oldest row, not only when the backoff retry is due.
- The steps of rows dropped at that bound are counted as ranges, so span records naming
  them can be told apart.
- Ctrl-C while ``log()`` places held span records: the records reach the span sink or
  stay held, never neither.
- ``et.info()["warnings"]`` keys are readable strings.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from helpers import needs_python, not_a_signal_point

import expr_tracker as et
from expr_tracker.history import store as store_mod

#: the store and the objects it owns (pending span data, the open-row timer, the reader)
STORE_FILES = {
    str(Path(et.__file__).resolve().parent / "history" / name)
    for name in ("store.py", "spanfold.py", "openrow.py", "storeread.py")
}


def _rows(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


# ---------------------------------------------------------------- the disk comes back

RECOVERY_CHILD = """
import json, resource, signal, sys, time
import expr_tracker as et
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
run = et.init(project="proj", name="r1", dir=sys.argv[1], max_pending_records=50)
for i in range(10):
    et.log({"a": i}, step=i)
run.history.flush()
size = (run.dir / "metrics.jsonl").stat().st_size
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))   # the disk is "full" now
for i in range(10, 400):
    with et.span("s"):
        pass
    et.log({"a": i, "pad": "p" * 100}, step=i)
for _ in range(4):
    run.history.flush()         # failed attempts: the backoff retry is seconds away now
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))   # the disk recovers
time.sleep(0.3)
for i in range(400, 700):       # past max_pending_records before any retry is due
    et.log({"a": i}, step=i)
print(json.dumps(et.info()["history"]["writer"]), flush=True)
et.finish()
"""


def test_rows_after_the_disk_recovers_are_written_not_dropped(tmp_path):
    root = tmp_path / "runs"
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(RECOVERY_CHILD), str(root)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    stats = json.loads(p.stdout.strip().splitlines()[-1])
    steps = [r["_step"] for r in _rows(root / "proj" / "r1" / "metrics.jsonl")]
    assert [s for s in steps if s >= 400] == list(range(400, 700))  # none lost after
    assert steps == sorted(set(steps))
    # what was dropped during the outage is counted, and named as step ranges
    lost = sorted(set(range(700)) - set(steps))
    assert stats["dropped"] == len(lost) > 0
    named = [s for lo, hi in stats["dropped_steps"] for s in range(lo, hi + 1)]
    assert named == lost


def test_dead_disk_is_probed_at_most_once_per_interval(tmp_path):
    """At the bound with the disk still failing: rows are dropped without a write attempt
    per row (one probe per ``PROBE_INTERVAL_S``), and the retry schedule is unchanged."""
    from expr_tracker.history import writer as wmod

    clock = [0.0]
    w = wmod.JsonlWriter(
        tmp_path / "m.jsonl",
        max_pending_records=3,
        async_write=False,
        buffer_size=100,
        clock=lambda: clock[0],
    )
    w.file.fd = os.open(os.devnull, os.O_RDONLY)  # every write now fails with EBADF
    for i in range(4):
        w.append(b'{"_step":%d}' % i, i)  # the 4th is past the bound: a flush, which fails
    errors, retry = w.write_errors, w._next_retry
    for i in range(4, 200):  # same instant: one probe at most
        w.append(b'{"_step":%d}' % i, i)
    assert w.write_errors - errors <= 1
    assert w._next_retry == retry
    clock[0] += wmod.PROBE_INTERVAL_S
    w.append(b'{"_step":200}', 200)
    assert w.write_errors - errors <= 2
    assert w.pending == 3 and w.dropped == 198
    assert w.stats()["dropped_steps"] == [[0, 197]]
    os.close(w.file.fd)
    w.file.fd = os.open(tmp_path / "m.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    clock[0] += wmod.PROBE_INTERVAL_S
    w.append(b'{"_step":201}', 201)  # the probe works: the queue is written, nothing dropped
    assert w.dropped == 198 and w.pending == 0
    w.close()
    assert [r["_step"] for r in _rows(tmp_path / "m.jsonl")] == [198, 199, 200, 201]


# ---------------------------------------------------------------- Ctrl-C placing held records


class StoreInjector:
    """Raise ``KeyboardInterrupt`` at the ``at``-th trace event (call, line, return) of
    the store's modules (``history/store.py`` and the objects it owns) on this thread, once (see
    tests/helpers.py)."""

    def __init__(self, at: int | None) -> None:
        self.at = at
        self.count = 0
        self.fired = False

    def _local(self, frame, event, arg):
        if self.fired:
            return None
        if event == "line" and not_a_signal_point(frame):
            return self._local  # no signal handler runs there (the end of a with block)
        self.count += 1
        if self.count == self.at:
            self.fired = True
            raise KeyboardInterrupt(f"injected at {frame.f_code.co_name}:{frame.f_lineno}")
        return self._local

    def _global(self, frame, event, arg):
        if frame.f_code.co_filename in STORE_FILES:
            return self._local(frame, event, arg)
        return None

    def run(self, fn, *args, **kw):
        sys.settrace(self._global)
        try:
            return fn(*args, **kw)
        finally:
            sys.settrace(None)


@needs_python(store_mod, why="interrupts each line of")
@pytest.mark.parametrize("explicit", [True, False])
def test_interrupted_log_keeps_held_span_records(tmp_path, explicit):
    """A ``log()`` placing a held span record, interrupted at each point of the store in
    turn: the record reaches spans.jsonl exactly once (now or at a later fold)."""
    run = et.init(project="proj", name="r1", dir=str(tmp_path / "runs"))
    kw = (lambda i: {"step": i}) if explicit else (lambda i: {})
    with et.span("s") as s:
        pass
    made = [s.id]
    probe = StoreInjector(None)
    probe.run(et.log, {"x": 0.0}, **kw(0))
    fired = 0
    for i, at in enumerate(range(1, probe.count + 5), start=1):
        with et.span("s") as s:
            pass
        made.append(s.id)
        inj = StoreInjector(at)
        try:
            inj.run(et.log, {"x": float(i)}, **kw(i))
        except KeyboardInterrupt:
            pass
        fired += inj.fired
    assert fired > probe.count // 2
    et.finish()
    ids = collections.Counter(r["id"] for r in _rows(run.dir / "spans.jsonl"))
    assert sorted(ids) == made  # none lost (ids are unique and increasing per process)
    assert set(ids.values()) == {1}  # none twice


def test_span_sink_interrupted_inside_keeps_nothing_twice():
    """Interrupted inside the sink, the records are the sink's (it had them): not held
    again; interrupted before it, they stay held and reach the sink at the next fold."""
    from expr_tracker.history.store import HistoryStore

    got: list[tuple[int, list]] = []
    boom = [True]

    def sink(step, records):
        if boom[0]:
            boom[0] = False
            got.append((step, list(records)))
            raise KeyboardInterrupt("inside the sink")
        got.append((step, list(records)))

    s = HistoryStore(None, max_open_seconds=None)
    s.hold_spans(sink, max_seconds=None)
    s.ingest_span({"time_ms/a": 1.0}, 1.0, record={"id": 1})
    with pytest.raises(KeyboardInterrupt):
        s.ingest({"x": 1}, step=3)
    assert s.held_span_records == 0
    s.ingest_span({"time_ms/a": 1.0}, 1.0, record={"id": 2})
    s.ingest({"x": 1}, step=4)
    assert [(st, [r["id"] for r in recs]) for st, recs in got] == [(3, [1]), (4, [2])]


# ---------------------------------------------------------------- readable warning keys


def test_info_warning_keys_are_readable(tmp_path):
    class BadRepr:
        def __repr__(self):
            raise RuntimeError("no repr")

    et.init(project="proj", name="r1", dir=str(tmp_path / "runs"))
    et.log({"a": BadRepr()})
    et.log({"b": 1}, step=0)  # behind the open step: dropped, warned
    warnings = et.info()["warnings"]
    et.finish()
    assert warnings, warnings
    assert all(not k.startswith("(") for k in warnings), warnings
    assert "drop: backward_step" in warnings, warnings
    assert any(k.startswith("repr: ") for k in warnings), warnings


def test_warner_counts_every_occurrence_under_one_label():
    from expr_tracker.history.codec import Warner

    w = Warner()
    barrier = threading.Barrier(4)

    def go():
        barrier.wait()
        for _ in range(100):
            w.warn(("drop", "disk"), "x")

    ts = [threading.Thread(target=go) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert w.counts == {"drop: disk": 400}
