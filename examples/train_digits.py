"""The main job: train a small MLP on scikit-learn's handwritten digits, tracked end to end.

    python examples/train_digits.py                      # ~8 epochs on the CPU, well under a minute
    python examples/train_digits.py train.epochs=2 tracker.history.buffer.size=100
    python examples/train_digits.py train.fault=spike    # watch the spike rule fire

Everything the tracker does is configured by ``cfg.tracker`` (the ``tracker`` Hydra config
group shipped with expr_tracker, plus the rules in ``conf/train_digits.yaml``); the training
code itself only calls ``et.init``, ``et.span``, ``et.log`` and ``et.finish``. The digits
(1797 images of 8x8 pixels) ship with scikit-learn, so nothing is downloaded.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import hydra
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

import expr_tracker as et
from expr_tracker.plugins import CpuTime

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


def make_data(cfg: DictConfig):
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=cfg.data.test_fraction, random_state=cfg.seed, stratify=y
    )
    return (torch.from_numpy(x_tr), torch.from_numpy(y_tr)), (
        torch.from_numpy(x_te),
        torch.from_numpy(y_te),
    )


def make_model(cfg: DictConfig) -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, cfg.model.hidden),
        nn.ReLU(),
        nn.Dropout(cfg.model.dropout),
        nn.Linear(cfg.model.hidden, cfg.model.hidden),
        nn.ReLU(),
        nn.Linear(cfg.model.hidden, 10),
    )


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    model.eval()
    logits = model(x)
    model.train()
    return {
        "eval/loss": nn.functional.cross_entropy(logits, y).item(),
        "eval/acc": (logits.argmax(1) == y).float().mean().item(),
    }


def train(
    cfg: DictConfig, on_eval: Callable[[int, int, dict[str, float]], None] | None = None
) -> et.Run:
    """Train and track; the run is left open (the caller finishes it). ``on_eval(epoch,
    step, metrics)`` is called after each epoch's evaluation is logged: an Optuna objective
    reports ``metrics["eval/loss"]`` there and may raise ``optuna.TrialPruned``."""
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(1)
    (x_tr, y_tr), (x_te, y_te) = make_data(cfg)
    model = make_model(cfg)
    opt = torch.optim.AdamW(
        model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay
    )
    steps_per_epoch = math.ceil(len(x_tr) / cfg.data.batch_size)
    total = cfg.train.epochs * steps_per_epoch
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.train.lr, total_steps=total)

    run = et.init(spec=cfg.tracker, config=OmegaConf.to_container(cfg, resolve=True))
    print(f"tracking into {run.dir}")
    gen = torch.Generator().manual_seed(cfg.seed)
    # str(): Hydra reads the override `train.fault=nan` as a float NaN
    fault = str(cfg.train.fault)
    step = 0
    for epoch in range(cfg.train.epochs):
        order = torch.randperm(len(x_tr), generator=gen)
        for b in range(steps_per_epoch):
            with et.span("step", plugins=[CpuTime()]):
                with et.span("data"):
                    idx = order[b * cfg.data.batch_size : (b + 1) * cfg.data.batch_size]
                    xb, yb = x_tr[idx], y_tr[idx]
                with et.span("forward"):
                    logits = model(xb)
                    loss = nn.functional.cross_entropy(logits, yb)
                with et.span("backward"):
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                with et.span("optimizer"):
                    opt.step()
                    sched.step()
            value = loss.item()
            if fault == "nan" and step >= cfg.train.fault_step:
                value = float("nan")
            elif fault == "spike" and step == cfg.train.fault_step:
                value *= 50.0
            metrics = {
                "train/loss": value,
                "train/acc": (logits.argmax(1) == yb).float().mean().item(),
                "lr": sched.get_last_lr()[0],
                "epoch": epoch,
            }
            if b == steps_per_epoch - 1:
                with et.span("eval"):
                    metrics.update(evaluate(model, x_te, y_te))
            et.log(metrics)
            if on_eval is not None and "eval/loss" in metrics:
                on_eval(epoch, step, metrics)
            step += 1
    return run


def show_summary(run: et.Run, seconds: float) -> None:
    summary = run.summary.to_dict()
    table = Table(
        title=f"{run.project}/{run.name}: {summary.get('_step', -1) + 1} steps in {seconds:.1f} s"
    )
    table.add_column("metric")
    table.add_column("last value", justify="right")
    for key in sorted(k for k in summary if not k.startswith("_")):
        value = summary[key]
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    Console().print(table)


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="train_digits")
def main(cfg: DictConfig) -> None:
    t0 = time.perf_counter()
    run = train(cfg)
    et.finish()
    show_summary(run, time.perf_counter() - t0)
    if cfg.trace and (run.dir / "spans.jsonl").exists():
        from expr_tracker.trace import write_trace

        out = run.dir / "trace.json"
        write_trace(run.dir, out)
        print(f"timeline: {out}  (open it in https://ui.perfetto.dev)")
    print(f"run directory: {run.dir}")
    print(f"query it:      et history {run.dir} -n 5")


if __name__ == "__main__":
    sys.exit(main())
