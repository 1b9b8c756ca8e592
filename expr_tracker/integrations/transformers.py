"""Hugging Face ``Trainer`` -> expr_tracker: :class:`ExprTrackerCallback` (docs/integrations.md).

.. code-block:: python

    from expr_tracker.integrations.transformers import ExprTrackerCallback

    args = TrainingArguments(output_dir="out", report_to="none", logging_steps=10)
    trainer = Trainer(model, args, ..., callbacks=[ExprTrackerCallback(project="sft")])
    trainer.train()

Importing this module imports ``transformers`` (``import expr_tracker`` never does); without
it the import raises ``ImportError`` naming ``pip install 'expr-tracker[transformers]'``.

What lands where:

- ``trainer.train()`` starts a run (``et.init(spec=..., **init_kwargs)``), or joins the current
  one when ``et.run`` is set and the callback names no run of its own (a joined run is the
  user's: the callback never finishes it, and never replaces its config). A callback given
  its own ``name=`` (``id=``, ``run_dir=``) while another run is current (a Trainer started
  inside another's training) gets a run of its own, not made current. It records
  ``{"args": TrainingArguments.to_dict(), "model": model.config.to_dict()}`` as the config
  (nested, so the Trainer's keys never collide with the user's; keys ending in ``_token``
  are left out): given to ``et.init`` for a run of its own, so a second launch under the
  same ``name`` with other arguments starts ``<name>-2`` instead of continuing the first
  (docs/streams.md, "Run identity"); added to a joined run. It finishes the run in
  ``on_train_end``.
- Every ``on_log`` row is logged at ``state.global_step`` under the Trainer's own names
  (``loss``, ``grad_norm``, ``learning_rate``, ``epoch``, ``eval_loss``, ``train_runtime``, ...:
  what ``trainer.state.log_history`` holds and the console prints; no ``train/`` prefix is
  added). The callback opens row ``global_step + 1`` when an optimizer step begins, so span
  time from the user's code (a collator, ``compute_loss``) and ``et.log(d, commit=False)``
  land on the step being trained; evaluation rows at the step of the training row merge into it.
- After training, ``trainer.evaluate()`` logs into the current run if there is one, else it
  reopens the callback's run (``resume="must"``, ``step_policy="allow"``, alert rules off:
  they watched training) and finishes it again in ``on_evaluate``: the row lands at ``global_step``, the step of the last training
  row, as a second line that readers merge by step (a key logged twice: the later value wins).
- A ``train()`` that raises never reaches ``on_train_end``: the callback's run is finished as
  ``failed`` with the exception as it propagates, whether or not the program catches it (the
  callback wraps the ``train`` of the Trainer it was given to, found when the Trainer is
  built; a callback added later with ``add_callback`` finishes the run as ``failed`` at the
  next ``train()`` or evaluation instead).
"""

from __future__ import annotations

import copy
import functools
import logging
import sys
import weakref
from collections.abc import Mapping
from os import PathLike
from types import FrameType
from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "expr_tracker.integrations.transformers needs Hugging Face transformers: "
        "pip install 'expr-tracker[transformers]'"
    ) from exc

from expr_tracker import _current, api
from expr_tracker._warn import Warner

__all__ = ["ExprTrackerCallback"]

log = logging.getLogger("expr_tracker")

#: ``et.init`` keywords that wandb's ``init`` takes and ``et.init`` maps itself (values such as
#: ``mode="online"`` or ``resume=True`` are not spec values yet): not checked at construction
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
        "backends",  # may hold objects with init/log/finish (not spec data)
    }
)
#: keywords that name a run of the callback's own: with one, the callback never joins
#: another current run
_OWN_RUN = ("name", "id", "run_dir")
#: keywords the callback sets itself when it reopens its run after training
_REOPEN_DROPS = frozenset(
    {
        "project",
        "name",
        "id",
        "dir",
        "run_dir",
        "resume",
        "config",
        "reinit",
        "alert",
        "alerts",
        "alert_rules",
    }
)


def _is_secret(key: Any) -> bool:
    """``hub_token``, ``push_to_hub_token``, ``token``: left out of the recorded config."""
    return isinstance(key, str) and (key == "token" or key.endswith("_token"))


def _public(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if not _is_secret(k)}


class ExprTrackerCallback(TrainerCallback):
    """A ``transformers.TrainerCallback`` that tracks ``Trainer`` runs with expr_tracker.

    Pass it to the Trainer with ``report_to="none"`` (or any other reporters alongside):
    ``Trainer(..., callbacks=[ExprTrackerCallback(project="sft", spec="tracker.yaml")])``.

    Args:
        project: the run's project (``<dir>/<project>/<name>/``); None: the spec's or default.
        spec: a run spec: a YAML/JSON/TOML path, a dict or an OmegaConf DictConfig (e.g.
            ``cfg.tracker`` under Hydra), exactly as ``et.init(spec=...)`` takes it.
        log_config: record the ``TrainingArguments`` and the model config into ``et.config``
            as ``{"args": {...}, "model": {...}}`` (default True; keys ending in ``_token``
            are left out; a later ``train()`` in the same run overwrites them).
        rank_zero_only: only the process with ``state.is_world_process_zero`` tracks (the
            default); False: every process starts its own run, which ``et.init`` names per
            rank (``metrics.rankN.jsonl``, docs/streams.md).
        **init_kwargs: any ``et.init`` keyword (``name``, ``dir``, ``tags``, ``config``,
            ``alert_rules``, ``spans``, ``step_policy``, wandb's ``id``/``mode`` ...), passed on
            as given; they win over the spec, as keyword arguments always do.

    Raises (at construction, so the script fails before the model trains):
        TypeError: ``spec`` is no path, dict or DictConfig; ``project`` is not a string;
            ``log_config``/``rank_zero_only`` is not a bool.
        SpecError: the spec or a spec keyword is invalid (a missing file, a bad value, an
            unknown key), each problem named with its path and what is valid. Keywords that
            only ``et.init`` maps (wandb's) are checked by ``et.init`` when training starts.

    Attributes:
        run: the run being tracked (None before the first ``train()``); stays set, finished,
            after training.
    """

    def __init__(
        self,
        project: str | None = None,
        *,
        spec: Any = None,
        log_config: bool = True,
        rank_zero_only: bool = True,
        **init_kwargs: Any,
    ) -> None:
        if project is not None and not isinstance(project, str):
            raise TypeError(
                f"ExprTrackerCallback(project=...): expected a string or None, got "
                f"{type(project).__name__}"
            )
        for flag, value in (("log_config", log_config), ("rank_zero_only", rank_zero_only)):
            if not isinstance(value, bool):
                raise TypeError(
                    f"ExprTrackerCallback({flag}=...): expected True or False, got {value!r}"
                )
        if project is not None:
            init_kwargs["project"] = project
        self.spec = _plain_spec(spec)
        self.init_kwargs = init_kwargs
        self.log_config = log_config
        self.rank_zero_only = rank_zero_only
        self._check()
        self.run: Any = None
        self._owned = False  # started by this callback (so it finishes it)
        self._training = False  # between on_train_begin and on_train_end
        self._in_step = False  # between on_step_begin and on_step_end
        self._close_after_eval = False  # a run (re)opened for an evaluate() after training
        self._ahead_until = 0  # the run's step when training began (rows behind it: dropped)
        self._watched: Any = weakref.WeakSet()  # Trainers whose train() reports exceptions
        # each model's config as first seen, before training changed it (see _model_config)
        self._model_configs: Any = weakref.WeakKeyDictionary()
        self._warner = Warner(log)

    def _check(self) -> None:
        """Validate the spec and the spec keywords now, with the same errors ``et.init``
        gives (nothing is created)."""
        from expr_tracker.spec import resolve

        given = {k: v for k, v in self.init_kwargs.items() if k not in _MAPPED_BY_INIT}
        resolve(self.spec, kwargs=given)

    def __repr__(self) -> str:
        return f"ExprTrackerCallback(project={self.init_kwargs.get('project')!r})"

    # ------------------------------------------------------------------ helpers

    def _tracks(self, state: Any) -> bool:
        return not self.rank_zero_only or bool(getattr(state, "is_world_process_zero", True))

    def _guarded(self, what: str, fn: Any, *args: Any) -> Any:
        """Run ``fn``; a failure warns once per hook and training goes on."""
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - measuring never breaks training
            if type(exc).__name__ == "TrialPruned":  # a => prune rule in an Optuna objective
                raise
            self._warner.warn(
                ("hook", what),
                "expr_tracker: ExprTrackerCallback %s failed (%s: %s); training goes on "
                "(warned once)",
                what,
                type(exc).__name__,
                exc,
            )
            return None

    def _log(self, metrics: dict[str, Any], step: int) -> None:
        run = self.run
        if run is None or run.finished:
            return
        if run.log(metrics, step=step) < 0 and metrics and step >= self._ahead_until:
            self._warner.warn(
                ("row_dropped", run.name),
                "expr_tracker: the Trainer's row at step %d was dropped: run %s is already "
                "at step %d (a plain et.log() inside the training loop commits the step "
                "early: log with commit=False there). Warned once.",
                step,
                run.name,
                run.step,
            )

    @staticmethod
    def _current() -> Any:
        run = _current.run
        return None if run is None or run.finished or run.forked else run

    def _start(self, args: Any, state: Any, model: Any) -> None:
        """Join the current run, or start one (``et.init``: configuration errors raise)."""
        run = self.run
        if run is not None and self._owned and not run.finished:
            # the previous train() raised before on_train_end and the program went on
            self._guarded("finishing the failed run", self._finish, 1)
        current = self._current()
        given = False  # the Trainer's config went to et.init as the config given at init
        if current is not None and not self._names_another_run(current):
            self.run, self._owned = current, False
        else:
            kwargs = dict(self.init_kwargs)
            config = self._init_config(args, model)
            if config is not None:
                kwargs["config"] = config
                given = True
            if current is not None:  # a run of its own beside the current one (nested)
                kwargs["reinit"] = "create_new"
            self.run, self._owned = api.init(spec=self.spec, **kwargs), True
        if self.log_config and not given:
            self._guarded("recording the config", self._record_config, args, model)
        run = self.run
        self._ahead_until = run.step  # rows behind it are dropped: explained here, once
        if self._owned and run.resumed and run.step > state.global_step + 1:
            # the same name again (a rerun, or a resume from an earlier checkpoint)
            self._warner.warn(
                ("resumed_ahead", run.name),
                "expr_tracker: run %s already holds steps up to %d (et.init continues a run "
                "of the same name), ahead of the Trainer's global_step %d: the Trainer's rows "
                "for steps %d-%d are dropped and the earlier attempt's kept. Give the run a new "
                "name (or resume='never'), resume training from the checkpoint of that step "
                "(trainer.train(resume_from_checkpoint=...)), or pass step_policy='allow' to "
                "log those steps again",
                run.name,
                run.step - 1,
                state.global_step,
                state.global_step + 1,
                run.step - 1,
            )
        if not self._owned and run.step > state.global_step + 1:
            self._warner.warn(
                ("joined_ahead", run.name),
                "expr_tracker: the current run %s is at step %d, ahead of the Trainer's "
                "global_step %d: rows at earlier steps are dropped under "
                "step_policy='monotonic' (log your own metrics with commit=False, or start "
                "the run with step_policy='allow')",
                run.name,
                run.step,
                state.global_step,
            )

    def _names_another_run(self, current: Any) -> bool:
        """The callback was given a run of its own (``name``/``id``/``run_dir``) that is not
        ``current``."""
        kw = self.init_kwargs
        if not any(kw.get(k) is not None for k in _OWN_RUN):
            return False
        if kw.get("run_dir") is not None:
            from pathlib import Path

            return Path(kw["run_dir"]).expanduser().resolve() != Path(current.dir).resolve()
        name = kw.get("id") if kw.get("id") is not None else kw.get("name")
        project = kw.get("project")
        return name != current.name or (project is not None and project != current.project)

    def _init_config(self, args: Any, model: Any) -> dict[str, Any] | None:
        """The config given to ``et.init`` for the callback's own run: the user's ``config``
        (a mapping) with the Trainer's; None where it is recorded after init instead
        (``log_config=False``, a ``config`` of another type, nothing to record)."""
        user = self.init_kwargs.get("config")
        if not self.log_config or not (user is None or isinstance(user, Mapping)):
            return None
        data = self._guarded("reading the config", self._trainer_config, args, model)
        return {**(user or {}), **data} if data else None

    def _trainer_config(self, args: Any, model: Any) -> dict[str, Any]:
        """``{"args": TrainingArguments.to_dict(), "model": model.config.to_dict()}``, keys
        ending in ``_token`` left out; the model's as first seen (:meth:`_model_config`)."""
        data: dict[str, Any] = {}
        to_dict = getattr(args, "to_dict", None)
        if callable(to_dict):
            data["args"] = _public(to_dict())
        model_config = self._model_config(model)
        if model_config is not None:
            data["model"] = model_config
        return data

    def _model_config(self, model: Any) -> dict[str, Any] | None:
        """``model.config.to_dict()`` as the callback first saw it. Training changes it:
        the first forward of a ``...ForSequenceClassification`` sets ``problem_type``. So
        read later (an ``evaluate()`` reopening the run, a ``train()`` again after a caught
        failure) it would differ from the config the run was started with, and be taken
        for another experiment: a change recorded, a new ``<name>-2`` run. Reading it once
        per model keeps every start of this callback comparing what the user configured."""
        try:
            return copy.deepcopy(self._model_configs[model])
        except (KeyError, TypeError):  # not seen yet; or a model without weak references
            pass
        to_dict = getattr(getattr(model, "config", None), "to_dict", None)
        if not callable(to_dict):
            return None
        data = _public(to_dict())
        try:
            self._model_configs[model] = copy.deepcopy(data)
        except TypeError:
            pass
        return data

    def _record_config(self, args: Any, model: Any) -> None:
        data = self._trainer_config(args, model)
        if not data:
            return
        config = self.run.config
        if self._owned:
            config.update(data, allow_val_change=True)
            return
        # a joined run is the user's: its config is never replaced (a second Trainer joining
        # it records its arguments only where the run holds none)
        kept = [k for k in data if k in config and config[k] != _plain(data[k])]
        config.setdefaults(data)
        if kept:
            self._warner.warn(
                ("config_kept", self.run.name),
                "expr_tracker: the current run %s already holds another Trainer's %s in its "
                "config; kept (a joined run's config is never replaced: give this callback "
                "its own name= for a run of its own)",
                self.run.name,
                " and ".join(kept),
            )

    def _finish(self, exit_code: int | None = None, exception: BaseException | None = None) -> None:
        run = self.run
        if exception is not None:
            run.finish(exception=exception)
        else:
            run.finish(exit_code=exit_code)
        if api.get_run() is run:
            api.finish()  # no longer the current run

    # ------------------------------------------------------------------ a raising train()

    def _watch(self) -> None:
        """Wrap the ``train`` of the Trainer calling this hook (found on the stack), so an
        exception out of it finishes the callback's run as ``failed`` with it, even when
        the program catches it."""
        trainer = _calling_trainer()
        if trainer is None or trainer in self._watched:
            return
        self._watched.add(trainer)
        train = trainer.train
        ref = weakref.ref(self)

        @functools.wraps(train)
        def watched_train(*args: Any, **kwargs: Any) -> Any:
            try:
                return train(*args, **kwargs)
            except BaseException as exc:
                callback = ref()
                if callback is not None:
                    callback._train_raised(exc)
                raise

        trainer.train = watched_train

    def _train_raised(self, exc: BaseException) -> None:
        if not self._training:
            return  # before on_train_begin, or after on_train_end
        self._training = self._in_step = False
        run = self.run
        if run is not None and self._owned and not run.finished:
            self._guarded("finishing the failed run", self._finish, 1, exc)

    def _reopen(self, args: Any, model: Any) -> None:
        """The callback's run, finished at the end of training, opened again for an
        evaluation after it: the same directory, steps accepted at or behind the last, the
        same config given at init."""
        run = self.run
        kwargs = {k: v for k, v in self.init_kwargs.items() if k not in _REOPEN_DROPS}
        config = self._init_config(args, model)
        if config is not None:
            kwargs["config"] = config
        elif self.init_kwargs.get("config") is not None:
            kwargs["config"] = self.init_kwargs["config"]
        kwargs.update(
            project=run.project,
            name=run.name,
            run_dir=str(run.dir),
            resume="must",
            step_policy="allow",
            # the rules watched training; in this attempt a rule on a training metric
            # would only report that metric as never logged
            alerts={"enabled": False},
        )
        self.run = api.init(spec=self.spec, **kwargs)
        self._owned = True

    def _outside_training(self, args: Any, state: Any, model: Any) -> None:
        """``on_log`` outside ``train()`` (``trainer.evaluate()``): pick the run to log into."""
        current = self._current()
        if current is not None:
            if current is not self.run:
                self.run, self._owned = current, False
            return
        run = self.run
        if run is not None and self._owned and run.finished and not run.disabled:
            self._reopen(args, model)
        elif run is None or run.finished:
            self._start(args, state, model)
        self._close_after_eval = self._owned

    # ------------------------------------------------------------------ hooks

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The Trainer being built: watch its ``train()`` for exceptions."""
        self._guarded("watching train()", self._watch)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Start (or join) the run and record the config. Errors from ``et.init`` (a bad
        spec, a locked run, ``resume`` forbidding what is on disk) raise: nothing has
        trained yet."""
        if not self._tracks(state):
            return
        self._guarded("watching train()", self._watch)  # added after the Trainer was built
        self._training = True
        self._close_after_eval = False
        self._start(args, state, kwargs.get("model"))

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Open row ``global_step + 1``: the step this optimizer step produces."""
        if self._training:
            self._in_step = True
            self._guarded("opening the step", self._log, {}, state.global_step + 1)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Place the span time of the step just trained in its row (``global_step``); stop
        training when a rule's action asked to (docs/alerts.md "Actions")."""
        if self._training:
            self._in_step = False
            self._guarded("closing the step", self._log, {}, state.global_step)
            self._stop_if_asked(control)

    def _stop_if_asked(self, control: Any) -> None:
        """``control.should_training_stop`` once a ``=> stop``/``=> prune`` rule fired."""
        run = self.run
        if run is not None and run.should_stop():
            control.should_training_stop = True

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """An evaluation or prediction while an optimizer step is open: the ``train()`` that
        opened it raised and the program went on (evaluation never runs inside a step), so
        that training is over: its run is finished as ``failed`` and the evaluation is
        logged as one after training (its row at ``global_step`` is not dropped)."""
        if self._training and self._in_step:
            self._training = self._in_step = False
            run = self.run
            if run is not None and self._owned and not run.finished:
                self._guarded("finishing the failed run", self._finish, 1)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        """Log the Trainer's row at ``state.global_step`` under its own names."""
        if not self._tracks(state) or not logs:
            return
        if not self._training:
            self._guarded(
                "opening the run for evaluation",
                self._outside_training,
                args,
                state,
                kwargs.get("model"),
            )
        self._guarded("logging", self._log, dict(logs), state.global_step)
        if self._training:
            self._stop_if_asked(control)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """After an evaluation outside training, finish the run it (re)opened."""
        if self._close_after_eval and not self._training:
            self._close_after_eval = False
            self._guarded("finishing the run", self._finish)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Finish the run unless it is the user's (joined): then it stays open."""
        if not self._training:
            return
        self._training = False
        run = self.run
        if run is None or run.finished:
            return
        if self._owned:
            self._guarded("finishing the run", self._finish)
        else:
            self._guarded("flushing the run", run.flush)


def _plain(value: Any) -> Any:
    """``value`` as a run's config holds it (JSON data)."""
    from expr_tracker.history.codec import normalize_value

    return normalize_value(value)


def _calling_trainer() -> Any:
    """The ``transformers.Trainer`` whose method called the current hook, from the stack."""
    from transformers import Trainer

    frame: FrameType | None = sys._getframe(2)
    for _ in range(12):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer):
            return candidate
        frame = frame.f_back
    return None


def _plain_spec(spec: Any) -> Any:
    """``spec`` as ``et.init`` takes it; a type it never takes raises ``TypeError`` now."""
    if spec is None or isinstance(spec, (str, PathLike, Mapping)):
        return spec
    if type(spec).__module__.startswith("omegaconf"):
        return spec  # a DictConfig: et.init resolves its interpolations
    raise TypeError(
        f"ExprTrackerCallback(spec=...): expected a YAML/JSON/TOML path, a dict or an "
        f"OmegaConf DictConfig, got {type(spec).__name__}"
    )
