"""benchmarks/bench_ranks.py at a tiny scale: every section runs in a fresh rank-0 process
with its peers' files, judges the steps and reports. (Not a timed test: no time is
asserted.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import ROOT

BENCH = ROOT / "benchmarks" / "bench_ranks.py"
pytestmark = pytest.mark.slow  # five fresh processes (about 5 s)


def test_tiny_ranks_bench():
    p = subprocess.run(
        [sys.executable, str(BENCH), "--n", "200", "--repeat", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    sections = json.loads(p.stdout.strip().splitlines()[-1])["sections"]
    assert sections["skew2_poll"]["judgements"] == 1200  # warm-up and timed steps, each once
    assert sections["skew8_poll"]["polls"] == 1200 and sections["base"]["judgements"] == 0
    assert sections["skew2"]["judgements"] > 0  # polled rarely, still judged
