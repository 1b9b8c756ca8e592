"""examples/hydra_sweep.py: a multirun of three jobs, one run each, grouped under the sweep."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

pytest.importorskip("hydra")


@pytest.mark.slow
def test_hydra_sweep(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "hydra_sweep.py"), "hydra.sweep.dir=sweep/a"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    runs = sorted((tmp_path / "runs" / "hydra_sweep").iterdir())
    stamp = runs[0].name.split("-lr=")[0][: -len("-0")]  # sweep_a-<launch stamp>-<launch id>
    assert stamp.startswith("sweep_a-")
    assert [r.name for r in runs] == [
        f"{stamp}-0-lr=0.3",
        f"{stamp}-1-lr=0.1",
        f"{stamp}-2-lr=0.03",
    ]
    infos = [json.loads((r / "run.json").read_text()) for r in runs]
    assert len({i["group"] for i in infos}) == 1
    assert all(i["status"] == "finished" and i["steps"] == 30 for i in infos)
    assert [i["hydra"]["job_num"] for i in infos] == [0, 1, 2]
    for r, lr in zip(runs, (0.3, 0.1, 0.03), strict=True):
        assert json.loads((r / "config.json").read_text()) == {"lr": lr, "steps": 30}
        spec = json.loads((r / "spec.json").read_text())
        assert [rule["name"] for rule in spec["alerts"]["rules"]] == ["et_nan_guard"]
        assert spec["history"]["buffer"]["size"] == 10
        assert Path(infos[0]["hydra"]["config_dir"], "overrides.yaml").exists()
