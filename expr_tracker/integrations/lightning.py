"""A Lightning ``Logger`` that records into an expr_tracker run (docs/integrations.md).

``Trainer(logger=ExprTrackerLogger(project="demo"))``: hyper-parameters go to
``config.json``, every ``log_metrics`` call to ``metrics.jsonl`` at Lightning's step, and the
run finishes when Lightning finalizes the logger (``finished``, or ``failed`` when training
raised).

The run is started when it is first needed, with its hyper-parameters as the config given at
init, so that a rerun under the same ``name`` with other hyper-parameters starts
``<name>-2`` instead of continuing (docs/streams.md "Run identity"): those Lightning is about
to log for the ``fit``/``validate``/``test`` that first uses the logger (its module's and
datamodule's ``hparams_initial``, found from the calling ``Trainer`` on the stack), else
those of a first ``log_hyperparams`` called before training (the lightning-hydra-template).
A logger given its own ``name=`` (``id=``, ``run_dir=``) while another run is current gets
a run of its own beside it; one without joins the current run. Importing this module imports Lightning: ``lightning`` (``lightning.pytorch``) when
installed, else ``pytorch_lightning`` 2.x; ``import expr_tracker`` itself never does.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from argparse import Namespace
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from expr_tracker import api
from expr_tracker._warn import Warner

try:  # the unified package first; the standalone pytorch_lightning 2.x has the same API
    from lightning.fabric.utilities.rank_zero import rank_zero_only
    from lightning.pytorch.loggers.logger import Logger, rank_zero_experiment
except ImportError:  # pragma: no cover - exercised only where lightning is absent
    try:
        from lightning_fabric.utilities.rank_zero import rank_zero_only
        from pytorch_lightning.loggers.logger import Logger, rank_zero_experiment
    except ImportError as exc:
        raise ImportError(
            "expr_tracker.integrations.lightning needs Lightning: "
            "pip install 'expr-tracker[lightning]' (or pytorch-lightning>=2.0)"
        ) from exc

__all__ = ["ExprTrackerLogger"]

log = logging.getLogger("expr_tracker")

#: Lightning's finalize() statuses that end a run well; any other one ("failed",
#: "aborted", ...) marks it failed
_SUCCESS = frozenset({"success", "finished", "succeeded", "completed"})


class ExprTrackerLogger(Logger):
    """Lightning logger writing into an expr_tracker run.

    Args:
        project: the run's project (``<dir>/<project>/<name>/``); None: the spec's default.
        name: the run's name; None: a timestamp plus a random suffix (the same on every
            rank of one ``torchrun`` launch).
        spec: a run spec (a YAML/JSON/TOML path, a dict, or an OmegaConf DictConfig) for
            spans, alert rules, channels, buffering ...
        save_dir: where runs live (``et.init(dir=...)``; default ``./runs``).
        **init_kwargs: any ``et.init`` keyword (``config``, ``tags``, ``alert_rules``,
            ``run_dir``, ``mode`` ...).

    The run is created on first use (rank 0 only): Lightning's at ``fit``/``test`` setup, or
    a ``log_hyperparams``/``log_metrics`` call before, with ``et.init`` and the config the
    rerun decision compares (the ``config`` keyword with the hyper-parameters Lightning is
    about to log, or those of that first ``log_hyperparams``), and becomes the current run,
    so ``et.span``, ``et.log`` and ``et.alert`` in a ``LightningModule`` go to it. If a run
    is already current then, a logger without a ``name`` (``id``, ``run_dir``) of another
    run joins it and never finishes it (only flushes); one with its own gets that run
    beside the current one (not made current), and finishes it.

    Directories follow Lightning's ``save_dir/name/version`` layout: :attr:`name` is the
    project, :attr:`version` the run's name, :attr:`log_dir` the run directory, so a
    ``ModelCheckpoint`` without ``dirpath`` saves into ``<run dir>/checkpoints``.

    Raises:
        SpecError, ResumeError, RunLockedError: from ``et.init``, when the run is created.
    """

    def __init__(
        self,
        project: str | None = None,
        name: str | None = None,
        spec: Any = None,
        save_dir: str | os.PathLike[str] | None = None,
        **init_kwargs: Any,
    ) -> None:
        super().__init__()
        if "dir" in init_kwargs and save_dir is not None:
            raise TypeError("ExprTrackerLogger: pass save_dir= or dir=, not both")
        if save_dir is not None:
            init_kwargs["dir"] = os.fspath(save_dir)
        self._project = project
        self._name = name
        self._spec = spec
        self._init_kwargs = init_kwargs
        self._run: Any = None
        self._owned = False  # True: this logger started the run and finishes it
        self._independent = False  # its own run beside another current one (not current)
        # the config the run was started with (the rerun decision's), given again when the
        # run is continued (after finalize, in processes spawned by ddp_spawn)
        self._config: Any = None
        # where the run is, in a process started by ddp_spawn: what the parent handed over
        self._handoff: dict[str, Any] | None = None
        self._offset = 0  # added to Lightning's steps once they fall behind the run's step
        self._warner = Warner(log)

    # ------------------------------------------------------------------ the run

    @property
    def experiment(self) -> Any:
        """The :class:`expr_tracker.Run` (``logger.experiment.log({...})``), created on
        first access with ``et.init``, or the current run when one is active. On ranks
        other than 0 a do-nothing object, except in processes started by ``ddp_spawn``:
        there every rank writes its own files of the run the parent handed over. After
        ``finalize`` finished it, the next access continues the same run (e.g.
        ``trainer.test()`` after ``trainer.fit()``)."""
        if self._handoff is not None and rank_zero_only.rank > 0:
            return self._rank_run()
        return self._rank_zero_experiment()

    @rank_zero_experiment
    def _rank_zero_experiment(self) -> Any:
        return self._get_run()

    def _get_run(self, params: Mapping[str, Any] | None = None) -> Any:
        """The run on rank 0: the logger's while it is open; else the current run, joined
        (unless the logger names a run of its own); else its own, continued or started
        (``params``: hyper-parameters being logged, for the config given at init)."""
        run = self._run
        if run is not None and not run.finished:
            return run
        current = api.get_run()
        usable = current is not None and not current.finished and not current.forked
        if usable and not self._names_another_run(current):
            self._run, self._owned = current, False
            return current
        self._independent = usable  # its own run beside the current one
        self._run = self._continue(run) if run is not None or self._handoff else self._init(params)
        self._owned = True
        return self._run

    def _names_another_run(self, current: Any) -> bool:
        """The logger was given a run of its own (``name``, ``id``, ``run_dir``) that is not
        ``current`` (as the Hugging Face callback and the Accelerate tracker decide)."""
        kw = self._init_kwargs
        if kw.get("run_dir") is not None:
            return Path(kw["run_dir"]).expanduser().resolve() != Path(current.dir).resolve()
        name = kw.get("id") if kw.get("id") is not None else self._name
        if name is None:
            return False
        return name != current.name or (
            self._project is not None and self._project != current.project
        )

    def _init(self, params: Mapping[str, Any] | None = None) -> Any:
        """Start the run: ``et.init`` with the ``config`` keyword and the hyper-parameters
        (``params``, else those Lightning is about to log for the calling ``Trainer``) as
        the config given at init, so a rerun with others starts ``<name>-2``."""
        kwargs = dict(self._init_kwargs)
        hparams = _comparable(params if params is not None else self._trainer_hparams())
        user = kwargs.get("config")
        if hparams and (user is None or isinstance(user, Mapping)):
            kwargs["config"] = {**(user or {}), **hparams}
        self._config = kwargs.get("config")
        if self._independent:
            kwargs["reinit"] = "create_new"
        return api.init(self._project, self._name, spec=self._spec, **kwargs)

    def _continue(self, run: Any) -> Any:
        """Continue ``run`` (finished by ``finalize`` or its owner), or the run the parent
        process handed over (``ddp_spawn``): its folder is fixed (``run_dir``), so it is
        continued, or started by a rank that has not written it yet, with the config it was
        started with (nothing recorded as changed)."""
        where = self._handoff if run is None else _identity(run)
        drop = ("id", "resume", "dir", "reinit")
        kwargs = {k: v for k, v in self._init_kwargs.items() if k not in drop}
        if self._config is not None:
            kwargs["config"] = self._config
        kwargs.update(run_dir=where["run_dir"])
        if self._independent:
            kwargs["reinit"] = "create_new"
        return api.init(where["project"], where["name"], spec=self._spec, **kwargs)

    def _trainer_hparams(self) -> dict[str, Any] | None:
        """The hyper-parameters Lightning logs at the setup of the ``Trainer`` using this
        logger that is calling (found on the stack): its module's ``hparams_initial`` merged
        with its datamodule's, each where it logs them (``save_hyperparameters(logger=
        False)`` does not), as ``lightning.pytorch.loggers.utilities._log_hyperparams``
        chooses them; None without such a Trainer or with ``enable_autolog_hparams=False``.
        Never raises."""
        try:
            return _hparams_on_stack(self, sys._getframe(1))
        except Exception:  # noqa: BLE001 - the run starts without them
            return None

    def _rank_run(self) -> Any:
        """This rank's producer of the handed-over run (``metrics.rank<N>.jsonl``), so that
        ``et.log``/``et.span`` in a ``LightningModule`` record on every rank as under
        ``torchrun``; Lightning's own calls stay on rank 0."""
        run = self._run
        if run is not None and not run.finished:
            return run
        os.environ.setdefault("RANK", str(rank_zero_only.rank))
        self._run, self._owned = self._continue(None), True
        return self._run

    def _hand_over(self) -> dict[str, Any] | None:
        """In the parent, while Lightning pickles the trainer for processes it spawns
        (``ddp_spawn``): the run is started here if it was not (so its name is chosen
        once, by this process), then finished, so that the workers (rank 0 writes
        ``metrics.jsonl``) can continue it; their copies of the logger carry where it is."""
        if self._handoff is not None:
            return self._handoff  # a copy made in a worker, pickled again
        if rank_zero_only.rank > 0:
            return None
        run = self._run if self._run is not None else self.experiment
        if not run.finished:
            try:
                run.finish()
                if api.get_run() is run:
                    api.finish()  # no longer the current run of this process
            except Exception as exc:  # noqa: BLE001 - measuring never breaks training
                self._warn("handing the run to the spawned processes", exc)
        return _identity(run)

    @property
    def name(self) -> str | None:
        """The run's project (Lightning's experiment name); None on ranks other than 0
        unless ``project`` was given."""
        run = self._rank_zero_run()
        return run.project if run is not None else self._project

    @property
    def version(self) -> str | None:
        """The run's name (= its id); None on ranks other than 0 unless ``name`` was given."""
        run = self._rank_zero_run()
        return run.name if run is not None else self._name

    @property
    def save_dir(self) -> str | None:
        """Where runs live (the spec's ``dir``, default ``./runs``)."""
        run = self._rank_zero_run()
        if run is not None:
            return str(run.spec.dir)
        return self._init_kwargs.get("dir")

    @property
    def root_dir(self) -> str | None:
        """``<save_dir>/<project>``: the folder of every run of the project."""
        save_dir, name = self.save_dir, self.name
        return None if save_dir is None or name is None else os.path.join(save_dir, name)

    @property
    def log_dir(self) -> str | None:
        """The run directory (``run.dir``)."""
        run = self._rank_zero_run()
        return str(run.dir) if run is not None else None

    def _rank_zero_run(self) -> Any:
        """The run (created on first use, rank 0 only); a finished one is not continued:
        reading a name or a directory after ``finalize`` changes nothing."""
        if rank_zero_only.rank > 0:
            return None
        return self._run if self._run is not None else self.experiment

    # ------------------------------------------------------------------ Lightning's hooks

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """Record hyper-parameters into the run's config (``config.json``).

        ``params``: a mapping (Lightning's ``AttributeDict``), an ``argparse.Namespace``, a
        dataclass or a pydantic model. Values Lightning logs again (each ``fit``/``test``)
        replace earlier ones (``allow_val_change=True``). Called before the run started
        (before training), it starts it with these values (a mapping's) as the config given
        at init, which the rerun decision compares. A value that cannot be recorded warns
        once; training goes on.
        """
        if isinstance(params, Namespace):
            params = vars(params)
        if isinstance(params, Mapping):
            params = dict(params)
        try:
            # the first use of the logger (before training: the lightning-hydra-template):
            # these are the config the run starts with
            if self._run is None and self._handoff is None:
                run = self._get_run(params if isinstance(params, dict) else None)
            else:
                run = self.experiment
            run.config.update(params, allow_val_change=True)
        except Exception as exc:  # noqa: BLE001 - measuring never breaks training
            self._warn("log_hyperparams", exc)

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Log ``metrics`` at Lightning's ``step`` (``trainer.global_step``-based).

        Calls with the same step merge into one row (Lightning logs step metrics, then
        validation and epoch metrics, at one step); the row is committed when a later step
        arrives or the run finishes. Span time from the user's ``training_step`` joins the
        row of this call. A step behind the run's open step (a joined run that already
        holds later steps, a second ``Trainer`` with this logger, or a run continued
        after ``finalize``) would be dropped: instead Lightning's steps are shifted from
        then on so they land at the run's open step, with one warning. ``step=None``
        merges into the open row.

        On the other ranks of ``ddp_spawn`` (which write their own files of the run) the
        metrics stay rank 0's, but the row of ``step`` is opened, so that the span time and
        ``et.log(..., commit=False)`` of that rank land on Lightning's steps as on rank 0,
        not all in one row. Elsewhere other ranks do nothing (``rank_zero_only``).
        """
        if rank_zero_only.rank > 0:
            if self._handoff is None or step is None:
                return
            metrics = {}
        try:
            run = self.experiment
            if step is None:
                run.log(dict(metrics), commit=False)
                return
            target = int(step) + self._offset
            behind = run.step - target
            if behind > 0:
                self._offset += behind
                target += behind
                self._warner.warn(
                    ("lightning", "step_shift"),
                    "expr_tracker: Lightning's step %s is behind run %s's step %s (a run "
                    "already holding later steps): Lightning's steps are shifted by +%s",
                    step,
                    run.name,
                    run.step,
                    self._offset,
                )
            run.log(dict(metrics), step=target)
            if run.should_stop():  # a => stop / => prune rule fired (docs/alerts.md "Actions")
                _stop_trainer(self, sys._getframe())
        except Exception as exc:  # noqa: BLE001 - measuring never breaks training
            if type(exc).__name__ == "TrialPruned":  # a => prune rule in an Optuna objective
                raise
            self._warn("log_metrics", exc)

    @rank_zero_only
    def save(self) -> None:
        """Nothing to do: Lightning calls this after every ``log_metrics``, and committed
        rows are already written by the run's background writer (within
        ``buffer.max_seconds``); ``logger.experiment.flush()`` forces a write."""

    def finalize(self, status: str) -> None:
        """End of ``fit``/``validate``/``test``: finish the run this logger started (on
        every rank that writes one: rank 0, and each rank under ``ddp_spawn``).

        ``"success"`` (and ``"finished"``, which Lightning passes before a SLURM requeue)
        records ``finished``; ``"failed"`` or any other status records ``failed``, with the
        exception being handled when there is one. A run the logger joined is only flushed
        (its owner finishes it). A later use continues the run (see :attr:`experiment`).
        """
        run = self._run
        if run is None or run.finished:
            return
        try:
            if not self._owned:
                run.flush()
                return
            if str(status).lower() in _SUCCESS:
                run.finish()
            else:
                exc = sys.exc_info()[1]
                if exc is not None:
                    run.finish(exception=exc)
                else:
                    run.finish(exit_code=1)
        except Exception as exc:  # noqa: BLE001 - measuring never breaks training
            self._warn("finalize", exc)

    # ------------------------------------------------------------------ helpers

    def _warn(self, where: str, exc: Exception) -> None:
        self._warner.warn(
            ("lightning", where, type(exc).__name__),
            "expr_tracker: ExprTrackerLogger.%s failed (%s: %s); training goes on",
            where,
            type(exc).__name__,
            exc,
        )

    def __getstate__(self) -> dict[str, Any]:
        # a Run owns open files and a lock: a pickled logger starts without it. Pickled for
        # a process being spawned (ddp_spawn), it carries where the run is, which this
        # process hands over (finishes) so that the workers can write it.
        handoff = self._hand_over() if _spawning() else self._handoff
        state = self.__dict__.copy()
        state["_run"] = None
        state["_owned"] = False
        state["_handoff"] = handoff
        del state["_warner"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("_handoff", None)
        state.setdefault("_independent", False)
        state.setdefault("_config", None)
        self.__dict__.update(state)
        self._warner = Warner(log)

    def __repr__(self) -> str:
        run = self._run
        where = str(Path(run.dir)) if run is not None else "not started"
        return f"ExprTrackerLogger({where})"


#: frames looked through for the calling Trainer
_STACK_DEPTH = 64
#: what ``repr()`` of an object without a repr of its own ends with: not the same in two runs
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>")


def _comparable(hparams: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``hparams`` as JSON data (as ``config.json`` holds them), without the values that
    only an address names (``activation=F.relu`` reads ``<function relu at 0x7f...>``: it
    would differ in every process, so every rerun would be another config); those reach
    ``config.json`` through ``log_hyperparams`` all the same."""
    if not hparams:
        return None
    from expr_tracker.history.codec import normalize_value

    def keep(v: Any) -> Any:
        if isinstance(v, str) and _ADDRESS.search(v):
            return _DROP
        if isinstance(v, dict):
            kept = {k: keep(x) for k, x in v.items()}
            return {k: x for k, x in kept.items() if x is not _DROP}
        if isinstance(v, list):
            kept_list = [keep(x) for x in v]
            return _DROP if any(x is _DROP for x in kept_list) else kept_list
        return v

    data = keep(normalize_value(dict(hparams)))
    return data if isinstance(data, dict) and data else None


_DROP = object()


def _hparams_on_stack(logger: Any, frame: Any) -> dict[str, Any] | None:
    """See :meth:`ExprTrackerLogger._trainer_hparams`. The Trainer is the ``self`` of a
    frame whose ``loggers`` hold ``logger``; its module and datamodule are its own once
    attached, else the ``model``/``datamodule`` arguments of its ``fit``/``test``... (in the
    parent of ``ddp_spawn`` processes, which pickles the logger before attaching them)."""
    trainer = model = datamodule = None
    for _ in range(_STACK_DEPTH):
        if frame is None:
            break
        local = frame.f_locals
        candidate = local.get("self")
        if trainer is None and any(x is logger for x in getattr(candidate, "loggers", None) or ()):
            trainer = candidate
        if trainer is not None:
            if model is None and hasattr(local.get("model"), "hparams_initial"):
                model = local["model"]
            if datamodule is None and hasattr(local.get("datamodule"), "hparams_initial"):
                datamodule = local["datamodule"]
        frame = frame.f_back
    if trainer is None or not getattr(trainer, "enable_autolog_hparams", True):
        return None
    model = getattr(trainer, "lightning_module", None) or model
    datamodule = getattr(trainer, "datamodule", None) or datamodule
    logs_model = model is not None and bool(getattr(model, "_log_hyperparams", False))
    logs_data = datamodule is not None and bool(getattr(datamodule, "_log_hyperparams", False))
    hparams: dict[str, Any] = {}
    if logs_model:
        hparams.update(model.hparams_initial)
    if logs_data:
        hparams.update(datamodule.hparams_initial)
    hparams.pop("_class_path", None)  # LightningCLI's, never logged
    return hparams or None


def _stop_trainer(logger: Any, frame: Any) -> None:
    """Set ``trainer.should_stop`` on the ``Trainer`` calling ``logger`` (found on the stack
    as :func:`_hparams_on_stack` finds it): Lightning ends ``fit`` after this batch."""
    for _ in range(_STACK_DEPTH):
        if frame is None:
            return
        candidate = frame.f_locals.get("self")
        if any(x is logger for x in getattr(candidate, "loggers", None) or ()):
            candidate.should_stop = True
            return
        frame = frame.f_back


def _identity(run: Any) -> dict[str, Any]:
    return {"project": run.project, "name": run.name, "run_dir": str(run.dir)}


def _spawning() -> bool:
    """True while ``multiprocessing`` pickles what a process it spawns receives (the
    ``spawn``/``forkserver`` start methods that ``ddp_spawn`` uses)."""
    import multiprocessing.context

    return multiprocessing.context.get_spawning_popen() is not None
