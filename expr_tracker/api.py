"""Module-level functions over the current run: ``et.init``, ``et.log``, ``et.finish`` ...

The current run is a process-wide singleton behind a lock (shared by every thread, unlike
the span nesting stack, which is per thread and per asyncio task). A forked child that
inherited it gets :class:`~expr_tracker.errors.ForkedRunError` on use and may start its own
run with ``et.init``. The hooks that finish the runs still open when the process ends
(exception, ``sys.exit``, SIGTERM, interpreter exit) are :mod:`expr_tracker.process_exit`'s;
starting a run installs them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from expr_tracker import _current as _state
from expr_tracker import process_exit
from expr_tracker._current import FORK_MESSAGE
from expr_tracker.errors import (
    ForkedRunError,
    RunAlreadyActiveError,
)
from expr_tracker.history.live import current_run, no_run_error
from expr_tracker.history.live import history as history  # et.history, re-exported
from expr_tracker.runs import Run, wandb_data_arg
from expr_tracker.runsummary import Summary

_lock = threading.Lock()


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
            rank of one ``torchrun`` launch). An existing run started with the same
            ``config`` is resumed, one with another config makes this run ``<name>-2``
            (``-3`` ...), either with one line on stderr; ``resume="must"`` continues it
            whatever the config, ``resume="never"`` always starts a new run
            (docs/streams.md, "Run identity"). In a process forked from one with an active run (a DataLoader
            worker) that names no run but a stream of its own, ``project``, ``name`` and
            the run directory default to the parent's run: ``et.init(stream="data0")``
            joins it.
        spec: a run spec: a YAML/JSON/TOML path, a dict, or an OmegaConf DictConfig (e.g.
            ``cfg.tracker`` under Hydra; interpolations are resolved).
        config: the run's configuration (hyper-parameters), saved as ``config.json``; any
            mapping, an OmegaConf container, a dataclass or a pydantic model. The spec's own
            node in it (``config=cfg`` with ``spec=cfg.tracker``, whatever its key) is left
            out: it is the spec, in ``spec.json`` (docs/hydra.md).
        **kwargs: any spec field by its flat keyword name (``dir``, ``run_dir``, ``stream``,
            ``resume``, ``step_policy``, ``cache_bytes``, ``buffer_size``, ``spans``,
            ``span_metrics``, ``alert_rules``, ``entity``, ``job_type``, ``mode`` ...); see
            ``docs/configuration.md``. wandb's keywords are accepted too
            (``expr_tracker.wandb_compat``, docs/coming-from-wandb.md): ``id`` (the run's
            name), ``mode="disabled"`` (a no-op run), ``reinit`` (True: finish the current
            run first; ``"create_new"``: an independent run; ``"return_previous"``),
            ``resume=True|"auto"``, ``allow_val_change``, ``config_include_keys``,
            ``config_exclude_keys``; the rest (``settings``, ``save_code`` ...) are
            ignored with one warning each. ``backends`` may also hold objects with
            ``init``/``log``/``finish`` (added to the backends the spec names;
            docs/mirrors.md).

    Sources, later wins: defaults < webhook environment variables < ``ET_ALERT_CONFIG`` <
    ``ET_CONFIG`` < ``et.configure_alert()`` < ``spec`` < keyword arguments.

    Raises:
        RunAlreadyActiveError: a run is active in this process (call ``et.finish()`` first,
            or pass ``reinit``).
        SpecError: the spec is invalid (every problem listed, with its path and source).
        ResumeError: ``resume="must"`` found no run to continue (or ``resume="never"`` an
            existing one in a folder given by ``run_dir=``/``id=``).
        RunLockedError: another live process writes the same stream and rank (nothing of
            its files was read or touched).
        TypeError: an object in ``backends`` lacks ``init``/``log``/``finish``.
    """
    from expr_tracker.spec.sources import config_without_spec
    from expr_tracker.wandb_compat import wandb_init_call

    # the spec's own node (cfg.tracker in cfg) is the spec, not a hyper-parameter
    call = wandb_init_call(project, name, config_without_spec(config, spec), kwargs)
    if call.reinit == "create_new":
        return _independent_run(spec, call)
    with _lock:
        cur = _state.run
        parent = None
        if cur is not None:
            if cur.forked:
                parent = cur
                _state.run = None  # inherited from the parent: drop it without touching its locks
            elif not cur.finished:
                if call.reinit == "return_previous":
                    return cur
                if call.reinit != "finish_previous":
                    raise RunAlreadyActiveError(
                        f"a run is already active ({cur.project}/{cur.name}); call "
                        "et.finish() before et.init() again (or pass reinit=True to finish it "
                        "first, reinit='create_new' for an independent run)"
                    )
                cur.finish()
                _state.run = None
        given = call.given
        if "alert_rules" in given:
            given["alert_rules"] = _rules_as_data(given["alert_rules"])
        objects = _backend_objects(given)  # objects with init/log/finish: not spec data
        run = _resolve_and_build(spec, given, parent, backend_objects=objects, pinned=call.pinned)
        if call.allow_val_change:
            run.config.allow_changes()
        _state.run = run
        process_exit.install()
    return run


def _resolve_and_build(
    spec: Any,
    given: dict[str, Any],
    parent: Run | None = None,
    *,
    independent: bool = False,
    backend_objects: Any = (),
    pinned: bool = False,
) -> Run:
    """Resolve the spec from its sources and build the run (under ``_lock``); ``pinned``:
    wandb's ``id=`` fixes the run's name (docs/streams.md, "Run identity")."""
    from expr_tracker.assemble import build
    from expr_tracker.spec import SpecError, resolve

    alert = _state.configured_alert or None
    resolved = resolve(spec, kwargs=given, configure_alert=alert, quick=True)
    if parent is not None and _joins_parent(resolved, parent):
        given.update(project=parent.project, name=parent.name, run_dir=str(parent.dir))
        resolved = resolve(spec, kwargs=given, configure_alert=alert, quick=True)
    try:
        return build(
            resolved, independent=independent, backend_objects=backend_objects, pinned=pinned
        )
    except SpecError as exc:
        raise _with_config_keys(exc, spec) from None


def _independent_run(spec: Any, call: Any) -> Run:
    """An independent run (``et.Run(...)``, ``et.init(reinit="create_new")``): built like
    the current one, never made current; its span recorder is not the active one."""
    given = call.given
    if "alert_rules" in given:
        given["alert_rules"] = _rules_as_data(given["alert_rules"])
    objects = _backend_objects(given)  # objects with init/log/finish: not spec data
    with _lock:  # resolve + build serialised with et.init
        run = _resolve_and_build(
            spec, given, independent=True, backend_objects=objects, pinned=call.pinned
        )
        if call.allow_val_change:
            run.config.allow_changes()
        process_exit.add_independent_run(run)
        process_exit.install()
    return run


def _new_run(project: str | None, name: str | None, kwargs: dict[str, Any]) -> Run:
    """``et.Run(project, name, **kwargs)`` (registered in ``_current.new_run``)."""
    from expr_tracker.spec.sources import config_without_spec
    from expr_tracker.wandb_compat import wandb_init_call

    kwargs = dict(kwargs)
    spec = kwargs.pop("spec", None)
    config = config_without_spec(kwargs.pop("config", None), spec)
    kwargs.pop("reinit", None)  # an independent run replaces nothing
    return _independent_run(spec, wandb_init_call(project, name, config, kwargs))


def _end_run(run: Run, exception: BaseException | None) -> None:
    """The end of ``with et.init(...) as run:`` (registered in ``_current.end_run``)."""
    if run is _state.run:
        _finish_current(run, exception=exception)
    else:
        run.finish(exception=exception)


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


def log(
    metrics: Mapping[str, Any] | None = None,
    step: int | None = None,
    commit: bool | None = None,
    *,
    data: Mapping[str, Any] | None = None,
) -> int:
    """Log metrics into the current step (docs/logging.md "The commit table", as wandb's).

    ``log(d)`` merges ``d`` into the open row and commits it (the step advances);
    ``commit=False`` only merges; ``step=N`` opens step N (committing the previous one) and
    merges without committing unless ``commit=True``. Values: numbers, bools, strings, None,
    NumPy and torch scalars/arrays, datetimes, paths, enums, dataclasses, pydantic models;
    anything else is written as its ``repr`` with one warning. ``data=`` is wandb's name of
    the first argument (``et.log(data={...}, step=3)``); give one of the two.

    Returns the step the metrics landed on (-1 when dropped, e.g. a backward step).

    Raises:
        NoActiveRunError: no run is active.
        TypeError: ``metrics`` is not a mapping, or both ``metrics`` and ``data`` are given.
        ForkedRunError: this is a forked child that inherited the run.
    """
    run = _state.run
    if run is None:
        raise no_run_error()
    if data is not None:  # wandb's keyword: off the common path
        metrics = wandb_data_arg(metrics, data)
    return run.ingest(metrics, step, commit)


def log_artifact(
    artifact_or_path: Any,
    name: str | None = None,
    type: str | None = None,  # noqa: A002 - wandb's keyword
    aliases: Any = None,
    metadata: Mapping[str, Any] | None = None,
    mode: str | None = None,
) -> Any:
    """Store an artifact as the next version of ``name`` in ``<dir>/<project>/artifacts/``
    and record it in the run's ``artifacts.jsonl`` (docs/artifacts.md).

    ``artifact_or_path``: an ``et.Artifact``, or a file or directory path (an artifact named
    after the path's last part, type ``dataset``). ``name``/``type`` override the artifact's;
    ``aliases``: a list of strings (``latest`` always follows the newest version);
    ``metadata``: merged over the artifact's. Identical contents (the same digest) return
    the existing version, with the aliases moved onto it. The first version is ``v0`` (as in
    wandb); a store whose first version is ``v1`` goes on from its highest.

    ``mode``: ``"copy"`` or ``"link"`` for this call (None: the run's ``artifacts.mode``,
    ``copy`` by default). ``copy`` stores read-only copies (a reflink clone where the file
    system has one, so it costs no data), so saving the source again in place
    (``torch.save`` to the same path) never changes a logged version. ``link`` hard-links
    instead: no copy, but an in-place rewrite of the source then changes the stored files;
    that is detected, never handed out: a later ``use_artifact``/``get_path``/``dir``/
    ``download`` raises ``ArtifactCorruptedError`` (docs/artifacts.md "Link or copy").

    Returns the ``ArtifactVersion`` (``name``, ``version`` int, ``digest``, ``type``,
    ``aliases``, ``metadata``, ``run``, ``path``, ``dir``, ``files()``, ``get_path()``,
    ``download()``); an ``et.Artifact`` passed in is resolved to it too (``artifact.version``,
    ``artifact.digest`` ... work afterwards).

    Raises:
        NoActiveRunError: no run is active.
        ValueError: a ``mode`` other than ``copy`` or ``link`` (nothing read).
        ArtifactNameError: a bad name, type, file name or alias (it says what is valid).
        ArtifactError: an empty artifact, an unreadable source, a store that cannot be
            written (read-only, full disk): nothing is published then.
    """
    run = _state.run
    if run is None:
        raise no_run_error()
    return run.log_artifact(artifact_or_path, name, type, aliases, metadata, mode)


def use_artifact(artifact: Any, type: str | None = None) -> Any:  # noqa: A002
    """A stored version of the current project's artifact, recorded as used by the run.

    ``artifact``: ``"name"`` or ``"name:latest"`` (the newest), ``"name:v0"`` (the first),
    ``"name:v3"``, ``"name:<alias>"``; or an object, returned itself once resolved: an
    ``ArtifactVersion`` of this project (refreshed: its aliases as they are now; the store
    must still hold its digest), or an ``et.Artifact`` (the version ``log_artifact`` made of
    it, else the newest version of its name holding its contents, every file hashed; it then
    answers ``version``, ``digest``, ``dir``, ``get_path()`` ...). ``type``: the type it must
    have. The manifest is checked, and the stored files cheaply (regular files inside the
    version directory, sizes; a file whose modification time changed, or with none recorded,
    is re-hashed, and a hard-linked one also when its change time did);
    ``version.verify()`` re-hashes everything.

    Raises:
        NoActiveRunError: no run is active.
        ArtifactNotFoundError: no such artifact, version or alias, or none holding the
            object's contents (also a ``FileNotFoundError``).
        ArtifactTypeError: the version's type is not ``type``.
        ArtifactCorruptedError: a stored file is missing or changed since it was logged, or
            the store was tampered with (a manifest that is not valid, a file outside the
            version directory); the message names the file or entry.
    """
    run = _state.run
    if run is None:
        raise no_run_error()
    return run.use_artifact(artifact, type)


def define_metric(
    name: str,
    step_metric: str | None = None,
    summary: str | None = None,
    hidden: bool | None = None,
    goal: str | None = None,
    step_sync: bool | None = None,
    overwrite: bool | None = None,
    **kwargs: Any,
) -> Any:
    """``define_metric`` on the current run: see :meth:`Run.define_metric`.

    Raises:
        NoActiveRunError: no run is active.
        ValueError / TypeError: a bad name or value.
    """
    return current_run().define_metric(
        name, step_metric, summary, hidden, goal, step_sync, overwrite, **kwargs
    )


def mark_preempting() -> None:
    """Mark the current run's attempt as being preempted: see :meth:`Run.mark_preempting`
    (wandb's ``wandb.mark_preempting()``); the attempt ends as ``preempted``.

    Raises:
        NoActiveRunError: no run is active.
    """
    current_run().mark_preempting()


def should_stop() -> bool:
    """True once an alert rule with an action fired in the current run (``=> stop: ...``
    or ``=> prune: ...``; docs/alerts.md "Actions"): end the training loop at the next step
    boundary, e.g. ``for batch in loader: ...; et.log(m); if et.should_stop(): break``.

    The rules run when a step is committed, so the answer changes at a ``log()`` that
    commits a step, and stays True for the rest of the run. False when no run is active.
    The request is ``et.run.stop_request`` (action, rule, step, message).
    """
    run = _state.run
    return run is not None and run.should_stop()


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


def finish(exit_code: int | None = None, quiet: bool | None = None) -> None:
    """Commit the open row, flush everything and close the run. Idempotent.

    Interrupted (Ctrl-C, SIGTERM), it can be called again: it completes what was left
    and the run stays the current one until then (the exit hook completes it otherwise).
    A call from a second thread waits for the first to complete.

    Order: the open row is committed (so alert rules see it), then spans, the alert engine
    and delivery (drained within its deadline) close, then the history is flushed and
    closed, ``summary.json`` and ``run.json`` written. A non-zero ``exit_code`` marks the
    run ``failed`` in ``run.json``. ``quiet`` (wandb's) is accepted; nothing is printed at
    the end of a run anyway.

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
    _finish_current(run, exit_code, quiet=quiet)


def _finish_current(
    run: Run,
    exit_code: int | None = None,
    exception: BaseException | None = None,
    quiet: bool | None = None,
) -> None:
    try:
        run.finish(exit_code=exit_code, exception=exception, quiet=quiet)
    finally:
        # an interrupted finish() keeps the run current: calling et.finish() again (or the
        # exit hook) completes it, and et.init() refuses to start another meanwhile
        with _lock:
            if _state.run is run and run.finished:
                _state.run = None
    signum = process_exit.signal_received()
    if signum is not None:  # SIGTERM arrived while finishing: honour it now
        raise SystemExit(128 + signum)


def configure_alert(config: Any = None, /, **values: Any) -> None:
    """Alert configuration for runs started afterwards (the ``alerts`` section of the spec).

    ``config``: an ``et.AlertConfig`` or a mapping of the section; ``values``: its keys
    (``channels``, ``policy``, ``rules``, ``enabled``, ...), applied on top of ``config``.
    Models (``et.AlertConfig``, ``et.ChannelConfig``, ``et.WebhookPolicy``) stand for the
    fields set on them, so ``et.configure_alert(cfg)`` and ``et.configure_alert(**cfg)``
    are the same, and unset defaults leave lower sources alone.

    Precedence: above ``ET_CONFIG``/``ET_ALERT_CONFIG`` and the environment, below
    ``et.init(spec=...)`` and ``et.init(alert=...)``. Calling it again merges deeply (rules
    and channels by name).

    Raises:
        SpecError: an unknown key or a bad value (with its path and a suggestion), a rule
            that does not compile, or a channel of an unknown type or with bad options
            (``alerts.channels.<name>.options.<key>``); nothing is kept from a call that
            raises.
    """
    from expr_tracker.assemble import check
    from expr_tracker.spec import merge, resolve
    from expr_tracker.spec.plain import alerts_data

    given = alerts_data(values)
    if config is not None:
        base = alerts_data(config)
        if not isinstance(base, Mapping):
            raise TypeError(
                f"configure_alert(config): expected an et.AlertConfig or a mapping of the "
                f"alerts section, got {type(config).__name__}"
            )
        given = merge(base, given, at="alerts")
    with _lock:
        merged = merge(_state.configured_alert, given, at="alerts")
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


def list_alert_rules() -> list[Any]:
    """The current run's alert rules: a list of ``et.AlertRule`` (frozen; ``name``,
    ``condition``, ``source``, ``level``, ``for_steps``, ``channels``, ...), in registration
    order (the spec's rules first, then ``add_alert_rule``'s).

    Returns ``[]`` when no run is active or alerts are disabled for it (like reading a
    setting, it never raises for that). Each rule's live state (``ok``/``pending``/
    ``firing``), evaluations and fires are in ``et.info()["alerts"]["rules"][rule.name]``.

    Raises:
        ForkedRunError: this is a forked child that inherited the run.
    """
    run = _state.run
    if run is None:
        return []
    if run.forked:
        raise ForkedRunError(FORK_MESSAGE)
    return run.alert_rules()


def remove_alert_rule(name: Any) -> Any:
    """Remove an alert rule from the current run; returns the removed ``et.AlertRule``
    (``et.add_alert_rule(it)`` registers it again, with a fresh state).

    ``name``: the rule's name, or the ``AlertRule`` that ``add_alert_rule``/
    ``list_alert_rules`` returned. From the next committed row on the rule is not
    evaluated; an evaluation in progress on another thread completes first. Its pending or
    firing state is dropped; ``alerts.jsonl`` records a ``removed`` transition, and no
    channel is notified (the condition did not recover, so no ``resolved`` notice).
    Alerts it raised before are still delivered.

    Raises:
        KeyError: no rule of that name on the run (the message lists the registered
            names, with a close match).
        NoActiveRunError: no run is active.
        ForkedRunError: this is a forked child that inherited the run.
    """
    return current_run().remove_rule(name)


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
    crit; any case) or an ``et.AlertLevel``; ``channels``: names or types to use (None
    routes by level and tags); ``tags``: routing tags; ``fields``: name -> value;
    ``extra``: ``subtitle``, ``traceback``, ``mentions``, ``link``, ``dedup_key``, ``step``,
    ``source`` (``backends=`` is the old name of ``channels``). Returns True when some channel took the message (with
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


# modules below api reach these through the leaf _current: et.Run(...) and the end of a
# `with` block (runs.py), et.history(stream=) (history), the run-less et.alert (alerts/)
def _check_stream(stream: Any) -> None:
    """``et.history(stream=...)``'s check (registered in ``_current.check_stream``)."""
    from expr_tracker.spec.resolve import check_stream

    check_stream(stream, "history")


def _standalone_dispatcher() -> Any:
    """The run-less ``et.alert`` dispatcher (registered in ``_current.standalone_dispatcher``;
    assemble/ imported on the first run-less alert, not at ``import expr_tracker``)."""
    from expr_tracker.assemble.delivery import standalone_dispatcher

    return standalone_dispatcher()


_state.new_run = _new_run
_state.standalone_dispatcher = _standalone_dispatcher
_state.check_stream = _check_stream
_state.end_run = _end_run
