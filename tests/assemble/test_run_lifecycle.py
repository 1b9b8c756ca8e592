"""Runs end to end with real processes: resume, crash, a failing disk, locks, fork, streams."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import run_py

import expr_tracker as et
from expr_tracker.history.reader import read_rows
from expr_tracker.history.runinfo import read_run_info


def start(tmp_path, **kw):
    kw.setdefault("dir", str(tmp_path / "runs"))
    return et.init(project="proj", name="r1", **kw)


# ---------------------------------------------------------------- resume


def test_resume_continues_from_max_step_plus_one(tmp_path):
    start(tmp_path)
    for i in range(5):
        et.log({"a": i})
    et.summary()["best"] = 4
    et.finish()
    run = start(tmp_path)
    assert run.history.open_step == 5
    assert et.summary()["best"] == 4
    et.log({"a": 5})
    assert [r["_step"] for r in et.history(-1)] == list(range(6))
    et.finish()
    info = json.loads((run.dir / "run.json").read_text())
    assert info["resumed_at_step"] == 5
    assert info["previous_attempts"][-1]["status"] == "finished"


def test_resume_after_patch_lines_uses_max_step(tmp_path):
    run = start(tmp_path)
    et.log({"a": 1}, step=7)
    assert run.history.write_open_row()  # what max_open_seconds does on a timer
    et.log({"b": 2}, step=7)  # more data for step 7: a patch line at commit
    et.log({"c": 3}, step=8, commit=True)
    et.finish()
    lines = (run.dir / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3  # row, patch, row
    meta = json.loads((run.dir / "metrics.meta.json").read_text())
    assert meta["has_duplicate_steps"] is True
    assert [r["_step"] for r in read_rows(run.dir / "metrics.jsonl")] == [7, 8]
    assert read_rows(run.dir / "metrics.jsonl")[0] == {
        **read_rows(run.dir / "metrics.jsonl")[0],
        "a": 1,
        "b": 2,
    }
    run = start(tmp_path)
    assert run.history.open_step == 9


@pytest.mark.parametrize("planted", [2**63, -7], ids=["past-2**63-1", "negative"])
def test_resume_passes_over_a_line_whose_step_is_no_step(tmp_path, planted):
    """A line written by hand whose ``_step`` is no step (``is_step``: -7, 2**63), which no
    reader takes as a row, is no step to a resume either: with 2**63 the resumed run opened
    step 2**63+1 and dropped every log() (step_overflow); -7 marked the file unsorted."""
    run = start(tmp_path)
    for i in range(5):
        et.log({"a": i})
    et.finish()
    with open(run.dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"_step": planted, "a": -1}) + "\n")
    run = start(tmp_path)
    assert run.history.open_step == 5
    et.log({"a": 5})
    et.finish()
    assert [r["_step"] for r in read_rows(run.dir / "metrics.jsonl")] == list(range(6))
    meta = json.loads((run.dir / "metrics.meta.json").read_text())
    assert (meta["max_step"], meta["sorted"], meta["has_duplicate_steps"]) == (5, True, False)


def test_resume_under_allow_uses_max_not_last_step(tmp_path):
    run = start(tmp_path, step_policy="allow")
    et.log({"a": 1}, step=9, commit=True)
    et.log({"a": 2}, step=3, commit=True)
    et.finish()
    run = start(tmp_path, step_policy="allow")
    assert run.history.open_step == 10


def test_resume_modes(tmp_path):
    from expr_tracker.assemble import ResumeError

    with pytest.raises(ResumeError, match="must"):
        start(tmp_path, resume="must")
    start(tmp_path)
    et.log({"a": 1})
    et.finish()
    new = start(tmp_path, resume="never")  # always a new run (docs/streams.md)
    assert new.name == "r1-2"
    et.finish()
    with pytest.raises(ResumeError, match="never"):  # a folder given: it cannot move
        start(tmp_path, resume="never", run_dir=str(tmp_path / "runs" / "proj" / "r1"))
    assert start(tmp_path, resume="must").name == "r1"
    et.finish()


def test_open_row_written_after_max_open_seconds_and_merged(tmp_path):
    run = start(tmp_path, max_open_seconds=0.05)
    et.log({"a": 1}, commit=False)
    deadline = time.monotonic() + 10
    path = run.dir / "metrics.jsonl"
    while time.monotonic() < deadline and (not path.exists() or not path.read_text()):
        time.sleep(0.02)
    assert read_rows(path)[0]["a"] == 1  # on disk before any commit
    assert et.history(5, include_open=False) == []  # still not committed
    et.log({"b": 2})  # the real commit: a patch line
    et.finish()
    assert len(path.read_text().splitlines()) == 2
    rows = read_rows(path)
    assert len(rows) == 1 and rows[0]["a"] == 1 and rows[0]["b"] == 2


# ---------------------------------------------------------------- crash


CRASH_CHILD = """
import sys, time, expr_tracker as et
et.init(project="proj", name="r1", dir=sys.argv[1], buffer_size=1)
for i in range(100):
    et.log({"loss": float(i)})
et.get_run().history.flush()
print("flushed", flush=True)
# simulate a write torn by the crash: half a record at the end of the file
with open(et.get_run().dir / "metrics.jsonl", "ab") as f:
    f.write(b'{"loss": 1.0, "_st')
time.sleep(60)
"""


def test_sigkill_mid_run_then_resume(tmp_path):
    runs = tmp_path / "runs"
    p = subprocess.Popen(
        [sys.executable, "-c", CRASH_CHILD, str(runs)], stdout=subprocess.PIPE, text=True
    )
    assert p.stdout.readline().strip() == "flushed"
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=30)  # waits, and closes the pipe
    run_dir = runs / "proj" / "r1"
    # a later reader finds the dead pid: crashed
    assert read_run_info(run_dir / "run.json")["status"] == "crashed"
    # every flushed row reads back (the torn fragment is ignored by readers)
    assert [r["loss"] for r in et.read_history(run_dir)] == [float(i) for i in range(100)]
    # the next run repairs the torn line and resumes past it
    run = start(tmp_path)
    assert run.history.open_step == 100
    et.log({"loss": 100.0})
    et.finish()
    raw = (run_dir / "metrics.jsonl").read_bytes()
    assert b"_st\n" not in raw and raw.endswith(b"\n")
    rows = read_rows(run_dir / "metrics.jsonl")
    assert [r["_step"] for r in rows] == list(range(101))
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "finished"
    assert info["previous_attempts"][-1]["status"] == "crashed"


def test_uncaught_exception_marks_failed(tmp_path):
    code = """
    import sys, expr_tracker as et
    et.init(project="proj", name="r1", dir=sys.argv[1])
    et.log({"a": 1}, commit=False)
    raise ValueError("diverged")
    """
    p = run_py(code, str(tmp_path / "runs"), check=False)
    assert p.returncode == 1
    run_dir = tmp_path / "runs" / "proj" / "r1"
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "failed"
    assert info["exception"]["type"] == "ValueError"
    assert "diverged" in info["exception"]["message"]
    assert read_rows(run_dir / "metrics.jsonl")[0]["a"] == 1  # the open row was committed


EXITS = """
import sys, expr_tracker as et
how = sys.argv[2]
et.init(project="proj", name=how, dir=sys.argv[1])
et.log({"a": 1})
if how == "handled":  # what Hydra's @hydra.main and a torch.multiprocessing worker do
    try:
        raise ValueError("diverged")
    except ValueError:
        sys.exit(1)
if how == "status":
    sys.exit(3)
if how == "zero":
    sys.exit(0)
"""


@pytest.mark.parametrize(
    ("how", "rc", "status"),
    [("handled", 1, "failed"), ("status", 3, "failed"), ("zero", 0, "finished")],
)
def test_sys_exit_with_an_error_status_marks_failed(tmp_path, how, rc, status):
    """A program that handles an exception by exiting non-zero never reaches
    sys.excepthook: the run it leaves open is failed (with that exception), not finished."""
    p = run_py(EXITS, str(tmp_path / "runs"), how, check=False)
    assert p.returncode == rc, p.stderr
    info = json.loads((tmp_path / "runs" / "proj" / how / "run.json").read_text())
    assert info["status"] == status, info
    if how == "handled":
        assert info["exception"]["type"] == "ValueError"
        assert info["exception"]["message"] == "diverged"


HYDRA_TASK = """
import sys
import hydra
from hydra.core.config_store import ConfigStore
import expr_tracker as et

ConfigStore.instance().store(name="cfg", node={"lr": 0.1})
runs = sys.argv.pop(1)


@hydra.main(version_base="1.3", config_path=None, config_name="cfg")
def main(cfg):
    et.init(project="proj", name="hydra", dir=runs, config={"lr": cfg.lr})
    et.log({"loss": 1.0})
    raise RuntimeError("diverged")


main()
"""


def test_an_exception_in_a_hydra_task_marks_the_run_failed(tmp_path):
    """@hydra.main prints the task's exception and calls sys.exit(1) (no excepthook): the
    run started in the task (without the job callback) is failed with it."""
    pytest.importorskip("hydra")
    p = run_py(HYDRA_TASK, str(tmp_path / "runs"), f"hydra.run.dir={tmp_path / 'out'}", check=False)
    assert p.returncode == 1 and "diverged" in p.stderr, p.stderr
    info = json.loads((tmp_path / "runs" / "proj" / "hydra" / "run.json").read_text())
    assert info["status"] == "failed"
    assert info["exception"]["type"] == "RuntimeError"
    assert info["exception"]["message"] == "diverged"


SPAWNED = """
import sys
import torch.multiprocessing as mp
import expr_tracker as et


def worker(i, runs):
    et.init(project="proj", name="spawned", dir=runs)
    et.log({"loss": 1.0})
    raise RuntimeError("boom in the worker")


if __name__ == "__main__":
    try:
        mp.spawn(worker, args=(sys.argv[1],), nprocs=1)
    except Exception as exc:
        print("parent saw", type(exc).__name__)
"""


@pytest.mark.slow
def test_an_exception_in_a_spawned_torch_worker_marks_its_run_failed(tmp_path):
    """torch.multiprocessing (ddp_spawn's launcher) catches a worker's exception, sends it
    to the parent and exits with sys.exit(1): the worker's run is failed, not finished."""
    pytest.importorskip("torch")
    script = tmp_path / "spawned.py"
    script.write_text(SPAWNED)
    p = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "parent saw ProcessRaisedException" in p.stdout, p.stdout + p.stderr
    info = json.loads((tmp_path / "runs" / "proj" / "spawned" / "run.json").read_text())
    assert info["status"] == "failed"
    assert info["exception"]["message"] == "boom in the worker"


def test_run_json_identity(tmp_path):
    run = start(tmp_path)
    et.finish()
    info = json.loads((run.dir / "run.json").read_text())
    for key in ("host", "pid", "argv", "python", "packages", "started_at", "ended_at"):
        assert key in info
    assert info["packages"]["expr_tracker"] == et.__version__


# ---------------------------------------------------------------- failing disk


FAILING_DISK_CHILD = """
import logging, resource, signal, sys, expr_tracker as et
logging.basicConfig(level=logging.WARNING)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
run = et.init(project="proj", name="r1", dir=sys.argv[1], buffer_size=1)
et.log({"x": 0})
run.history.flush()
size = (run.dir / "metrics.jsonl").stat().st_size
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))   # the disk is "full" now
for i in range(1, 200):
    et.log({"x": i})                                      # training continues
run.history.flush()
stats = et.info()["history"]["writer"]
print("errors", stats["write_errors"] > 0, "pending", stats["pending"], flush=True)
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))   # the disk recovers
et.finish()
"""


def test_failing_disk_keeps_rows_and_warns_once(tmp_path):
    p = run_py(FAILING_DISK_CHILD, str(tmp_path / "runs"))
    assert "errors True pending 199" in p.stdout
    assert p.stderr.count("cannot write to") == 1
    rows = read_rows(tmp_path / "runs" / "proj" / "r1" / "metrics.jsonl")
    assert [r["x"] for r in rows] == list(range(200))


def test_pending_limit_drops_oldest_loudly(tmp_path):
    from expr_tracker.history.writer import JsonlWriter

    w = JsonlWriter(tmp_path / "m.jsonl", max_pending_records=3, async_write=False, buffer_size=100)
    w.file.fd = os.open(os.devnull, os.O_RDONLY)  # every write now fails with EBADF
    for i in range(5):
        w.append(json.dumps({"_step": i}).encode(), i)
    assert w.flush() is False
    assert w.pending == 3 and w.dropped == 2
    os.close(w.file.fd)
    w.file.fd = os.open(tmp_path / "m.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    assert w.flush() is True
    w.close()
    assert [r["_step"] for r in read_rows(tmp_path / "m.jsonl")] == [2, 3, 4]


# ---------------------------------------------------------------- one writer per file


def test_two_processes_on_one_stream_refused(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys,time,expr_tracker as et\n"
            "et.init(project='proj', name='r1', dir=sys.argv[1])\n"
            "print('ready', flush=True)\ntime.sleep(60)\n",
            str(tmp_path / "runs"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(et.RunLockedError, match=f"pid={holder.pid}"):
            start(tmp_path)
        # another stream of the same run is fine
        start(tmp_path, stream="data")
        et.log({"a": 1})
        et.finish()
        assert (tmp_path / "runs" / "proj" / "r1" / "metrics.data.jsonl").exists()
    finally:
        holder.kill()
        holder.communicate()  # waits, and closes the pipe


# ---------------------------------------------------------------- fork


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_gets_clear_error_and_can_start_its_own_stream(tmp_path):
    code = """
    import os, sys, expr_tracker as et
    et.init(project="proj", name="r1", dir=sys.argv[1])
    et.log({"parent": 1})
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            et.log({"child": 1})
            code = 10
        except et.ForkedRunError as e:
            if "et.init" not in str(e):
                code = 11
        try:
            et.init(project="proj", name="r1", dir=sys.argv[1], stream="worker")
            et.log({"child": 2})
            et.finish()
        except Exception as e:
            print("child init failed", e, flush=True)
            code = 12
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    print("child exit", os.waitstatus_to_exitcode(status), flush=True)
    et.log({"parent": 2})
    et.finish()
    """
    p = run_py(code, str(tmp_path / "runs"), timeout=60)
    assert "child exit 0" in p.stdout, p.stdout + p.stderr
    run_dir = tmp_path / "runs" / "proj" / "r1"
    assert [r.get("parent") for r in read_rows(run_dir / "metrics.jsonl")] == [1, 2]
    assert read_rows(run_dir / "metrics.worker.jsonl")[0]["child"] == 2


# ---------------------------------------------------------------- streams and ranks


def test_rank_files_and_stream_validation(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    run = start(tmp_path, stream="data")
    et.log({"a": 1})
    et.finish()
    names = sorted(p.name for p in run.dir.iterdir())
    assert "metrics.data.rank3.jsonl" in names
    assert "metrics.data.rank3.meta.json" in names
    assert "run.data.rank3.json" in names
    assert "summary.data.rank3.json" in names
    # run-level files are rank 0's: rank 3 never writes (or overwrites) them
    assert "config.data.json" not in names and "spec.json" not in names
    from expr_tracker.spec import SpecError

    for bad in ("../x", "a/b", "..", "a.b", ""):
        with pytest.raises(SpecError, match="stream"):
            start(tmp_path, stream=bad)


def test_rank_aware_off_uses_plain_names(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "2")
    run = start(tmp_path, rank_aware=False)
    et.log({"a": 1})
    et.finish()
    assert (run.dir / "metrics.jsonl").exists() and (run.dir / "run.json").exists()


def test_producer_that_records_nothing_leaves_no_empty_files(tmp_path):
    run = start(tmp_path, stream="worker")
    et.finish()
    names = {p.name for p in run.dir.iterdir()}
    assert "run.worker.json" in names
    assert "spans.worker.jsonl" not in names and "metrics.worker.jsonl" not in names


# ---------------------------------------------------------------- history while live / offline


def test_history_live_includes_open_row_and_offline_reads(tmp_path):
    run = start(tmp_path)
    for i in range(10):
        et.log({"a": i})
    et.log({"a": 10}, commit=False)
    got = et.history(3)
    assert [r["a"] for r in got] == [8, 9, 10]
    got[0]["a"] = "changed"  # a snapshot
    assert et.history(3)[0]["a"] == 8
    et.finish()
    assert [r["a"] for r in et.history(2, run=run.dir)] == [9, 10]
    assert len(et.history(-1, run=run.dir)) == 11


def test_spec_json_saved_with_secrets_redacted(tmp_path):
    run = start(
        tmp_path,
        alert={"channels": [{"type": "slack", "url": "https://hooks.example/SECRET123"}]},
    )
    et.finish()
    text = (run.dir / "spec.json").read_text()
    assert "SECRET123" not in text
    spec = json.loads(text)
    assert spec["project"] == "proj" and spec["history"]["buffer"]["size"] == 50


# ---------------------------------------------------------------- configuration errors


@pytest.mark.parametrize(
    "bad",
    [
        {"spans": {"plugins": [{"type": "cpu_tme"}]}},
        {"alert_rules": ["loss >> 2"]},
        {"alert_rules": ["mean(loss[5000]) > 1"]},
        {"alert": {"channels": [{"type": "slak", "url": "http://127.0.0.1:9/x"}]}},
    ],
    ids=["plugin", "syntax", "window", "channel"],
)
def test_failed_init_leaves_nothing_and_a_retry_works(tmp_path, bad):
    with pytest.raises(ValueError):  # SpecError, RuleError, ChannelConfigError are ValueErrors
        start(tmp_path, **bad)
    assert not (tmp_path / "runs" / "proj" / "r1").exists()
    assert et.get_run() is None
    run = start(tmp_path, resume="never")  # the lock was released, nothing half-made
    et.log({"a": 1})
    et.finish()
    assert json.loads((run.dir / "run.json").read_text())["status"] == "finished"


def test_failed_init_on_an_existing_run_restores_it(tmp_path):
    run = start(tmp_path)
    et.log({"a": 1})
    et.finish()
    before = (run.dir / "run.json").read_bytes()
    with pytest.raises(ValueError):
        start(tmp_path, alert_rules=["loss >> 2"])
    assert (run.dir / "run.json").read_bytes() == before
    start(tmp_path)
    assert et.log({"a": 2}) == 1


def test_unknown_plugin_type_is_a_spec_error_with_a_suggestion(tmp_path):
    from expr_tracker.spec import SpecError

    with pytest.raises(SpecError, match=r"spans\.plugins\[0\]\.type.*did you mean `cpu_time`"):
        start(tmp_path, spans={"plugins": [{"type": "cpu_tme"}]})


def test_builder_and_rule_objects_in_alert_rules(tmp_path):
    from expr_tracker.alerts.rules import AlertRule

    start(tmp_path, alert_rules=[et.M.loss > 1, AlertRule(condition="loss < 0", level="error")])
    et.log({"loss": 2.0})
    rules = et.info()["alerts"]["rules"]
    assert len(rules) == 2
    assert sum(r["fires"] for r in rules.values()) == 1


SIGTERM_CHILD = """
import sys, time, expr_tracker as et
et.init(project="proj", name="r1", dir=sys.argv[1])
for i in range(21):
    et.log({"x": i})
print("logged", flush=True)
for _ in range(1200):  # short sleeps: a signal is handled within one (CPython)
    time.sleep(0.05)
"""


def test_sigterm_flushes_and_records_the_signal(tmp_path):
    p = subprocess.Popen(
        [sys.executable, "-c", SIGTERM_CHILD, str(tmp_path / "runs")],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout.readline().strip() == "logged"
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=30)  # waits, and closes the pipe
    assert p.returncode == 128 + signal.SIGTERM
    run_dir = tmp_path / "runs" / "proj" / "r1"
    assert [r["x"] for r in read_rows(run_dir / "metrics.jsonl")] == list(range(21))
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "failed" and info["signal"] == "SIGTERM"
    assert info["exit_code"] == 143


# ---------------------------------------------------------------- the sidecar is only a hint


def test_wrong_sidecar_is_repaired_on_resume(tmp_path):
    run = start(tmp_path, buffer_size=1)
    for i in range(2500):
        et.log({"x": i})
    et.finish()
    meta_path = run.dir / "metrics.meta.json"
    meta = json.loads(meta_path.read_text())
    assert meta["lines"] == 2500 and meta["max_step"] == 2499 and len(meta["index"]) == 3
    # another program appended a line; the sidecar now lies about the size
    with open(run.dir / "metrics.jsonl", "a") as f:
        f.write('{"x": -1, "_step": 7000, "_time": 0}\n')
    meta["lines"] = 12
    meta_path.write_text(json.dumps(meta))
    run = start(tmp_path)
    assert run.history.open_step == 7001
    et.finish()
    fixed = json.loads(meta_path.read_text())
    assert fixed["lines"] == 2501 and fixed["max_step"] == 7000
    assert fixed["size"] == (run.dir / "metrics.jsonl").stat().st_size


def test_run_json_records_the_git_commit(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "train.py").write_text("print(1)\n")
    subprocess.run([*git, "-C", str(repo), "add", "."], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-qm", "x"], check=True)
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    monkeypatch.chdir(repo)
    run = start(tmp_path)
    et.finish()
    info = json.loads((run.dir / "run.json").read_text())
    assert info["git"] == {"commit": head, "dirty": False}


def test_configure_alert_validates_at_configuration_time():
    from expr_tracker.spec import SpecError

    with pytest.raises(SpecError, match="chanels.*did you mean `channels`"):
        et.configure_alert(chanels=[])
    with pytest.raises(ValueError, match="webhok"):
        et.configure_alert(channels=[{"type": "webhok", "url": "http://127.0.0.1:9/x"}])
    with pytest.raises(SpecError, match="missing operand"):
        et.configure_alert(rules=["loss > "])
    from expr_tracker import _current

    assert _current.configured_alert == {}  # nothing kept from calls that raised


def test_rule_errors_name_the_rule_and_the_hydra_key(tmp_path):
    from omegaconf import OmegaConf

    from expr_tracker.spec import SpecError

    cfg = OmegaConf.create(
        {"tracker": {"dir": str(tmp_path), "alerts": {"rules": {"spike": {"condition": "x > "}}}}}
    )
    with pytest.raises(SpecError) as info:
        et.init(spec=cfg.tracker)
    (issue,) = info.value.issues
    assert issue.path == "alerts.rules.spike.condition"
    assert issue.config_key == "tracker.alerts.rules.spike.condition"
    assert "missing operand" in str(info.value)


def test_run_json_counts_steps_over_every_attempt(tmp_path):
    start(tmp_path)
    for i in range(3):
        et.log({"a": i})
    et.finish()
    run = start(tmp_path)
    et.log({"a": 3})
    et.log({"a": 4})
    et.finish()
    info = json.loads((run.dir / "run.json").read_text())
    assert (info["steps"], info["last_step"]) == (5, 4)
    run = start(tmp_path)
    et.finish()
    info = json.loads((run.dir / "run.json").read_text())
    assert (info["steps"], info["last_step"]) == (5, 4)


MP_CHILD = """
import multiprocessing as mp, sys, expr_tracker as et

def work(root):
    et.init(project="mp", name="r", dir=root, stream="child")
    for i in range(200):
        et.log({"x": i})
    # no et.finish(): the process leaves through os._exit like a DataLoader worker

if __name__ == "__main__":
    et.init(project="mp", name="r", dir=sys.argv[1])
    et.log({"parent": 1})
    p = mp.get_context("fork").Process(target=work, args=(sys.argv[1],))
    p.start()
    p.join()
    print("child exit", p.exitcode, flush=True)
    et.finish()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_multiprocessing_child_run_is_finished_at_process_exit(tmp_path):
    script = tmp_path / "mp_child.py"
    script.write_text(MP_CHILD)
    p = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "child exit 0" in p.stdout, p.stdout + p.stderr
    run_dir = tmp_path / "runs" / "mp" / "r"
    assert [r["x"] for r in read_rows(run_dir / "metrics.child.jsonl")] == list(range(200))
    assert json.loads((run_dir / "run.child.json").read_text())["status"] == "finished"


SUMMARY_CRASH_CHILD = """
import sys, time, expr_tracker as et
et.init(project="proj", name="r1", dir=sys.argv[1], buffer_size=1)
for i in range(300):
    et.log({"loss": float(i), "only_crash": i})
et.get_run().history.flush()
print("flushed", flush=True)
time.sleep(60)
"""


def test_summary_survives_a_crash_and_catches_up_on_resume(tmp_path):
    start(tmp_path)
    et.log({"loss": -1.0, "only_first": 1})
    et.summary()["best"] = "first"
    et.finish()
    p = subprocess.Popen(
        [sys.executable, "-c", SUMMARY_CRASH_CHILD, str(tmp_path / "runs")],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout.readline().strip() == "flushed"
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=30)  # waits, and closes the pipe
    start(tmp_path)
    s = et.summary()
    # the logged keys caught up from the crashed attempt's rows (et.summary holds no _step)
    assert s["only_crash"] == 299 and s["loss"] == 299.0 and "_step" not in s
    assert s["only_first"] == 1 and s["best"] == "first"
    et.log({"only_after": 1})
    et.finish()
    saved = json.loads((tmp_path / "runs" / "proj" / "r1" / "summary.json").read_text())
    assert {"only_first", "only_crash", "only_after", "best"} <= set(saved)


def test_summary_is_saved_in_the_background_while_rows_arrive(tmp_path, monkeypatch):
    import expr_tracker.runsummary as summary_module

    monkeypatch.setattr(summary_module, "SUMMARY_SAVE_INTERVAL_S", 0.05)
    run = start(tmp_path)
    et.log({"loss": 1.5})
    path = run.dir / "summary.json"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not path.exists():
        time.sleep(0.02)
    assert json.loads(path.read_text())["loss"] == 1.5  # before finish


def test_rank_that_does_not_alert_records_but_never_notifies(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    run = start(tmp_path, alert_rules=["loss > 1 => error: high"])
    et.log({"loss": 2.0})
    et.finish()
    records = [json.loads(x) for x in (run.dir / "alerts.rank1.jsonl").read_text().splitlines()]
    firing = [r for r in records if r.get("event") == "firing"]
    assert len(firing) == 1 and firing[0]["notify"] is False
    assert not [r for r in records if r.get("kind") == "delivery"]


def test_run_that_logged_nothing_leaves_no_sidecar(tmp_path):
    run = start(tmp_path)
    et.finish()
    assert not (run.dir / "metrics.meta.json").exists()


SIGTERM_IN_FINISH_CHILD = """
import sys, threading, time, os, signal, expr_tracker as et
from expr_tracker.testing import WebhookServer

with WebhookServer(["hang"]) as server:
    et.init(project="proj", name="r1", dir=sys.argv[1], alert={
        "notify_on": ["finish"],
        "policy": {"timeout": 1.0, "max_retries": 0},
        "channels": [{"type": "webhook", "url": server.url}],
    })
    for i in range(100):
        et.log({"x": i})
    # SIGTERM arrives while finish() waits on the hanging endpoint
    threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
    et.finish()
    print("not reached", flush=True)
"""


@pytest.mark.slow
def test_sigterm_during_finish_lets_it_complete_then_exits_143(tmp_path):
    p = subprocess.run(
        [sys.executable, "-c", SIGTERM_IN_FINISH_CHILD, str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 128 + signal.SIGTERM, p.stdout + p.stderr
    assert "not reached" not in p.stdout
    run_dir = tmp_path / "runs" / "proj" / "r1"
    assert [r["x"] for r in read_rows(run_dir / "metrics.jsonl")] == list(range(100))
    assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"
    assert json.loads((run_dir / "summary.json").read_text())["x"] == 99
    assert not list(run_dir.glob(".*.tmp"))


@pytest.mark.parametrize("given", ["dir", "run_dir"])
def test_a_relative_folder_is_fixed_at_the_start(tmp_path, monkeypatch, given):
    """A relative ``dir=``/``run_dir=`` is the folder under the working directory of the
    moment the run starts: a script (or a framework) that changes directory afterwards
    still writes every file of the run into that one folder (before, ``metrics.jsonl``,
    its sidecar and ``summary.json`` went under the new directory, beside a second
    ``run.json``)."""
    start, later = tmp_path / "start", tmp_path / "later"
    start.mkdir()
    later.mkdir()
    monkeypatch.chdir(start)
    kw = {"dir": "runs"} if given == "dir" else {"run_dir": "runs/p/r"}
    run = et.init(project="p", name="r", **kw)
    assert run.dir == start / "runs" / "p" / "r"
    monkeypatch.chdir(later)
    for i in range(5):
        et.log({"loss": float(i)})
    et.finish()
    assert list(later.iterdir()) == []
    files = {p.name for p in run.dir.iterdir()}
    assert {"metrics.jsonl", "metrics.meta.json", "run.json", "summary.json"} <= files
    assert len(read_rows(run.dir / "metrics.jsonl")) == 5
    assert json.loads((run.dir / "run.json").read_text())["status"] == "finished"
