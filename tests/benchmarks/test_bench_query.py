"""benchmarks/bench_query.py at a tiny scale: it writes real runs, reuses them on the next
call, checks every query's row count, reports each path, and refuses to wipe a folder it
did not write. (Not a timed test: no time is asserted.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import ROOT

BENCH = ROOT / "benchmarks" / "bench_query.py"
pytestmark = pytest.mark.slow


def bench(*args):
    return subprocess.run(
        [sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=600
    )


def test_tiny_run_then_reuse_then_foreign_folder_refused(tmp_path):
    data = tmp_path / "data"
    args = ["--data", str(data), "--runs", "4", "--steps", "300", "--repeat", "1"]
    p = bench(*args)
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout.strip().splitlines()[-1])
    assert set(report["results"]) == {"agg/py", "agg/cli", "nan/py", "nan/cli"}
    assert report["data"]["generated_s"] is not None and report["machine"]["cores"] >= 1
    assert all(r["cold"]["rss_mb"] > 0 for r in report["results"].values())
    # each path appended 1,000 steps to run r000, recorded so the data set stays valid
    manifest = json.loads((data / "bench-query.json").read_text())
    assert manifest["appended"] == {"r000": 4000}
    info = json.loads((data / "runs" / "bench" / "r000" / "run.json").read_text())
    assert info["last_step"] == 300 + 4000 - 1
    p = bench(*args, "--queries", "nan", "--paths", "py")
    assert p.returncode == 0, p.stderr
    assert "(reused)" in p.stdout
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("precious")
    p = bench("--data", str(foreign), "--runs", "2", "--steps", "10")
    assert p.returncode != 0 and "left alone" in p.stderr
    assert (foreign / "keep.txt").read_text() == "precious"
