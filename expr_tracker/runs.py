"""Run: what :func:`expr_tracker.assemble.build` made, and the fan-out of committed rows.

A run owns, per producer (stream and rank), the :class:`HistoryStore` and its writer, the
summary, and whatever the spec enabled (span recorder, alert engine). A committed row
reaches every sink in :attr:`HistoryStore.sinks` (summary, alert engine, backends), outside
the store lock. ``finish()`` commits the open row first (alerts are evaluated at commit),
then drains and closes everything, and records the final status in ``run.json``.
"""

from __future__ import annotations

import logging
import numbers
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from expr_tracker import _current, process_exit
from expr_tracker._current import FORK_MESSAGE, fork_generation
from expr_tracker._warn import Warner
from expr_tracker.errors import ExprTrackerError, NoActiveRunError
from expr_tracker.history.metricdefs import MetricDef
from expr_tracker.history.runinfo import close_life, write_run_info
from expr_tracker.history.store import HistoryStore
from expr_tracker.runconfig import RunConfig
from expr_tracker.runsummary import Summary as Summary  # the run's summary, public here too

log = logging.getLogger("expr_tracker")


def _exit_code_arg(exit_code: Any) -> int | None:
    """``finish(exit_code=)``: an integer (0: success) or None.

    Raises:
        TypeError: another type (a string, a float, a bool), naming the value.
    """
    if exit_code is None:
        return None
    if isinstance(exit_code, bool) or not isinstance(exit_code, numbers.Integral):
        raise TypeError(
            f"finish(exit_code={exit_code!r}): exit_code must be an int (0 for success, "
            "non-zero marks the run failed) or None"
        )
    return int(exit_code)


def wandb_data_arg(metrics: Any, data: Any) -> Any:
    """``log(data=...)``, wandb's name of ``log``'s first argument: the mapping to log
    (``et.log`` and ``Run.log``; docs/coming-from-wandb.md).

    Raises:
        TypeError: ``metrics`` was given as well (naming both).
    """
    if metrics is not None:
        raise TypeError(
            "log() got both metrics and data=: data is wandb's name of the same argument; "
            "give one of them (et.log({...}) or et.log(data={...}))"
        )
    return data


def _backend_object(backend: Any) -> Any:
    """What ``run.backends`` shows of a mirror's backend: the object given to ``et.init``
    (an adapted one carries it in ``obj``), the built-in backend, or None (not installed)."""
    return getattr(backend, "obj", backend)


def _unknown_rule_message(name: Any, known: list[str], *, alerts_on: bool) -> str:
    import difflib

    if not alerts_on:
        return f"no alert rule {name!r}: alerts are disabled for this run (alerts.enabled: false)"
    if not known:
        return f"no alert rule {name!r}: this run has no alert rules"
    close = difflib.get_close_matches(str(name), known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"no alert rule {name!r}{hint}; registered: {', '.join(repr(k) for k in known)}"


@dataclass(frozen=True)
class StopRequest:
    """What a rule with an action asked for (docs/alerts.md "Actions"): ``action``
    (``stop`` or ``prune``), the ``rule``'s name, the ``step`` it fired at and its
    rendered ``message``. ``run.stop_request``; ``run.json`` holds it as ``stop_request``."""

    action: str
    rule: str
    step: int | None
    message: str

    def to_record(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "rule": self.rule,
            "step": self.step,
            "message": self.message,
        }


def _optuna_pruned() -> type[BaseException] | None:
    """``optuna.TrialPruned`` when this thread runs inside an Optuna objective (a frame of
    ``Study.optimize``'s ``_run_trial`` on the stack), else None. Optuna is never imported
    here: a process that did not import it runs no objective."""
    optuna = sys.modules.get("optuna")
    if optuna is None:
        return None
    frame: Any = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_run_trial" and frame.f_globals.get("__name__") == (
            "optuna.study._optimize"
        ):
            pruned = getattr(optuna, "TrialPruned", None)
            return pruned if isinstance(pruned, type) else None
        frame = frame.f_back
    return None


#: serialises the deferred alert builds (``Run._build_alerts``): a rule added from one
#: thread and an alert sent from another build one engine
_ALERTS_BUILD = threading.RLock()
#: one build of a run's deferred ``artifacts`` at a time (``Run.artifacts``)
_ARTIFACTS_BUILD = threading.Lock()


class Run:
    """One tracked run of this process (one stream, one rank).

    ``et.init(...)`` returns the current run; ``et.Run(project=..., **init keywords)``
    builds an independent one (not the current run: its own files, lock, summary and
    config; ``et.span``/``et.alert`` keep going to the current run). ``with et.init(...)
    as run:`` finishes the run when the block ends (``failed``, with the exception
    recorded, when it raises).

    Attributes:
        project, name, stream, rank: identity; ``id`` is the name (the run directory's).
        dir: the run directory (``Path``).
        spec: the validated, frozen ``RunSpec`` (a run started from a plain spec builds it
            on first access: Pydantic is not imported at start, docs/architecture.md
            "Cold start").
        history: the :class:`HistoryStore` (``run.history.flush()`` waits for the write).
        summary: the :class:`Summary`.
        config: the :class:`~expr_tracker.runconfig.RunConfig` (what ``config.json`` holds).
        spans: the span recorder, or None when spans are disabled.
        alerts: the alert engine, or None when no rule is registered.
        artifacts: what ``log_artifact``/``use_artifact`` delegate to (set by build).
        step, tags, notes, group, entity, job_type, url, start_time, resumed: see the
            properties.
    """

    def __new__(cls, project: str | None = None, name: str | None = None, **kwargs: Any) -> Run:
        # et.Run(...) builds through the factory api registers (spec resolved, then assemble/);
        # build itself makes its runs with Run._assemble, which skips this
        factory = _current.new_run
        if factory is None:  # pragma: no cover - expr_tracker/__init__ imports api
            raise ExprTrackerError("import expr_tracker before creating a Run")
        return factory(project, name, kwargs)

    def __init__(self, project: str | None = None, name: str | None = None, **kwargs: Any):
        """An independent run: ``et.Run(project="p", name="eval", config={...})``.

        Takes the keywords of ``et.init`` (spec fields and the wandb ones). The run is not
        the current one (``et.run``/``et.log`` do not see it): call ``run.log``,
        ``run.finish`` (or use ``with``). It is finished at process exit if still open.

        Raises:
            SpecError, ResumeError, RunLockedError: as ``et.init`` (a second run of the
                same name, stream and rank in this process is refused by the lock).
        """
        # everything was done by __new__ (the factory returned an assembled run)

    def __reduce_ex__(self, protocol: Any) -> Any:
        # copy/pickle would call Run.__new__, which builds a new run: refuse instead
        raise TypeError(
            "a Run cannot be copied or pickled (it owns open files and a lock); pass "
            "run.dir, run.name or run.config.as_dict() instead"
        )

    @classmethod
    def _assemble(cls, **parts: Any) -> Run:
        """A run from the parts assemble/ made (the composition root's constructor)."""
        self = object.__new__(cls)
        self._setup(**parts)
        return self

    def _setup(
        self,
        *,
        spec: Any,
        resolved: Any,
        run_dir: Path,
        stream: str | None,
        rank: int,
        store: HistoryStore,
        summary: Summary,
        config: RunConfig,
        info: dict[str, Any],
        info_path: Path | None,
        warner: Warner,
        started_mono: float | None = None,
    ) -> None:
        self._spec = spec
        self.resolved = resolved
        self.dir = run_dir
        self.project = spec.project
        self._name: str = spec.name
        self.stream = stream
        self.rank = rank
        self.history = store
        self.summary = summary
        self.config = config
        self.info_record = info
        self._info_path = info_path
        self.warner = warner
        self.spans: Any = None
        self._alerts: Any = None
        self._dispatcher: Any = None
        #: builds the alert engine and its delivery on first need (a run started with no
        #: rule: ``assemble.build``); None once built or when there is nothing to build
        self._alerts_factory: Callable[[], None] | None = None
        self._artifacts_obj: Any = None  # expr_tracker.artifacts.RunArtifacts (artifacts)
        #: builds ``artifacts`` on first access (``assemble.build``); None once built
        self._artifacts_factory: Callable[[], Any] | None = None
        #: the mirrors (``backends.mirror.Mirror``), attached by build (``run.backends``)
        self.mirrors: list[Any] = []
        self.system: Any = None  # the SystemSampler of this host (docs/system.md), or None
        self.sync: Any = None  # the BackgroundSync to a bucket (docs/team.md), or None
        self.media: Any = None  # the run folder's MediaStore (docs/media.md), or None
        self._closers: list[tuple[str, Callable[[], Any]]] = []
        self._late_closers: list[tuple[str, Callable[[], Any]]] = []
        # monotonic time at run.json's started_at: duration_s never follows wall-clock jumps
        self._started_mono = time.monotonic() if started_mono is None else started_mono
        self._stats: dict[str, Callable[[], Any]] = {}
        self._finished = False  # True once finish() completed
        self._finishing_thread: int | None = None
        self._finish_stage = 0  # the next stage of finish() to run (see _finish_stages)
        self._exit_code: int | None = None
        self._close_error = False
        self._finish_lock = threading.RLock()
        self._fork_gen = fork_generation()
        self.exception: tuple[type[BaseException], BaseException, Any] | None = None
        self._listeners: list[Callable[[str, dict[str, Any]], Any]] = []
        self.ingest = store.ingest
        self._stop_request: StopRequest | None = None  # set by a rule's action
        self.independent = False  # et.Run(...): not the current run
        config.connect(self.emit)
        self.quiet = False
        summary.on_assign = self._summary_assigned

    # ------------------------------------------------------------------ wandb-style identity

    @property
    def alerts(self) -> Any:
        """The alert engine, None when alerts are disabled. A run started with no rule
        builds it here on first need (``add_rule``, ``et.alert``, ``info()``), not at
        ``et.init`` (docs/architecture.md "Cold start")."""
        if self._alerts_factory is not None:
            self._build_alerts()
        return self._alerts

    @alerts.setter
    def alerts(self, engine: Any) -> None:
        if self._alerts_factory is not None:  # the deferred build first, as at the start
            self._build_alerts()
        self._alerts = engine

    @property
    def dispatcher(self) -> Any:
        """The alert delivery (``Dispatcher``), None when the run does not alert; built
        with :attr:`alerts`."""
        if self._alerts_factory is not None:
            self._build_alerts()
        return self._dispatcher

    @dispatcher.setter
    def dispatcher(self, dispatcher: Any) -> None:
        if self._alerts_factory is not None:  # the deferred build first, as at the start
            self._build_alerts()
        self._dispatcher = dispatcher

    @property
    def alerts_deferred(self) -> bool:
        """True while the alert engine and delivery wait for their first need
        (:meth:`defer_alerts`); a forked child never builds them."""
        return self._alerts_factory is not None

    @property
    def artifacts(self) -> Any:
        """The run's :class:`~expr_tracker.artifacts.RunArtifacts` (what ``log_artifact``
        and ``use_artifact`` delegate to), or None (a disabled run). Built on first access
        (:meth:`defer_artifacts`): a run that never logs an artifact never imports the
        artifact package (docs/architecture.md "Cold start")."""
        obj = self._artifacts_obj
        if obj is None and self._artifacts_factory is not None:
            with _ARTIFACTS_BUILD:
                obj = self._artifacts_obj
                factory = self._artifacts_factory
                if obj is None and factory is not None:
                    obj = self._artifacts_obj = factory()
                    self._artifacts_factory = None
        return obj

    @artifacts.setter
    def artifacts(self, value: Any) -> None:
        self._artifacts_obj = value
        self._artifacts_factory = None

    def defer_artifacts(self, build: Callable[[], Any]) -> None:
        """Have ``build()`` make :attr:`artifacts` on its first access, once
        (``assemble.build``)."""
        self._artifacts_factory = build

    def defer_alerts(self, build: Callable[[], None]) -> None:
        """Have ``build()`` (which sets :attr:`alerts` and :attr:`dispatcher`) run on the
        first need of either, at most once (``assemble.build``, a run with no rule)."""
        self._alerts_factory = build

    def _build_alerts(self) -> None:
        """Run the deferred alert build once (not in a forked child, nor once finishing);
        a failure leaves the run without alerts, with one warning: measuring never breaks
        the training loop."""
        with _ALERTS_BUILD:
            factory = self._alerts_factory
            if factory is None or self.forked or self._finished or self.finishing:
                return
            self._alerts_factory = None
            try:
                factory()
            except Exception as exc:  # noqa: BLE001
                self._alerts = self._dispatcher = None
                self.warner.warn(
                    ("alerts", type(exc).__name__),
                    "expr_tracker: the alert engine could not be built (%s: %s); the run "
                    "goes on without alerts",
                    type(exc).__name__,
                    exc,
                )

    @property
    def spec(self) -> Any:
        """The validated, frozen ``RunSpec``; built here on first access when the run
        started from a spec checked without Pydantic (``spec.quick.SpecView``)."""
        spec = self._spec
        materialize = getattr(type(spec), "materialize", None)
        if materialize is not None:
            spec = self._spec = materialize(spec)
        return spec

    @property
    def id(self) -> str:
        """The run's identifier: its name (the run directory's name); ``et.init(id=X)``
        continues the run named X."""
        return self._name

    @property
    def name(self) -> str:
        """The run's name: its identity and its directory's name (``runs/<project>/<name>``).

        Assigning (wandb's ``run.name = "..."``, a display name) keeps the identity — the
        run stays in its directory, ``run.name`` and ``run.id`` do not change, so
        ``et.init(id=run.id)`` still continues it — and records the value as
        ``display_name`` in ``run.json``, with one warning.
        """
        return self._name

    @name.setter
    def name(self, value: Any) -> None:
        if not isinstance(value, str):
            raise TypeError(f"run.name must be a string, got {type(value).__name__}")
        self.warner.warn(
            ("display_name",),
            "expr_tracker: run.name = %r: a run's name is its directory (%s) and stays %r; "
            "the value is recorded as display_name in run.json",
            value,
            self.dir,
            self._name,
        )
        self._set_info("display_name", value)

    @property
    def step(self) -> int:
        """The step the next plain ``log()`` writes (the open step)."""
        return self.history.open_step

    @property
    def entity(self) -> str | None:
        return self._spec.entity

    @property
    def job_type(self) -> str | None:
        return self._spec.job_type

    @property
    def group(self) -> str | None:
        return self._spec.group

    @property
    def tags(self) -> list[str]:
        """The run's tags, a list (a copy: ``run.tags.append(x)`` changes nothing; assign
        ``run.tags = [*run.tags, x]``, which rewrites ``run.json``)."""
        return list(self.info_record.get("tags") or ())

    @tags.setter
    def tags(self, value: Any) -> None:
        if isinstance(value, str) or not all(isinstance(t, str) for t in value):
            raise TypeError(f"tags must be a sequence of strings, got {value!r}")
        self._set_info("tags", list(value))

    @property
    def backends(self) -> dict[str, Any]:
        """The mirrors this run feeds on this rank, by name: ``{"wandb": <WandbBackend>,
        "PrintBackend": <your object>}`` (a copy). Names as in ``et.info()["backends"]``
        (``wandb``, ``trackio``, a backend object's ``name`` or class name; ``wandb#2`` for
        a second entry of one kind); values are the backend objects (a ``WandbBackend``'s
        ``run`` is the wandb run once it started; an object you passed is itself). ``{}``
        with no mirror, on a rank ``backend_on_rank`` leaves out, and for a backend whose
        library is missing the value is None (docs/mirrors.md)."""
        return {m.label: _backend_object(m.backend) for m in self.mirrors}

    @property
    def notes(self) -> str | None:
        """The run's notes; assigning a string rewrites ``run.json``."""
        return self.info_record.get("notes")

    @notes.setter
    def notes(self, value: str | None) -> None:
        if value is not None and not isinstance(value, str):
            raise TypeError(f"notes must be a string or None, got {type(value).__name__}")
        self._set_info("notes", value)

    @property
    def url(self) -> None:
        """Always None: runs are local files (their place is :attr:`dir`)."""
        return None

    @property
    def start_time(self) -> float:
        """When this attempt of the run started, epoch seconds (``run.json``'s
        ``started_at``)."""
        return float(self.info_record.get("started_at") or 0.0)

    @property
    def resumed(self) -> bool:
        """True when this attempt continues a run that existed on disk."""
        return "resumed_at_step" in self.info_record

    def mark_preempting(self) -> None:
        """Mark this attempt as being preempted (wandb's ``run.mark_preempting()``): call it
        when the scheduler announces the stop (SLURM's warning signal, a spot instance's
        notice), before saving a checkpoint.

        ``run.json`` gets ``preempting_at`` (epoch seconds) at once, and the attempt ends as
        ``preempted`` however it ends: ``finish()``, an exception, SIGTERM, or a kill that
        leaves no chance to finish (readers then report ``preempted`` instead of
        ``crashed``). The next ``et.init`` that continues the run says ``previous attempt:
        preempted`` and records it so in ``previous_attempts`` (docs/streams.md, "Run
        identity"). Marking again keeps the first time; a finished run is not changed.
        """
        if self._finished or self.info_record.get("preempting_at") is not None:
            return
        self._set_info("preempting_at", time.time())

    # ------------------------------------------------------------------ actions

    @property
    def stop_request(self) -> StopRequest | None:
        """What a rule with an action asked for (the first stop, or a prune), or None."""
        return self._stop_request

    def should_stop(self) -> bool:
        """True once a rule with an action (``=> stop: ...``, ``=> prune: ...``) fired: end
        the training loop at the next step boundary (docs/alerts.md "Actions"). Stays
        True for the rest of the run."""
        return self._stop_request is not None

    def take_action(self, event: Any) -> None:
        """The alert engine's ``on_action``: record what a firing rule with an action asks
        for (``run.json`` gets ``stop_request`` at once). A ``prune`` also makes the next
        ``log()`` inside an Optuna objective finish the run (``pruned``) and raise
        ``optuna.TrialPruned``. The first request is kept, except that a prune replaces a
        stop (the run ends ``pruned`` then)."""
        action = getattr(event, "action", None)
        if action not in ("stop", "prune") or self._finished:
            return
        current = self._stop_request
        if current is not None and not (current.action == "stop" and action == "prune"):
            return
        request = StopRequest(action, str(event.rule.name), event.step, str(event.message))
        self._stop_request = request
        self._set_info("stop_request", request.to_record())
        if action == "prune":
            self.ingest = self._ingest_then_prune

    def _ingest_then_prune(
        self, metrics: Any, step: int | None = None, commit: bool | None = None
    ) -> int:
        """``log()`` once a prune was requested: the values are recorded as always; inside
        an Optuna objective the run is then finished (``pruned``) and ``optuna.TrialPruned``
        raised, as ``trial.should_prune()`` would have the objective do."""
        landed = self.history.ingest(metrics, step, commit)
        pruned = _optuna_pruned()
        if pruned is not None and not self._finished:
            request = self._stop_request
            message = f"pruned by alert rule {request.rule!r}" if request else "pruned"
            if self is _current.run:
                end = _current.end_run
                if end is not None:
                    end(self, None)
                else:
                    self.finish()
            else:
                self.finish()
            raise pruned(f"{message} at step {request.step if request else None}")
        return landed

    @property
    def offline(self) -> bool:
        return True

    @property
    def disabled(self) -> bool:
        return False

    def _set_info(self, key: str, value: Any) -> None:
        self.info_record[key] = value
        if self._info_path is not None and not self._finished:
            try:
                write_run_info(self._info_path, self.info_record)
            except OSError as exc:
                self.warner.warn(
                    ("run.json",), "expr_tracker: cannot write %s (%s)", self._info_path, exc
                )

    def _summary_assigned(self, changes: dict[str, Any]) -> None:
        self.emit("summary", {"changes": changes})

    # ------------------------------------------------------------------ define_metric

    def define_metric(
        self,
        name: str,
        step_metric: str | None = None,
        summary: str | None = None,
        hidden: bool | None = None,
        goal: str | None = None,
        step_sync: bool | None = None,
        overwrite: bool | None = None,
        **ignored: Any,
    ) -> MetricDef:
        """Say how a metric is summarised and which metric is its x axis (wandb's
        ``define_metric``).

        Args:
            name: a metric name, or a glob (``"val/*"``, fnmatch rules; an exact definition
                wins over a glob, the latest glob over earlier ones).
            step_metric: the metric this one is plotted against (``"iter"``); recorded for
                readers: ``et.history(..., output_type="pandas", index=True)`` indexes by
                it, and mirrors pass it on.
            summary: ``"min"``, ``"max"``, ``"mean"``, ``"first"``, ``"last"``, ``"best"``
                (with ``goal``), ``"copy"`` (the plain last value, the default) or
                ``"none"`` (left out of the summary); a comma list gives several
                (``"min,max"``). ``summary.json`` then holds ``{"min": ..., "max": ...}``
                for the metric, aggregated over the numeric, finite values committed
                since the definition (a resumed run continues the saved aggregation).
                A value assigned to ``run.summary`` wins.
            hidden: recorded (mirrors hide it); goal: ``"minimize"``/``"maximize"``
                (``best``); step_sync: recorded (the x value is not filled in here: log
                it with the metric); overwrite: ``False`` keeps the earlier definition's
                values for arguments left None.

        Returns the definition in force. Emits the ``"define_metric"`` event.

        Raises:
            ValueError / TypeError: a bad name or value (naming what is valid).
        """
        if ignored:
            self.warner.warn(
                ("define_metric_kwargs", tuple(sorted(ignored))),
                "expr_tracker: define_metric(%s) is not used here; ignored",
                ", ".join(sorted(ignored)),
            )
        d = self.summary.define(
            name,
            step_metric=step_metric,
            summary=summary,
            hidden=hidden,
            goal=goal,
            step_sync=step_sync,
            overwrite=overwrite,
        )
        payload = d.to_json()
        del payload["step_sync"]
        self.emit("define_metric", payload)
        return d

    # ------------------------------------------------------------------ with

    def __enter__(self) -> Run:
        return self

    def __exit__(self, etype: Any, value: Any, tb: Any) -> None:
        end = _current.end_run
        if end is not None:
            end(self, value if isinstance(value, BaseException) else None)
        else:  # pragma: no cover - api registers end_run on import
            self.finish(exception=value if isinstance(value, BaseException) else None)

    # ------------------------------------------------------------------ use

    @property
    def forked(self) -> bool:
        """True in a forked child that inherited this run object."""
        return self._fork_gen != fork_generation()

    @property
    def finished(self) -> bool:
        """True once :meth:`finish` completed (everything closed, ``run.json`` written)."""
        return self._finished

    @property
    def finishing(self) -> bool:
        """True while :meth:`finish` runs (not after it was interrupted, nor once done)."""
        return self._finishing_thread is not None

    @property
    def exit_code(self) -> int | None:
        """The exit code the run ends with, for mirrors: the code given to ``finish()``,
        else 1 after an exception, else 0 once finishing (None before ``finish()``)."""
        if self._exit_code is not None:
            return self._exit_code
        if self.exception is not None:
            return 1
        return 0 if (self._finishing_thread is not None or self._finished) else None

    def log(
        self,
        metrics: dict[str, Any] | None = None,
        step: int | None = None,
        commit: bool | None = None,
        *,
        data: dict[str, Any] | None = None,
    ) -> int:
        """Log ``metrics`` (see :meth:`HistoryStore.ingest`); returns the step they landed on.
        ``data=`` is wandb's name of ``metrics`` (give one of the two, else ``TypeError``)."""
        if data is not None:
            metrics = wandb_data_arg(metrics, data)
        return self.ingest(metrics, step, commit)  # type: ignore[arg-type]

    def log_artifact(
        self,
        artifact_or_path: Any,
        name: str | None = None,
        type: str | None = None,  # noqa: A002 - wandb's keyword
        aliases: Any = None,
        metadata: dict[str, Any] | None = None,
        mode: str | None = None,
    ) -> Any:
        """Log an ``et.Artifact`` or a file/directory path as the next version of an
        artifact of this run's project; see :func:`expr_tracker.api.log_artifact`."""
        return self._artifacts().log_artifact(artifact_or_path, name, type, aliases, metadata, mode)

    def use_artifact(self, artifact: Any, type: str | None = None) -> Any:  # noqa: A002
        """A stored version (``"name"``, ``"name:v3"``, ``"name:<alias>"``; an
        ``ArtifactVersion`` or ``et.Artifact`` is returned itself, resolved), recorded as used
        by this run; see :func:`expr_tracker.api.use_artifact`."""
        return self._artifacts().use_artifact(artifact, type)

    def _artifacts(self) -> Any:
        if self.forked:
            from expr_tracker.errors import ForkedRunError

            raise ForkedRunError(FORK_MESSAGE)
        if self._finished or self.artifacts is None:
            why = "has finished" if self._finished else "has no artifact store"
            if not self._finished and self.disabled:
                why += " (mode='disabled' reads and writes no files)"
            raise NoActiveRunError(
                f"run {self.project}/{self.name} {why}; artifacts are logged and used by a "
                "live run (et.init)"
            )
        return self.artifacts

    def add_closer(self, name: str, fn: Callable[[], Any], *, late: bool = False) -> None:
        """Register ``fn`` to run at finish, in registration order.

        Closers run after the open row is committed and before the history is closed;
        ``late`` ones run after everything is on disk and ``run.json`` is written (alert
        delivery: its drain may wait on a slow endpoint, which must never hold the data).
        """
        (self._late_closers if late else self._closers).append((name, fn))

    def subscribe(self, fn: Callable[[str, dict[str, Any]], Any]) -> None:
        """Call ``fn(event, payload)`` for each run event other than rows (rows reach
        :attr:`HistoryStore.sinks`): ``"config"`` (the keys that changed), ``"summary"``
        (keys the user assigned), ``"define_metric"`` (one definition), ``"artifact"`` (one
        version logged or used). Mirrors subscribe here."""
        self._listeners.append(fn)

    def emit(self, event: str, payload: dict[str, Any]) -> None:
        """Hand ``payload`` to every subscriber; a subscriber that raises is logged once per
        event and never reaches the caller (measuring never breaks the training loop)."""
        for fn in list(self._listeners):
            try:
                fn(event, payload)
            except Exception as exc:  # noqa: BLE001
                self.warner.warn(
                    ("listener", event, type(exc).__name__),
                    "expr_tracker: a %s listener failed (%s: %s); ignored",
                    event,
                    type(exc).__name__,
                    exc,
                )

    def add_stats(self, name: str, fn: Callable[[], Any]) -> None:
        """Register a section of :meth:`info`."""
        self._stats[name] = fn

    def add_rule(self, rule: Any, **overrides: Any) -> Any:
        """Register an alert rule on this live run (``et.add_alert_rule``); returns the
        registered ``AlertRule``. The engine sees every row committed from now on.

        Raises:
            RuleError: the rule does not compile.
            ValueError: the rule reads the system sampler's rows (``stream: system``: those
                rules come from the spec, docs/system.md).
            NoActiveRunError: alerts are disabled for this run (``alerts.enabled: false``).
        """
        engine = self.alerts
        if engine is None:
            raise NoActiveRunError("alerts are disabled for this run (alerts.enabled: false)")
        stream = rule.get("stream") if isinstance(rule, dict) else getattr(rule, "stream", None)
        if stream is not None:
            raise ValueError(
                f"a rule with stream {stream!r} cannot be added to a live run: give it in the "
                "spec (alerts.rules) at et.init, where the system sampler's engine takes it "
                "(docs/system.md); et.add_alert_rule reads the run's own rows"
            )
        registered = engine.add_rule(rule, **overrides)
        sinks = self.history.sinks
        if engine.on_step not in sinks:
            sinks.append(engine.on_step)
        return registered

    def alert_rules(self) -> list[Any]:
        """The alert rules registered on this run (``AlertRule`` objects, in registration
        order); ``[]`` when alerts are disabled. Their state and counters are in
        ``info()["alerts"]["rules"][name]``."""
        engine = self.alerts
        return [] if engine is None else engine.rules

    def remove_rule(self, rule: Any) -> Any:
        """Unregister an alert rule (its name, or the ``AlertRule``) from the live engine
        (``et.remove_alert_rule``); returns the removed ``AlertRule``. Safe from any thread:
        an evaluation in progress completes first and no later row is evaluated against
        it; its pending/firing state is dropped and a ``removed`` transition is recorded in
        ``alerts.jsonl`` (no channel is notified).

        Raises:
            KeyError: no rule of that name (the message lists the registered ones, with a
                close match).
        """
        name = getattr(rule, "name", rule)
        engine = self.alerts
        removed = None if engine is None or not isinstance(name, str) else engine.remove_rule(name)
        if removed is None:
            known = [r.name for r in self.alert_rules()]
            raise KeyError(_unknown_rule_message(name, known, alerts_on=engine is not None))
        return removed

    def flush(self) -> None:
        """Write committed rows and completed span records to disk, and wait.

        The open row stays open (it is not committed).
        """
        self.history.flush()
        self.summary.save()

    def info(self) -> dict[str, Any]:
        """Everything countable about the run: history (with ``log_dir``, ``metrics_file``,
        ``last_step``), cache, writer, ``summary`` (a copy of :attr:`summary`), spans,
        alerts (each rule's ``unresolved_metrics``), artifacts (``root``), backends."""
        out: dict[str, Any] = {
            "project": self.project,
            "name": self.name,
            "stream": self.stream,
            "rank": self.rank,
            "dir": str(self.dir),
            "status": self.info_record.get("status"),
            "history": self.history.stats(),
            "summary": self.summary.to_dict(),
            "warnings": {str(k): v for k, v in self.warner.counts.items()},
        }
        if self._alerts_factory is not None:  # its "alerts" and "delivery" sections
            self._build_alerts()
        for name, fn in self._stats.items():
            try:
                out[name] = fn()
            except Exception as exc:  # noqa: BLE001
                out[name] = {"error": f"{type(exc).__name__}: {exc}"}
        return out

    # ------------------------------------------------------------------ finish

    def finish(
        self,
        exit_code: int | None = None,
        exception: BaseException | None = None,
        quiet: bool | None = None,
    ) -> None:
        """Commit the open row, drain and close everything, record the final status.

        ``quiet`` (wandb's) is accepted: a run prints no end-of-run summary here anyway.

        Idempotent, and resumable: each stage runs to completion once; an exception that
        interrupts one (Ctrl-C, SIGTERM's ``SystemExit``) propagates, and the next call
        (``et.finish()`` again, or the exit hook) redoes that stage and completes the rest.
        A second thread calling it waits until the first completes. ``finished`` turns
        True, and ``run.json`` says ``finished``, only once the history writer is closed;
        ``exception`` (or a non-zero ``exit_code``, or a history that failed to close)
        marks the run ``failed``.

        Raises:
            TypeError: ``exit_code`` is not an int or None (nothing is finished then).
        """
        exit_code = _exit_code_arg(exit_code)
        if self.forked:
            from expr_tracker.errors import ForkedRunError

            raise ForkedRunError(FORK_MESSAGE)
        with self._finish_lock:  # re-entrant: a closer or sink calling finish() returns
            if self._finished or self._finishing_thread == threading.get_ident():
                return
            try:
                self._finishing_thread = threading.get_ident()
                if quiet is not None:
                    self.quiet = bool(quiet)
                if exception is not None:
                    self.exception = (type(exception), exception, exception.__traceback__)
                if exit_code is not None and self._exit_code is None:
                    self._exit_code = exit_code
                stages = self._finish_stages()
                while self._finish_stage < len(stages):
                    name, fn = stages[self._finish_stage]
                    try:
                        fn()
                    except Exception:  # noqa: BLE001 - finishing must always complete
                        log.exception("expr_tracker: %s at finish failed", name)
                        if name == "closing the history":
                            self._close_error = True
                    self._finish_stage += 1
                self._finished = True
            finally:
                self._finishing_thread = None
        process_exit.after_finish()  # a SIGTERM deferred while this ran exits now

    def _finish_stages(self) -> list[tuple[str, Callable[[], Any]]]:
        return [
            ("committing the open row", self.history.commit),
            *[(f"closing {name}", fn) for name, fn in self._closers],
            ("closing the history", self.history.close),
            ("saving the summary", self.summary.close),
            ("writing run.json", self._write_final_info),
            *[(f"closing {name}", fn) for name, fn in self._late_closers],
        ]

    def _write_final_info(self) -> None:
        info = self.info_record
        info["ended_at"] = time.time()
        info["duration_s"] = round(time.monotonic() - self._started_mono, 3)  # not wall time
        close_life(info)  # wall_duration_s, active_duration_s: over every attempt
        # over every attempt of the run, as `et runs` counts them (a resume continues at
        # the file's highest step + 1)
        resumed_at = int(info.get("resumed_at_step") or 0)
        info["steps"] = resumed_at + self.history.rows_committed
        last = (self.history.last_row or {}).get("_step")
        info["last_step"] = last if last is not None else (resumed_at - 1 if resumed_at else None)
        writer = self.history.writer
        exit_code = self._exit_code
        if self.exception is not None:
            etype, evalue, tb = self.exception
            info["status"] = "failed"
            info["exception"] = {
                "type": etype.__name__,
                "message": str(evalue),
                "traceback": "".join(traceback.format_exception(etype, evalue, tb))[-8000:],
            }
        elif exit_code not in (None, 0):
            info["status"] = "failed"
            info["exit_code"] = exit_code
        elif self._close_error or (writer is not None and not writer.closed):
            # never "finished" while the metrics file is still open
            info["status"] = "failed"
            info["error"] = "the history writer could not be closed (see the log)"
        else:
            info["status"] = "finished"
        request = self._stop_request
        if request is not None and request.action == "prune":
            # a pruned trial ends pruned, also when optuna.TrialPruned ended it
            if info["status"] == "finished" or (
                self.exception is not None and self.exception[0].__name__ == "TrialPruned"
            ):
                info["status"] = "pruned"
                info.pop("exception", None)
        if info.get("preempting_at") is not None:  # mark_preempting(): however it ended
            info["status"] = "preempted"
        try:
            write_run_info(self._info_path, info)  # type: ignore[arg-type]  # None: a DisabledRun
        except OSError as exc:
            log.warning("expr_tracker: cannot write %s (%s)", self._info_path, exc)

    def __repr__(self) -> str:
        return f"Run(project={self.project!r}, name={self.name!r}, dir={str(self.dir)!r})"


class DisabledRun(Run):
    """``mode="disabled"``: a run that writes nothing and creates no directory.

    ``log`` counts steps and returns them (nothing is kept: ``et.history()`` is empty),
    ``config`` and ``summary`` (and ``define_metric``) work in memory, ``finish`` only
    marks it finished; alert rules are not evaluated and ``et.alert`` sends nothing;
    ``log_artifact`` stores nothing (returns None), ``use_artifact`` raises
    ``NoActiveRunError`` (there is no store to read).
    ``dir`` is where the run would live (not created).
    """

    def _setup(self, **parts: Any) -> None:
        super()._setup(**parts)
        self._step_counter = 0
        self._count_lock = threading.Lock()
        self.ingest = self._ingest_nothing

    @property
    def disabled(self) -> bool:
        return True

    @property
    def step(self) -> int:
        return self._step_counter

    def _ingest_nothing(
        self, metrics: Any, step: int | None = None, commit: bool | None = None
    ) -> int:
        if not isinstance(metrics, Mapping):
            raise TypeError(
                f"log() takes a mapping of metric names to values, got {type(metrics).__name__}"
            )
        with self._count_lock:
            if type(step) is int and step > self._step_counter:
                self._step_counter = step
            landed = self._step_counter
            if commit or (commit is None and step is None):
                self._step_counter += 1
            return landed

    def log(
        self,
        metrics: Any = None,
        step: int | None = None,
        commit: bool | None = None,
        *,
        data: Any = None,
    ) -> int:
        if data is not None:
            metrics = wandb_data_arg(metrics, data)
        return self._ingest_nothing(metrics, step, commit)

    def add_rule(self, rule: Any, **overrides: Any) -> Any:
        """Nothing is evaluated in a disabled run; returns None."""
        return None

    def log_artifact(self, artifact_or_path: Any, *args: Any, **kwargs: Any) -> Any:
        """Nothing is stored in a disabled run (training code runs unchanged); returns None."""
        return None

    def flush(self) -> None:
        return None

    def finish(
        self,
        exit_code: int | None = None,
        exception: BaseException | None = None,
        quiet: bool | None = None,
    ) -> None:
        exit_code = _exit_code_arg(exit_code)
        if exit_code is not None:
            self._exit_code = exit_code
        self._finished = True
