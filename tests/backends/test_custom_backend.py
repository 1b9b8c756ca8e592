"""Backend objects (init/log/finish) passed to et.init(backends=[...]): every committed row
once, in order, on a thread of their own; events, final summary and exit code; identity per
stream and rank; failures, a slow backend and the finish deadline never break training."""

from __future__ import annotations

import json
import logging
import threading

import pytest
from helpers import read_lines

import expr_tracker as et
from expr_tracker.assemble import build
from expr_tracker.spec import SpecError, resolve


class Recorder:
    """A backend whose log has no commit parameter; it records every call."""

    def __init__(self):
        self.calls = []
        self.info = None
        self.thread = None
        self.exit_code = None

    def init(self, **info):
        self.info = info
        self.thread = threading.current_thread().name

    def log(self, metrics, step):
        self.calls.append(("log", step, dict(metrics)))

    def on_event(self, event, payload):
        self.calls.append((event, payload))

    def finish(self, exit_code):
        self.exit_code = exit_code

    def rows(self):
        return [(c[1], c[2]) for c in self.calls if c[0] == "log"]


class WithCommit:
    """wandb-shaped: log(data, step=None, commit=None); finish() without an exit code;
    init names only two keywords."""

    def __init__(self):
        self.rows = []
        self.finished = False

    def init(self, project, name):
        self.project, self.name = project, name

    def log(self, data, step=None, commit=None):
        self.rows.append((step, commit, data))

    def finish(self):
        self.finished = True


def test_every_row_once_in_order_with_span_metrics(run_dir):
    rec = Recorder()
    run = et.init(project="proj", name="r1", backends=[rec, "jsonl"], config={"lr": 0.1})
    for i in range(200):
        with et.span("fwd"):
            pass
        et.log({"loss": 1.0 / (i + 1), "i": i})
    et.log({"x": 1}, commit=False)  # the open row is committed at finish and mirrored too
    et.finish()
    rows = rec.rows()
    assert [s for s, _ in rows] == list(range(201))
    on_disk = read_lines(run_dir / "metrics.jsonl")
    assert len(on_disk) == 201
    for (step, metrics), disk in zip(rows, on_disk, strict=True):
        assert step == disk["_step"]
        assert metrics == {k: v for k, v in disk.items() if k not in ("_step", "_time")}
    assert all("time_ms/fwd" in m for _, m in rows[:200])
    assert rows[200][1] == {"x": 1}
    assert rec.thread.startswith("expr_tracker-mirror-")  # never the training thread
    assert rec.info["project"] == "proj" and rec.info["name"] == "r1"
    assert rec.info["group"] == "r1" and rec.info["config"] == {"lr": 0.1}
    assert rec.info["stream"] is None and rec.info["rank"] == 0
    assert rec.exit_code == 0
    stats = run.info()["backends"]["Recorder"]
    assert stats["queued"] == stats["sent"] == 201
    assert stats["dropped"] == {} and stats["alive"] is True and stats["finished"] is True


def test_the_same_object_twice_is_one_backend(run_dir):
    """backends=[b, b] (base code: b initialised twice, every row twice)."""
    inits = []

    class Counting(Recorder):
        def init(self, **info):
            inits.append(info["name"])
            super().init(**info)

    rec, other = Counting(), Recorder()
    run = et.init(project="proj", name="r1", backends=[rec, other, rec])
    et.log({"a": 1})
    et.log({"a": 2})
    et.finish()
    assert inits == ["r1"]
    assert rec.rows() == other.rows() == [(0, {"a": 1}), (1, {"a": 2})]
    assert sorted(run.info()["backends"]) == ["Counting", "Recorder"]


def test_commit_parameter_and_named_keywords_detected(run_dir):
    b = WithCommit()
    et.init(project="proj", name="r1", backends=b)  # one object without a list
    et.log({"a": 1})
    et.log({"a": 2}, step=5)  # opens step 5 (commits 1 first), committed at finish
    et.finish()
    assert b.project == "proj" and b.name == "r1"
    assert b.rows == [(0, True, {"a": 1}), (5, True, {"a": 2})]
    assert b.finished


def test_rejected_rows_reach_no_backend(run_dir):
    rec = Recorder()
    run = et.init(project="proj", name="r1", backends=[rec])
    et.log({"a": 1}, step=10, commit=True)
    assert et.log({"a": 2}, step=3, commit=True) == -1  # backward: step_policy monotonic
    et.log({"a": 3}, step=11, commit=True)
    et.log({"a": 4}, commit=False)  # open, not committed: nothing mirrored yet
    run.history.flush()
    et.finish()
    assert rec.rows() == [(10, {"a": 1}), (11, {"a": 3}), (12, {"a": 4})]


def test_events_final_summary_and_failed_exit_code(run_dir):
    rec = Recorder()
    run = et.init(project="proj", name="r1", backends=[rec])
    et.log({"loss": 2.0})
    run.emit("config", {"changes": {"bs": 32}})
    run.emit("summary", {"changes": {"best": 0.9}})
    run.emit(
        "define_metric",
        {"name": "val/*", "step_metric": "epoch", "summary": "max", "hidden": False, "goal": None},
    )
    et.log({"loss": 1.0})
    run.finish(exception=RuntimeError("boom"))
    kinds = [c[0] for c in rec.calls]
    assert kinds == ["log", "config", "summary", "define_metric", "log", "summary"]
    assert rec.calls[1][1] == {"changes": {"bs": 32}}
    final = rec.calls[-1][1]
    assert final["final"] is True and final["changes"]["loss"] == 1.0
    assert not any(k.startswith("_") for k in final["changes"])
    assert rec.exit_code == 1


def test_streams_and_ranks_are_backend_runs_of_their_own(tmp_path, monkeypatch):
    main, data, rank1 = Recorder(), Recorder(), Recorder()
    kw = {"project": "proj", "name": "r1"}
    runs = [build(resolve(kwargs=kw, environ={}), environ={}, backend_objects=[main])]
    runs.append(build(resolve(kwargs={**kw, "stream": "data"}, environ={}), backend_objects=[data]))
    spec = resolve(kwargs={**kw, "backend_on_rank": "all"}, environ={})
    runs.append(build(spec, environ={"RANK": "1"}, backend_objects=[rank1]))
    for n, run in enumerate(runs):
        for i in range(3):
            run.log({"v": n * 10 + i})
    for run in runs:
        run.finish()
    assert [r.info["name"] for r in (main, data, rank1)] == ["r1", "r1.data", "r1.rank1"]
    assert {r.info["group"] for r in (main, data, rank1)} == {"r1"}
    assert len({r.info["id"] for r in (main, data, rank1)}) == 3
    assert [m["v"] for _, m in data.rows()] == [10, 11, 12]
    assert [m["v"] for _, m in rank1.rows()] == [20, 21, 22]
    assert [s for s, _ in rank1.rows()] == [0, 1, 2]  # each its own step axis


def test_id_is_stable_across_a_resume(run_dir):
    first, second = Recorder(), Recorder()
    et.init(project="proj", name="r1", backends=[first])
    et.log({"a": 1})
    et.finish()
    et.init(project="proj", name="r1", backends=[second])
    et.log({"a": 2})
    et.finish()
    assert first.info["id"] == second.info["id"]
    assert first.info["resumed"] is False and second.info["resumed"] is True
    assert second.rows() == [(1, {"a": 2})]


def test_backend_on_rank_default_leaves_other_ranks_out(tmp_path):
    rec = Recorder()
    run = build(
        resolve(kwargs={"project": "p", "name": "n"}, environ={}),
        environ={"RANK": "2"},
        backend_objects=[rec],
    )
    run.log({"a": 1})
    run.finish()
    assert rec.info is None and rec.calls == []
    assert run.info()["backends"] == {}  # there on every rank (torchrun runs one script)
    listed = Recorder()
    spec = resolve(kwargs={"project": "p", "name": "n2", "backend_on_rank": [0, 2]}, environ={})
    run = build(spec, environ={"RANK": "2"}, backend_objects=[listed])
    run.log({"a": 1})
    run.finish()
    assert listed.info["name"] == "n2.rank2" and listed.rows() == [(0, {"a": 1})]


class FailingInit(Recorder):
    def init(self, **info):
        raise ConnectionError("no route to host")


class FailingLog(Recorder):
    def log(self, metrics, step):
        if step % 2:
            raise ValueError(f"bad row {step}")
        super().log(metrics, step)


class AlwaysFailing(Recorder):
    def log(self, metrics, step):
        raise OSError("disk quota")


def test_failing_init_turns_the_mirror_off_training_goes_on(run_dir, caplog):
    caplog.set_level(logging.WARNING, "expr_tracker")
    b = FailingInit()
    run = et.init(project="proj", name="r1", backends=[b])
    for i in range(10):
        et.log({"a": i})
    et.finish()
    assert len(read_lines(run_dir / "metrics.jsonl")) == 10
    stats = run.info()["backends"]["FailingInit"]
    assert stats["alive"] is False and stats["sent"] == 0
    assert "no route to host" in stats["last_error"]
    assert sum(stats["dropped"].values()) == 10
    assert b.exit_code is None  # never initialised: never finished
    msgs = [r.getMessage() for r in caplog.records if "FailingInit mirror" in r.getMessage()]
    assert len(msgs) == 1 and "is off" in msgs[0]


def test_failing_log_is_counted_and_warned_once(run_dir, caplog):
    caplog.set_level(logging.WARNING, "expr_tracker")
    b = FailingLog()
    run = et.init(project="proj", name="r1", backends=[b])
    for i in range(10):
        et.log({"a": i})
    et.finish()
    assert [s for s, _ in b.rows()] == [0, 2, 4, 6, 8]
    stats = run.info()["backends"]["FailingLog"]
    assert stats["sent"] == 5 and stats["failures"] == 5
    assert stats["dropped"] == {"log_failed": 5} and stats["alive"] is True
    assert "bad row 9" in stats["last_error"]
    msgs = [r.getMessage() for r in caplog.records if "FailingLog mirror failed" in r.getMessage()]
    assert len(msgs) == 1
    assert b.exit_code == 0


def test_a_backend_failing_every_row_is_given_up(run_dir):
    from expr_tracker.backends.mirror import MAX_CONSECUTIVE_FAILURES

    b = AlwaysFailing()
    run = et.init(project="proj", name="r1", backends=[b])
    for i in range(MAX_CONSECUTIVE_FAILURES + 30):
        et.log({"a": i})
    et.finish()
    stats = run.info()["backends"]["AlwaysFailing"]
    assert stats["alive"] is False and stats["failures"] == MAX_CONSECUTIVE_FAILURES
    assert stats["dropped"]["log_failed"] == MAX_CONSECUTIVE_FAILURES
    assert sum(stats["dropped"].values()) == MAX_CONSECUTIVE_FAILURES + 30
    assert b.exit_code == 0  # initialised: finished


class Blocking(Recorder):
    """Blocks in log until released: the slowest backend there is."""

    def __init__(self):
        super().__init__()
        self.release = threading.Event()
        self.entered = threading.Event()

    def log(self, metrics, step):
        self.entered.set()
        self.release.wait(30)
        super().log(metrics, step)


def test_slow_backend_bounded_queue_and_finish_deadline(run_dir, caplog):
    caplog.set_level(logging.WARNING, "expr_tracker")
    b = Blocking()
    run = et.init(
        project="proj",
        name="r1",
        backends=[b],
        backend_queue_size=5,
        backend_finish_timeout=0.2,
    )
    et.log({"a": 0})
    assert b.entered.wait(10)  # the mirror thread is stuck in log(step=0)
    for i in range(1, 100):
        et.log({"a": i})  # never blocks: 5 are queued, the rest dropped
    stats = run.info()["backends"]["Blocking"]
    assert stats["queued"] == 6 and stats["dropped"] == {"queue_full": 94}
    et.finish()  # returns although the backend is still stuck: the deadline
    assert not b.release.is_set() and b.exit_code is None
    stats = run.info()["backends"]["Blocking"]
    assert stats["dropped"] == {"queue_full": 94, "finish_timeout": 5}
    assert len(read_lines(run_dir / "metrics.jsonl")) == 100  # the local files have all
    msgs = [r.getMessage() for r in caplog.records if "Blocking mirror" in r.getMessage()]
    assert len(msgs) == 2  # once behind, once past the deadline
    b.release.set()  # the call it was stuck in returns: finish is still called, late
    for _ in range(100):
        if b.exit_code is not None:
            break
        threading.Event().wait(0.05)
    assert b.exit_code == 0 and b.rows() == [(0, {"a": 0})]


def test_bad_backends_are_configuration_errors(run_dir):
    with pytest.raises(SpecError) as err:
        et.init(project="proj", name="r1", backends=["wandbb"])
    assert "'wandbb'" in str(err.value) and "jsonl, trackio, wandb" in str(err.value)
    with pytest.raises(SpecError) as err:
        et.init(project="proj", name="r1", backend_kwargs={"wandb": {"entitty": "me"}})
    assert "backend_kwargs" in str(err.value) and "entitty" in str(err.value)
    assert "entity" in str(err.value)
    with pytest.raises(SpecError, match="backend_on_rank"):
        et.init(project="proj", name="r1", backend_on_rank="some")
    with pytest.raises(TypeError, match="init, log and finish"):
        et.init(project="proj", name="r1", backends=[object()])
    with pytest.raises(TypeError, match="pass an instance"):
        et.init(project="proj", name="r1", backends=[Recorder])
    assert not run_dir.exists()  # refused before anything touched the disk


class WeirdLog(Recorder):
    def log(self):  # takes no row
        pass


class WeirdFinish(Recorder):
    def finish(self, a, b):  # needs arguments no mirror gives
        pass


class WeirdInit(Recorder):
    def init(self, project, api_key):  # api_key is not one of the init keywords
        pass


class WeirdEvent(Recorder):
    def on_event(self, event):
        pass


def test_unusable_signatures_are_refused_at_init(run_dir):
    cases = [
        (WeirdLog(), "WeirdLog.log", "log(metrics, step=N)"),
        (WeirdFinish(), "WeirdFinish.finish", "finish(exit_code=N)"),
        (WeirdInit(), "WeirdInit.init", "api_key"),
        (WeirdEvent(), "WeirdEvent.on_event", "on_event(event, payload)"),
    ]
    for obj, what, how in cases:
        with pytest.raises(TypeError) as err:
            et.init(project="proj", name="r1", backends=[obj])
        assert what in str(err.value) and how in str(err.value), str(err.value)
    for given in (3, [None]):
        with pytest.raises(TypeError) as err:
            et.init(project="proj", name="r1", backends=given)
        assert "backends" in str(err.value) and "jsonl, trackio, wandb" in str(err.value)
    assert not run_dir.exists()


def test_spans_survive_a_library_half_imported_by_a_mirror(run_dir):
    # a mirror imports its library on its own thread; meanwhile sys.modules may hold a
    # partially initialised asyncio, which the span recorder peeks at for task names
    import sys
    import types

    et.init(project="proj", name="r1")
    real = sys.modules["asyncio"]
    sys.modules["asyncio"] = types.ModuleType("asyncio")
    try:
        with et.span("fwd"):
            pass
    finally:
        sys.modules["asyncio"] = real
    et.log({"a": 1})
    et.finish()
    (row,) = read_lines(run_dir / "metrics.jsonl")
    assert "time_ms/fwd" in row


def test_objects_are_added_to_the_backends_a_spec_file_names(tmp_path, run_dir):
    spec = tmp_path / "run.yaml"
    spec.write_text("backends: [jsonl]\nbackend_queue_size: 7\n")
    rec = Recorder()
    run = et.init(project="proj", name="r1", spec=str(spec), backends=[rec])
    et.log({"a": 1})
    et.finish()
    assert run.spec.backends == ["jsonl"] and run.spec.backend_queue_size == 7
    assert rec.rows() == [(0, {"a": 1})]
    assert json.loads((run_dir / "spec.json").read_text())["backends"] == ["jsonl"]


def test_ctrl_c_while_finish_waits_for_a_mirror_then_finish_again(tmp_path):
    # a real SIGINT (in a child: it must reach a thread blocked in the mirror's wait)
    from helpers import run_py

    p = run_py(
        """
        import json, os, signal, threading
        import expr_tracker as et

        class Blocking:
            def __init__(self):
                self.release, self.entered, self.rows, self.code = (
                    threading.Event(), threading.Event(), [], None)
            def init(self, **info):
                pass
            def log(self, metrics, step):
                self.entered.set()
                self.release.wait(60)
                self.rows.append(step)
            def finish(self, exit_code):
                self.code = exit_code

        b = Blocking()
        run = et.init(project="proj", name="r1", backends=[b], backend_finish_timeout=60)
        et.log({"a": 0})
        assert b.entered.wait(10)
        path = run.dir / "run.json"

        def interrupt():
            while '"finished"' not in path.read_text():  # finish() reached the mirrors
                threading.Event().wait(0.01)
            threading.Event().wait(0.1)
            os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=interrupt, daemon=True).start()
        try:
            et.finish()
            out = {"interrupted": False}
        except KeyboardInterrupt:
            out = {"interrupted": True, "finished_then": run.finished}
        b.release.set()
        et.finish()  # resumes at the interrupted stage
        out.update(finished=run.finished, code=b.code, rows=b.rows)
        print(json.dumps(out))
        """,
        timeout=60,
    )
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out == {
        "interrupted": True,
        "finished_then": False,
        "finished": True,
        "code": 0,
        "rows": [0],
    }


@pytest.mark.slow
def test_a_stuck_backend_does_not_hold_the_process_past_the_deadline(tmp_path):
    from helpers import run_py

    p = run_py(
        """
        import threading
        import expr_tracker as et

        class Stuck:
            def init(self, **info):
                pass
            def log(self, metrics, step):
                threading.Event().wait()  # forever
            def finish(self):
                pass

        et.init(project="proj", name="r1", backends=[Stuck()], backend_finish_timeout=0.5)
        for i in range(50):
            et.log({"a": i})
        # no et.finish(): the exit hook finishes the run
        """,
        timeout=60,
    )
    assert "did not drain within 0.5 s" in p.stderr
    rows = read_lines(tmp_path / "runs" / "proj" / "r1" / "metrics.jsonl")
    assert [r["a"] for r in rows] == list(range(50))
    info = json.loads((tmp_path / "runs" / "proj" / "r1" / "run.json").read_text())
    assert info["status"] == "finished"


class Exiting(Recorder):
    def log(self, metrics, step):
        if step == 2:
            raise SystemExit(3)  # not an Exception: stops the mirror's thread
        super().log(metrics, step)


def test_a_backend_stopping_its_thread_turns_the_mirror_off(run_dir):
    b = Exiting()
    run = et.init(project="proj", name="r1", backends=[b])
    for i in range(10):
        et.log({"a": i})
    et.finish()
    stats = run.info()["backends"]["Exiting"]
    assert stats["alive"] is False and "SystemExit" in stats["last_error"]
    assert stats["sent"] == 2 and b.rows() == [(0, {"a": 0}), (1, {"a": 1})]
    assert stats["queued"] == 10 and stats["dropped"] == {"log_failed": 1, "backend_off": 7}
    assert stats["pending"] == 0
    assert len(read_lines(run_dir / "metrics.jsonl")) == 10
