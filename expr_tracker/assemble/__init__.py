"""``build(resolved) -> Run``: the composition root, the only place runtime objects are
constructed from a spec.

Reads the validated :class:`~expr_tracker.spec.models.RunSpec` once and hands plain values
to the runtime (the hot path never touches Pydantic):

- :mod:`.check`: :func:`check`, everything a spec can get wrong beyond its schema (span
  plugins, alert rules, channels), with no side effect; also ``et config validate``.
- :mod:`.identity`: which run directory a start writes to: resume by the config given at
  init, ``<name>-2`` for another config, ranks following rank 0 (the lock taken first).
- :mod:`.history`: the run directory and file names, the one-writer lock and the undo of a
  failed attempt, resume, the history store and its writer, ``run.json``, ``config.json``,
  ``spec.json`` and the summary.
- :mod:`.spans`: the span recorder, its writer, plugins and print target.
- :mod:`.alerts`: the alert engine, the alert log, the watchdog and the row sink.
- :mod:`.delivery`: the channels, policies and dispatcher from an ``AlertsSpec``
  (``build_dispatcher``, also for ``et alert``), a run's delivery, and the run-less
  dispatcher of ``et.alert`` (``standalone_dispatcher``).
- :mod:`.artifacts`: the project's artifact store and the run's lineage (``run.artifacts``).
- :mod:`.system`: the background sampler of the machine (``metrics.system.jsonl``) and the
  rules that read it.
- :mod:`.sync`: the background upload to a bucket (``sync.url``), last pass at finish.
- :mod:`.backends`: the mirrors (wandb, trackio, backend objects), started last.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from expr_tracker._warn import Warner
from expr_tracker.assemble.alerts import build_alerts
from expr_tracker.assemble.artifacts import build_artifacts
from expr_tracker.assemble.backends import build_backends
from expr_tracker.assemble.check import channel_issue, check, deferrable_alerts
from expr_tracker.assemble.history import (
    announce,
    construct_run,
    normalize_config,
    run_directory,
)
from expr_tracker.assemble.identity import ResumeError, choose
from expr_tracker.assemble.media import build_media
from expr_tracker.assemble.querycache import build_query_cache
from expr_tracker.assemble.spans import build_spans
from expr_tracker.assemble.sync import build_sync
from expr_tracker.assemble.system import build_system
from expr_tracker.history.paths import detect_rank
from expr_tracker.runs import Run

__all__ = [
    "ResumeError",
    "build",
    "build_disabled",
    "build_dispatcher",
    "check",
    "normalize_config",
    "run_directory",
]

log = logging.getLogger("expr_tracker")


def __getattr__(name: str) -> Any:  # PEP 562
    """``build_dispatcher`` on first use: the delivery package (channels, HTTP, policies)
    is imported only by a run with alert rules, ``et alert`` and ``et.alert``."""
    if name == "build_dispatcher":
        from expr_tracker.assemble.delivery import build_dispatcher

        return build_dispatcher
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build(
    resolved: Any,
    *,
    environ: dict[str, str] | None = None,
    independent: bool = False,
    backend_objects: Any = (),
    pinned: bool = False,
) -> Run:
    """Construct a :class:`Run` from a resolved spec (``expr_tracker.spec.resolve``).

    ``mode: disabled`` gives a :class:`~expr_tracker.runs.DisabledRun` (nothing touches
    the disk). ``independent`` (``et.Run(...)``): the run's span recorder is not made the
    active one (``et.span`` keeps reporting to the current run).

    Everything that can fail on configuration (rules, plugin types, channels) is checked
    before anything touches the disk; if construction still fails afterwards, what this
    attempt created is removed and the one-writer lock released, so fixing the spec and
    calling ``et.init`` again in the same process works. ``backend_objects`` are mirrored
    besides the spec's ``backends`` (objects with init/log/finish, from ``et.init``).
    ``pinned`` (wandb's ``id=``): the run's name is fixed, never moved to ``<name>-2`` for
    another config (:mod:`.identity`).

    Raises:
        SpecError: everything :func:`check` finds (plugins, rules, channels), each problem
            with its spec path.
        ResumeError: ``resume="must"`` found no run, or ``resume="never"`` an existing one
            in a fixed folder (``run_dir=``, ``id=``).
        RunLockedError: another live process writes the same stream and rank.
        TypeError: a backend object lacks init/log/finish.
    """
    from expr_tracker.backends.protocol import adapt

    for obj in backend_objects:  # before anything touches the disk
        adapt(obj)
    spec = resolved.spec
    env = os.environ if environ is None else environ
    if spec.mode == "disabled":
        return build_disabled(resolved, env)
    warner = Warner()
    stream = spec.stream
    rank = detect_rank(env)
    file_rank = rank if spec.history.rank_aware else 0

    # 1. configuration checks: nothing on disk yet; the same function as `et config validate`
    engine = check(resolved, env, stream=stream, rank=rank)

    # 2. which run: each candidate's one-writer lock comes before anything of it is read,
    # snapshotted or undone: a refused process (RunLockedError) has touched nothing of the
    # holder's. The chosen one stays locked.
    choice = choose(resolved, env, warner, stream, file_rank, pinned=pinned)
    attempt, resolved, run_dir = choice.attempt, choice.resolved, choice.run_dir
    spec = resolved.spec
    if engine is not None:
        engine.run_info["run"] = spec.name
    try:
        attempt.snapshot()

        # 3. construction; undone if anything fails
        run = construct_run(
            resolved, spec, env, warner, stream, rank, file_rank, run_dir, attempt, choice
        )
        attempt.closers.append(lambda: _undo_runtime(run, engine))
        run.independent = independent
        build_spans(run, spec, run_dir, stream, file_rank, rank, warner, activate=not independent)
        if engine is not None:
            build_alerts(
                run, spec, run_dir, stream, file_rank, rank, warner, engine, world_size(env)
            )
        elif deferrable_alerts(spec):  # no rule yet: the engine and its delivery on first need
            run.defer_alerts(
                _late_alerts(
                    run, resolved, run_dir, stream, file_rank, rank, warner, world_size(env)
                )
            )
        build_artifacts(run, spec, run_dir, stream, file_rank)
        build_media(run, run_dir)
        build_system(run, resolved, run_dir, stream, file_rank, rank, env)
        build_sync(run, spec, run_dir, stream, file_rank)  # last: nothing after it can fail
    except BaseException as exc:
        attempt.undo()
        from expr_tracker.alerts.delivery.channels import ChannelConfigError

        if isinstance(exc, ChannelConfigError):  # the environment changed since check()
            from expr_tracker.spec import SpecError

            raise SpecError([channel_issue(resolved, exc)]) from None
        raise
    attempt.done()
    if attempt.notice:
        announce(attempt.notice)
    # mirrors start last, once the run exists on disk; a backend never fails the start
    try:
        build_backends(run, spec, rank, warner, backend_objects)
    except Exception as exc:  # noqa: BLE001
        warner.warn(
            ("backends", type(exc).__name__),
            "expr_tracker: the mirrors could not be started (%s: %s); the run goes on without",
            type(exc).__name__,
            exc,
        )
    # the query cache's closer after every other (sync, mirrors): the data before its cache
    build_query_cache(run, spec)
    return run


def _late_alerts(
    run: Run,
    resolved: Any,
    run_dir: Any,
    stream: str | None,
    file_rank: int,
    rank: int,
    warner: Warner,
    size: int,
) -> Any:
    """The deferred build of a run started with no rule (``Run.alerts``): the engine with
    no rule, hooked in as :func:`build_alerts` hooks one in at the start."""

    def late() -> None:
        from expr_tracker.assemble.check import make_engine

        engine = make_engine(resolved, stream, rank)
        if engine is not None:
            build_alerts(run, resolved.spec, run_dir, stream, file_rank, rank, warner, engine, size)

    return late


def world_size(environ: Any) -> int:
    """Processes in the job, from ``WORLD_SIZE`` as torchrun sets it (1 when unset or not
    an int)."""
    try:
        return max(1, int(environ.get("WORLD_SIZE") or 1))
    except ValueError:
        return 1


def build_disabled(resolved: Any, environ: Any = None) -> Run:
    """The no-op run of ``mode: disabled``: config, summary and ``define_metric`` in memory,
    no directory, no file, no lock, no thread."""
    from expr_tracker.history.store import HistoryStore
    from expr_tracker.runconfig import RunConfig
    from expr_tracker.runs import DisabledRun
    from expr_tracker.runsummary import Summary

    spec = resolved.spec
    warner = Warner()
    info = {
        "status": "disabled",
        "project": spec.project,
        "name": spec.name,
        "stream": spec.stream,
        "started_at": time.time(),
        "group": spec.group,
        "tags": list(spec.tags),
        "notes": spec.notes,
        "entity": spec.entity,
        "job_type": spec.job_type,
    }
    return DisabledRun._assemble(
        spec=spec,
        resolved=resolved,
        run_dir=run_directory(spec),
        stream=spec.stream,
        rank=detect_rank(os.environ if environ is None else environ),
        store=HistoryStore(None, max_open_seconds=None, warner=warner),
        summary=Summary(None),
        config=RunConfig(normalize_config(spec.config, warner)),
        info=info,
        info_path=None,
        warner=warner,
    )


def _undo_runtime(run: Run, engine: Any) -> None:
    """Stop what a failed build started (span recorder, watchdog, delivery threads, the
    system sampler)."""
    if run.system is not None:
        run.system.close(0.5)
    if run.spans is not None:
        run.spans.close()
    if engine is not None:
        engine.close()
    dispatcher = run.dispatcher
    if dispatcher is not None:
        dispatcher.close(timeout=0.5)
