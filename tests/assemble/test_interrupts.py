"""Interrupts and failures inside the library (issue 10, section 2).

- Ctrl-C or SIGTERM while ``log()``, a commit or a flush runs on the main thread loses no
  committed row and writes no step twice, leaves no lock held, and ``finish()`` afterwards
  completes: a real child process interrupted at random moments, and an in-process
  injection of ``KeyboardInterrupt`` at every line, call and return of the library code
  that one ``log()``, ``flush()`` or ``finish()`` runs (deterministic).
- A value JSON cannot encode never raises from ``log()`` nor poisons later rows.
- ``max_pending_records`` bounds memory at append time.
- ``finish()`` never reports ``finished`` while the writer is still open.
"""

from __future__ import annotations

import collections
import json
import logging
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from helpers import Injector, count_events, needs_python

import expr_tracker as et
from expr_tracker.history import store as store_mod
from expr_tracker.history.runinfo import read_run_info


def file_steps(run) -> list[int]:
    with open(run.dir / "metrics.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["_step"] for line in f]


def assert_exactly_once(steps_on_disk: list[int], returned: list[int]) -> None:
    dups = [s for s, n in collections.Counter(steps_on_disk).items() if n > 1]
    assert dups == [], f"steps written twice: {dups[:20]}"
    missing = sorted(set(returned) - set(steps_on_disk))
    assert missing == [], f"steps log() returned for but not on disk: {missing[:20]}"
    assert steps_on_disk == sorted(steps_on_disk)


# ---------------------------------------------------------------- a real child, real signals

STORM_CHILD = """
import json, os, signal, sys
import expr_tracker as et
from expr_tracker import process_exit

root, out, which = sys.argv[1], sys.argv[2], sys.argv[3]
run = et.init(project="proj", name="r1", dir=root, buffer_size=int(sys.argv[4]), cache_rows=64)
armed = False


def on_signal(signum, frame):
    # the interrupt lands while log() or flush() runs, once per call (a second one within
    # microseconds, while the first is being cleaned up, is not what a person or a
    # scheduler sends); elsewhere (this loop's own bookkeeping) it is ignored
    global armed
    if armed:
        armed = False
        if signum == signal.SIGTERM:
            process_exit._on_sigterm(signum, frame)  # the library's handler: raises SystemExit(143)
        raise KeyboardInterrupt


signal.signal(getattr(signal, which), on_signal)
ok, interrupts, i = [], 0, 0
print("ready", flush=True)
while not os.path.exists(os.path.join(out, "stop")):
    for _ in range(50):
        try:
            armed = True
            s = et.log({"x": float(i), "i": i})
            armed = False
            ok.append(s)
        except (KeyboardInterrupt, SystemExit):
            armed = False
            interrupts += 1
        i += 1
    try:
        armed = True
        run.history.flush()
        armed = False
    except (KeyboardInterrupt, SystemExit):
        armed = False
        interrupts += 1
with open(os.path.join(out, "ok.json"), "w") as f:
    json.dump({"ok": ok, "interrupts": interrupts}, f)
try:
    et.finish()
except SystemExit as exc:  # et.finish() honours a SIGTERM received earlier
    print("exit", exc.code, flush=True)
print("finished", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signame", "buffer_size"), [("SIGINT", 50), ("SIGINT", 1), ("SIGTERM", 1)]
)
def test_signal_storm_loses_nothing_and_finish_completes(tmp_path, signame, buffer_size):
    """A child logs in a loop while this process interrupts it ~150 times at random moments
    (each interrupt is caught and logging goes on), then finishes: every step ``log()``
    returned for is on disk exactly once, and ``finish()`` does not deadlock."""
    root = tmp_path / "runs"
    p = subprocess.Popen(
        [sys.executable, "-c", STORM_CHILD, str(root), str(tmp_path), signame, str(buffer_size)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout.readline().strip() == "ready"
        rng = random.Random(f"{signame}-{buffer_size}")
        for _ in range(150):
            time.sleep(rng.uniform(0.0003, 0.004))
            p.send_signal(getattr(signal, signame))
        (tmp_path / "stop").touch()
        out, err = p.communicate(timeout=60)  # a deadlock in log() or finish() fails here
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, err
    assert "finished" in out, err
    res = json.loads((tmp_path / "ok.json").read_text())
    assert res["interrupts"] > 20  # the signals did land inside the loop
    run_dir = root / "proj" / "r1"
    with open(run_dir / "metrics.jsonl", encoding="utf-8") as f:
        steps = [json.loads(line)["_step"] for line in f]
    assert_exactly_once(steps, res["ok"])
    assert read_run_info(run_dir / "run.json")["status"] in ("finished", "failed")
    assert "Traceback" not in err.replace("KeyboardInterrupt", ""), err


# ---------------------------------------------------------------- deterministic injection


def check_store(run) -> None:
    """The cache (the writer's queue) and the file agree: ordinals are line numbers."""
    store, w = run.history, run.history.writer
    with w._io_lock:  # no flush in flight on the flusher thread
        assert not w.queue.lines  # the cache is the queue (JsonlWriter.feed_from)
        assert w.flushed + w.pending == store.cache.next_ordinal - store.disk_prefix_rows
        assert w.lines == store.disk_prefix_rows + w.flushed  # nothing dropped here
    assert store.open_step == (store.last_row or {"_step": -1})["_step"] + 1


@needs_python(store_mod, why="interrupts each line of")
@pytest.mark.parametrize("cache_rows", [2_000_000, 8])
def test_interrupt_at_every_point_of_log(tmp_path, cache_rows):
    """One ``log()`` interrupted at each of its points in turn (with eviction flushing under
    the store lock when the cache is small): no step twice, nothing returned lost, the
    stores consistent, no lock held (the next call would deadlock)."""
    run = et.init(project="proj", name="r1", dir=str(tmp_path / "runs"), cache_rows=cache_rows)
    returned = []
    i = 2
    # the first row makes the writer schedule its first flush (JsonlWriter.added): more
    # points than a later log(), which only appends to the cache (the writer's queue)
    n = count_events(et.log, {"x": 0.0, "s": "a"}) + 10
    typical = count_events(et.log, {"x": 1.0, "s": "a"})
    returned += [0, 1]
    fired = 0
    for at in range(1, n):
        inj = Injector(at)
        try:
            returned.append(inj.run(et.log, {"x": float(i), "s": "a"}))
        except KeyboardInterrupt:
            pass
        fired += inj.fired
        i += 1
        check_store(run)
        returned.append(et.log({"x": float(i)}))  # the next call works (no lock left held)
        i += 1
    assert fired > typical // 2
    et.finish()
    assert_exactly_once(file_steps(run), returned)
    assert [r["_step"] for r in et.history(-1, run=run.dir)] == file_steps(run)


def test_interrupt_at_every_point_of_flush(tmp_path):
    """``flush()`` interrupted at each point: the batch it took is on disk or back in the
    queue, never both, never neither."""
    run = et.init(
        project="proj",
        name="r1",
        dir=str(tmp_path / "runs"),
        buffer_size=10_000,
        buffer_interval=3600,
        max_buffer_seconds=None,
    )
    returned = [et.log({"x": 0.0})]
    n = count_events(run.history.flush) + 10
    for at in range(1, n):
        returned += [et.log({"x": float(at)}), et.log({"y": float(at)})]
        try:
            Injector(at).run(run.history.flush)
        except KeyboardInterrupt:
            pass
        check_store(run)
    run.history.flush()
    check_store(run)
    et.finish()
    assert_exactly_once(file_steps(run), returned)


@pytest.mark.slow
def test_interrupt_at_every_point_of_finish(tmp_path):
    """``finish()`` interrupted at each point, then called again: it completes, writes the
    rest and reports ``finished``; the run stays current until then."""
    points = None
    at = 1
    while points is None or at < points:
        root = tmp_path / f"runs{at}"
        run = et.init(project="proj", name="r1", dir=str(root), buffer_size=10_000)
        returned = [et.log({"x": float(k)}) for k in range(5)]
        et.log({"open": 1.0}, commit=False)
        returned.append(run.history.open_step)
        if points is None:
            points = count_events(et.finish, stdlib=False) + 5
            run2 = run
        else:
            try:
                # our code only: closing the alert engine and delivery waits on
                # threading.Event, which a signal inside threading.py can break
                Injector(at, stdlib=False).run(et.finish)
            except KeyboardInterrupt:  # done, or still current until finished
                assert run.finished or et.get_run() is run
            et.finish()
            run2 = run
            at += max(1, points // 150)  # about 150 points, spread over the whole finish
        assert run2.finished and et.get_run() is None
        assert_exactly_once(file_steps(run2), returned)
        assert read_run_info(run2.dir / "run.json")["status"] == "finished"
        assert run2.history.writer.closed


def test_interrupted_finish_is_completed_at_exit(tmp_path):
    """Ctrl-C inside ``finish()`` with nothing calling it again: the exit hook completes
    it (before, the run was dropped and its pending rows never written)."""
    code = """
    import sys, expr_tracker as et
    run = et.init(project="proj", name="r1", dir=sys.argv[1], buffer_size=10_000)
    for k in range(20):
        et.log({"x": float(k)})
    w = run.history.writer
    real = w.close
    def interrupted():
        w.close = real
        raise KeyboardInterrupt
    w.close = interrupted
    try:
        et.finish()
    except KeyboardInterrupt:
        print("interrupted", et.get_run() is run, run.finished, flush=True)
    """
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert "interrupted True False" in p.stdout
    run_dir = tmp_path / "runs" / "proj" / "r1"
    with open(run_dir / "metrics.jsonl", encoding="utf-8") as f:
        assert [json.loads(line)["x"] for line in f] == [float(k) for k in range(20)]
    assert read_run_info(run_dir / "run.json")["status"] == "finished"


def test_finish_from_a_second_thread_waits_for_the_first(tmp_path):
    """Two threads finish at once: the second returns only once the first has closed the
    writer (before, it returned at once while the file was still being written)."""
    run = et.init(project="proj", name="r1", dir=str(tmp_path / "runs"))
    et.log({"x": 1.0})
    w = run.history.writer
    entered, release = threading.Event(), threading.Event()
    real_close = w.close

    def slow_close():
        entered.set()
        release.wait(10)
        real_close()

    w.close = slow_close
    t = threading.Thread(target=run.finish)
    t.start()
    assert entered.wait(10)
    seen = {}

    def second():
        run.finish()
        seen["closed"] = w.closed
        seen["finished"] = run.finished

    t2 = threading.Thread(target=second)
    t2.start()
    t2.join(0.3)
    assert t2.is_alive() and not run.finished  # waiting, not reporting finished
    release.set()
    t.join(10)
    t2.join(10)
    assert seen == {"closed": True, "finished": True}


def test_writer_close_failure_is_not_reported_finished(tmp_path, caplog):
    """A history that fails to close leaves the run ``failed`` in run.json, never
    ``finished`` with the metrics file still open."""
    run = et.init(project="proj", name="r1", dir=str(tmp_path / "runs"))
    et.log({"x": 1.0})

    def broken():
        raise OSError("stale file handle")

    run.history.writer.close = broken
    with caplog.at_level(logging.ERROR, logger="expr_tracker"):
        et.finish()
    info = read_run_info(run.dir / "run.json")
    assert info["status"] == "failed"
    assert "could not be closed" in info["error"]


@needs_python(store_mod, why="replaces HistoryStore.commit on an instance of")
def test_sigterm_while_finishing_in_another_thread_is_not_ignored(tmp_path):
    """A finish() interrupted earlier does not make SIGTERM a no-op: the handler only
    defers while a finish() is running now."""
    code = """
    import os, signal, sys, time, expr_tracker as et
    run = et.init(project="proj", name="r1", dir=sys.argv[1])
    et.log({"x": 1.0})
    real = run.history.commit
    def interrupted():
        run.history.commit = real
        raise KeyboardInterrupt
    run.history.commit = interrupted
    try:
        et.finish()
    except KeyboardInterrupt:
        pass
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
    print("SIGTERM was ignored", flush=True)
    """
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 128 + signal.SIGTERM, (p.stdout, p.stderr)
    assert "ignored" not in p.stdout
    info = read_run_info(tmp_path / "runs" / "proj" / "r1" / "run.json")
    assert info["status"] == "failed" and info["signal"] == "SIGTERM"


# ---------------------------------------------------------------- hostile values


class BadRepr:
    def __repr__(self):
        raise RuntimeError("no repr for you")


def _class_without_module():
    ns: dict = {}
    exec("C = type('C', (), {})", ns)  # noqa: S102 - type() called where __name__ is unset
    cls = ns["C"]
    assert not hasattr(cls, "__module__")
    return cls


def _deep(n: int):
    root = cur = []
    for _ in range(n):
        nxt: list = []
        cur.append(nxt)
        cur = nxt
    return root


def _hostile():
    nomod = _class_without_module()
    return {
        "surrogate": "a\ud800b",
        "surrogate_key": {"k\udfff": 1.0},
        "big_int": 10**400,
        "huge_int": 10**5000,  # beyond the int -> str digit limit too
        "bad_repr": BadRepr(),
        "no_module_class": nomod,
        "no_module_instance": nomod(),
        "deep": _deep(100_000),
    }


@pytest.mark.parametrize("name", list(_hostile()))
def test_hostile_value_never_raises_nor_poisons(tmp_path, caplog, name):
    value = _hostile()[name]
    run = et.init(project="proj", name="r1", dir=str(tmp_path / "runs"))
    before = dict(run.warner.counts)
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        s0 = et.log({name: value, "ok": 1.0})
        s1 = et.log({name: value, "ok": 2.0})  # the same cause again: no second warning
        et.log({"ok": 3.0}, commit=False)
        et.log({name: value}, commit=False)  # sitting in the open row
        s2 = et.log({"later": 4.0})
    assert (s0, s1, s2) == (0, 1, 2)
    warned = [r.getMessage() for r in caplog.records if r.name == "expr_tracker"]
    assert len(warned) == len(set(warned)), warned  # once per cause
    if name != "no_module_class":  # a class is written as its name: no warning needed
        assert len(warned) >= 1
        counted = {k: v for k, v in run.warner.counts.items() if before.get(k) != v}
        assert counted or et.info()["history"]["dropped"], "the conversion is counted"
    et.finish()
    with open(run.dir / "metrics.jsonl", "rb") as f:
        lines = f.read().splitlines()
    rows = [json.loads(line) for line in lines]  # every line is valid JSON
    for raw in lines:
        raw.decode("utf-8")  # and valid UTF-8
    assert [r["ok"] for r in rows] == [1.0, 2.0, 3.0]
    assert rows[2]["later"] == 4.0
    assert read_run_info(run.dir / "run.json")["status"] == "finished"


def test_hostile_values_how_they_are_written(tmp_path):
    run = et.init(project="proj", name="r1", dir=str(tmp_path / "runs"))
    h = _hostile()
    et.log({"surrogate": h["surrogate"], "big_int": h["big_int"], "bad_repr": h["bad_repr"]})
    et.log({"surrogate_key": h["surrogate_key"], "cls": h["no_module_class"]})
    et.log({"deep": h["deep"], "nested_big": [1, 10**400]})
    info = et.info()
    et.finish()
    with open(run.dir / "metrics.jsonl", encoding="utf-8") as f:
        r0, r1, r2 = (json.loads(line) for line in f)
    assert r0["surrogate"] == "a\ufffdb"
    assert "big_int" not in r0  # too large for a float: dropped, counted
    assert info["history"]["dropped"]["int_too_large"] == 1
    assert r0["bad_repr"] == "<tests.test_interrupts.BadRepr object (repr() failed)>" or r0[
        "bad_repr"
    ].endswith("BadRepr object (repr() failed)>")
    assert r1["surrogate_key"] == {"k\ufffd": 1.0}
    assert r1["cls"] == "C"
    assert isinstance(r2["deep"], list) and r2["nested_big"] == [1, None]
    for cause in ("lone_surrogate", "too_deep", "int_too_large", "repr_failed"):
        assert any(cause in k for k in info["warnings"]), (cause, info["warnings"])


# ---------------------------------------------------------------- max_pending_records


FAILING_DIR_CHILD = """
import json, logging, os, shutil, sys
import expr_tracker as et
logging.basicConfig(level=logging.WARNING)
run = et.init(project="proj", name="r1", dir=sys.argv[1], buffer_size=1,
              max_pending_records=10)
et.log({"x": 0})
run.history.flush()
path = run.dir / "metrics.jsonl"
w = run.history.writer
os.close(w.file.fd)
w.file.fd = None
os.replace(path, path.with_suffix(".moved"))
os.mkdir(path)              # the writer's file is a directory now: every write fails
worst = 0
for i in range(1, 200):
    et.log({"x": i})
    worst = max(worst, et.info()["history"]["pending_rows"])
h = et.info()["history"]
print(json.dumps({"worst": worst, "dropped": h["dropped"], "writer": h["writer"]}), flush=True)
os.rmdir(path)
os.replace(path.with_suffix(".moved"), path)
et.finish()
"""


def test_max_pending_records_bounds_memory_at_append_time(tmp_path):
    """While every write fails, pending rows never exceed ``max_pending_records`` after any
    ``log()`` (before, the bound was applied only when a retry ran, at most once a second
    to every 30 s); the oldest are dropped, counted and logged as errors (not per row)."""
    p = subprocess.run(
        [sys.executable, "-c", FAILING_DIR_CHILD, str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout.splitlines()[0])
    assert res["worst"] <= 10, res
    assert res["dropped"]["disk"] >= 180
    assert res["writer"]["dropped"] == res["dropped"]["disk"]
    errors = [line for line in p.stderr.splitlines() if line.startswith("ERROR")]
    assert 1 <= len(errors) <= 10, p.stderr  # loud, but not one line per dropped row
    assert "dropped the oldest" in errors[0]
    with open(tmp_path / "runs" / "proj" / "r1" / "metrics.jsonl", encoding="utf-8") as f:
        xs = [json.loads(line)["x"] for line in f]
    assert xs[0] == 0 and xs[-10:] == list(range(190, 200))  # the newest were kept


def test_max_pending_records_with_a_working_disk_applies_back_pressure(tmp_path):
    """A flusher that falls behind (a slow disk) never makes the queue grow past the bound,
    and nothing is dropped: ``append`` writes synchronously instead."""
    from expr_tracker.history.writer import JsonlWriter

    w = JsonlWriter(
        tmp_path / "m.jsonl",
        buffer_size=1_000_000,
        interval=None,
        max_seconds=None,
        max_pending_records=5,
    )
    for i in range(50):
        w.append(json.dumps({"_step": i}).encode(), i)
        assert w.pending <= 5
    w.close()
    assert w.dropped == 0
    with open(tmp_path / "m.jsonl", encoding="utf-8") as f:
        assert [json.loads(line)["_step"] for line in f] == list(range(50))
