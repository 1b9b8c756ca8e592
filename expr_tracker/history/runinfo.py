"""``run.json``: what a run is and how it ended.

Statuses: ``running``, ``finished``, ``failed`` (with the exception type and message) and
``crashed`` — a run whose file still says ``running`` but whose process is gone, detected
when a later reader or a resume looks at it (same host, pid no longer alive).

``run.json`` is read as untrusted input (``history.untrusted``): only a regular file inside
its run directory, bounded in size, JSON with a depth limit; a file that is not a JSON
object is unreadable (:func:`load_run_info` says why), never a crash or a hang.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from expr_tracker.history.codec import dumps_pretty
from expr_tracker.history.paths import atomic_write
from expr_tracker.history.untrusted import read_json


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1e3):03d}"


def git_info(cwd: str | None = None) -> dict[str, Any] | None:
    """The commit (and whether the tree is dirty) of the repository around ``cwd``."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=2,
        )
        if commit.returncode != 0:
            return None
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=2,
        )
        return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return None


def package_versions() -> dict[str, str]:
    """Versions of expr_tracker and of the ML packages this process already imported."""
    from importlib import metadata

    out: dict[str, str] = {}
    from expr_tracker._version import __version__

    out["expr_tracker"] = __version__
    for mod, dist in (
        ("torch", "torch"),
        ("numpy", "numpy"),
        ("pandas", "pandas"),
        ("hydra", "hydra-core"),
        ("omegaconf", "omegaconf"),
        ("pydantic", "pydantic"),
        ("sklearn", "scikit-learn"),
    ):
        if mod in sys.modules:
            try:
                out[dist] = metadata.version(dist)
            except metadata.PackageNotFoundError:
                pass
    return out


def new_run_info(
    *,
    project: str,
    name: str,
    stream: str | None,
    rank: int,
    run_dir: Path,
    argv: list[str] | None = None,
) -> dict[str, Any]:
    """A new ``run.json`` record (status ``running``). ``argv``: the command line to record
    (the builder passes ``sys.argv`` with credentials hidden); default ``sys.argv``."""
    now = time.time()
    return {
        "status": "running",
        "project": project,
        "name": name,
        "stream": stream,
        "rank": rank,
        "run_dir": str(run_dir),
        "started_at": now,
        "started_at_iso": _iso(now),
        "ended_at": None,
        "duration_s": None,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "argv": list(sys.argv if argv is None else argv),
        "cwd": os.getcwd(),
        "git": git_info(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": package_versions(),
    }


def write_run_info(path: Path, info: dict[str, Any]) -> None:
    """Write ``run.json`` atomically. Raises ``OSError``."""
    atomic_write(path, dumps_pretty(info))


#: the largest pid the kernel hands out (``pid_max`` is at most 2**22 on Linux)
_PID_MAX = 2**31 - 1


def pid_alive(pid: int) -> bool:
    """True when a process ``pid`` exists (or we may not signal it); False for one that does
    not, and for a value that is no pid (<= 0, too large)."""
    if not 0 < pid <= _PID_MAX:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def read_run_info(path: str | os.PathLike[str], *, repair: bool = True) -> dict[str, Any] | None:
    """Read ``run.json``; a ``running`` run whose process is gone is reported ``crashed``.

    With ``repair`` the file is rewritten with ``status: crashed`` (once detected).
    Returns None when the file is missing or unreadable (:func:`load_run_info` says why).
    """
    try:
        return load_run_info(path, repair=repair)
    except (OSError, ValueError):
        return None


def load_run_info(path: str | os.PathLike[str], *, repair: bool = False) -> dict[str, Any]:
    """``run.json`` as :func:`read_run_info` reads it, raising instead of returning None.

    Raises:
        OSError: it cannot be read (``FileNotFoundError``, ``PermissionError``;
            ``history.untrusted.UnsafeFileError`` for a FIFO, device or socket, a file
            outside its folder, or one too large).
        ValueError: it is not JSON, or not a JSON object (a list, a string).
    """
    p = Path(path)
    info = read_json(p, root=p.parent)
    if not isinstance(info, dict):
        raise ValueError(f"not a JSON object (a JSON {_json_kind(info)})")
    if info.get("status") == "running" and is_dead(info):
        info["status"] = "crashed"
        info["crash_detected_at"] = time.time()
        if repair:
            try:
                write_run_info(p, info)
            except OSError:
                pass
    return info


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return "number"


def is_dead(info: dict[str, Any]) -> bool:
    """True when ``info`` describes a process on this host that no longer runs."""
    pid = info.get("pid")
    if info.get("host") != socket.gethostname() or type(pid) is not int or pid <= 0:
        return False
    if pid == os.getpid():
        return False
    return not pid_alive(pid)
