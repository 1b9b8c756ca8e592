"""A real CPU Optuna study over the digits model (examples/train_digits.py, its Hydra config
composed with Hydra's compose API): the shipped `+tracker/alerts=prune_median` rule set,
raising optuna.TrialPruned through `=> prune:`, against Optuna's MedianPruner reporting the
validation loss per epoch (docs/alerts.md "Comparing with other runs").

The same seeded RandomSampler draws the same learning rates in every study, so the trials
pair up; a study with no pruner gives each trial's full-length result, which says which
trials diverge (final eval/loss above 1.0: chance is ln 10 = 2.30, a learning rate that
works ends near 0.1-0.3) and how many steps each pruner saved.
"""

from __future__ import annotations

import importlib.util
import json
import math
import statistics
from pathlib import Path

import pytest
from helpers import ROOT

pytestmark = pytest.mark.slow  # 3 studies x 10 trials of real training: 15-20 s on 2 loaded cores
torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")
pytest.importorskip("hydra")
optuna = pytest.importorskip("optuna")

from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.core.global_hydra import GlobalHydra  # noqa: E402

import expr_tracker as et  # noqa: E402

N_TRIALS = 10
EPOCHS = 4
STEPS_PER_EPOCH = 23  # ceil(1437 training images / batch 64)
SEED = 3  # the sampler's: its first draws include good and diverging learning rates
DIVERGED = 1.0  # final eval/loss above this: the learning rate diverged


def _load_example():
    spec = importlib.util.spec_from_file_location("train_digits", ROOT / "examples/train_digits.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _study(digits, runs: Path, mode: str) -> dict:
    """Run one study; per trial number: lr, final eval/loss (None when pruned) and the
    training steps it ran (the cost a pruner saves)."""
    trials: dict[int, dict] = {}

    overrides = [f"train.epochs={EPOCHS}", "trace=false", f"tracker.dir={runs}"]
    overrides.append(f"tracker.project={mode}")
    if mode == "rule":
        overrides += ["+tracker/alerts=prune_median", "tracker.alerts.guard_metric=train/loss"]
    base = compose("train_digits", overrides=overrides)  # once: a trial changes two keys

    def objective(trial):
        lr = trial.suggest_float("lr", 1e-3, 3.0, log=True)
        cfg = base.copy()
        cfg.train.lr = lr
        cfg.tracker.name = f"trial-{trial.number}"
        record = trials[trial.number] = {"lr": lr, "value": None}

        def report(epoch, step, metrics):
            if mode == "median":
                trial.report(metrics["eval/loss"], epoch)
                if trial.should_prune():
                    raise optuna.TrialPruned(f"epoch {epoch}")

        def steps_trained() -> int:  # the last row the run logged (a rule prunes mid-epoch)
            rows = (runs / mode / f"trial-{trial.number}" / "metrics.jsonl").read_text()
            return json.loads(rows.splitlines()[-1])["_step"] + 1

        try:
            run = digits.train(cfg, on_eval=report)
        except optuna.TrialPruned:
            if mode == "median":
                # pruned by Optuna, not by a rule: the run ends failed, never a peer
                et.finish(exit_code=1)
            record["steps"] = steps_trained()
            raise
        et.finish()
        record["steps"] = steps_trained()
        record["value"] = run.summary["eval/loss"]
        return record["value"]

    pruner = {
        "none": optuna.pruners.NopPruner(),
        # 3 finished trials before pruning, as the rule set's min_runs=3
        "median": optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=0),
        "rule": optuna.pruners.NopPruner(),  # the rule prunes, from inside et.log()
    }[mode]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=SEED), pruner=pruner)
    study.optimize(objective, n_trials=N_TRIALS)
    for t in study.trials:
        trials[t.number]["state"] = t.state.name
    return {"trials": trials, "best": study.best_value}


@pytest.fixture
def studies(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    torch.set_num_threads(1)
    digits = _load_example()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
            return {m: _study(digits, tmp_path / "runs", m) for m in ("none", "median", "rule")}
    finally:
        GlobalHydra.instance().clear()


def test_prune_median_rule_prunes_diverging_trials_earlier_than_median_pruner(studies, tmp_path):
    full, median, rule = (studies[m]["trials"] for m in ("none", "median", "rule"))
    assert [full[n]["lr"] for n in full] == [rule[n]["lr"] for n in rule]  # paired trials
    diverging = [n for n in full if full[n]["value"] > DIVERGED]
    good = [n for n in full if full[n]["value"] <= DIVERGED]
    assert len(diverging) >= 3 and len(good) >= 3, {n: full[n]["value"] for n in full}

    # the rule prunes what it prunes with status `pruned` in run.json
    for n, t in rule.items():
        info = json.loads((tmp_path / "runs/rule" / f"trial-{n}" / "run.json").read_text())
        assert (info["status"] == "pruned") == (t["state"] == "PRUNED"), (n, info["status"])

    full_steps = EPOCHS * STEPS_PER_EPOCH
    # every diverging trial the MedianPruner stops, the rule stops too, no later on average
    late = [n for n in diverging if n >= 3]  # once 3 trials finished: both need 3 peers
    pruned_by_median = [n for n in late if median[n]["state"] == "PRUNED"]
    pruned_by_rule = [n for n in late if rule[n]["state"] == "PRUNED"]
    assert pruned_by_rule == late and set(pruned_by_median) <= set(pruned_by_rule)
    mean_median = statistics.mean(median[n]["steps"] for n in late)
    mean_rule = statistics.mean(rule[n]["steps"] for n in late)
    assert mean_rule <= mean_median < full_steps, (mean_rule, mean_median)

    # no worse best result. Both studies draw the same learning rates and train
    # deterministically (seeded, one thread), so a trial that completes gives the very value
    # it gives unpruned; the best values differ only if a pruner stopped the best trial.
    # The tolerance, 0.02 eval/loss (14 % of the best, 0.139), fails a pruner that stopped
    # both of the two best trials (0.139, 0.140: the next is 0.166) and stays far above the
    # float noise of other CPUs and torch builds.
    assert studies["rule"]["best"] <= studies["median"]["best"] + 0.02
    assert math.isclose(studies["rule"]["best"], studies["none"]["best"], abs_tol=0.02)
