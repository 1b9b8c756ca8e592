"""Two Hydra sweeps into the same sweep directory never continue each other's runs: run
names carry a stamp taken once per launch (on_multirun_start), pickled with the callback."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime

import pytest
from helpers import ROOT

pytest.importorskip("hydra")

from omegaconf import OmegaConf  # noqa: E402

from expr_tracker.hydra.callback import (  # noqa: E402
    _PROCESS_START,
    TrackerCallback,
    _fallback_launch_id,
    _fallback_launch_time,
    launch_stamp,
    sweep_prefix,
)


def _sweep(cwd):
    # verbatim from docs/hydra.md
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "hydra_sweep.py"),
            "hydra.sweep.dir=multirun/docs",
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_running_the_sweep_twice_with_the_same_sweep_dir(tmp_path):
    _sweep(tmp_path)
    _sweep(tmp_path)
    runs = sorted((tmp_path / "runs" / "hydra_sweep").iterdir())
    assert len(runs) == 6  # three per sweep, none resumed
    infos = {r.name: json.loads((r / "run.json").read_text()) for r in runs}
    for r in runs:
        info = infos[r.name]
        assert info["status"] == "finished" and info["steps"] == 30
        assert "previous_attempts" not in info and "resumed_at_step" not in info
        lines = (r / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(x)["_step"] for x in lines] == list(range(30))
    # one prefix (and one group) per sweep: multirun_docs-<YYYYmmdd-HHMMSS>-<launch id>
    prefixes = Counter(name.rsplit("-", 2)[0] for name in infos)
    assert len(prefixes) == 2 and set(prefixes.values()) == {3}
    for prefix in prefixes:
        stamp, launch_id = prefix.removeprefix("multirun_docs-").rsplit("-", 1)
        datetime.strptime(stamp, "%Y%m%d-%H%M%S")
        assert (tmp_path / "multirun" / "docs" / f".et-launch-{launch_id}").exists()
        assert {i["group"] for n, i in infos.items() if n.startswith(prefix)} == {
            f"hydra_sweep-{prefix}"
        }
        assert sorted(n.removeprefix(prefix) for n in infos if n.startswith(prefix)) == [
            "-0-lr=0.3",
            "-1-lr=0.1",
            "-2-lr=0.03",
        ]


def test_the_stamp_is_taken_once_and_pickled_with_the_callback(tmp_path):
    cb = TrackerCallback()
    assert cb.launched_at is None and cb.launch_id is None
    cb.on_multirun_start(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "x")}}}))
    assert abs(cb.launched_at - time.time()) < 5
    clone = pickle.loads(pickle.dumps(cb))  # what a process-pool launcher does
    assert clone.launched_at == cb.launched_at and clone.launch_id == cb.launch_id


def test_launches_into_one_sweep_dir_get_distinct_reserved_ids(tmp_path):
    ids = set()
    for _ in range(20):  # in the same second, mostly
        cb = TrackerCallback()
        cb.on_multirun_start(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
        ids.add(cb.launch_id)
    assert len(ids) == 20
    assert {p.name for p in tmp_path.iterdir()} == {f".et-launch-{i}" for i in ids}
    assert _fallback_launch_id("") == _fallback_launch_id("")  # one per process
    (tmp_path / "multirun.yaml").write_text("{}")
    assert _fallback_launch_id(str(tmp_path)) == _fallback_launch_id(str(tmp_path))


@pytest.mark.slow
def test_three_launches_into_one_sweep_dir_at_once_share_no_run(tmp_path):
    # the tester's repro: three sweeps into hydra.sweep.dir=multirun/same3 started together
    # (one-second launch stamps alone gave two of them the same run names)
    cmd = [
        sys.executable,
        str(ROOT / "examples" / "hydra_sweep.py"),
        "hydra.sweep.dir=multirun/same3",
        "steps=5",
        "lr=0.3,0.1",
    ]
    procs = [
        subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(3)
    ]
    errs = [p.communicate(timeout=180)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errs
    assert not any("resuming run" in e for e in errs), errs
    runs = sorted((tmp_path / "runs" / "hydra_sweep").iterdir())
    assert len(runs) == 6
    for r in runs:
        steps = [json.loads(x)["_step"] for x in (r / "metrics.jsonl").read_text().splitlines()]
        assert steps == list(range(5)), r.name
        assert "previous_attempts" not in json.loads((r / "run.json").read_text())


def test_prefix_keeps_a_time_named_sweep_dir_as_is():
    t = datetime(2024, 5, 1, 12, 0, 0).timestamp()
    # Hydra's default multirun/${now:%Y-%m-%d}/${now:%H-%M-%S}: already names this launch
    assert sweep_prefix("multirun/2024-05-01/12-00-00", t + 1) == "2024-05-01_12-00-00"
    # the same directory given again an hour later is another launch
    later = t + 3600
    assert sweep_prefix("multirun/2024-05-01/12-00-00", later) == (
        f"2024-05-01_12-00-00-{launch_stamp(later)}"
    )
    assert sweep_prefix("multirun/docs", t) == f"multirun_docs-{launch_stamp(t)}"
    assert launch_stamp(t) == "20240501-120000"


def test_fallback_launch_time(tmp_path):
    (tmp_path / "multirun.yaml").write_text("{}")
    os.utime(tmp_path / "multirun.yaml", (1_700_000_000, 1_700_000_000))
    assert _fallback_launch_time(str(tmp_path)) == 1_700_000_000
    assert _fallback_launch_time(str(tmp_path / "none")) == _PROCESS_START
    assert _fallback_launch_time("") == _PROCESS_START
