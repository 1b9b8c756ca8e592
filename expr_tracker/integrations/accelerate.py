"""Hugging Face Accelerate: ``Accelerator(log_with=ExprTrackerTracker(...))`` logs into a run.

``ExprTrackerTracker`` is an ``accelerate.tracking.GeneralTracker`` that maps Accelerate's
tracker hooks onto the run API and nothing else (docs/integrations.md, "Accelerate"):

- ``accelerator.init_trackers(project_name, config=...)`` -> :meth:`ExprTrackerTracker.start`
  (``et.init`` with the tracker's arguments, or joins the current run) and
  :meth:`~ExprTrackerTracker.store_init_configuration` (``run.config.update``);
- ``accelerator.log(values, step=...)`` -> :meth:`~ExprTrackerTracker.log` (``run.log`` at
  Accelerate's step; without one, the run's own next step);
- ``accelerator.end_training()`` -> :meth:`~ExprTrackerTracker.finish` (finishes the run it
  started, never one it joined).

Accelerate runs ``init_trackers`` and ``log`` on the main process only, so the other
processes start no run. Importing this module imports ``accelerate`` (an ``ImportError``
naming the extra when it is missing) and registers the tracker under its name, so
``Accelerator(log_with="expr_tracker")`` works too where Accelerate has
``accelerate.tracking.register_tracker_class``.
"""

from __future__ import annotations

import operator
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


class ExprTrackerTracker(GeneralTracker):
    """An Accelerate tracker writing to an expr_tracker run.

    ``Accelerator(log_with=ExprTrackerTracker(project="demo", spec="tracker.yaml", lr=...))``
    (an instance: Accelerate hands it neither ``init_trackers``' ``project_name`` nor its
    ``init_kwargs``, so give them here), or, by name, ``Accelerator(log_with="expr_tracker")``
    after importing this module: Accelerate then builds the tracker in ``init_trackers`` as
    ``ExprTrackerTracker(project_name, **init_kwargs["expr_tracker"])``.

    Args:
        project, name: the run's project and name, as for ``et.init`` (``name`` defaults to a
            timestamp plus a random suffix, the same on every rank of one launch).
        spec: a run spec: a YAML/JSON/TOML path, a dict or an OmegaConf DictConfig (spans,
            alert rules, channels ...), as for ``et.init``.
        config: a starting configuration, saved with the run (``init_trackers``' ``config``
            is added to it).
        **init_kwargs: any other ``et.init`` keyword (``dir``, ``resume``, ``mode``,
            ``alert_rules``, ``tags`` ...), passed to ``et.init`` unchecked until the run
            starts.

    The run starts in ``init_trackers`` (:meth:`start`), not here: Accelerate builds its
    process state first. When a run is already active there, the tracker joins it (its own
    ``project``/``name``/``spec``/keywords are then unused, with one warning; ``config`` is
    added to the run's) and ``end_training()`` leaves it open for the code that started it.

    Attributes:
        name: ``"expr_tracker"``: the key of ``init_kwargs``/``log_kwargs`` and of
            ``accelerator.get_tracker``.
        tracker: the :class:`~expr_tracker.Run` (None before ``init_trackers`` and on the
            processes other than the main one).
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
        # not ``self.name``: that is the tracker's name, which Accelerate looks trackers up by
        self._project = project
        self._run_name = name
        self._spec = spec
        self._config = config
        self._init_kwargs = init_kwargs
        self._run: Any = None
        self._owned = False  # True: started here, so finished at end_training()
        self._elsewhere = False  # True: not the main process, no run by design
        self._warner = Warner()

    @property
    def tracker(self) -> Any:
        """The :class:`~expr_tracker.Run` written to (None before :meth:`start` and on the
        processes other than the main one); after ``end_training()`` the finished run."""
        return self._run

    def start(self) -> None:
        """Start the run (``et.init`` with this tracker's arguments) or join the current one.

        Called by ``accelerator.init_trackers`` on the main process; on any other process it
        does nothing (``main_process_only``). A second call while the run is open does
        nothing; one after :meth:`finish` starts the next run.

        Raises:
            SpecError, ResumeError, RunLockedError: as ``et.init`` does, for a bad spec or
                keyword, a ``resume`` the runs on disk forbid, or a run another process writes.
        """
        if self._run is not None and not self._run.finished:
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
            self._join(current)
            return
        self._run = api.init(
            self._project,
            self._run_name,
            spec=self._spec,
            config=self._config,
            **self._init_kwargs,
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
                "(finish the current run before init_trackers() for a run of the tracker's own)",
                run.project,
                run.name,
                ", ".join(unused),
            )
        self._run = run
        self._owned = False
        if self._config is not None:
            run.config.update(self._config)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Add ``values`` (``init_trackers``' ``config``: a mapping of hyper-parameters) to the
        run's config (``config.json``), as ``run.config.update(values)``.

        Raises:
            ConfigChangeError: a key already in the config with a different value (a resumed
                or joined run; pass ``allow_val_change=True`` to the tracker to allow it).
            TypeError: ``values`` is not a mapping, namespace, dataclass or pydantic model.
        """
        if self._run is not None:
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
        row is committed; ``run.json`` says ``finished``); a joined run is only flushed and
        stays open. Safe to call twice and on processes without a run."""
        run = self._run
        if run is None or run.finished:
            return
        if not self._owned:
            try:
                run.flush()
            except Exception as exc:  # noqa: BLE001 - the run is the user's; leave it be
                self._warner.warn("flush", "expr_tracker: flushing the joined run failed: %s", exc)
            return
        if api.get_run() is run:
            api.finish()  # also stops it being the current run
        else:
            run.finish()


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
