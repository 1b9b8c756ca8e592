"""benchmarks/bench_wide.py at a tiny scale: it writes a wide run, builds its cache in fresh
processes that check the row count, and reports the machine with the figures. (Not a timed
test: no time is asserted.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import ROOT

BENCH = ROOT / "benchmarks" / "bench_wide.py"
pytestmark = pytest.mark.slow


def test_tiny_wide_run():
    p = subprocess.run(
        [sys.executable, str(BENCH), "--metrics", "3000", "--lines", "3", "--repeat", "1"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout.strip().splitlines()[-1])
    assert report["metrics_per_line"] == 3000 and report["lines"] == 3
    assert report["build_mb_s"] > 0 and report["decode_mb_s"] > 0
    assert report["machine"]["cores"] >= 1 and report["code"] == str(ROOT)
