"""et.watch on parameters near float32's limits: the histogram's counts still put each
value in its bin (docs/media.md "Watching a model"), and non-finite values are counted."""

from __future__ import annotations

import pytest

import expr_tracker as et
from expr_tracker.media import load_histogram

torch = pytest.importorskip("torch")


def test_watch_histogram_of_huge_parameters_bins_each_value(tmp_path):
    et.init(project="p", name="huge", dir=str(tmp_path / "runs"), system=False)
    model = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.7e38, -1.7e38], [0.0, 1.0]]))
    et.watch(model, log="parameters", log_freq=1)
    model(torch.zeros(1, 2))
    et.log({"loss": 0.0})
    run_dir = et.get_run().dir
    ref = et.history()[0]["parameters/weight"]
    et.finish()
    h = load_histogram(run_dir, ref)[0].tolist()
    # one value at each end, two in the middle bins: not all four in the first bin
    assert sum(h) == 4
    assert h[0] == 1 and h[-1] == 1
    assert h[len(h) // 2] == 2
