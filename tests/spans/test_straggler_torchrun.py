"""A real torchrun on gloo/CPU with a sleep injected into one rank's forward: rank 0's
skew() rule names that rank within 20 steps, and et ranks / et trace see it too
(docs/streams.md "Straggler ranks")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = """
import sys, time
import torch
import torch.distributed as dist
import expr_tracker as et

SLOW = int(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
et.init(
    project="p",
    name="straggle",
    dir=sys.argv[1],
    spec={"history": {"buffer": {"interval": 0.05}}},
    alert_rules=[{
        "name": "straggler",
        "condition": "skew(time_ms/forward) > 1.5",
        "for_steps": 5,
        "level": "warning",
        "message": "straggler rank {rank}",
    }],
)
x = torch.randn(16, 8)
for step in range(40):
    with et.span("forward"):
        if rank == SLOW:
            time.sleep(0.02)
        loss = model(x).pow(2).mean()
    with et.span("backward"):
        loss.backward()
    opt.step()
    opt.zero_grad()
    et.log({"loss": loss.item()})
et.finish()
dist.destroy_process_group()
"""


def torchrun(tmp_path, nproc: int, slow: int):
    pytest.importorskip("torch.distributed")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        "--standalone",
        str(script),
        str(tmp_path / "runs"),
        str(slow),
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env["OMP_NUM_THREADS"] = "1"
    p = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out, err = p.communicate(timeout=240)
    assert p.returncode == 0, out + err
    return tmp_path / "runs" / "p" / "straggle"


def firings(run_dir):
    lines = (run_dir / "alerts.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    return [r for r in recs if r.get("kind") == "transition" and r.get("state") == "firing"]


def check(run_dir, nproc: int, slow: int):
    fired = firings(run_dir)
    assert fired, (run_dir / "alerts.jsonl").read_text()
    assert fired[0]["message"] == f"straggler rank {slow}"
    assert fired[0]["step"] < 20  # named within 20 steps (5 of them the rule's for_steps)
    for r in range(1, nproc):  # the other ranks evaluate the rule too: UNKNOWN there
        path = run_dir / f"alerts.rank{r}.jsonl"
        assert not path.exists() or not firings_of(path)
    from expr_tracker.history.rankreport import rank_report

    rep = {s["span"]: s for s in rank_report(run_dir)["spans"]}
    fwd = rep["forward"]
    assert fwd["ranks"] == nproc and fwd["steps"] == 40
    assert max(fwd["slowest"], key=fwd["slowest"].get) == slow
    assert fwd["skew_median"] > 1.5


def firings_of(path):
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in recs if r.get("state") == "firing"]


@pytest.mark.slow  # two torch processes start: 30-45 s on 2 loaded cores (the 4-rank
# variant takes longer than the 30 s allowed; four ranks are tested in-process in
# tests/alerts/test_alerts_skew.py)
def test_torchrun_two_ranks_the_rule_names_the_slow_rank(tmp_path):
    check(torchrun(tmp_path, 2, 1), 2, 1)
