"""`run.mark_preempting()` / `et.mark_preempting()` (wandb's): the attempt ends `preempted`
however it ends (finish, SIGTERM, a kill), readers report it so instead of `crashed`, and the
resume says `previous attempt: preempted`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import expr_tracker as et
from expr_tracker.cli.main import main as et_main
from expr_tracker.errors import NoActiveRunError
from expr_tracker.history.runinfo import read_run_info


def _info(run_dir):
    return json.loads((run_dir / "run.json").read_text())


def test_marked_attempt_finishes_preempted_and_the_resume_says_so(tmp_path, capsys):
    run = et.init(project="p", name="r", dir=str(tmp_path), config={"lr": 0.1})
    et.log({"loss": 1.0})
    run.mark_preempting()
    marked_at = _info(run.dir)["preempting_at"]  # on disk at once, before finish
    assert isinstance(marked_at, float) and _info(run.dir)["status"] == "running"
    run.mark_preempting()  # again: the first time stays
    assert _info(run.dir)["preempting_at"] == marked_at
    et.finish()
    assert _info(run.dir)["status"] == "preempted"
    capsys.readouterr()

    again = et.init(project="p", name="r", dir=str(tmp_path), config={"lr": 0.1})
    err = capsys.readouterr().err
    assert "resuming run p/r at step 1; previous attempt: preempted" in err
    info = _info(again.dir)
    assert info["previous_attempts"][-1]["status"] == "preempted"
    assert "preempting_at" not in info  # the mark is the attempt's, not the run's
    et.log({"loss": 0.5})
    et.finish()
    assert _info(again.dir)["status"] == "finished"


def test_unmarked_finish_is_finished_and_a_finished_run_is_not_marked(tmp_path):
    run = et.init(project="p", name="plain", dir=str(tmp_path))
    et.finish()
    run.mark_preempting()  # after finish: nothing changes
    info = _info(run.dir)
    assert info["status"] == "finished" and "preempting_at" not in info


def test_module_level_call_needs_a_run_and_a_disabled_run_takes_it(tmp_path):
    with pytest.raises(NoActiveRunError):
        et.mark_preempting()
    et.init(project="p", name="d", dir=str(tmp_path), mode="disabled")
    et.mark_preempting()  # nothing to mark on disk
    et.finish()
    assert not (tmp_path / "p").exists()


# ------------------------------------------------------------------ ended from outside

SCRIPT = textwrap.dedent(
    """
    import sys, time
    import expr_tracker as et

    et.init(project="p", name="job", dir=sys.argv[1], config={"lr": 0.1}, buffer_size=1)
    et.log({"loss": 1.0})
    if sys.argv[2] == "mark":
        et.mark_preempting()
    et.get_run().flush()
    print("READY", flush=True)
    for _ in range(2400):  # short sleeps: a signal is handled within one (CPython)
        time.sleep(0.05)
    """
)


def _start(tmp_path, mark):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    p = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "runs"), "mark" if mark else "no"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stdout.readline().strip() == "READY", p.stderr.read()
    return p


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_marked_job_stopped_from_outside_is_preempted(tmp_path, capsys, how):
    p = _start(tmp_path, mark=True)
    try:
        os.kill(p.pid, getattr(signal, how))
        p.wait(timeout=60)
    finally:
        p.kill()
        p.communicate(timeout=30)  # waits, and closes the pipes
    run_dir = tmp_path / "runs" / "p" / "job"
    on_disk = _info(run_dir)
    # SIGTERM finishes the run (exit 128 + 15); SIGKILL leaves "running" for readers to judge
    assert on_disk["status"] == ("running" if how == "SIGKILL" else "preempted")
    assert read_run_info(run_dir / "run.json")["status"] == "preempted"
    assert et_main(["runs", str(tmp_path / "runs")]) == 0
    assert "preempted" in capsys.readouterr().out
    if how == "SIGKILL":  # the query views judge a dead attempt as et runs does
        pytest.importorskip("duckdb")
        rows = et.query("SELECT status, run_status FROM runs", dir=str(tmp_path / "runs"))
        assert rows.to_dict("records") == [{"status": "preempted", "run_status": "preempted"}]

    run = et.init(project="p", name="job", dir=str(tmp_path / "runs"), config={"lr": 0.1})
    assert "previous attempt: preempted" in capsys.readouterr().err
    assert _info(run.dir)["previous_attempts"][-1]["status"] == "preempted"
    et.finish()


@pytest.mark.slow
def test_an_unmarked_killed_job_is_still_crashed(tmp_path, capsys):
    p = _start(tmp_path, mark=False)
    try:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=60)
    finally:
        p.kill()
        p.communicate(timeout=30)  # waits, and closes the pipes
    run_dir = tmp_path / "runs" / "p" / "job"
    assert read_run_info(run_dir / "run.json")["status"] == "crashed"
    et.init(project="p", name="job", dir=str(tmp_path / "runs"), config={"lr": 0.1})
    assert "previous attempt: crashed" in capsys.readouterr().err
    et.finish()
