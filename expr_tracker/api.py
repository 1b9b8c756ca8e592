"""Module-level functions over the current run: ``et.init``, ``et.log``, ``et.finish`` ...

The current run is a process-wide singleton behind a lock (shared by every thread, unlike
the span nesting stack, which is per thread and per asyncio task). A forked child that
inherited it gets :class:`~expr_tracker.errors.ForkedRunError` on use and may start its own
run with ``et.init``.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from expr_tracker import _current as _state
from expr_tracker._current import FORK_MESSAGE
from expr_tracker.errors import (
    ForkedRunError,
    RunAlreadyActiveError,
)
from expr_tracker.history.live import current_run, no_run_error
from expr_tracker.history.live import history as history  # et.history, re-exported
from expr_tracker.runs import Run, Summary

_logger = logging.getLogger("expr_tracker")

_lock = threading.Lock()
_hooks_installed = False
_prev_excepthook = None


def init(
    project: str | None = None,
    name: str | None = None,
    *,
    spec: Any = None,
    config: Any = None,
    **kwargs: Any,
) -> Run:
    """Start a run and make it the current one.

    Args:
        project, name: where the run lives: ``<dir>/<project>/<name>/`` (at most 200 bytes
            each; ``name`` defaults to a timestamp plus a random suffix, the same in every
            rank of one ``torchrun`` launch; an existing name is resumed, with one line on
            stderr). In a process forked from one with an active run (a DataLoader
            worker) that names no run but a stream of its own, ``project``, ``name`` and
            the run directory default to the parent's run: ``et.init(stream="data0")``
            joins it.
        spec: a run spec: a YAML/JSON/TOML path, a dict, or an OmegaConf DictConfig (e.g.
            ``cfg.tracker`` under Hydra; interpolations are resolved).
        config: the run's configuration (hyper-parameters), saved as ``config.json``; any
            mapping, an OmegaConf container, a dataclass or a pydantic model.
        **kwargs: any spec field by its flat keyword name (``dir``, ``run_dir``, ``stream``,
            ``resume``, ``step_policy``, ``cache_bytes``, ``buffer_size``, ``spans``,
            ``span_metrics``, ``alert_rules`` ...); see ``docs/configuration.md``.
            ``backends`` may also hold objects with ``init``/``log``/``finish`` (added to
            the backends the spec names; docs/mirrors.md).

    Sources, later wins: defaults < webhook environment variables < ``ET_ALERT_CONFIG`` <
    ``ET_CONFIG`` < ``et.configure_alert()`` < ``spec`` < keyword arguments.

    Raises:
        RunAlreadyActiveError: a run is active in this process (call ``et.finish()`` first).
        SpecError: the spec is invalid (every problem listed, with its path and source).
        ResumeError: ``resume`` forbids what is on disk.
        RunLockedError: another live process writes the same stream and rank (nothing of
            its files was read or touched).
        TypeError: an object in ``backends`` lacks ``init``/``log``/``finish``.
    """
    from expr_tracker.build import build
    from expr_tracker.spec import SpecError, resolve

    with _lock:
        cur = _state.run
        parent = None
        if cur is not None:
            if cur.forked:
                parent = cur
                _state.run = None  # inherited from the parent: drop it without touching its locks
            elif not cur.finished:
                raise RunAlreadyActiveError(
                    f"a run is already active ({cur.project}/{cur.name}); call et.finish() "
                    "before et.init() again"
                )
        given = dict(kwargs)
        objects = _backend_objects(given)  # objects with init/log/finish: not spec data
        if "alert_rules" in given:
            given["alert_rules"] = _rules_as_data(given["alert_rules"])
        if project is not None:
            given["project"] = project
        if name is not None:
            given["name"] = name
        if config is not None:
            given["config"] = config
        resolved = resolve(spec, kwargs=given, configure_alert=_state.configured_alert or None)
        if parent is not None and _joins_parent(resolved, parent):
            given.update(project=parent.project, name=parent.name, run_dir=str(parent.dir))
            resolved = resolve(spec, kwargs=given, configure_alert=_state.configured_alert or None)
        try:
            run = build(resolved, backend_objects=objects)
        except SpecError as exc:
            raise _with_config_keys(exc, spec) from None
        _state.run = run
        _install_hooks()
        _finish_at_process_exit()
    return run


def _backend_objects(given: dict[str, Any]) -> list[Any]:
    """Take the backend objects (anything but names and mappings) out of
    ``given["backends"]``, so the spec stays JSON-able; returns them. Objects alone leave
    the backends other sources name in place (objects are added to them)."""
    backends = given.get("backends")
    if backends is None or isinstance(backends, (str, Mapping)):
        return []
    items = list(backends) if isinstance(backends, (list, tuple)) else [backends]
    objects = [b for b in items if not isinstance(b, (str, Mapping))]
    names = [b for b in items if isinstance(b, (str, Mapping))]
    if objects and not names:
        del given["backends"]
    else:
        given["backends"] = names
    return objects


def _joins_parent(resolved: Any, parent: Run) -> bool:
    """A forked child (a DataLoader worker) that names no run but a stream of its own joins
    the run it inherited: no source gave ``name`` or ``run_dir``, ``project``/``dir`` are
    the parent's or defaults, and the child's ``stream`` is set and not the parent's (a
    child without a stream starts a run of its own, as before: joining would resume the
    parent's main stream once the parent finished)."""
    if not resolved.spec.stream or resolved.spec.stream == parent.stream:
        return False
    src = resolved.source_of
    if src("name") != "default" or src("run_dir") != "default":
        return False
    if src("project") != "default" and resolved.spec.project != parent.project:
        return False
    if src("dir") != "default":
        expected = Path(resolved.spec.dir).expanduser() / parent.project / parent.name
        if os.path.abspath(expected) != os.path.abspath(parent.dir):
            return False
    return True


def _with_config_keys(exc: Any, spec: Any) -> Any:
    """A build-time SpecError about values from a Hydra/OmegaConf ``spec``, each issue naming
    its config key (``tracker.alerts.rules.loss_spike.condition``) as validation errors do."""
    from dataclasses import replace

    from expr_tracker.spec import SpecError

    full_key = getattr(spec, "_get_full_key", None)
    prefix = full_key("") if callable(full_key) else None
    if not prefix:
        return exc
    issues = [
        replace(i, config_key=f"{prefix}.{i.path}")
        if i.source == "spec" and i.config_key is None
        else i
        for i in exc.issues
    ]
    return SpecError(issues)


def _rules_as_data(rules: Any) -> Any:
    """``alert_rules`` items the spec can hold: ``M`` expressions become their DSL text and
    ``AlertRule`` objects their field mapping (the spec stays JSON-able; one AST either way)."""
    if not isinstance(rules, (list, tuple)):
        rules = [rules]
    out = []
    for rule in rules:
        if hasattr(rule, "to_source") and hasattr(rule, "node"):  # an M expression
            rule = rule.to_source()
        elif hasattr(rule, "condition") and hasattr(rule, "for_steps"):  # an AlertRule
            data = rule.to_dict()
            if not data.get("condition") and hasattr(rule.condition, "to_source"):
                data["condition"] = rule.condition.to_source()
            rule = data
        out.append(rule)
    return out


def log(metrics: Mapping[str, Any], step: int | None = None, commit: bool | None = None) -> int:
    """Log metrics into the current step (spec design.txt A.1, the wandb commit table).

    ``log(d)`` merges ``d`` into the open row and commits it (the step advances);
    ``commit=False`` only merges; ``step=N`` opens step N (committing the previous one) and
    merges without committing unless ``commit=True``. Values: numbers, bools, strings, None,
    NumPy and torch scalars/arrays, datetimes, paths, enums, dataclasses, pydantic models;
    anything else is written as its ``repr`` with one warning.

    Returns the step the metrics landed on (-1 when dropped, e.g. a backward step).

    Raises:
        NoActiveRunError: no run is active.
        TypeError: ``metrics`` is not a mapping.
        ForkedRunError: this is a forked child that inherited the run.
    """
    run = _state.run
    if run is None:
        raise no_run_error()
    return run.ingest(metrics, step, commit)


def get_run() -> Run | None:
    """The current run, or None."""
    return _state.run


def summary() -> Summary:
    """The current run's summary: the last value of every metric plus your assignments.

    ``et.summary()["best_acc"] = 0.93`` is persisted to ``summary.json``.
    """
    return current_run().summary


def info() -> dict[str, Any]:
    """Counters of the current run (see :meth:`Run.info`).

    Returns a dict: ``project``, ``name``, ``stream``, ``rank``, ``dir``, ``status``;
    ``history`` (rows logged and on disk, cache rows/bytes and limits, evicted rows, queries,
    disk queries and bytes read, hit rate, dropped rows by cause, the writer's counters);
    ``warnings`` (cause -> count); ``spans`` (records written/dropped, plugin failures) when
    spans are on; ``alerts`` (per rule: evaluations, fires, errors, state; unresolved
    metrics) when rules exist; ``delivery`` (per channel: sent, failed, suppressed, dropped,
    pending, alive) when alerts are on.

    Raises:
        NoActiveRunError: no run is active.
        ForkedRunError: this is a forked child that inherited the run.
    """
    return current_run().info()


def finish(exit_code: int | None = None) -> None:
    """Commit the open row, flush everything and close the run. Idempotent.

    Interrupted (Ctrl-C, SIGTERM), it can be called again: it completes what was left
    and the run stays the current one until then (the exit hook completes it otherwise).
    A call from a second thread waits for the first to complete.

    Order: the open row is committed (so alert rules see it), then spans, the alert engine
    and delivery (drained within its deadline) close, then the history is flushed and
    closed, ``summary.json`` and ``run.json`` written. A non-zero ``exit_code`` marks the
    run ``failed`` in ``run.json``.

    Raises:
        ForkedRunError: this is a forked child that inherited the run (start its own).
    """
    with _lock:
        run = _state.run
        if run is None:
            return
        if run.forked:
            _state.run = None
            raise ForkedRunError(FORK_MESSAGE)
    try:
        run.finish(exit_code=exit_code)
    finally:
        # an interrupted finish() keeps the run current: calling et.finish() again (or the
        # exit hook) completes it, and et.init() refuses to start another meanwhile
        with _lock:
            if _state.run is run and run.finished:
                _state.run = None
    if _signal_received is not None:  # SIGTERM arrived while finishing: honour it now
        raise SystemExit(128 + _signal_received)


def configure_alert(**values: Any) -> None:
    """Alert configuration for runs started afterwards (the ``alerts`` section of the spec).

    Precedence: above ``ET_CONFIG``/``ET_ALERT_CONFIG`` and the environment, below
    ``et.init(spec=...)`` and ``et.init(alert=...)``. Calling it again merges deeply (rules
    and channels by name).

    Raises:
        SpecError: an unknown key or a bad value (with its path and a suggestion), a rule
            that does not compile, or a channel of an unknown type or with bad options
            (``alerts.channels.<name>.options.<key>``); nothing is kept from a call that
            raises.
    """
    from expr_tracker.build import check
    from expr_tracker.spec import merge, resolve

    with _lock:
        merged = merge(_state.configured_alert, values, at="alerts")
        # validated now, on its own (no environment, no files): errors name what was given
        check(resolve(None, configure_alert=merged, environ={}))
        _state.configured_alert = merged


def add_alert_rule(rule: Any, **overrides: Any) -> Any:
    """Register an alert rule on the current run; returns the registered ``AlertRule``.

    ``rule``: a DSL string (``"zscore(loss[50]) > 4 => error: spike"``), an ``M`` builder
    expression, a dict/YAML entry (``{name, condition, level, ...}``) or an ``AlertRule``;
    ``overrides`` set rule options (``level``, ``for_steps``, ``channels`` ...).

    Raises:
        RuleError: syntax, unknown function, arity or window errors (at registration).
        NoActiveRunError: no run, or alerts are disabled for it (``alerts.enabled: false``).
    """
    return current_run().add_rule(rule, **overrides)


def alert(
    title: str,
    text: str = "",
    level: str = "warning",
    channels: Any = None,
    tags: Any = (),
    fields: Mapping[str, Any] | None = None,
    **extra: Any,
) -> bool:
    """Send an alert now through the run's channels (or, without a run, through the
    channels configured by ``configure_alert``/``ET_ALERT_CONFIG``/the environment).

    Never raises. ``level``: debug|info|warning|error|critical (aliases warn, err, fatal,
    crit); ``channels``: names or types to use (None routes by level and tags); ``tags``:
    routing tags; ``fields``: name -> value; ``extra``: ``subtitle``, ``traceback``,
    ``mentions``, ``link``, ``dedup_key``, ``step``, ``source`` (``backends=`` is the old
    name of ``channels``). Returns True when some channel took the message (with
    ``async_send: false``: delivered it). See ``expr_tracker.alerts.delivery.alert``.
    """
    from expr_tracker.alerts.delivery import alert as _alert

    return _alert(title, text, level, channels, tags, fields, **extra)


def register_backend(kind: str, cls: type) -> type:
    """Register an alert channel class under ``kind`` (usable as ``type: kind`` in a spec).

    ``cls`` needs ``send(message, timeout)``; returns ``cls``. Raises ``TypeError`` for a
    class without ``send`` and ``ValueError`` for a bad ``kind``.
    """
    from expr_tracker.alerts.delivery.channels import register_backend as _register

    return _register(kind, cls)


#: the same function under the name our code uses for alert destinations
register_channel = register_backend


# ---------------------------------------------------------------------- process hooks


def _excepthook(etype: type[BaseException], value: BaseException, tb: Any) -> None:
    run = _state.run
    if run is not None and not run.forked and run.exception is None:
        run.exception = (etype, value, tb)
    if run is not None and not run.forked and not run.finished and not _interactive():
        # the process is about to exit and the exit hook to finish the run: a second
        # Ctrl-C from here on must not cut that short (see _at_exit)
        _hold_sigint()
    hook = _prev_excepthook or sys.__excepthook__
    hook(etype, value, tb)


def _interactive() -> bool:
    return bool(sys.flags.interactive) or hasattr(sys, "ps1")


#: attempts of the at-exit finish: an interrupted stage is redone by the next one
_EXIT_ATTEMPTS = 100
_sigint_prev: Any = None  # the SIGINT handler _hold_sigint replaced (None: not held)
_sigints_at_exit = 0  # SIGINTs that arrived while the exit hook finished the run


def _sigint_at_exit(signum: int, frame: Any) -> None:
    global _sigints_at_exit
    _sigints_at_exit += 1  # the process is exiting: the run is finished first


def _hold_sigint() -> None:
    """Make SIGINT a no-op (counted) until :func:`_release_sigint`: on the main thread only,
    and only while the exit hook finishes the run (the program is exiting anyway)."""
    global _sigint_prev
    if _sigint_prev is not None or threading.current_thread() is not threading.main_thread():
        return
    try:
        prev = signal.getsignal(signal.SIGINT)
        if prev is None:  # installed from C: we could not put it back
            return
        _sigint_prev = prev
        signal.signal(signal.SIGINT, _sigint_at_exit)
    except (ValueError, OSError, TypeError):  # pragma: no cover - no signals here
        pass


def _release_sigint() -> None:
    global _sigint_prev
    prev = _sigint_prev
    if prev is None:
        return
    try:
        signal.signal(signal.SIGINT, prev)
    except (ValueError, OSError, TypeError):  # pragma: no cover
        pass
    _sigint_prev = None


def _at_exit() -> None:
    """Finish the run at interpreter exit. Nobody is left to call it again, so it must
    complete: SIGINT is held off meanwhile, and a stage interrupted anyway (a
    ``KeyboardInterrupt`` or ``SystemExit`` raised inside it) is redone by the next
    attempt (``Run.finish`` resumes at the interrupted stage)."""
    try:
        _hold_sigint()
        for _attempt in range(_EXIT_ATTEMPTS):
            try:
                _finish_at_exit()
                return
            except Exception:  # noqa: BLE001 - nothing may fail at interpreter exit
                _logger.exception("expr_tracker: finishing the run at exit failed")
                return
            except BaseException:  # noqa: BLE001 - interrupted: resume the stage
                continue
        _logger.error("expr_tracker: finishing the run at exit was interrupted too often")
    finally:
        _release_sigint()


def _finish_at_exit() -> None:
    run = _state.run
    if run is None or run.forked or run.finished:
        return
    if run.exception is None and getattr(sys, "last_type", None) is not None:
        run.exception = (sys.last_type, sys.last_value, sys.last_traceback)
    exit_code = None
    if _signal_received is not None:
        run.info_record["signal"] = signal.Signals(_signal_received).name
        exit_code = 128 + _signal_received
    run.finish(exit_code=exit_code)


_signal_received: int | None = None


def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM (how SLURM and Kubernetes stop a job): finish the run, exit 128 + signum.

    The handler only raises ``SystemExit``; the run is finished by the exit hook once the
    stack has unwound (so no lock held by the interrupted code is ever re-entered), and the
    process exits with 143 as if killed by the signal.
    """
    global _signal_received
    run = _state.run
    if run is not None and not run.forked and (run.finishing or run.finished):
        # finishing now (et.finish() or the exit hook): let it complete, so the data
        # and run.json reach the disk; the process then exits with 128 + signum
        if _signal_received is None:
            _signal_received = signum
        return
    if run is None or run.forked:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _signal_received = signum
    raise SystemExit(128 + signum)


def _finish_at_process_exit() -> None:
    """In a ``multiprocessing`` child (a DataLoader worker), finish the run when the process
    exits: such children leave through ``os._exit``, which skips ``atexit``, but
    ``multiprocessing`` runs its finalizers first."""
    mp = sys.modules.get("multiprocessing")
    if mp is None or mp.parent_process() is None:
        return
    from multiprocessing import util

    util.Finalize(None, _at_exit, exitpriority=10)


def _install_hooks() -> None:
    global _hooks_installed, _prev_excepthook
    if _hooks_installed:
        return
    _hooks_installed = True
    _prev_excepthook = sys.excepthook
    sys.excepthook = _excepthook
    atexit.register(_at_exit)
    # SIGTERM: only where nobody else handles it (a framework's own handler wins)
    if threading.current_thread() is threading.main_thread():
        try:
            if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _on_sigterm)
        except (ValueError, OSError):  # pragma: no cover - no signals here
            pass
