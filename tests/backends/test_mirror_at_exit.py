"""A script that never calls et.finish() (the run is finished at process exit, as wandb users
expect) still mirrors every row: the exit finish runs before the at-exit hooks a backend's
``init`` registered (wandb tears its service down in one), and a backend still importing its
library when the interpreter starts shutting down can finish its ``init``."""

from __future__ import annotations

import json
import threading

import pytest
from helpers import run_py

# the backend writes what it got into a JSON file (argv[1]); its init registers an at-exit
# hook that tears it down, as wandb's service connection does
TEARDOWN = """
import atexit, json, sys, threading, time
import expr_tracker as et

out = sys.argv[1]
started = threading.Event()   # et.init returned (as wandb's init takes seconds)

class Service:
    def init(self, **info):
        started.wait()
        self.rows, self.down, self.code = [], False, None
        atexit.register(self.teardown)
    def teardown(self):
        self.down = True
    def log(self, metrics, step):
        if self.down:
            raise ConnectionResetError("Connection lost")
        self.rows.append(step)
    def finish(self, exit_code):
        if self.down:
            raise ConnectionResetError("Connection lost")
        self.code = exit_code
        with open(out, "w") as f:
            json.dump({"rows": self.rows, "code": exit_code}, f)

run = et.init(project="p", name="r", dir=sys.argv[2], backends=[Service()])
started.set()
while run.info()["backends"]["Service"]["alive"] is None:   # the backend's init returned
    time.sleep(0.01)
for i in range(10):
    et.log({"loss": 1.0 / (i + 1)})
if sys.argv[3] == "raise":
    raise RuntimeError("boom")
"""


@pytest.mark.parametrize("how, code", [("ok", 0), ("raise", 1)])
def test_rows_reach_a_backend_whose_init_registered_an_exit_hook(tmp_path, how, code):
    out = tmp_path / "out.json"
    p = run_py(TEARDOWN, str(out), str(tmp_path / "runs"), how, check=False)
    assert p.returncode == code, p.stderr
    assert "mirror" not in p.stderr, p.stderr
    assert json.loads(out.read_text()) == {"rows": list(range(10)), "code": code}


# the backend's init is still importing its library when the main thread ends (wandb's
# import takes a second; a short script is done before): concurrent.futures.thread registers
# a threading at-exit hook when imported, refused once the interpreter shuts down
LATE_IMPORT = """
import json, sys, threading, time
assert "concurrent.futures.thread" not in sys.modules
import expr_tracker as et

out = sys.argv[1]

class Slow:
    def init(self, **info):
        while threading.main_thread().is_alive():   # the script has ended
            time.sleep(0.01)
        from concurrent.futures import ThreadPoolExecutor   # as wandb's import does
        self.rows = []
    def log(self, metrics, step):
        self.rows.append(step)
    def finish(self):
        with open(out, "w") as f:
            json.dump(self.rows, f)

et.init(project="p", name="r", dir=sys.argv[2], backends=[Slow()])
for i in range(5):
    et.log({"loss": 1.0 / (i + 1)})
"""


def test_a_backend_importing_while_the_interpreter_shuts_down(tmp_path):
    out = tmp_path / "out.json"
    p = run_py(LATE_IMPORT, str(out), str(tmp_path / "runs"))
    assert "mirror" not in p.stderr, p.stderr
    assert json.loads(out.read_text()) == list(range(5))


# a backend whose finish() never returns (a service that hangs at teardown); the script's
# last act is the exit finish (or et.finish(), with "finish"), after the rows are on disk
HUNG = """
import sys, threading
import expr_tracker as et

class Hung:
    def init(self, **info):
        pass
    def log(self, metrics, step):
        pass
    def finish(self):
        print("finish called", flush=True)
        threading.Event().wait()   # forever

et.init(project="p", name="r", dir=sys.argv[1], backends=[Hung()],
        backend_finish_timeout=sys.argv[2])
for i in range(5):
    et.log({"loss": 1.0 / (i + 1)})
print("logged", flush=True)
if sys.argv[3] == "finish":
    et.finish()
"""


def _start_hung(tmp_path, timeout, how):
    import subprocess
    import sys

    p = subprocess.Popen(
        [sys.executable, "-c", HUNG, str(tmp_path / "runs"), timeout, how],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    guard = threading.Timer(120, p.kill)  # a child stuck before it prints fails, never hangs
    guard.start()
    try:
        assert p.stdout.readline().strip() == "logged"
        assert p.stdout.readline().strip() == "finish called"  # the wait for the mirror began
    finally:
        guard.cancel()
    return p


def _rows_intact(tmp_path):
    run = tmp_path / "runs" / "p" / "r"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["_step"] for r in rows] == [0, 1, 2, 3, 4]
    assert json.loads((run / "run.json").read_text())["status"] == "finished"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["exit", "finish"])
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_ends_the_wait_for_a_hung_mirror(tmp_path, sig, how):
    """Issue 20 point 13: the mirror's deadline is 60 s, but SIGTERM or Ctrl-C during the
    wait (at process exit, or in et.finish()) ends the process at once; the rows and
    run.json were on disk before the wait began. (10 s is a hang guard, not a benchmark.)"""
    import signal
    import subprocess

    p = _start_hung(tmp_path, "60s", how)
    try:
        p.send_signal(getattr(signal, sig))
        _, err = p.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{sig} during the wait for a hung mirror did not end the process")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    signum = getattr(signal, sig)
    assert p.returncode in (-signum, 128 + signum), (p.returncode, err)
    assert "stopped waiting for the Hung mirror at finish (interrupted)" in err, err
    _rows_intact(tmp_path)


@pytest.mark.slow
def test_without_a_signal_a_hung_mirror_holds_exit_to_its_deadline(tmp_path):
    import subprocess

    p = _start_hung(tmp_path, "1s", "exit")
    try:
        _, err = p.communicate(timeout=30)  # the deadline is 1 s; 30 s: a hang guard
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        pytest.fail("a hung mirror held the process past its deadline")
    assert p.returncode == 0, err
    assert "did not drain within 1.0 s at finish" in err, err
    _rows_intact(tmp_path)
