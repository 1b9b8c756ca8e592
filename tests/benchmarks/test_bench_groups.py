"""benchmarks/bench_groups.py at a tiny scale: it runs every centre and band and reports
them with the machine. (Not a timed test: no time is asserted.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT

BENCH = ROOT / "benchmarks" / "bench_groups.py"
pytestmark = pytest.mark.slow


def test_tiny_group_band_bench():
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    p = subprocess.run(
        [sys.executable, str(BENCH), "--seeds", "4", "--steps", "20", "--repeat", "1"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout.strip().splitlines()[-1])
    assert report["seeds"] == 4 and report["steps"] == 20
    assert set(report["median_s"]) == {
        "mean/std",
        "mean/minmax",
        "mean/sem",
        "mean/ci",
        "median/minmax",
        "median/ci",
    }
    assert all(v >= 0 for v in report["median_s"].values())
    assert report["machine"]["cores"] >= 1
