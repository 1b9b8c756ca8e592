"""The system sampler across processes (docs/system.md): a two-rank torchrun launch has one
sampler; SIGTERM mid-run leaves whole rows and a finished file; a forked child neither
samples nor waits for the parent's sampler."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from helpers import ROOT

import expr_tracker as et


def _env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK")}
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT), e.get("PYTHONPATH", "")])
    e["OMP_NUM_THREADS"] = "1"
    return e


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


TORCHRUN_SCRIPT = """
import sys, time
import torch.distributed as dist
import expr_tracker as et

dist.init_process_group("gloo")
rank = dist.get_rank()
run = et.init(project="p", name="tr", dir=sys.argv[1], system_interval="50ms")
et.log({"rank": rank})
end = time.monotonic() + 30
while rank == 0 and run.system.rows < 3 and time.monotonic() < end:
    time.sleep(0.02)
dist.barrier()
print(f"RANK {rank} sampler {run.system is not None}", flush=True)
et.finish()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_torchrun_two_ranks_one_sampler(tmp_path):
    pytest.importorskip("torch.distributed")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TORCHRUN_SCRIPT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone"]
    p = subprocess.run(
        [*cmd, str(script), str(tmp_path / "runs")],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "RANK 0 sampler True" in p.stdout and "RANK 1 sampler False" in p.stdout
    d = tmp_path / "runs" / "p" / "tr"
    assert sorted(q.name for q in d.glob("metrics.system*.jsonl")) == ["metrics.system.jsonl"]
    rows = _rows(d / "metrics.system.jsonl")
    assert len(rows) >= 3 and len({r["host"] for r in rows}) == 1


SIGTERM_SCRIPT = """
import sys, time, expr_tracker as et
run = et.init(project="p", name="term", dir=sys.argv[1], system_interval="50ms")
i = 0
while True:
    et.log({"x": i}); i += 1
    if run.system.rows >= 3 and i % 50 == 0:
        print("READY", flush=True)
    time.sleep(0.005)
"""


@pytest.mark.slow
def test_sigterm_mid_run_leaves_whole_rows(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGTERM_SCRIPT, str(tmp_path / "runs")],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "READY"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode != 0  # SIGTERM ends the process after finishing the run
    d = tmp_path / "runs" / "p" / "term"
    rows = _rows(d / "metrics.system.jsonl")  # every line whole JSON
    assert len(rows) >= 3
    steps = [r["_step"] for r in rows]
    assert steps == sorted(set(steps))
    meta = json.loads((d / "metrics.system.meta.json").read_text())
    assert meta["lines"] == len(rows)  # the writer was closed: its sidecar is final
    assert json.loads((d / "run.json").read_text())["status"] != "running"
    assert "Traceback" not in err


def _child_exits() -> None:
    time.sleep(0.2)


def test_a_forked_child_neither_samples_nor_waits(tmp_path):
    run = et.init(project="p", name="fork", dir=str(tmp_path / "runs"), system_interval="50ms")
    path = run.dir / "metrics.system.jsonl"
    end = time.monotonic() + 20
    while run.system.rows < 2 and time.monotonic() < end:
        time.sleep(0.02)
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_child_exits)
    child.start()
    child.join(60)
    assert child.exitcode == 0
    before = run.system.rows
    end = time.monotonic() + 20
    while run.system.rows < before + 2 and time.monotonic() < end:
        time.sleep(0.02)
    et.finish()
    rows = _rows(path)
    assert len(rows) == run.system.rows >= before + 2  # the parent's sampler went on
    steps = [r["_step"] for r in rows]
    assert steps == sorted(set(steps))  # one writer: nothing from the child
