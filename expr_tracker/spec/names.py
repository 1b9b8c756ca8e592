"""Default run names: unique per process, shared by the ranks of one ``torchrun`` launch.

The rule (also in docs/streams.md, "Run identity"):

- A plain process: ``YYYYmmdd-HHMMSS-xxxxxx``, the local start time followed by six random
  hex digits, so two runs started in the same second (two scripts, two Hydra multirun jobs
  in one process, two tests) never share a directory, and names still sort by time; one
  process never draws the same digits twice in a second (before, 200 names drawn at once
  shared a name about once in a thousand tries).
- Under ``torchrun`` (``TORCHELASTIC_RUN_ID`` is set) every rank must find the same name
  without talking to the others. The six hex digits are a hash of the rendezvous id, which
  ``torchrun`` gives every rank of a launch (a fresh uuid per launch for ``--standalone`` and
  single-node launches; the ``--rdzv-id`` you pass otherwise). The time is the start time of
  the ``torchrun`` agent, the ranks' parent process (read from ``/proc``, Linux), so it is the
  same in every rank of the node: the agent is the nearest ancestor process that was not
  itself started with that ``TORCHELASTIC_RUN_ID``, so a wrapper script between the agent
  and Python (``torchrun --no-python bash run.sh``) and a DataLoader worker forked by a rank
  find the same one. When the id is the static default ``none`` the hash is taken over the
  agent's host, pid and start time instead, so two launches still differ.
- Fallbacks: where the agent's start time cannot be read (not Linux), the name is
  ``torchrun-xxxxxx`` (the hash alone). On several nodes (``GROUP_WORLD_SIZE`` > 1) the
  agents start at different moments, so the name is ``torchrun-<rdzv id>``: pass the same
  ``--rdzv-id`` (a job id) on every node, or give ``name=``.
- Inside a Hydra multirun job under ``torchrun`` the job number is appended (``-3``), so the
  jobs of one sweep stay apart.

A restart of the workers by the same agent (``--max-restarts``) keeps the name: it resumes
the same run, as a restart should.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

_STAMP = "%Y%m%d-%H%M%S"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.,=+\-@%]+")
#: the rendezvous id torchrun sets when none was chosen (static rendezvous): not per launch
_NO_RUN_ID = ("", "none")
#: [the second, the names given out in it]: a process never draws one name twice
_issued: list[Any] = ["", set()]
_issued_lock = threading.Lock()


def default_run_name(environ: Mapping[str, str] | None = None) -> str:
    """The name of a run given none: see the module docstring for the rule.

    Returns a string valid as ``RunSpec.name`` (at most 80 bytes, no path separator).
    """
    env = os.environ if environ is None else environ
    if "TORCHELASTIC_RUN_ID" in env:
        name = _torchrun_name(env)
        job = _hydra_multirun_job()
        return f"{name}-{job}" if job is not None else name
    stamp = time.strftime(_STAMP)
    with _issued_lock:
        if _issued[0] != stamp:  # a new second: the names of the last one cannot recur
            _issued[:] = [stamp, set()]
        taken = _issued[1]
        while True:  # six random hex digits, never one this process gave out this second
            name = f"{stamp}-{os.urandom(3).hex()}"
            if name not in taken:
                taken.add(name)
                return name


def launch_key(environ: Mapping[str, str] | None = None) -> str | None:
    """What every rank of one ``torchrun`` launch shares and no other launch has: the
    rendezvous id with the agent's start (host, pid and start time where the id is the
    static ``none``); None outside ``torchrun``. Rank 0 records it in ``run.json``
    (``launch``) so the other ranks find the run rank 0 chose (docs/streams.md, "Run
    identity")."""
    env = os.environ if environ is None else environ
    if "TORCHELASTIC_RUN_ID" not in env:
        return None
    run_id = str(env.get("TORCHELASTIC_RUN_ID", ""))
    agent_pid = _agent_pid(run_id)
    agent = _process_start(agent_pid)
    start = agent[0] if agent else ""
    if run_id.strip().lower() in _NO_RUN_ID:
        import socket  # torchrun only: a plain start has no other use for it

        key = f"torchrun:{socket.gethostname()}:{agent_pid}:{start}"
    elif _int(env.get("GROUP_WORLD_SIZE")) > 1:  # several nodes: only the id is shared
        key = f"torchrun:{run_id}"
    else:
        key = f"torchrun:{run_id}:{start}"
    job = _hydra_multirun_job()  # the jobs of one sweep are launches of their own
    return f"{key}:job{job}" if job is not None else key


def _torchrun_name(env: Mapping[str, str]) -> str:
    run_id = str(env.get("TORCHELASTIC_RUN_ID", ""))
    agent_pid = _agent_pid(run_id)
    agent = _process_start(agent_pid)
    if run_id.strip().lower() not in _NO_RUN_ID:
        if _int(env.get("GROUP_WORLD_SIZE")) > 1:  # several nodes: only the id is shared
            safe = _UNSAFE.sub("_", run_id).strip("._")[:64] or _digest(run_id)
            return f"torchrun-{safe}"
        key = run_id
    else:
        import socket

        key = f"{socket.gethostname()}:{agent_pid}:{agent[0] if agent else ''}"
    suffix = _digest(key)
    if agent is None:
        return f"torchrun-{suffix}"
    return f"{time.strftime(_STAMP, time.localtime(agent[1]))}-{suffix}"


def _digest(text: str) -> str:
    import hashlib  # on first use: loading OpenSSL is a few ms of every start

    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:6]


def _int(value: str | None) -> int:
    try:
        return int(value) if value is not None else 0
    except ValueError:
        return 0


def _agent_pid(run_id: str) -> int:
    """The pid of the torchrun agent: the nearest ancestor that was not started with this
    ``TORCHELASTIC_RUN_ID`` (so a wrapper script between the agent and Python, or a
    DataLoader worker forked by a rank, finds the same agent as the rank itself). The
    parent process where ``/proc`` cannot say."""
    marker = f"TORCHELASTIC_RUN_ID={run_id}".encode("utf-8", "surrogateescape")
    pid = os.getppid()
    for _ in range(32):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                started_with_it = marker in f.read().split(b"\0")
            if not started_with_it:
                return pid
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            parent = int(stat[stat.rindex(b")") + 2 :].split()[1])  # field 4, ppid
        except (OSError, ValueError, IndexError):
            return pid
        if parent <= 1:
            return pid
        pid = parent
    return pid


def _process_start(pid: int) -> tuple[int, float] | None:
    """``(clock ticks since boot, epoch seconds)`` at which process ``pid`` started, read
    from ``/proc``; None where that is not available."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        ticks = int(stat[stat.rindex(b")") + 2 :].split()[19])  # field 22, starttime
        with open("/proc/stat", "rb") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return ticks, btime + ticks // hz


def _hydra_multirun_job() -> str | None:
    """The job number of the Hydra multirun job this process runs, else None (Hydra is
    looked at only when the app already imported it)."""
    module = sys.modules.get("hydra.core.hydra_config")
    if module is None:
        return None
    try:
        hydra_config = module.HydraConfig
        if not hydra_config.initialized():
            return None
        cfg = hydra_config.get()
        mode = str(getattr(cfg.mode, "name", cfg.mode)).rsplit(".", 1)[-1]
        if mode != "MULTIRUN":
            return None
        return str(cfg.job.num)
    except Exception:  # noqa: BLE001 - a name is never worth failing a run
        return None
