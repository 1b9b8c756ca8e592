"""Which run directory a start writes to (docs/streams.md, "Run identity").

A name is where a run lives, not a promise that every start under it is the same
experiment. The default ``resume: allow`` decides by the config given at init (``config=``,
a Hydra ``cfg``; keys added later with ``et.config.update`` do not count): a producer whose
latest attempt was given the same config continues it (a restart after preemption); another
config moves on to ``<name>-2``, ``-3`` ... — the first one that this producer has not
written yet, or whose latest attempt had the same config — and says so in one line naming
the changed keys. ``resume: must`` continues the named run whatever its config and records
the change (``run.json`` ``config_changes``, kept per attempt in ``previous_attempts``);
``resume: never`` always starts a new run (the first name this producer has not written).
A start given no config at all (an evaluation script, ``et.init(name=...)`` alone) says
nothing about the experiment: it continues the named run, and the config recorded for the
next comparison stays the one the run was last started with.

The name is fixed — resume or start, never moved — when the folder is given (``run_dir=``),
for wandb's ``id=`` (the id is the run), and for ranks other than 0: rank 0 decides, and
under ``torchrun`` the other ranks find the run whose rank-0 ``run.json`` records their
launch (``launch``, :func:`~expr_tracker.spec.names.launch_key`), waiting for rank 0 to
choose when it has not yet.

Every candidate is locked before anything of it is read (:class:`Attempt`); one held by a
live process is not free: a ``-k`` one is passed over; the named run is too when the live
process was given another config (read from its ``run.json`` once it records its start: a
sweep launched in parallel under one name), or under ``resume: never``; else (the same
config, no config given, a fixed name) it raises ``RunLockedError`` as before. The comparison reads this producer's ``run.json`` (its ``init_config``) only
when the run exists, so starting a new run costs nothing more.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from expr_tracker._warn import Warner
from expr_tracker.assemble.history import Attempt, normalize_config, run_directory
from expr_tracker.errors import ExprTrackerError, RunLockedError
from expr_tracker.history.paths import file_name, hostname
from expr_tracker.history.runinfo import read_run_info

__all__ = [
    "Choice",
    "ResumeError",
    "choose",
    "config_changes",
    "describe_changes",
    "notice",
]

#: seconds a rank other than 0 waits for rank 0 of its launch to choose the run
FOLLOW_TIMEOUT = 60.0
_FOLLOW_POLL = 0.05
#: seconds a start waits for the live process holding the named run to record its config
LIVE_TIMEOUT = 10.0
#: names tried after the one asked for (``-2`` ... ``-10001``)
_MAX_CANDIDATES = 10_000
#: changed keys named in the one line; the rest are counted
_NAMED_KEYS = 3


class ResumeError(ExprTrackerError, FileExistsError):
    """``resume="must"`` found no run to continue."""


@dataclass
class Choice:
    """The run a start writes to, its lock held (``attempt``)."""

    attempt: Attempt
    resolved: Any  # the resolved spec, ``name`` set to the chosen one
    run_dir: Path
    init_config: dict[str, Any]  # the config given at init (JSON data)
    recorded: dict[str, Any]  # what run.json keeps of it (credentials hidden)
    launch: str | None = None  # the torchrun launch, recorded by rank 0
    changes: dict[str, Any] | None = None  # continuing with another config: per key
    requested: str | None = None  # the name asked for, when another one was chosen
    why: str | None = None  # why that one was not taken (the stderr line)
    pinned: bool = False  # the folder was given (run_dir=, id=): never moved

    @property
    def spec(self) -> Any:
        return self.resolved.spec


def choose(
    resolved: Any,
    env: Any,
    warner: Warner,
    stream: str | None,
    file_rank: int,
    *,
    pinned: bool = False,
) -> Choice:
    """Choose the run directory and take this producer's lock in it (see the module
    docstring). The returned attempt holds the lock and has created what it lists; the
    caller snapshots it and undoes it if the start fails.

    Raises:
        RunLockedError: the named run's producer is held by another live process.
        ResumeError: ``resume="must"`` and this producer has no run to continue.
    """
    from expr_tracker.spec.errors import redact_config
    from expr_tracker.spec.names import launch_key

    spec = resolved.spec
    config = normalize_config(spec.config, warner)
    recorded = redact_config(config)
    launch = launch_key(env)
    base = run_directory(spec)
    pinned = pinned or bool(spec.run_dir)  # the folder is given: never moved
    fixed = pinned or spec.resume == "must"  # resumed or started there
    first = 1
    if file_rank > 0 and not fixed:  # rank 0 decides, the other ranks follow
        if launch is not None:
            first = _follow(spec, base, stream, launch, warner)
        fixed = True
    k = first
    moved: dict[str, Any] | None = None  # why the named run was not taken
    wait_until: float | None = None  # for a live holder of the named run to record its start
    changes: dict[str, Any] | None
    while True:
        run_dir = _candidate(base, k)
        attempt = Attempt(run_dir, stream, file_rank)
        metrics_path = run_dir / file_name("metrics", stream, file_rank)
        info_path = run_dir / file_name("run", stream, file_rank)
        try:
            attempt.lock(metrics_path, warner)
        except RunLockedError:
            if k != first:
                k = _next(k, spec)  # a live process writes it: not free
                continue
            if fixed or not (config or spec.resume == "never"):
                raise  # this very run is being written: wait for it, or another name
            live = _live_init_config(info_path, metrics_path, wait_until)
            if live is _RETRY:  # the holder is starting (or only probing): look again
                wait_until = wait_until or time.monotonic() + LIVE_TIMEOUT
                time.sleep(_FOLLOW_POLL)
                continue
            if live is None:
                raise  # a holder whose config cannot be read: as before
            changes = {} if spec.resume == "never" else config_changes(live, recorded)
            if spec.resume != "never" and not changes:
                raise  # the same experiment, running now: not started twice
            if moved is None:
                moved = changes  # another experiment is running under the name: move on
            k = _next(k, spec)
            continue
        try:
            exists = metrics_path.exists() or info_path.exists()
            if not exists:
                if spec.resume == "must":
                    raise ResumeError(
                        f"resume='must' but there is no run to continue at {run_dir} "
                        f"(no {metrics_path.name}); check project/name/dir or use "
                        "resume='allow'"
                    )
                changes = None
                break
            if fixed:
                if pinned and spec.resume == "never":
                    raise ResumeError(
                        f"resume='never' but {run_dir} already holds this run "
                        f"({metrics_path.name}), and its folder is fixed (run_dir= or id=); "
                        "give another one, or use resume='allow' to continue it"
                    )
                # rank 0 records the config given at init; the other ranks' decide nothing
                if file_rank == 0 and config:
                    changes = _changes_since(info_path, run_dir, stream, recorded) or None
                else:
                    changes = None
                break
            if spec.resume == "never":
                changes = None
            elif not config:  # no config given (an eval script, a second stream): continue
                changes = None
                break
            else:
                changes = _changes_since(info_path, run_dir, stream, recorded)
                if not changes:
                    break
            if moved is None:
                moved = changes or {}
        except BaseException:
            attempt.undo()
            raise
        attempt.undo()  # probed, not ours: the lock is released, nothing was changed
        k = _next(k, spec)
    if not config and exists and file_rank == 0:
        # nothing given says nothing about the experiment: the next start compares with
        # what the run's latest start was given, not with this empty config
        recorded = _recorded_init_config(info_path) or recorded
    choice = Choice(
        attempt=attempt,
        resolved=resolved,
        run_dir=run_dir,
        init_config=config,
        recorded=recorded,
        launch=launch if file_rank == 0 else None,
        changes=changes,
        pinned=pinned,
    )
    if k != 1:
        name = f"{spec.name}-{k}"
        choice.resolved = replace(resolved, spec=spec.model_copy(update={"name": name}))
        if moved is not None:
            choice.requested = spec.name
            who = f"{spec.project}/{spec.name}"
            choice.why = (
                f"run {who} exists (resume='never')"
                if spec.resume == "never"
                else f"run {who} was started with another config ({describe_changes(moved)})"
            )
    return choice


def _candidate(base: Path, k: int) -> Path:
    return base if k == 1 else base.with_name(f"{base.name}-{k}")


def _next(k: int, spec: Any) -> int:
    if k > _MAX_CANDIDATES:
        raise ExprTrackerError(
            f"runs {spec.name}-2 ... {spec.name}-{k} all exist with other configs or are "
            "being written; give the run another name"
        )
    return 2 if k == 1 else k + 1


def notice(choice: Choice, resumed: str | None) -> str | None:
    """The one stderr line of this start: ``resumed`` is the resume line (``run ... at step
    N; previous attempt: S``) when the producer continues, else None."""
    spec = choice.spec
    tail = ""
    if choice.requested is not None:
        tail = f" (to continue {spec.project}/{choice.requested} instead, pass resume='must')"
    if resumed is None:
        if choice.why is None:
            return None
        return (
            f"expr_tracker: {choice.why}; starting run {spec.project}/{spec.name} in "
            f"{choice.run_dir}{tail}"
        )
    if choice.why is not None:
        return (
            f"expr_tracker: {choice.why}; resuming {resumed} (that run was started with "
            f"this config); in {choice.run_dir}{tail}"
        )
    if choice.changes:
        return (
            f"expr_tracker: resuming {resumed}; config changed since: "
            f"{describe_changes(choice.changes)} (run.json: config_changes); in "
            f"{choice.run_dir}"
        )
    if spec.resume == "must":
        hint = ""  # continuing is what was asked for
    elif choice.pinned:  # resume='never' is an error there: another id or folder starts anew
        hint = " (a run named by id= or run_dir= is continued: give another one to start anew)"
    else:
        hint = (
            " (resume='allow' continues a run started with the same config; another name, "
            "or resume='never', starts anew)"
        )
    return f"expr_tracker: resuming {resumed}; in {choice.run_dir}{hint}"


# ------------------------------------------------------------------ the comparison

_RETRY = object()


def _live_init_config(info_path: Path, metrics_path: Path, wait_until: float | None) -> Any:
    """The config given at init to the live process holding ``metrics_path``'s lock, from
    its ``run.json`` once that names it (its pid and host, as the lock file does).
    :data:`_RETRY` while it has not recorded its start yet, or released the lock (it was
    only comparing configs, or its start failed), until ``wait_until`` has passed; None
    when it cannot be told (then, or a writer that records no ``init_config``) and for a
    run open in this very process."""
    from expr_tracker.history.recovery import lock_path_of

    try:
        holder = lock_path_of(metrics_path).read_text("utf-8", "replace")
    except OSError:
        holder = ""
    fields = dict(part.split("=", 1) for part in holder.split() if "=" in part)
    if fields.get("pid") == str(os.getpid()) and fields.get("host") == hostname():
        return None  # a run open in this process: refused, as two runs of one name are
    info = read_run_info(info_path, repair=False) if info_path.exists() else None
    if (
        info is not None
        and fields.get("pid") == str(info.get("pid"))
        and fields.get("host") == info.get("host")
    ):
        recorded = info.get("init_config")
        return recorded if isinstance(recorded, dict) else None
    if wait_until is None or time.monotonic() < wait_until:
        return _RETRY
    return None


def _recorded_init_config(info_path: Path) -> dict[str, Any] | None:
    info = read_run_info(info_path, repair=False) if info_path.exists() else None
    recorded = (info or {}).get("init_config")
    return recorded if isinstance(recorded, dict) else None


def _changes_since(
    info_path: Path, run_dir: Path, stream: str | None, given: dict[str, Any]
) -> dict[str, Any]:
    """How ``given`` differs from the config the producer's latest attempt was given at
    init (its ``run.json`` ``init_config``). A run written before that was recorded is
    compared by its ``config[.S].json`` on the keys given now (it may hold keys added
    later)."""
    info = read_run_info(info_path, repair=False) if info_path.exists() else None
    recorded = (info or {}).get("init_config")
    if isinstance(recorded, dict):
        return config_changes(recorded, given)
    try:
        saved = json.loads((run_dir / file_name("config", stream)).read_text("utf-8"))
    except (OSError, ValueError):
        saved = {}
    return config_changes(saved if isinstance(saved, dict) else {}, given, given_only=True)


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flat(value, path + "."))
        else:
            out[path] = value
    return out


#: the memory address in a repr() (``<function relu at 0x7f...>``, ``functools.partial(...)``,
#: ``<__main__.C object at 0x...>``): recorded for a value that cannot be encoded, it differs
#: in every process while naming the same thing
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _same(a: Any, b: Any) -> bool:
    if a == b:
        return True
    if isinstance(a, str) and isinstance(b, str):  # a repr() compares by what it names
        return _ADDRESS.sub(" at 0x", a) == _ADDRESS.sub(" at 0x", b)
    try:  # NaN equals NaN
        return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    except (TypeError, ValueError):
        return False


def config_changes(
    before: dict[str, Any], after: dict[str, Any], *, given_only: bool = False
) -> dict[str, Any]:
    """``{dotted key: {"before": old, "after": new}}`` for every leaf that differs (a key
    only in ``after`` has no ``before``, one only in ``before`` no ``after``; with
    ``given_only`` those are not listed)."""
    b, a = _flat(before), _flat(after)
    out: dict[str, Any] = {}
    for key, value in a.items():
        if key not in b:
            out[key] = {"after": value}
        elif not _same(b[key], value):
            out[key] = {"before": b[key], "after": value}
    if not given_only:
        for key, value in b.items():
            if key not in a:
                out[key] = {"before": value}
    return out


def _short(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def describe_changes(changes: dict[str, Any], limit: int = _NAMED_KEYS) -> str:
    """``lr: 0.003 -> 0.001, seed added, dropout removed and 2 more``."""
    parts = []
    for key, change in list(changes.items())[:limit]:
        if "before" not in change:
            parts.append(f"{key} added ({_short(change['after'])})")
        elif "after" not in change:
            parts.append(f"{key} removed")
        else:
            parts.append(f"{key}: {_short(change['before'])} -> {_short(change['after'])}")
    text = ", ".join(parts) or "no key"
    more = len(changes) - limit
    return f"{text} and {more} more" if more > 0 else text


# ------------------------------------------------------------------ ranks follow rank 0


def _follow(spec: Any, base: Path, stream: str | None, launch: str, warner: Warner) -> int:
    """The candidate rank 0 of this launch chose: the first whose rank-0 ``run.json``
    records ``launch``. Where the named run has no rank-0 files yet, rank 0 starts it
    there. Otherwise wait (rank 0 has not chosen yet), at most :data:`FOLLOW_TIMEOUT`."""
    run0 = file_name("run", stream, 0)
    metrics0 = file_name("metrics", stream, 0)
    deadline = time.monotonic() + FOLLOW_TIMEOUT
    while True:
        k = 1
        while k <= _MAX_CANDIDATES:
            d = _candidate(base, k)
            info = read_run_info(d / run0, repair=False)
            if info is None:
                if k == 1 and not (d / metrics0).exists():
                    return 1
                break
            if info.get("launch") == launch:
                return k
            k = 2 if k == 1 else k + 1
        if time.monotonic() >= deadline:
            warner.warn(
                ("follow", str(base)),
                "expr_tracker: waited %.0f s for rank 0 to choose the run of this launch "
                "(%s exists); this rank writes to it. Give rank 0 time to call et.init "
                "first, or pass run_dir= to every rank",
                FOLLOW_TIMEOUT,
                base,
            )
            return 1
        time.sleep(_FOLLOW_POLL)
