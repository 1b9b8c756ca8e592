"""Hugging Face Accelerate: ``Accelerator(log_with=ExprTrackerTracker(...))`` logs into a run.

``ExprTrackerTracker`` is an ``accelerate.tracking.GeneralTracker`` that maps Accelerate's
tracker hooks onto the run API and nothing else (docs/integrations.md, "Accelerate"):

- ``accelerator.init_trackers(project_name, config=...)`` -> :meth:`ExprTrackerTracker.start`
  (joins the current run, or prepares the tracker's own) and
  :meth:`~ExprTrackerTracker.store_init_configuration`, which starts the tracker's run with
  that config given at init (``et.init(config=...)``: what decides whether a run of the same
  name is continued, docs/streams.md "Run identity"), or adds it to a joined run;
- ``accelerator.log(values, step=...)`` -> :meth:`~ExprTrackerTracker.log` (``run.log`` at
  Accelerate's step; without one, the run's own next step);
- ``accelerator.end_training()`` -> :meth:`~ExprTrackerTracker.finish` (finishes the run it
  started, never one it joined; ``failed``, with the exception, when called while one is
  being handled: in an ``except`` or ``finally`` block).

Accelerate runs ``init_trackers`` and ``log`` on the main process only, so the other
processes start no run. Importing this module imports ``accelerate`` (an ``ImportError``
naming the extra when it is missing) and registers the tracker under its name, so
``Accelerator(log_with="expr_tracker")`` works too where Accelerate has
``accelerate.tracking.register_tracker_class``; ``import expr_tracker`` imports this module
as soon as ``accelerate.tracking`` is loaded (``expr_tracker.integrations.autoload``), so the
name works without importing it here first.
"""

from __future__ import annotations

import operator
import sys
from typing import Any

try:
    from accelerate.tracking import GeneralTracker
except ImportError as exc:  # the framework is optional: name the extra that installs it
    raise ImportError(
        "expr_tracker.integrations.accelerate needs the accelerate package: "
        "pip install 'expr-tracker[accelerate]'"
    ) from exc

from expr_tracker import api
from expr_tracker._warn import Warner

__all__ = ["ExprTrackerTracker"]

#: ``et.init`` keywords that are wandb's (``et.init`` maps them) or hold objects: not spec
#: keywords, so not checked against the spec at ``start()``
_MAPPED_BY_INIT = frozenset(
    {
        "id",
        "mode",
        "resume",
        "reinit",
        "allow_val_change",
        "config_include_keys",
        "config_exclude_keys",
        "settings",
        "save_code",
        "anonymous",
        "sync_tensorboard",
        "tensorboard",
        "monitor_gym",
        "magic",
        "force",
        "fork_from",
        "resume_from",
        "backends",
    }
)


class ExprTrackerTracker(GeneralTracker):
    """An Accelerate tracker writing to an expr_tracker run.

    ``Accelerator(log_with=ExprTrackerTracker(project="demo", spec="tracker.yaml", lr=...))``
    (an instance: Accelerate hands it neither ``init_trackers``' ``project_name`` nor its
    ``init_kwargs``, so give them here), or, by name, ``Accelerator(log_with="expr_tracker")``
    once ``expr_tracker`` is imported (before or after accelerate): Accelerate then builds the
    tracker in ``init_trackers`` as ``ExprTrackerTracker(project_name,
    **init_kwargs["expr_tracker"])``.

    Args:
        project, name: the run's project and name, as for ``et.init`` (``name`` defaults to a
            timestamp plus a random suffix, the same on every rank of one launch).
            ``run_name=`` is taken for ``project``: Accelerate's own trackers call their first
            argument, ``init_trackers``' ``project_name``, ``run_name`` (and keep it as
            ``tracker.run_name``, as this one does).
        spec: a run spec: a YAML/JSON/TOML path, a dict or an OmegaConf DictConfig (spans,
            alert rules, channels ...), as for ``et.init``.
        config: a starting configuration, saved with the run (``init_trackers``' ``config``
            is added to it).
        **init_kwargs: any other ``et.init`` keyword (``dir``, ``resume``, ``mode``,
            ``alert_rules``, ``tags`` ...), passed to ``et.init`` unchecked until the run
            starts.

    The run starts in ``init_trackers``, not here: Accelerate builds its process state
    first. It is started with ``init_trackers``' ``config`` added to ``config`` (the config
    given at init, so a second launch under the same ``name`` with another config becomes
    ``<name>-2`` instead of continuing the first); without one, at :meth:`start`'s first
    use (a ``log``, ``tracker``). When a run is already active at ``init_trackers``, the
    tracker joins it unless it names a run of its own (``name``, ``id``, ``run_dir``): then
    it starts that run beside the current one (``et.Run``). A joined run's own
    ``project``/``spec``/keywords are unused, with one warning; ``config`` is added to the
    run's where it holds no value (never replacing one), and ``end_training()`` leaves it
    open for the code that started it.

    Attributes:
        name: ``"expr_tracker"``: the key of ``init_kwargs``/``log_kwargs`` and of
            ``accelerator.get_tracker``.
        tracker: the :class:`~expr_tracker.Run` (None before ``init_trackers`` and on the
            processes other than the main one).
        run_name: the project given (``project``, ``run_name`` or ``init_trackers``'
            ``project_name``), as Accelerate's own trackers keep it; None when none was.

    Raises:
        TypeError: ``project`` and ``run_name`` both given, and different.
    """

    name = "expr_tracker"
    requires_logging_directory = False
    main_process_only = True

    def __init__(
        self,
        project: str | None = None,
        name: str | None = None,
        *,
        spec: Any = None,
        config: Any = None,
        **init_kwargs: Any,
    ) -> None:
        super().__init__()
        run_name = init_kwargs.pop("run_name", None)
        if run_name is not None:  # Accelerate's name for the first argument: the project
            if project is not None and project != run_name:
                raise TypeError(
                    f"ExprTrackerTracker: project={project!r} and run_name={run_name!r}: "
                    "run_name is Accelerate's name for the project (init_trackers' "
                    "project_name); give one of them, and the run's own name as name="
                )
            project = run_name
        #: Accelerate's trackers keep their first argument (the project) as ``run_name``
        self.run_name = project
        # not ``self.name``: that is the tracker's name, which Accelerate looks trackers up by
        self._project = project
        self._run_name = name
        self._spec = spec
        self._config = config
        self._init_kwargs = init_kwargs
        self._run: Any = None
        self._owned = False  # True: started here, so finished at end_training()
        self._elsewhere = False  # True: not the main process, no run by design
        self._pending = False  # start() ran: the run starts with init_trackers' config
        self._independent = False  # a run of its own beside another current run
        self._warner = Warner()

    @property
    def tracker(self) -> Any:
        """The :class:`~expr_tracker.Run` written to (None before :meth:`start` and on the
        processes other than the main one); after ``end_training()`` the finished run."""
        if self._pending:
            self._open()
        return self._run

    def start(self) -> None:
        """Join the current run, or prepare this tracker's own (started by
        :meth:`store_init_configuration` with ``init_trackers``' config, or at first use).

        Called by ``accelerator.init_trackers`` on the main process; on any other process it
        does nothing (``main_process_only``). A second call while the run is open does
        nothing; one after :meth:`finish` starts the next run.

        Raises:
            SpecError: a bad spec or keyword (checked here; the run is not created yet).
            ResumeError, RunLockedError: as ``et.init`` does, when the run starts.
        """
        if self._pending or (self._run is not None and not self._run.finished):
            return
        if self.main_process_only and not _is_main_process():
            self._elsewhere = True
            return
        current = api.get_run()
        if (
            current is not None
            and not current.finished
            and not current.forked
            and not self._init_kwargs.get("reinit")
        ):
            if not self._names_another_run(current):
                self._join(current)
                return
            self._independent = True
        else:
            self._independent = False
        self._check()
        self._pending = True
        if _init_trackers_without_config(sys._getframe(1)):
            # no store_init_configuration will follow: start now, so that spans timed
            # before the first log() (the first step's) are recorded, not lost
            self._open()

    def _names_another_run(self, current: Any) -> bool:
        """The tracker was given a run of its own (``name``, ``id``, ``run_dir``) that is
        not ``current``."""
        kw = self._init_kwargs
        if kw.get("run_dir") is not None:
            from pathlib import Path

            return Path(kw["run_dir"]).expanduser().resolve() != Path(current.dir).resolve()
        name = kw.get("id") if kw.get("id") is not None else self._run_name
        if name is None:
            return False
        return name != current.name or (
            self._project is not None and self._project != current.project
        )

    def _check(self) -> None:
        """Validate the spec and keywords now, as ``et.init`` would (nothing is created)."""
        from expr_tracker.spec import resolve

        given = {k: v for k, v in self._init_kwargs.items() if k not in _MAPPED_BY_INIT}
        for key, value in (("project", self._project), ("name", self._run_name)):
            if value is not None:
                given[key] = value
        resolve(self._spec, kwargs=given)

    def _open(self, values: Any = None) -> None:
        """Start the tracker's own run (``et.init``), with ``values`` (``init_trackers``'
        config) added to the tracker's ``config`` as the config given at init."""
        self._pending = False
        config = self._config
        if values is not None:
            config = {**_as_mapping(self._config), **_as_mapping(values)}
        kwargs = dict(self._init_kwargs)
        if self._independent:
            kwargs["reinit"] = "create_new"
        self._run = api.init(
            self._project, self._run_name, spec=self._spec, config=config, **kwargs
        )
        self._owned = True

    def _join(self, run: Any) -> None:
        unused = [f"{key}={value!r}" for key, value in self._init_kwargs.items()]
        if self._spec is not None:
            unused.insert(0, "spec")
        if self._run_name is not None and self._run_name != run.name:
            unused.insert(0, f"name={self._run_name!r}")
        if self._project is not None and self._project != run.project:
            unused.insert(0, f"project={self._project!r}")
        if unused:
            self._warner.warn(
                "join",
                "expr_tracker: ExprTrackerTracker joins the current run %s/%s; not used: %s "
                "(finish the current run before init_trackers(), or give the tracker a name= "
                "of its own, for a run of the tracker's own)",
                run.project,
                run.name,
                ", ".join(unused),
            )
        self._run = run
        self._owned = False
        if self._config is not None:
            self._add_to_joined(self._config)

    def _add_to_joined(self, values: Any) -> None:
        """Add ``values`` to a joined run's config where it holds no value: the run is the
        user's, its values are never replaced (a differing one warns once)."""
        config = self._run.config
        given = _as_mapping(values)
        before = config.as_dict()
        config.setdefaults(given)
        after = config.as_dict()
        kept = [k for k in given if k in before and after.get(k) != _plain(given[k])]
        if kept:
            self._warner.warn(
                ("config_kept", self._run.name),
                "expr_tracker: the current run %s already holds %s in its config; kept (a "
                "joined run's config is never replaced: give the tracker a name= of its own "
                "for a run of its own)",
                self._run.name,
                ", ".join(kept),
            )

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """``init_trackers``' ``config`` (a mapping of hyper-parameters): the tracker's own run
        starts now with it as the config given at init (``config.json``); a joined run gets
        the keys it does not hold yet (its values are never replaced).

        Raises:
            TypeError: ``values`` is not a mapping, namespace, dataclass or pydantic model.
            ResumeError, RunLockedError: as ``et.init`` does, when the run starts.
        """
        if self._pending:
            self._open(values)
        elif self._run is not None and not self._owned:
            self._add_to_joined(values)
        elif self._run is not None:
            self._run.config.update(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log ``values`` (metric name -> number, string, tensor ...) at Accelerate's ``step``.

        ``step=N`` opens step ``N`` (committing the previous one) and merges ``values`` into
        it, so spans timed before this call land in row ``N``; ``step=None`` logs at the
        run's own next step and commits it. A backward step is dropped by the run with one
        warning. ``kwargs`` (``log_kwargs["expr_tracker"]``): ``commit`` (as ``et.log``); any
        other key is ignored with one warning. Measuring never breaks training: a failure
        here is logged once per cause and the call returns.
        """
        if self._pending:
            self._open()  # configuration errors raise, as they would at init_trackers
        run = self._run
        if run is None:
            if not self._elsewhere:
                self._warner.warn(
                    "not_started",
                    "expr_tracker: ExprTrackerTracker.log() before init_trackers(): dropped",
                )
            return
        commit = kwargs.pop("commit", None)
        if kwargs:
            self._warner.warn(
                ("log_kwargs", *sorted(kwargs)),
                "expr_tracker: ExprTrackerTracker.log() ignores %s (it takes commit=)",
                ", ".join(sorted(kwargs)),
            )
        if step is not None and type(step) is not int:
            try:  # a 0-d integer tensor or a NumPy integer
                step = operator.index(step)
            except TypeError:
                pass  # the run drops a bad step with one warning
        try:
            run.log(values, step, commit)
        except Exception as exc:  # noqa: BLE001 - measuring never breaks training
            self._warner.warn(
                ("log", type(exc).__name__),
                "expr_tracker: ExprTrackerTracker.log() failed, values dropped: %s: %s",
                type(exc).__name__,
                exc,
            )

    def finish(self) -> None:
        """At ``accelerator.end_training()``: finish the run this tracker started (the open
        row is committed; ``run.json`` says ``finished``, or ``failed`` with the exception
        when called while one is being handled: ``end_training()`` in an ``except`` or
        ``finally`` block); a joined run is only flushed and stays open. Safe to call twice
        and on processes without a run."""
        if self._pending:
            self._open()
        run = self._run
        if run is None or run.finished:
            return
        if not self._owned:
            try:
                run.flush()
            except Exception as exc:  # noqa: BLE001 - the run is the user's; leave it be
                self._warner.warn("flush", "expr_tracker: flushing the joined run failed: %s", exc)
            return
        exc = sys.exc_info()[1]
        if exc is not None:  # end_training() while the training's exception is handled
            run.finish(exception=exc)
        else:
            run.finish()
        if api.get_run() is run:
            api.finish()  # also stops it being the current run


def _as_mapping(value: Any) -> dict[str, Any]:
    """The top-level keys of a config (a mapping, ``argparse.Namespace``, dataclass or
    pydantic model), as ``run.config.update`` takes it.

    Raises:
        TypeError: another type.
    """
    import dataclasses
    from collections.abc import Mapping

    if value is None:
        return {}
    if isinstance(value, Mapping):
        return {str(k): value[k] for k in value}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return dict(value.model_dump())
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return {k: v for k, v in vars(value).items() if not k.startswith("_")}
    raise TypeError(
        f"a config must be a mapping, an argparse.Namespace, a dataclass or a pydantic model, "
        f"not {type(value).__name__}"
    )


def _plain(value: Any) -> Any:
    from expr_tracker.history.codec import normalize_value

    return normalize_value(value)


def _init_trackers_without_config(frame: Any) -> bool:
    """True when ``accelerator.init_trackers`` called :meth:`ExprTrackerTracker.start`
    (found on the stack from ``frame``) with no ``config``: Accelerate then never calls
    ``store_init_configuration``, so nothing is left to wait for."""
    for _ in range(4):
        if frame is None:
            return False
        if frame.f_code.co_name == "init_trackers" and "config" in frame.f_locals:
            return frame.f_locals["config"] is None
        frame = frame.f_back
    return False


def _is_main_process() -> bool:
    from accelerate.state import PartialState

    return PartialState().is_main_process


def _register() -> None:
    """``Accelerator(log_with="expr_tracker")``: Accelerate's public registry, where it has one
    (older versions take the instance only)."""
    try:
        from accelerate.tracking import register_tracker_class
    except ImportError:
        return
    register_tracker_class(ExprTrackerTracker)


_register()
