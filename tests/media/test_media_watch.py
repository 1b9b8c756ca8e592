"""et.watch on a tiny torch model: histograms at the right steps only, gradients and
parameters, unwatch removes every hook (docs/media.md "Watching a model")."""

from __future__ import annotations

import pytest

import expr_tracker as et
from expr_tracker.media import load_histogram

torch = pytest.importorskip("torch")


def _train(model, steps):
    x = torch.randn(8, 3)
    for _ in range(steps):  # plain SGD (torch.optim's first import takes seconds)
        loss = model(x).pow(2).mean()
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
        et.log({"loss": loss.item()})


def test_watch_logs_at_multiples_of_log_freq_only(tmp_path):
    et.init(project="p", name="w", dir=str(tmp_path / "runs"), system=False)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    et.watch(model, log="all", log_freq=3)
    _train(model, 7)
    rows = et.history()
    with_hist = [r["_step"] for r in rows if "gradients/0.weight" in r]
    assert with_hist == [0, 3, 6]
    assert [r["_step"] for r in rows if "parameters/2.bias" in r] == [0, 3, 6]
    row = rows[3]
    g = row["gradients/0.weight"]
    et.get_run().media.flush()
    counts, edges = load_histogram(et.get_run().dir, g)
    assert g["_type"] == "histogram" and counts.sum() == 12 and len(edges) == 65
    assert row["gradients/0.weight.norm"] > 0 and row["parameters/0.weight.norm"] > 0
    # no hook is left between logged steps: only the forward pre-hook
    assert all(not p._backward_hooks for p in model.parameters())
    et.unwatch(model)
    assert not model._forward_pre_hooks
    _train(model, 4)
    assert not [r for r in et.history()[7:] if any(k.startswith("gradients/") for k in r)]


def test_watch_gradients_only_and_bad_arguments(tmp_path):
    with pytest.raises(et.NoActiveRunError):
        et.watch(torch.nn.Linear(2, 2))
    et.init(project="p", name="w2", dir=str(tmp_path / "runs"), system=False)
    model = torch.nn.Linear(3, 1)
    with pytest.raises(ValueError, match=r"watch\(log='weights'\) is not valid"):
        et.watch(model, log="weights")
    with pytest.raises(ValueError, match="log_freq=0"):
        et.watch(model, log_freq=0)
    with pytest.raises(ValueError, match="not a torch.nn.Module"):
        et.watch(object())
    et.watch(model, log_freq=2)  # gradients only, as wandb's default
    _train(model, 3)
    row = et.history()[2]
    assert "gradients/weight" in row and not [k for k in row if k.startswith("parameters/")]
    et.unwatch()
