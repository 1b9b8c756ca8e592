"""Helpers shared by several test modules (``tests/`` is on the test path: ``from helpers import ...``).

Fixtures live in ``tests/conftest.py``; plain functions and classes live here.
"""

from __future__ import annotations

import dis
import importlib.util
import json
import linecache
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

import expr_tracker as et

ROOT = Path(__file__).resolve().parent.parent  # the repository root (tests/ sits in it)


def read_lines(path):
    """Decoded rows of a JSONL file (NaN/Infinity accepted)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def strict_loads(text):
    """``json.loads`` that refuses NaN/Infinity (what strict JSON readers see)."""

    def bad(token):
        raise ValueError(f"not strict JSON: {token}")

    return json.loads(text, parse_constant=bad)


def alert_records(run):
    """The rows of a run's ``alerts.jsonl`` (none when the file does not exist)."""
    path = run.dir / "alerts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def needs(*modules: str):
    """Skip unless every module is installed, found without importing it: a module-level
    ``pytest.importorskip("torch")`` costs seconds of collection even when the tests that
    need torch are deselected."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)}")


def run_py(code: str, *args: str, timeout: float = 60, check: bool = True, env=None):
    """Run ``code`` in a fresh interpreter; returns the CompletedProcess."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )
    if check and p.returncode != 0:
        raise AssertionError(f"rc={p.returncode}\nstdout={p.stdout}\nstderr={p.stderr}")
    return p


def wait_or_dump(p: subprocess.Popen, timeout: float) -> int:
    """``p.wait(timeout)``; a child still running then (started with ``-X faulthandler``)
    is made to print every thread's stack (SIGABRT) and killed, and the test fails with
    that stack: a hang in CI says where it hung instead of only that it did."""
    try:
        return p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGABRT)
        try:
            _, err = p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        pytest.fail(f"the child did not exit within {timeout} s; its threads:\n{err}")


def cannot_read_prefix(path) -> list[str] | None:
    """argv prefix that runs a command unable to read ``path`` (a file of another uid, mode
    0600), as a colleague's files are for us: this uid (root) without the capabilities
    that bypass file permissions (``setpriv``; the interpreter under /root stays reachable,
    which another uid's would not be). None where that cannot be arranged: not root, no
    ``setpriv``, or it did not take."""
    if os.geteuid() != 0:
        return None
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search"]
    probe = subprocess.run(
        [*prefix, sys.executable, "-c", f"open({str(path)!r}).read()"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return prefix if "PermissionError" in probe.stderr else None


#: why a test that needs :func:`cannot_read_prefix` is skipped
CANNOT_READ_SKIP = "needs root and setpriv able to drop CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH"


# -- interrupt injection (in-process KeyboardInterrupt at every trace event) ------------------

PKG_DIR = str(Path(et.__file__).resolve().parent)
THREADING_FILE = threading.__file__

_LINE_STARTS: dict = {}


_NOP = dis.opmap["NOP"]


def not_a_signal_point(frame) -> bool:
    """A line event no signal handler can run at (the eval loop runs them only at calls,
    function entries and backward jumps), where raising would test what cannot happen:
    the ``NOP`` of a ``try:`` line, and the end of a ``with`` block, where the interpreter
    jumps back to the ``with`` line to call ``__exit__``."""
    code = frame.f_code
    if code.co_code[frame.f_lasti] == _NOP:
        return True
    starts = _LINE_STARTS.get(code)
    if starts is None:
        starts = _LINE_STARTS[code] = {}
        for off, line in dis.findlinestarts(code):
            starts.setdefault(line, off)  # where the line is entered from the top
    if starts.get(frame.f_lineno) == frame.f_lasti:
        return False  # entering the line from its start
    line = linecache.getline(code.co_filename, frame.f_lineno).strip()
    return line.startswith(("with ", "async with "))


class Injector:
    """Raise ``KeyboardInterrupt`` at the ``at``-th trace event (call, line or return) of
    library code (expr_tracker and threading.py) on this thread, once.

    A real signal's handler runs between bytecodes of the main thread; a line start, a
    function entry and the moment a call returns cover every place our code can be split.
    """

    def __init__(self, at: int | None, *, stdlib: bool = True) -> None:
        self.at = at
        self.stdlib = stdlib  # threading.py too (its Condition/Event are not signal-safe)
        self.count = 0
        self.fired = False

    def _local(self, frame, event, arg):
        if self.fired:
            return None
        if event == "line" and not_a_signal_point(frame):
            return self._local
        self.count += 1
        if self.count == self.at:
            self.fired = True
            raise KeyboardInterrupt(f"injected at {frame.f_code.co_name}:{frame.f_lineno}")
        return self._local

    def _global(self, frame, event, arg):
        f = frame.f_code.co_filename
        if f.startswith(PKG_DIR) or (self.stdlib and f == THREADING_FILE):
            return self._local(frame, event, arg)
        return None

    def run(self, fn, *args):
        sys.settrace(self._global)
        try:
            return fn(*args)
        finally:
            sys.settrace(None)


def count_events(fn, *args, stdlib: bool = True) -> int:
    probe = Injector(None, stdlib=stdlib)
    probe.run(fn, *args)
    return probe.count


def compiled(module) -> bool:
    """True when ``module`` was loaded from a compiled extension, not its ``.py`` (an
    ``ET_COMPILE=1`` build, docs/performance.md "A compiled build")."""
    from expr_tracker.compiled import compiled_modules

    return module.__name__ in compiled_modules()


def needs_python(*modules, why: str = "patches or traces"):
    """Skip a test that replaces methods of, or traces line by line, one of ``modules``
    when that module is compiled: a compiled class's methods are called directly and cannot
    be replaced, and compiled code gives the tracer no line events to interrupt at."""
    names = [m.__name__ for m in modules if compiled(m)]
    return pytest.mark.skipif(bool(names), reason=f"{why} {', '.join(names)}, compiled here")
