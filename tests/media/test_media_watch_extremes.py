"""et.watch on parameters near float32's limits: the histogram's counts still put each
value in its bin (docs/media.md "Watching a model"), and non-finite values are counted."""

from __future__ import annotations

import pytest

import expr_tracker as et

torch = pytest.importorskip("torch")


def test_watch_histogram_of_huge_parameters_bins_each_value(tmp_path):
    et.init(project="p", name="huge", dir=str(tmp_path / "runs"), system=False)
    model = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.7e38, -1.7e38], [0.0, 1.0]]))
    et.watch(model, log="parameters", log_freq=1)
    model(torch.zeros(1, 2))
    et.log({"loss": 0.0})
    h = et.history()[0]["parameters/weight"]
    et.finish()
    # one value at each end, two in the middle bins: not all four in the first bin
    assert sum(h["values"]) == 4
    assert h["values"][0] == 1 and h["values"][-1] == 1
    assert h["values"][len(h["values"]) // 2] == 2
