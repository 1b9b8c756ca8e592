"""A Lightning ``Logger`` that records into an expr_tracker run (docs/integrations.md).

``Trainer(logger=ExprTrackerLogger(project="demo"))``: hyper-parameters go to
``config.json``, every ``log_metrics`` call to ``metrics.jsonl`` at Lightning's step, and the
run finishes when Lightning finalizes the logger (``finished``, or ``failed`` when training
raised). Importing this module imports Lightning: ``lightning`` (``lightning.pytorch``) when
installed, else ``pytorch_lightning`` 2.x; ``import expr_tracker`` itself never does.
"""

from __future__ import annotations

import logging
import os
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

    The run is created on first use of :attr:`experiment` (rank 0 only; Lightning does so
    at ``fit`` setup) with ``et.init`` and becomes the current run, so ``et.span``,
    ``et.log`` and ``et.alert`` in a ``LightningModule`` go to it. If a run is already
    current then, the logger joins it and never finishes it (only flushes).

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
        run = self._run
        if run is not None and not run.finished:
            return run
        current = api.get_run()
        if current is not None and not current.finished and not current.forked:
            self._run, self._owned = current, False
            return current
        self._run = self._continue(run) if run is not None or self._handoff else self._init()
        self._owned = True
        return self._run

    def _init(self, **extra: Any) -> Any:
        kwargs = dict(self._init_kwargs)
        kwargs.update(extra)
        return api.init(self._project, self._name, spec=self._spec, **kwargs)

    def _continue(self, run: Any) -> Any:
        """Continue ``run`` (finished by ``finalize`` or its owner), or the run the parent
        process handed over (``ddp_spawn``): its folder is fixed (``run_dir``), so it is
        continued, or started by a rank that has not written it yet."""
        where = self._handoff if run is None else _identity(run)
        kwargs = {k: v for k, v in self._init_kwargs.items() if k not in ("id", "resume", "dir")}
        kwargs.update(run_dir=where["run_dir"])
        return api.init(where["project"], where["name"], spec=self._spec, **kwargs)

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
        replace earlier ones (``allow_val_change=True``). A value that cannot be recorded
        warns once; training goes on.
        """
        if isinstance(params, Namespace):
            params = vars(params)
        if isinstance(params, Mapping):
            params = dict(params)
        try:
            self.experiment.config.update(params, allow_val_change=True)
        except Exception as exc:  # noqa: BLE001 - measuring never breaks training
            self._warn("log_hyperparams", exc)

    @rank_zero_only
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
        """
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
        except Exception as exc:  # noqa: BLE001 - measuring never breaks training
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
        self.__dict__.update(state)
        self._warner = Warner(log)

    def __repr__(self) -> str:
        run = self._run
        where = str(Path(run.dir)) if run is not None else "not started"
        return f"ExprTrackerLogger({where})"


def _identity(run: Any) -> dict[str, Any]:
    return {"project": run.project, "name": run.name, "run_dir": str(run.dir)}


def _spawning() -> bool:
    """True while ``multiprocessing`` pickles what a process it spawns receives (the
    ``spawn``/``forkserver`` start methods that ``ddp_spawn`` uses)."""
    import multiprocessing.context

    return multiprocessing.context.get_spawning_popen() is not None
