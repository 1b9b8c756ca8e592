"""A Hydra multirun of three jobs, each tracked as its own run by the job callback.

Run it (offline, a few seconds)::

    python examples/hydra_sweep.py                 # = --multirun over lr=0.3,0.1,0.03
    python examples/hydra_sweep.py -m lr=1,2 steps=5

The app never calls ``et.init``: ``hydra.callbacks.tracker`` (``TrackerCallback``) starts a run
per job — named ``<sweep stamp>-<job num>-<overrides>``, all grouped under the sweep — records
the app config (``lr``, ``steps``) as the run's ``config.json`` and finishes the run when the
job ends. The run spec comes from the ``tracker`` config group (``tracker: default`` in the
defaults list below, plus the ``nan_guard`` rule set). Runs land in ``./runs/hydra_sweep/``.
"""

from __future__ import annotations

import math
import sys

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

import expr_tracker as et

# The primary config, kept in this file so the example is self-contained; a real app would
# write the same as conf/config.yaml. `_self_` last: these values beat tracker/default.yaml.
ConfigStore.instance().store(
    name="hydra_sweep",
    node={
        "defaults": [{"tracker": "default"}, {"tracker/alerts": ["nan_guard"]}, "_self_"],
        "lr": 0.1,
        "steps": 30,
        "tracker": {"project": "hydra_sweep", "history": {"buffer": {"size": 10}}},
        "hydra": {
            "callbacks": {"tracker": {"_target_": "expr_tracker.hydra.TrackerCallback"}},
            "sweeper": {"params": {"lr": "0.3,0.1,0.03"}},
            "job": {"chdir": False},
        },
    },
)


@hydra.main(version_base="1.3", config_path=None, config_name="hydra_sweep")
def train(cfg: DictConfig) -> float:
    """Gradient descent on f(w) = (w - 3)^2; logs ``loss`` and ``w`` every step."""
    w = 0.0
    loss = math.inf
    for _ in range(cfg.steps):
        grad = 2.0 * (w - 3.0)
        w -= cfg.lr * grad
        loss = (w - 3.0) ** 2
        et.log({"loss": loss, "w": w})
    run = et.get_run()
    print(f"lr={cfg.lr}: final loss {loss:.3g} -> {run.dir}")
    return loss


if __name__ == "__main__":
    if not any(a in ("-m", "--multirun") for a in sys.argv[1:]):
        sys.argv.insert(1, "--multirun")
    train()
