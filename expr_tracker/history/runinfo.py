"""``run.json``: what a run is and how it ended.

Statuses: ``running``, ``finished``, ``failed`` (with the exception type and message),
``crashed`` — a run whose file still says ``running`` but whose process is gone, detected
when a later reader or a resume looks at it (same host, pid no longer alive) — and
``preempted``: an attempt marked with ``run.mark_preempting()`` (``preempting_at``), however
it ended, also when it was killed before it could finish (:func:`dead_status`).

A run resumed under its name has several attempts (``previous_attempts``: the earlier ones;
``started_at``/``ended_at``/``duration_s``: the latest). Its whole life (docs/streams.md "Run
identity", Durations): ``first_started_at`` (the first attempt's start),
``wall_duration_s`` (first start to the latest end) and ``active_duration_s`` (the sum of the
attempts' durations), written at finish (:func:`close_life`) and computed by every reader
from the attempts (:func:`run_life`), also while the run is live. A crashed attempt (no
``ended_at``) counts up to its last row's ``_time``.

``run.json`` is read as untrusted input (``history.untrusted``): only a regular file inside
its run directory, bounded in size, JSON with a depth limit; a file that is not a JSON
object is unreadable (:func:`load_run_info` says why), never a crash or a hang.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from expr_tracker.history.codec import dumps_pretty
from expr_tracker.history.paths import atomic_write, hostname
from expr_tracker.history.untrusted import read_json


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1e3):03d}"


def git_info(cwd: str | None = None) -> dict[str, Any] | None:
    """The commit (and whether the tree is dirty) of the repository around ``cwd``: ``git
    rev-parse HEAD`` and ``git status`` run side by side; neither is started where no folder
    from ``cwd`` up looks like a repository (:func:`_in_repository`)."""
    if not _in_repository(cwd):
        return None
    import subprocess

    def start(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["git", *args],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    started: list[subprocess.Popen[str]] = []
    try:
        commit = start("rev-parse", "HEAD")
        started.append(commit)
        status = start("status", "--porcelain", "--untracked-files=no")
        started.append(status)
        commit_out = commit.communicate(timeout=2)[0]
        if commit.returncode != 0:
            return None
        status_out = status.communicate(timeout=2)[0]
        return {"commit": commit_out.strip(), "dirty": bool(status_out.strip())}
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        for proc in started:
            if proc.returncode is None:
                proc.kill()
                proc.wait()


def _in_repository(cwd: str | None) -> bool:
    """False only where git would find no repository either: ``GIT_DIR`` unset and no folder
    from ``cwd`` (default: the working directory) up to ``/`` holding ``.git`` or being a
    bare repository (``HEAD``, ``objects/``, ``refs/``). A few ``stat`` calls instead of two
    processes for a run started outside any repository."""
    if os.environ.get("GIT_DIR"):
        return True
    try:
        here = os.path.abspath(cwd if cwd is not None else os.getcwd())
    except OSError:
        return True  # git decides
    while True:
        if os.path.lexists(os.path.join(here, ".git")):
            return True
        if (
            os.path.isfile(os.path.join(here, "HEAD"))
            and os.path.isdir(os.path.join(here, "objects"))
            and os.path.isdir(os.path.join(here, "refs"))
        ):
            return True
        parent = os.path.dirname(here)
        if parent == here:
            return False
        here = parent


def python_version() -> str:
    """``platform.python_version()`` (``3.11.7``, ``3.13.0rc1``)."""
    import platform

    return platform.python_version()


def platform_name() -> str:
    """``platform.platform()`` as ``run.json`` records it (``Linux-6.8.0-x86_64-with-glibc2.36``).
    On Linux it is built from ``os.uname()`` and ``platform.libc_ver()`` without the
    ``uname -p`` process ``platform.platform()`` starts for the processor field, which
    Linux's ``uname -p`` gives as ``unknown`` or the machine name, both left out of the
    string anyway. Elsewhere, ``platform.platform()`` itself."""
    import platform

    join = getattr(platform, "_platform", None)  # the standard library's own formatting
    if sys.platform != "linux" or join is None:
        return platform.platform()
    uname = os.uname()
    libc, version = platform.libc_ver()
    return str(join(uname.sysname, uname.release, uname.machine, "", "with", libc + version))


def package_versions() -> dict[str, str]:
    """Versions of expr_tracker and of the ML packages this process already imported: the
    module's own ``__version__``, else the installed distribution's (``importlib.metadata``
    is imported only then: reading it costs more than the rest of a run's start)."""
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
        module = sys.modules.get(mod)
        if module is None:
            continue
        version = getattr(module, "__version__", None)
        if isinstance(version, str) and version:
            out[dist] = str(version)
            continue
        from importlib import metadata

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
        "host": hostname(),
        "pid": os.getpid(),
        "argv": list(sys.argv if argv is None else argv),
        "cwd": os.getcwd(),
        "git": git_info(),
        "python": python_version(),
        "platform": platform_name(),
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
        info["status"] = dead_status(info)
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


def dead_status(info: dict[str, Any]) -> str:
    """The status of an attempt whose ``run.json`` says ``running`` but whose process is gone:
    ``preempted`` when it was marked so (``run.mark_preempting()``), else ``crashed``."""
    return "preempted" if info.get("preempting_at") is not None else "crashed"


def is_dead(info: dict[str, Any]) -> bool:
    """True when ``info`` describes a process on this host that no longer runs."""
    pid = info.get("pid")
    if info.get("host") != hostname() or type(pid) is not int or pid <= 0:
        return False
    if pid == os.getpid():
        return False
    return not pid_alive(pid)


# --------------------------------------------------------------------------- a run's whole life


def _time_or_none(v: Any) -> float | None:
    """``v`` when it can be a time in epoch seconds (a finite number from 1970 to the year
    9999), else None."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        f = float(v)
        if f == f and 0.0 <= f <= 253402300799.0:
            return f
    return None


def _seconds_or_none(v: Any) -> float | None:
    """``v`` when it can be a duration (a number from 0 to the seconds up to the year 9999),
    else None."""
    return _time_or_none(v)


def last_row_time(metrics_path: Path) -> float | None:
    """The ``_time`` of the last row of a metrics file (its tail only), None without one."""
    from expr_tracker.history.reader import JsonlReader

    try:
        rows = JsonlReader(metrics_path, root=metrics_path.parent).tail_rows(1)
    except (OSError, ValueError):
        return None
    return _time_or_none(rows[-1].get("_time")) if rows else None


def previous_attempt(previous: dict[str, Any], metrics_path: Path | None = None) -> dict[str, Any]:
    """What ``previous_attempts`` keeps of the attempt ``previous`` (its ``run.json``, read by
    the start that continues it): status, start, end, pid, host, the exception type, the
    config changes, and ``duration_s``, its active seconds — as it recorded them when it
    finished; for one that never finished (killed: no ``ended_at``), up to its last known
    write, the ``_time`` of the last row in ``metrics_path`` (0 when it wrote none; rows it
    still held unwritten are lost with it), kept as ``last_seen_at``."""
    prev = {k: previous.get(k) for k in ("status", "started_at", "ended_at", "pid", "host")}
    if isinstance(previous.get("exception"), dict):
        prev["exception"] = {"type": previous["exception"].get("type")}
    if previous.get("config_changes"):
        prev["config_changes"] = previous["config_changes"]
    started = _time_or_none(previous.get("started_at"))
    ended = _time_or_none(previous.get("ended_at"))
    duration = _seconds_or_none(previous.get("duration_s"))
    if duration is None and started is not None and ended is not None:
        duration = max(0.0, ended - started)
    if duration is None and started is not None and ended is None:
        seen = last_row_time(metrics_path) if metrics_path is not None else None
        seen = max(started, seen) if seen is not None else started
        prev["last_seen_at"] = seen
        duration = round(seen - started, 3)
    prev["duration_s"] = duration
    return prev


def first_start(info: dict[str, Any]) -> float | None:
    """The first attempt's start: ``first_started_at`` when recorded, else the earliest
    ``started_at`` of the attempts (a ``run.json`` written before it was recorded)."""
    first = _time_or_none(info.get("first_started_at"))
    if first is not None:
        return first
    attempts = info.get("previous_attempts")
    starts = [
        t
        for a in (attempts if isinstance(attempts, list) else [])
        if isinstance(a, dict) and (t := _time_or_none(a.get("started_at"))) is not None
    ]
    own = _time_or_none(info.get("started_at"))
    if own is not None:
        starts.append(own)
    return min(starts) if starts else None


def open_life(info: dict[str, Any]) -> None:
    """Set ``first_started_at`` (and its ``_iso``) of a starting attempt's record (its
    ``previous_attempts`` and ``started_at`` set), and the whole-life durations to None
    until it finishes (:func:`close_life`)."""
    first = first_start(info)
    if first is None:
        return
    info["first_started_at"] = first
    info["first_started_at_iso"] = _iso(first)
    info["wall_duration_s"] = None
    info["active_duration_s"] = None


def close_life(info: dict[str, Any]) -> None:
    """Set ``wall_duration_s`` (first start to ``ended_at``) and ``active_duration_s`` (the
    attempts' ``duration_s`` summed) of a finishing attempt's record."""
    life = run_life([info])
    info["wall_duration_s"] = life["wall_duration_s"]
    info["active_duration_s"] = life["active_duration_s"]


def _attempts(
    info: dict[str, Any], last_time: float | None, now: float
) -> tuple[list[tuple[float, float]], float | None]:
    """``([(start, active seconds), ...], end)`` of one producer's attempts, oldest first;
    ``end`` is the latest attempt's: its ``ended_at``, now while its process runs, else (killed)
    ``last_time`` (its last row's time), never before its start."""
    out: list[tuple[float, float]] = []
    attempts = info.get("previous_attempts")
    for a in attempts if isinstance(attempts, list) else []:
        if not isinstance(a, dict):
            continue
        start = _time_or_none(a.get("started_at"))
        if start is None:
            continue
        d = _seconds_or_none(a.get("duration_s"))
        if d is None:  # recorded by an earlier version: its end, when it had one
            end = _time_or_none(a.get("ended_at"))
            d = max(0.0, end - start) if end is not None else 0.0
        out.append((start, d))
    start = _time_or_none(info.get("started_at"))
    if start is None:
        return out, None
    ended = _time_or_none(info.get("ended_at"))
    if ended is not None:
        d = _seconds_or_none(info.get("duration_s"))
        end = ended
        d = max(0.0, ended - start) if d is None else d
    elif info.get("status") == "running" and not is_dead(info):
        end = max(start, now)
        d = end - start
    else:  # killed before it could write ended_at: up to its last row
        end = max(start, last_time) if last_time is not None else start
        d = end - start
    out.append((start, d))
    return out, end


def run_life(
    infos: Any, *, last_time: float | None = None, now: float | None = None
) -> dict[str, float | None]:
    """A run's whole life from its producers' ``run*.json`` contents (``infos``: one, or
    each producer's of a run; a ``running`` one whose process is gone counts as killed):

    - ``first_started_at``: the first attempt's start (the earliest over the producers);
    - ``wall_duration_s``: from it to the latest end — ``ended_at``; now (``now``, default
      the clock) while a process still runs; for a killed attempt its last row's time
      (``last_time``, the reader's: the newest ``_time`` it read), never before its start;
    - ``active_duration_s``: the attempts' durations summed (each finished attempt's own
      ``duration_s``, a killed one's up to its last known write); over several producers
      (ranks, streams), the time at least one of them ran (their attempts' union).

    Values are None where ``run.json`` holds no usable start. Never raises for what the
    files hold (they are untrusted)."""
    if isinstance(infos, dict):
        infos = [infos]
    now = time.time() if now is None else now
    last_time = _time_or_none(last_time)
    firsts: list[float] = []
    ends: list[float] = []
    per: list[list[tuple[float, float]]] = []
    for info in infos:
        if not isinstance(info, dict):
            continue
        attempts, end = _attempts(info, last_time, now)
        first = first_start(info)
        if first is None or end is None:
            continue
        firsts.append(first)
        ends.append(end)
        per.append(attempts)
    if not firsts:
        return {"first_started_at": None, "wall_duration_s": None, "active_duration_s": None}
    first = min(firsts)
    if len(per) == 1:
        active = sum(d for _, d in per[0])
    else:  # the union of every producer's attempts
        active, reach = 0.0, -1.0
        for s, d in sorted(iv for attempts in per for iv in attempts):
            e = s + d
            if e > reach:
                active += e - max(s, reach)
                reach = e
    return {
        "first_started_at": first,
        "wall_duration_s": round(max(0.0, max(ends) - first), 3),
        "active_duration_s": round(active, 3),
    }
