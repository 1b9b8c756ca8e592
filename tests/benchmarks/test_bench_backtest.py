"""benchmarks/bench_backtest.py at a tiny scale: every section runs and the backtest finds the
diverging run. (Not a timed test: no time is asserted.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT

BENCH = ROOT / "benchmarks" / "bench_backtest.py"
pytestmark = pytest.mark.slow  # four fresh processes importing pyarrow and DuckDB


def test_tiny_backtest_bench(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    p = subprocess.run(
        [sys.executable, str(BENCH), "--runs", "4", "--steps", "400", "--repeat", "1"]
        + ["--data", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout.strip().splitlines()[-1])
    assert (report["runs"], report["steps"], report["rules"]) == (4, 400, 10)
    assert set(report["sections"]) == {"vector", "read", "cli", "replay"}
    cli = report["sections"]["cli"]
    assert cli["bad_runs"] == 1 and cli["caught_nan"] == 1 and cli["false_positives"] == 0
    assert report["sections"]["read"]["runs"] == 4
