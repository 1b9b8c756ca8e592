"""examples/quickstart.py runs offline and leaves a complete run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import ROOT


@pytest.mark.slow
def test_quickstart(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py"), "--steps", "50", "--name", "q"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    run = tmp_path / "runs" / "quickstart" / "q"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 50 and rows[-1]["_step"] == 49
    assert "time_ms/data" in rows[0] and "time_ms/step" in rows[0]
    assert json.loads((run / "run.json").read_text())["status"] == "finished"
    assert json.loads((run / "config.json").read_text()) == {"lr": 0.05, "steps": 50}
    assert "final_w" in json.loads((run / "summary.json").read_text())
    assert (run / "spans.jsonl").exists()
