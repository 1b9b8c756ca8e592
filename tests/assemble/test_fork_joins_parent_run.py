"""A process forked from one with an active run that calls ``et.init`` without a name joins
the parent's run (project, name, run directory): DataLoader workers following
docs/streams.md without ``name=`` write streams of the training run, not runs of their own."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

import expr_tracker as et

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")


def _worker_dirs(run_dir: Path) -> list[str]:
    return sorted(p.name for p in run_dir.glob("metrics.data*.jsonl"))


@pytest.mark.slow
def test_dataloader_workers_without_a_name_join_the_main_run(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, Dataset, get_worker_info

    class Squares(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            et.log({"item": i})
            return torch.tensor(float(i * i))

    def init_worker(_):
        et.init(stream=f"data{get_worker_info().id}", span_metrics=False)  # no name

    runs = tmp_path / "runs"
    run = et.init(project="streams", dir=str(runs))  # no explicit name either
    loader = DataLoader(
        Squares(),
        batch_size=2,
        num_workers=2,
        worker_init_fn=init_worker,
        multiprocessing_context="fork",
    )
    for batch in loader:
        et.log({"batch_sum": float(batch.sum())})
    et.finish()
    assert [p.name for p in (runs / "streams").iterdir()] == [run.name]  # one run
    assert _worker_dirs(run.dir) == ["metrics.data0.jsonl", "metrics.data1.jsonl"]
    assert [len(et.history(-1, run=run.dir, stream=f"data{w}")) for w in (0, 1)] == [4, 4]
    assert len(et.history(-1, run=run.dir)) == 4


def _child(stream, kwargs, out):
    try:
        run = et.init(stream=stream, **kwargs)
        et.log({"x": 1.0})
        et.finish()
        out.put(str(run.dir))
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        out.put(repr(exc))


def _in_fork(stream, **kwargs):
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=_child, args=(stream, kwargs, out))
    p.start()
    result = out.get(timeout=60)
    p.join(60)
    return result


def test_a_forked_child_joins_unless_it_names_another_run(tmp_path):
    runs = tmp_path / "runs"
    run = et.init(project="p", dir=str(runs))
    try:
        assert _in_fork("w") == str(run.dir)
        assert _in_fork("w2", project="p") == str(run.dir)
        own = _in_fork("w", name="own", dir=str(runs))  # a name of its own: its own run
        assert own == str(runs / "default" / "own")
        other = _in_fork("w", project="q", dir=str(runs))  # another project: its own run
        assert Path(other).parent == runs / "q"
        # no stream: a run of its own (joining would resume the parent's main stream)
        alone = _in_fork(None, project="p", dir=str(runs))
        assert Path(alone).parent == runs / "p" and alone != str(run.dir)
    finally:
        et.finish()
    assert sorted(p.name for p in run.dir.glob("metrics*.jsonl")) == [
        "metrics.w.jsonl",
        "metrics.w2.jsonl",
    ]
