"""Helpers of the ``et ui`` tests: the run writers (``et.log`` in subprocesses) and a real
``et ui`` server (uvicorn) on 127.0.0.1 at a free port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import ROOT

# the tests skip, saying why, without the ui extra or the query extra
for _mod, _extra in (("starlette", "ui"), ("uvicorn", "ui"), ("plotly", "ui"), ("duckdb", "query")):
    pytest.importorskip(_mod, reason=f"et ui needs the {_extra} extra ({_mod} is not installed)")

HOSTILE = "<script>alert(1)</script>"
HOSTILE_IMG = "<img src=x onerror=alert(2)>"

WRITER = textwrap.dedent(
    """
    import sys, time, expr_tracker as et
    HOSTILE, HOSTILE_IMG = {hostile!r}, {img!r}
    et.init(project="demo", name="alpha", dir=sys.argv[1], config={{"lr": 0.1, "model": {{"depth": 4}}, "note": HOSTILE}},
            tags=["base", HOSTILE_IMG], group="g1", alert_rules=["train/loss > 30 => warning: loss high {{train/loss}}"])
    et.define_metric("eval/*", step_metric="epoch")
    for i in range(40):
        with et.span("fwd"):
            pass
        v = float(i)
        if i == 10: v = float("nan")
        if i == 20: v = float("inf")
        et.log({{"train/loss": v, "eval/acc": i / 40, HOSTILE: i, HOSTILE_IMG: -i, "epoch": i / 10}})
    et.finish()
    et.init(project="demo", name="beta", dir=sys.argv[1], config={{"lr": 0.2, "model": {{"depth": 4}}}}, tags=["other"])
    for i in range(25):
        et.log({{"train/loss": 100.0 / (i + 1), "eval/acc": 0.5}})
    et.finish()
    """
).format(hostile=HOSTILE, img=HOSTILE_IMG)

LIVE_WRITER = textwrap.dedent(
    """
    import sys, time, expr_tracker as et
    run = et.init(project="demo", name="live", dir=sys.argv[1])
    for i in range(int(sys.argv[2])):
        et.log({"train/loss": 1.0 / (i + 1)})
        run.flush()
        time.sleep(float(sys.argv[3]))
    et.finish()
    """
)


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT), e.get("PYTHONPATH", "")])
    return e


CRASHER = textwrap.dedent(
    """
    import os, sys, expr_tracker as et
    run = et.init(project="demo", name="gamma", dir=sys.argv[1], tags=["base"])
    for i in range(5):
        et.log({"train/loss": 1.0})
    run.flush()
    os._exit(1)  # killed: no finish, run.json still says running
    """
)


def write_runs(root: Path) -> None:
    subprocess.run([sys.executable, "-c", WRITER, str(root)], check=True, env=env(), timeout=120)
    p = subprocess.run([sys.executable, "-c", CRASHER, str(root)], env=env(), timeout=120)
    assert p.returncode == 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: the token of the test servers (given as ET_UI_TOKEN, as a user on a shared box would)
TOKEN = "test-token_0123456789"


class Server:
    """A real ``et ui`` (uvicorn) on 127.0.0.1 at a free port, with :data:`TOKEN` (or
    ``token``; None: ``--no-token``). ``open(fragment)`` is the link ``et ui`` prints (the
    token in the query, then ``fragment``); ``auth`` the header a script sends."""

    def __init__(
        self, root: Path, cache_dir: Path, token: str | None = TOKEN, args: tuple = ()
    ) -> None:
        """``token``: given as ``ET_UI_TOKEN``; ``""``: none given (``et ui`` makes one);
        None: ``--no-token`` unless ``args`` has ``--token``."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = token or None
        self.rest = b""
        e = env()
        e.pop("ET_UI_TOKEN", None)
        if token:
            e["ET_UI_TOKEN"] = token
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "expr_tracker.cli.main",
                "ui",
                str(root),
                "--port",
                str(self.port),
                "--cache-dir",
                str(cache_dir),
                *(["--no-token"] if token is None and "--token" not in args else []),
                *args,
            ],
            env=e,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"et ui exited: {self.proc.stdout.read().decode()}")  # type: ignore[union-attr]
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        self.close()
        raise RuntimeError("et ui did not start listening within 60 s")

    def open(self, fragment: str = "") -> str:
        """The URL a browser opens: ``/?token=...`` then ``fragment`` (``#/run?run=...``)."""
        query = f"?token={self.token}" if self.token is not None else ""
        return f"{self.url}/{query}{fragment}"

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"} if self.token is not None else {}

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:  # the pipe is closed here, not left to the collector
            #: what the server printed that was not read yet (``b""`` without a pipe)
            self.rest = self.proc.stdout.read()
            self.proc.stdout.close()


HOSTILE_RUN = "<img src=x onerror=alert(3)>'\""

RANK_WRITER = textwrap.dedent(
    """
    import sys, expr_tracker as et
    et.init(project="p;'q", name=sys.argv[2], dir=sys.argv[1])
    for i in range(30):
        et.log({"loss": float(i) + int(sys.argv[3])})
    et.finish()
    """
)


def write_rank_runs(root: Path) -> None:
    """One run named :data:`HOSTILE_RUN` in project ``p;'q``, written by ranks 0 and 1
    (``RANK``; rank 1's files carry ``.rank1``), rank r logging ``loss = i + 100 r``."""
    for rank in (0, 1):
        e = env()
        e["RANK"] = str(rank)
        cmd = [sys.executable, "-c", RANK_WRITER, str(root), HOSTILE_RUN, str(100 * rank)]
        subprocess.run(cmd, check=True, env=e, timeout=120)
