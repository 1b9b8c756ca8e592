"""ExprTrackerLogger under a real Lightning Trainer on the CPU (a Linear layer, random data)."""

from __future__ import annotations

import json
import logging
import textwrap

import pytest
from helpers import read_lines, run_py

pytest.importorskip("lightning")
pytestmark = pytest.mark.slow

import expr_tracker as et  # noqa: E402

#: the tiny model, shared with the subprocess tests
MODEL_SRC = textwrap.dedent(
    """
    import torch
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    import expr_tracker as et


    class Tiny(L.LightningModule):
        def __init__(self, lr=0.05, width=4, fail_at=None):
            super().__init__()
            self.save_hyperparameters()
            self.layer = torch.nn.Linear(width, 1)

        def training_step(self, batch, batch_idx):
            if self.hparams.fail_at is not None and self.global_step == self.hparams.fail_at:
                raise RuntimeError("boom in training_step")
            x, y = batch
            with et.span("forward", batch=batch_idx, global_step=self.global_step):
                loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y), on_epoch=True)

        def test_step(self, batch, batch_idx):
            x, y = batch
            self.log("test_loss", torch.nn.functional.mse_loss(self.layer(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


    def loader():
        g = torch.Generator().manual_seed(0)
        ds = TensorDataset(torch.randn(40, 4, generator=g), torch.randn(40, 1, generator=g))
        return DataLoader(ds, batch_size=4)


    def trainer(logger, **kw):
        opts = dict(
            accelerator="cpu", max_epochs=2, limit_train_batches=5, limit_val_batches=2,
            log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, logger=logger,
        )
        opts.update(kw)
        return L.Trainer(**opts)
    """
)
exec(MODEL_SRC)  # noqa: S102 - defines Tiny, loader, trainer for the in-process tests

from expr_tracker.integrations.lightning import ExprTrackerLogger  # noqa: E402


def _run_json(run_dir):
    return json.loads((run_dir / "run.json").read_text())


def test_fit_logs_rows_config_and_finishes(tmp_path):
    logger = ExprTrackerLogger(project="lit", name="fit", save_dir=tmp_path / "runs")
    trainer(logger).fit(Tiny(lr=0.05), loader(), loader())  # noqa: F821

    run_dir = tmp_path / "runs" / "lit" / "fit"
    assert logger.log_dir == str(run_dir)
    assert (logger.name, logger.version) == ("lit", "fit")
    assert logger.save_dir == str(tmp_path / "runs")
    assert logger.root_dir == str(tmp_path / "runs" / "lit")

    rows = read_lines(run_dir / "metrics.jsonl")
    assert [r["_step"] for r in rows] == list(range(10))  # one row per Lightning step
    assert all("train_loss" in r for r in rows)
    # validation and epoch metrics land at the same step as that step's train metrics
    assert [r["_step"] for r in rows if "val_loss" in r] == [4, 9]
    assert [r["epoch"] for r in rows if "val_loss" in r] == [0, 1]
    # the span in training_step lands on the step Lightning logs that batch at
    assert all(r["time_ms/forward"] > 0 for r in rows)
    spans = read_lines(run_dir / "spans.jsonl")
    assert (
        [s["_step"] for s in spans] == [s["args"]["global_step"] for s in spans] == list(range(10))
    )

    config = json.loads((run_dir / "config.json").read_text())
    assert config["lr"] == 0.05 and config["width"] == 4 and config["fail_at"] is None
    info = _run_json(run_dir)
    assert info["status"] == "finished"
    assert et.get_run() is None or et.get_run().finished


def test_test_after_fit_continues_the_run(tmp_path, capsys):
    logger = ExprTrackerLogger(project="lit", name="fit-test", dir=str(tmp_path / "runs"))
    t = trainer(logger)  # noqa: F821
    model = Tiny()  # noqa: F821
    t.fit(model, loader(), loader())  # noqa: F821
    t.test(model, loader())  # noqa: F821
    run_dir = tmp_path / "runs" / "lit" / "fit-test"
    rows = read_lines(run_dir / "metrics.jsonl")
    assert [r["_step"] for r in rows if "test_loss" in r] == [10]
    assert len([r for r in rows if "train_loss" in r]) == 10
    info = _run_json(run_dir)
    assert info["status"] == "finished"
    # the run's whole life, not the test's 0.1 s (issue 21, point 4): the first start is
    # fit's, the wall time spans both, the active time is their sum
    (fit,) = info["previous_attempts"]
    assert info["first_started_at"] == fit["started_at"]
    assert info["wall_duration_s"] == round(info["ended_at"] - fit["started_at"], 3)
    assert info["active_duration_s"] == round(fit["duration_s"] + info["duration_s"], 3)
    assert info["active_duration_s"] > info["duration_s"]
    # test() continued with the config fit started with: nothing recorded as changed
    assert "config_changes" not in info and info["init_config"]["lr"] == 0.05


def test_joins_the_users_run_and_never_finishes_it(tmp_path):
    run = et.init(project="lit", name="mine", dir=str(tmp_path / "runs"), config={"batch": 4})
    et.log({"setup": 1})  # the user's own row, before Lightning's steps
    logger = ExprTrackerLogger(project="ignored")
    trainer(logger).fit(Tiny(), loader(), loader())  # noqa: F821
    assert logger.experiment is run
    assert not run.finished  # finalize("success") only flushed it
    assert dict(run.config.items())["batch"] == 4 and run.config.lr == 0.05
    et.log({"after": 2})
    et.finish()
    rows = read_lines(run.dir / "metrics.jsonl")
    steps = [r["_step"] for r in rows]
    assert steps == sorted(set(steps))  # nothing dropped, nothing twice
    assert sum("train_loss" in r for r in rows) == 10
    assert sum("val_loss" in r for r in rows) == 2
    assert rows[0]["setup"] == 1 and rows[-1]["after"] == 2
    assert _run_json(run.dir)["status"] == "finished"
    # the user's run finished: a later trainer.test() continues it, in its directory
    t = trainer(logger)  # noqa: F821
    t.test(Tiny(), loader())  # noqa: F821
    assert logger.log_dir == str(run.dir)
    assert sum("test_loss" in r for r in read_lines(run.dir / "metrics.jsonl")) == 1
    assert _run_json(run.dir)["status"] == "finished"


def test_a_rerun_with_other_hyperparameters_is_a_new_run(tmp_path, capsys):
    """The same name again with another lr starts <name>-2 (its checkpoints there too); the
    first run and its config.json are untouched; the first lr again continues the first
    run. The hyper-parameters reached the logger after the run had started (log_hyperparams
    follows the setup), so a rerun continued the run and replaced its lr (issue 21, 2/5)."""
    save_dir = tmp_path / "runs"

    def fit(lr, **kw):
        logger = ExprTrackerLogger(project="lit", name="rerun", save_dir=save_dir)
        trainer(logger, max_epochs=1, **kw).fit(Tiny(lr=lr), loader(), loader())  # noqa: F821
        return logger

    first = fit(0.05)
    capsys.readouterr()
    second = fit(0.2, enable_checkpointing=True)
    err = capsys.readouterr().err
    lit = save_dir / "lit"
    assert second.log_dir == str(lit / "rerun-2") and second.version == "rerun-2"
    assert "(lr: 0.05 -> 0.2); starting run lit/rerun-2" in err, err
    assert json.loads((lit / "rerun" / "config.json").read_text())["lr"] == 0.05
    assert json.loads((lit / "rerun-2" / "config.json").read_text())["lr"] == 0.2
    assert _run_json(lit / "rerun-2")["requested_name"] == "rerun"
    assert [p.name for p in (lit / "rerun-2" / "checkpoints").iterdir()] == ["epoch=0-step=5.ckpt"]
    assert not (lit / "rerun" / "checkpoints").exists()
    assert [r["_step"] for r in read_lines(lit / "rerun" / "metrics.jsonl")] == list(range(5))
    # the first lr again: the same experiment, continued (a restart)
    third = fit(0.05)
    assert third.log_dir == first.log_dir == str(lit / "rerun")
    assert "resuming run lit/rerun at step 5" in capsys.readouterr().err
    assert sorted(p.name for p in lit.iterdir()) == ["rerun", "rerun-2"]
    assert len(_run_json(lit / "rerun")["previous_attempts"]) == 1


def test_hyperparameters_logged_before_fit_decide_the_run(tmp_path, capsys):
    """The lightning-hydra-template logs the whole config with log_hyperparams before fit:
    those values are the config the run starts with; another value under the same name is
    <name>-2, the same values continue the run, and fit/test continue it without recording
    a change."""
    save_dir = tmp_path / "runs"

    def job(lr):
        logger = ExprTrackerLogger(project="lit", name="tmpl", save_dir=save_dir)
        logger.log_hyperparams({"model": {"optimizer": {"lr": lr}}, "seed": 1})
        t = trainer(logger, max_epochs=1)  # noqa: F821
        model = Tiny()  # noqa: F821
        t.fit(model, loader(), loader())  # noqa: F821
        t.test(model, loader())  # noqa: F821
        return Path(logger.log_dir)

    from pathlib import Path

    a = job(0.1)
    b = job(0.3)
    assert (a.name, b.name) == ("tmpl", "tmpl-2")
    assert "(model.optimizer.lr: 0.1 -> 0.3)" in capsys.readouterr().err
    for run_dir, lr in ((a, 0.1), (b, 0.3)):
        config = json.loads((run_dir / "config.json").read_text())
        assert config["model"] == {"optimizer": {"lr": lr}} and config["lr"] == 0.05
        info = _run_json(run_dir)
        assert info["init_config"] == {"model": {"optimizer": {"lr": lr}}, "seed": 1}
        assert "config_changes" not in info
        assert len(info["previous_attempts"]) == 1  # fit, then test
    assert job(0.1) == a  # the same values: continued


def test_values_named_by_an_address_do_not_make_every_rerun_new(tmp_path, capsys):
    """`activation=F.relu` saved as a hyper-parameter reads `<function relu at 0x...>`,
    another text in every process: left out of the comparison (config.json still has it),
    so the same script again continues its run."""
    import torch.nn.functional as F

    for _ in range(2):
        logger = ExprTrackerLogger(project="lit", name="addr", save_dir=tmp_path / "runs")
        logger.log_hyperparams({"lr": 0.1, "act": F.relu, "obj": object()})
        logger.finalize("success")
    run_dir = tmp_path / "runs" / "lit" / "addr"
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["addr"]
    assert "resuming run lit/addr" in capsys.readouterr().err
    assert _run_json(run_dir)["init_config"] == {"lr": 0.1}
    config = json.loads((run_dir / "config.json").read_text())
    assert config["lr"] == 0.1 and "<function relu" in config["act"]


def test_a_logger_with_its_own_name_gets_its_own_run_beside_the_current_one(tmp_path):
    """A current run A and ExprTrackerLogger(name="B"): B is a run of its own (not made
    current, finished by the logger); A keeps its config and rows. A logger without a name
    joins A. Before, every logger joined A (issue 21, 2/5)."""
    save_dir = tmp_path / "runs"
    a = et.init(project="lit", name="A", dir=str(save_dir), config={"batch": 4})
    et.log({"outer": 1.0})
    logger = ExprTrackerLogger(project="lit", name="B", save_dir=save_dir)
    trainer(logger, max_epochs=1).fit(Tiny(lr=0.3), loader(), loader())  # noqa: F821
    b_dir = save_dir / "lit" / "B"
    assert logger.log_dir == str(b_dir)  # (reading it does not continue the finished run)
    assert et.get_run() is a and not a.finished  # A stays current and open
    assert _run_json(b_dir)["status"] == "finished"
    assert json.loads((b_dir / "config.json").read_text())["lr"] == 0.3
    assert sum("train_loss" in r for r in read_lines(b_dir / "metrics.jsonl")) == 5
    assert dict(a.config.items()) == {"batch": 4}
    # test() after fit continues B, still beside A
    trainer(logger).test(Tiny(lr=0.3), loader())  # noqa: F821
    assert logger.log_dir == str(b_dir) and et.get_run() is a
    assert sum("test_loss" in r for r in read_lines(b_dir / "metrics.jsonl")) == 1
    # without a name: joins A
    joining = ExprTrackerLogger(project="lit")
    assert joining.experiment is a
    joining.log_metrics({"joined": 1.0}, step=5)
    joining.finalize("success")
    assert not a.finished
    et.finish()
    rows = read_lines(a.dir / "metrics.jsonl")
    assert rows[0]["outer"] == 1.0 and any("joined" in r for r in rows)
    assert not any("train_loss" in r or "test_loss" in r for r in rows)


def test_steps_behind_the_run_shift_with_one_warning(tmp_path, caplog):
    run = et.init(project="lit", name="ahead", dir=str(tmp_path / "runs"))
    for i in range(5):
        et.log({"user": i})
    logger = ExprTrackerLogger()
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        logger.log_metrics({"a": 1.0}, step=0)
        logger.log_metrics({"b": 2.0}, step=0)
        logger.log_metrics({"a": 3.0}, step=1)
    et.finish()
    rows = read_lines(run.dir / "metrics.jsonl")
    assert [(r["_step"], r.get("a"), r.get("b")) for r in rows[5:]] == [
        (5, 1.0, 2.0),
        (6, 3.0, None),
    ]
    assert sum("shifted" in m for m in caplog.messages) == 1


def test_log_hyperparams_takes_a_namespace_and_relogs(tmp_path):
    from argparse import Namespace

    logger = ExprTrackerLogger(project="lit", name="hp", save_dir=tmp_path / "runs")
    logger.log_hyperparams(Namespace(lr=0.1, layers=2))
    logger.log_hyperparams({"lr": 0.2})  # Lightning re-logs: a changed value is accepted
    assert logger.experiment.config.as_dict() == {"lr": 0.2, "layers": 2}
    logger.finalize("success")
    assert _run_json(tmp_path / "runs" / "lit" / "hp")["status"] == "finished"


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ("success", "finished"),
        ("finished", "finished"),
        ("failed", "failed"),
        ("aborted", "failed"),
    ],
)
def test_finalize_status_maps_onto_run_status(tmp_path, status, expected):
    logger = ExprTrackerLogger(project="lit", name=status, save_dir=tmp_path / "runs")
    logger.log_metrics({"x": 1.0}, step=0)
    logger.finalize(status)
    info = _run_json(tmp_path / "runs" / "lit" / status)
    assert info["status"] == expected
    assert logger.version == status  # reading it does not continue the finished run
    assert _run_json(tmp_path / "runs" / "lit" / status)["status"] == expected


def test_a_failing_bad_value_never_breaks_training(tmp_path, caplog):
    logger = ExprTrackerLogger(project="lit", name="bad", save_dir=tmp_path / "runs")
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        logger.log_hyperparams(object())  # not a mapping: warned, not raised
        logger.log_hyperparams(object())
    assert sum("log_hyperparams failed" in m for m in caplog.messages) == 1
    logger.finalize("success")


def test_an_exception_in_training_step_marks_the_run_failed(tmp_path):
    code = MODEL_SRC + textwrap.dedent(
        """
            import sys
            from expr_tracker.integrations.lightning import ExprTrackerLogger
            logger = ExprTrackerLogger(project="lit", name="boom", save_dir=sys.argv[1])
            trainer(logger).fit(Tiny(fail_at=3), loader(), loader())
            """
    )
    p = run_py(code, str(tmp_path / "runs"), check=False, timeout=120)
    assert p.returncode == 1, p.stderr
    assert "boom in training_step" in p.stderr
    run_dir = tmp_path / "runs" / "lit" / "boom"
    info = _run_json(run_dir)
    assert info["status"] == "failed"
    assert info["exception"]["type"] == "RuntimeError"
    rows = read_lines(run_dir / "metrics.jsonl")
    assert [r["_step"] for r in rows] == [0, 1, 2]  # every step before the failure


def test_importing_expr_tracker_imports_no_lightning():
    p = run_py(
        "import sys, expr_tracker\n"
        "assert not any(m.split('.')[0] in ('lightning', 'pytorch_lightning') for m in sys.modules)"
    )
    assert p.returncode == 0


def test_a_missing_lightning_names_the_extra():
    p = run_py(
        """
        import sys
        for name in ("lightning", "pytorch_lightning", "lightning_fabric"):
            sys.modules[name] = None  # as if not installed
        try:
            import expr_tracker.integrations.lightning
        except ImportError as exc:
            print(exc)
        """
    )
    assert "pip install 'expr-tracker[lightning]'" in p.stdout


def test_rank_nonzero_logs_nothing(tmp_path, monkeypatch):
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    monkeypatch.setattr(rank_zero_only, "rank", 1)
    logger = ExprTrackerLogger(project="lit", name="r1", save_dir=tmp_path / "runs")
    logger.log_hyperparams({"lr": 1})
    logger.log_metrics({"x": 1.0}, step=0)
    logger.finalize("success")
    assert logger.version == "r1" and logger.log_dir is None
    assert not (tmp_path / "runs").exists() and et.get_run() is None


def test_checkpoints_land_in_the_run_directory(tmp_path):
    logger = ExprTrackerLogger(project="lit", name="ckpt", save_dir=tmp_path / "runs")
    trainer(logger, enable_checkpointing=True, max_epochs=1).fit(Tiny(), loader(), loader())  # noqa: F821
    run_dir = tmp_path / "runs" / "lit" / "ckpt"
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["epoch=0-step=5.ckpt"]


def test_the_logger_pickles_without_its_run(tmp_path):
    import pickle

    logger = ExprTrackerLogger(project="lit", name="pickled", save_dir=tmp_path / "runs")
    logger.log_metrics({"x": 1.0}, step=0)
    copy = pickle.loads(pickle.dumps(logger))
    assert copy._run is None and copy._project == "lit"
    logger.finalize("success")


def test_a_pytorch_lightning_trainer_takes_it(tmp_path):
    pl = pytest.importorskip("pytorch_lightning")
    import torch

    class PlTiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    logger = ExprTrackerLogger(project="lit", name="pl", save_dir=tmp_path / "runs")
    pl.Trainer(
        accelerator="cpu",
        max_epochs=1,
        limit_train_batches=3,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=logger,
    ).fit(PlTiny(), loader())  # noqa: F821
    run_dir = tmp_path / "runs" / "lit" / "pl"
    assert [r["_step"] for r in read_lines(run_dir / "metrics.jsonl")] == [0, 1, 2]
    assert _run_json(run_dir)["status"] == "finished"


def test_spans_between_logged_steps_sum_into_the_logged_row(tmp_path):
    logger = ExprTrackerLogger(
        project="lit", name="every5", save_dir=tmp_path / "runs", span_count=True
    )
    trainer(logger, log_every_n_steps=5).fit(Tiny(), loader(), loader())  # noqa: F821
    rows = read_lines(tmp_path / "runs" / "lit" / "every5" / "metrics.jsonl")
    assert [(r["_step"], r["count/forward"]) for r in rows] == [(4, 5), (9, 5)]
    assert all("train_loss" in r and "val_loss" in r for r in rows)


DDP_SPAWN_SCRIPT = MODEL_SRC + textwrap.dedent(
    """
    import sys
    from expr_tracker.integrations.lightning import ExprTrackerLogger


    class Ranked(Tiny):
        def training_step(self, batch, batch_idx):
            et.log({"rank_seen": self.global_rank}, commit=False)  # on every rank
            return super().training_step(batch, batch_idx)


    def main():
        logger = ExprTrackerLogger(project="lit", name="spawned", save_dir=sys.argv[1])
        # the lightning-hydra-template's ddp_sim: hyper-parameters logged in the parent
        logger.log_hyperparams({"model": "Ranked", "seed": 7, "trainer": {"devices": 2}})
        model = Ranked(lr=0.02)
        kw = dict(devices=2, strategy="ddp_spawn", max_epochs=1, limit_test_batches=2)
        t = trainer(logger, **kw)
        t.fit(model, loader(), loader())
        t.test(model, loader())
        print("LOG_DIR", logger.log_dir, flush=True)


    if __name__ == "__main__":
        main()
    """
)


def test_ddp_spawn_parent_and_ranks_share_one_run(tmp_path):
    """trainer=ddp_sim of the lightning-hydra-template: hyper-parameters logged in the
    parent, fit and test in two processes each spawned by Lightning (gloo on the CPU) are
    one run: one directory, rank 0's and rank 1's files, config.json with the parent's and
    the model's hyper-parameters (issue 21, point 3)."""
    import os
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(DDP_SPAWN_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env["OMP_NUM_THREADS"] = "1"
    p = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "runs")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "RunLockedError" not in p.stderr
    runs = sorted(d.name for d in (tmp_path / "runs" / "lit").iterdir())
    assert runs == ["spawned"], runs
    run_dir = tmp_path / "runs" / "lit" / "spawned"
    assert f"LOG_DIR {run_dir}" in p.stdout
    names = {f.name for f in run_dir.iterdir()}
    assert {"metrics.jsonl", "run.json", "metrics.rank1.jsonl", "run.rank1.json"} <= names
    config = json.loads((run_dir / "config.json").read_text())
    assert config["model"] == "Ranked" and config["seed"] == 7  # logged in the parent
    assert config["trainer"] == {"devices": 2}
    assert config["lr"] == 0.02 and config["width"] == 4  # the model's, logged by rank 0
    rows = read_lines(run_dir / "metrics.jsonl")
    assert any("train_loss" in r for r in rows) and any("test_loss" in r for r in rows)
    assert {r["rank_seen"] for r in rows if "rank_seen" in r} == {0}
    shard = read_lines(run_dir / "metrics.rank1.jsonl")
    assert {r["rank_seen"] for r in shard if "rank_seen" in r} == {1}
    # rank 1's own records land on Lightning's steps as rank 0's do, not all in one row
    assert [r["_step"] for r in shard if "rank_seen" in r] == [
        r["_step"] for r in rows if "rank_seen" in r
    ]
    for spans in ("spans.jsonl", "spans.rank1.jsonl"):
        fit = [r for r in read_lines(run_dir / spans) if r["name"] == "forward"]
        assert len(fit) == 5, spans
        assert [r["_step"] for r in fit] == [r["args"]["global_step"] for r in fit], spans
    info = _run_json(run_dir)
    assert info["status"] == "finished"
    assert json.loads((run_dir / "run.rank1.json").read_text())["status"] == "finished"
    # every attempt (parent, fit ranks, test ranks) was started with the parent's config
    assert info["init_config"] == {"model": "Ranked", "seed": 7, "trainer": {"devices": 2}}
    assert "config_changes" not in info
    assert not any(a.get("config_changes") for a in info["previous_attempts"])


def test_spans_over_batches_and_epochs_land_on_the_logged_steps(tmp_path):
    """A user's callback timing each batch (on_train_batch_start -> _end, before Lightning
    logs the batch's step) and each epoch (log_metrics calls reach the store while it runs):
    each batch span joins the row of the step logged after it, each epoch span the step
    open when the epoch ends, its last (base code: the epoch's time in the next epoch's
    first row, the last epoch's in no row of its own)."""
    import lightning as L

    class Timer(L.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            self.batch = et.start_span("batch")

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.batch.end()

        def on_train_epoch_start(self, trainer, module):
            self.epoch = et.start_span("epoch", epoch=trainer.current_epoch)

        def on_train_epoch_end(self, trainer, module):
            self.epoch.end()

    logger = ExprTrackerLogger(project="lit", name="timed", save_dir=tmp_path / "runs")
    trainer(logger, callbacks=[Timer()]).fit(Tiny(), loader(), loader())  # noqa: F821
    run_dir = tmp_path / "runs" / "lit" / "timed"
    rows = {r["_step"]: r for r in read_lines(run_dir / "metrics.jsonl")}
    assert sorted(rows) == list(range(10))
    assert all(r["time_ms/epoch/batch"] > 0 for r in rows.values())
    assert [s for s, r in rows.items() if "time_ms/epoch" in r] == [4, 9]
    spans = read_lines(run_dir / "spans.jsonl")
    epochs = [(s["_step"], s["args"]["epoch"]) for s in spans if s["name"] == "epoch"]
    assert epochs == [(4, 0), (9, 1)]
    assert [s["_step"] for s in spans if s["name"] == "epoch/batch"] == list(range(10))


def test_a_stop_rule_stops_the_trainer(tmp_path):
    """``=> stop`` (docs/alerts.md "Actions"): the logger sets ``trainer.should_stop``."""
    logger = ExprTrackerLogger(
        project="lit",
        name="stop",
        save_dir=tmp_path / "runs",
        alert_rules=["train_loss > -1 for 3 => stop: enough"],
    )
    tr = trainer(logger, max_epochs=5)  # noqa: F821
    tr.fit(Tiny(lr=0.05), loader(), loader())  # noqa: F821
    # fired at the commit of step 2 (when step 3 was logged): fit ends after that batch
    assert tr.global_step == 4
    info = _run_json(tmp_path / "runs" / "lit" / "stop")
    assert info["status"] == "finished" and info["stop_request"]["step"] == 2
