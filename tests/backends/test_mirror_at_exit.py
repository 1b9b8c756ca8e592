"""A script that never calls et.finish() (the run is finished at process exit, as wandb users
expect) still mirrors every row: the exit finish runs before the at-exit hooks a backend's
``init`` registered (wandb tears its service down in one), and a backend still importing its
library when the interpreter starts shutting down can finish its ``init``."""

from __future__ import annotations

import json

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
