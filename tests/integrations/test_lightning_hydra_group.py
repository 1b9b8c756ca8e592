"""`logger=expr_tracker` in a lightning-hydra-template style app: the `logger` group option
ships with expr_tracker (no file in the app's repo), Hydra composes it, the template's way of
instantiating loggers builds ExprTrackerLogger, and a real Lightning fit records the run."""

from __future__ import annotations

import json

import pytest
from helpers import read_lines

pytest.importorskip("hydra")
pytest.importorskip("lightning")
pytestmark = pytest.mark.slow

import hydra  # noqa: E402
import lightning as L  # noqa: E402
import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.core.global_hydra import GlobalHydra  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import expr_tracker as et  # noqa: E402
from expr_tracker.integrations.lightning import ExprTrackerLogger  # noqa: E402

# configs/train.yaml of the template, cut down: the app's own `logger/` folder does not exist
TRAIN_YAML = """
defaults:
  - _self_
  - logger: null
task_name: train
tags: [dev]
seed: 12345
model:
  lr: 0.05
trainer:
  max_epochs: 1
"""


class Tiny(L.LightningModule):
    def __init__(self, lr=0.05):
        super().__init__()
        self.save_hyperparameters(logger=False)  # the template logs its cfg instead
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        with et.span("forward"):
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


@pytest.fixture
def compose_app(tmp_path):
    conf = tmp_path / "configs"
    conf.mkdir()
    (conf / "train.yaml").write_text(TRAIN_YAML)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        yield lambda *overrides: compose(config_name="train", overrides=list(overrides))
    GlobalHydra.instance().clear()


def _train(cfg):
    """What the template's src/train.py does: instantiate every logger node with a
    `_target_`, log the config as hyper-parameters, fit."""
    loggers = [hydra.utils.instantiate(node) for node in cfg.logger.values() if "_target_" in node]
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=cfg.trainer.max_epochs,
        limit_train_batches=4,
        limit_val_batches=0,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=loggers,
    )
    plain = OmegaConf.to_container(cfg)
    hparams = {k: plain[k] for k in ("model", "trainer", "task_name", "tags", "seed")}
    for logger in trainer.loggers:
        logger.log_hyperparams(hparams)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g))
    trainer.fit(Tiny(lr=cfg.model.lr), DataLoader(data, batch_size=4))
    return loggers


def test_logger_group_option_builds_the_logger_and_fit_records(compose_app, tmp_path):
    runs = tmp_path / "runs"
    cfg = compose_app(
        "logger=expr_tracker",
        "logger.expr_tracker.name=hydra",
        "+tracker=default",
        "tracker.project=lit",
        f"tracker.dir={runs}",
        "tracker.history.buffer.size=3",
    )
    assert cfg.logger.expr_tracker._target_ == (
        "expr_tracker.integrations.lightning.ExprTrackerLogger"
    )
    (logger,) = _train(cfg)
    assert isinstance(logger, ExprTrackerLogger)
    run_dir = runs / "lit" / "hydra"
    assert logger.log_dir == str(run_dir)
    rows = read_lines(run_dir / "metrics.jsonl")
    assert [r["_step"] for r in rows] == [0, 1, 2, 3]
    assert all("train/loss" in r and "time_ms/forward" in r for r in rows)
    config = json.loads((run_dir / "config.json").read_text())
    assert config["model"] == {"lr": 0.05} and config["tags"] == ["dev"]
    spec = json.loads((run_dir / "spec.json").read_text())
    assert spec["history"]["buffer"]["size"] == 3  # the tracker node is the logger's spec
    assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"


def test_logger_group_option_without_a_tracker_node(compose_app, tmp_path):
    cfg = compose_app(
        "logger=expr_tracker",
        "logger.expr_tracker.project=bare",
        f"logger.expr_tracker.save_dir={tmp_path / 'out'}",
        "+logger.expr_tracker.tags=[sweep]",
    )
    assert cfg.logger.expr_tracker.spec is None
    (logger,) = _train(cfg)
    run_dir = tmp_path / "out" / "bare" / logger.version
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "finished"
    assert json.loads((run_dir / "spec.json").read_text())["tags"] == ["sweep"]
    assert len(read_lines(run_dir / "metrics.jsonl")) == 4
