"""The one-writer lock and forked children: a child forked from a process holding a run
closes its copy of the lock descriptor, so a parent killed while the child lives does not
keep the run locked; the parent's own lock stays held while it lives; a lock held by a
process that inherited it from a dead pid says so."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import expr_tracker as et
from expr_tracker.errors import RunLockedError

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")

PARENT = textwrap.dedent(
    """
    import os, sys, time
    import expr_tracker as et
    runs, stop = sys.argv[1], sys.argv[2]
    et.init(project="p", name="r", dir=runs)
    et.log({"loss": 1.0})
    pid = os.fork()
    if pid == 0:  # a helper process that does not use the run
        open(stop + ".child", "w").close()  # running: its copy of the lock is closed by now
        for _ in range(1200):
            if os.path.exists(stop):
                break
            time.sleep(0.05)
        os._exit(0)
    print(pid, flush=True)
    time.sleep(600)  # killed by the test
    """
)


def _wait_for(pred, timeout=60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_a_forked_child_does_not_keep_a_killed_parents_run_locked(tmp_path):
    runs, stop = tmp_path / "runs", tmp_path / "stop"
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen(
        [sys.executable, str(script), str(runs), str(stop)], stdout=subprocess.PIPE, text=True
    )
    try:
        child_pid = int(parent.stdout.readline())
        # on a loaded machine the child may not have run yet, and until it runs it holds the
        # copy of the lock descriptor fork gave it
        assert _wait_for((tmp_path / "stop.child").exists)
        # while the parent lives its lock holds, also after the child closed its copy
        with pytest.raises(RunLockedError):
            et.init(project="p", name="r", dir=str(runs))
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        parent.stdout.close()  # the forked child keeps its copy: no communicate()
        os.kill(child_pid, 0)  # the forked helper still lives
        run = et.init(project="p", name="r", dir=str(runs))  # base: RunLockedError
        et.log({"loss": 2.0})
        et.finish()
        assert run.dir == runs / "p" / "r"
        os.kill(child_pid, 0)
    finally:
        stop.touch()
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    info = json.loads((runs / "p" / "r" / "run.json").read_text())
    assert info["previous_attempts"][-1]["status"] == "crashed"


def test_the_parents_lock_outlives_a_child_that_exits(tmp_path):
    runs = tmp_path / "runs"
    run = et.init(project="p", name="r", dir=str(runs))
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(0)  # the child's copy of the lock descriptor goes
        os.waitpid(pid, 0)
        probe = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys, expr_tracker as et\n"
                "try:\n"
                f"    et.init(project='p', name='r', dir={str(runs)!r})\n"
                "except et.RunLockedError:\n"
                "    sys.exit(3)\n",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert probe.returncode == 3, probe.stderr  # still locked by this live process
    finally:
        et.finish()
    assert run.finished


def test_a_lock_inherited_from_a_dead_pid_is_explained(tmp_path):
    # a process that took the lock started another one that inherited the descriptor
    # (pass_fds) and then died: the lock file names the dead pid
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc")
    runs = tmp_path / "runs"
    code = textwrap.dedent(
        f"""
        import subprocess, sys
        import expr_tracker as et
        et.init(project="p", name="r", dir={str(runs)!r})
        import os
        lock = [
            int(fd) for fd in os.listdir("/proc/self/fd")
            if os.path.realpath(f"/proc/self/fd/{{fd}}").endswith("metrics.jsonl.lock")
        ]
        holder = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(120)"],
            pass_fds=lock[:1], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        print(holder.pid, flush=True)
        os._exit(0)  # dies without finishing; the inheritor keeps the lock
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    holder = int(proc.stdout.split()[0])
    try:
        with pytest.raises(RunLockedError) as err:
            et.init(project="p", name="r", dir=str(runs))
        msg = str(err.value)
        dead = json.loads((runs / "p" / "r" / "run.json").read_text())["pid"]
        assert f"inherited it from pid {dead}" in msg
        assert "fuser" in msg and "metrics.jsonl.lock" in msg
    finally:
        os.kill(holder, signal.SIGKILL)
