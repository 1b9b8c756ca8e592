"""benchmarks/bench_peers.py at a tiny scale: expr_tracker, trackio (its local store) and
wandb (offline) each log in a fresh process, and the report has every library's figures and
expr_tracker's rows on disk. (Not a timed test: no time is asserted.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import ROOT

BENCH = ROOT / "benchmarks" / "bench_peers.py"
pytestmark = pytest.mark.slow


def test_tiny_round_of_every_library(tmp_path):
    p = subprocess.run(
        [sys.executable, str(BENCH), "--repeat", "1", "--n", "2000"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout.strip().splitlines()[-1])
    assert report["skipped"] == {}
    assert set(report["libs"]) == {"et", "trackio", "wandb"}
    for lib, figures in report["libs"].items():
        assert figures["n"] == 2000, lib
        assert 0 < figures["p50_us"] <= figures["p99_us"], lib
        assert figures["x_orjson"] > 0 and figures["x_json"] > 0, lib
    # 1,000 calls of warm-up and the 2,000 measured, each a line of metrics.jsonl
    assert report["libs"]["et"]["rows_written"] == [3000]
    assert report["et_vs_trackio"] > 0 and report["et_vs_wandb_floored"] > 0


def test_an_unknown_library_is_refused_by_name():
    p = subprocess.run(
        [sys.executable, str(BENCH), "--libs", "et,mlflow"], capture_output=True, text=True
    )
    assert p.returncode == 2
    assert "'mlflow' is not one of et, trackio, wandb" in p.stderr
