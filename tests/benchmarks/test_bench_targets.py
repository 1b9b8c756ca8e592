"""benchmarks/bench_targets.py in its quick form: every row of issue 27's table is there,
measured by the script that owns it, or said to be unmeasured when its part is skipped.
(Not a timed test: no time is asserted.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import ROOT

BENCH = ROOT / "benchmarks" / "bench_targets.py"
pytestmark = pytest.mark.slow


def test_quick_run_fills_every_row_but_the_skipped_ones():
    p = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--skip", "query"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout.strip().splitlines()[-1])
    assert report["errors"] == {}
    assert set(report["reports"]) == {"log", "peers", "startup", "memory"}
    rows = {r["what"]: r for r in report["rows"]}
    assert len(rows) == 14
    for what, r in rows.items():
        if "query" in what or "aggregate" in what:
            assert (r["figure"], r["met"], r["text"]) == (None, None, "not measured"), what
        else:
            assert r["figure"] > 0 and r["met"] in (True, False), what
            assert r["met"] == (f"| {what} | {r['target']} | {r['text']} | **yes** |" in p.stdout)


def test_an_unknown_part_is_refused_by_name():
    p = subprocess.run(
        [sys.executable, str(BENCH), "--skip", "gpu"], capture_output=True, text=True
    )
    assert p.returncode == 2
    assert "'gpu' is not one of log, peers, startup, query, memory" in p.stderr
