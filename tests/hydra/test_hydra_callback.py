"""TrackerCallback: one run per Hydra job, finished at job end, also when the job raised."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("hydra")

from expr_tracker.hydra.callback import job_run_name, sweep_stamp  # noqa: E402

APP = textwrap.dedent(
    """
    import hydra
    from omegaconf import DictConfig
    import expr_tracker as et

    @hydra.main(version_base="1.3", config_path="conf", config_name="config")
    def main(cfg: DictConfig) -> None:
        et.log({"loss": 1.0})
        et.log({"loss": 2.0}, commit=False)
        if cfg.fail:
            raise RuntimeError("boom in the task")

    if __name__ == "__main__":
        main()
    """
)
CONFIG = textwrap.dedent(
    """
    defaults:
      - tracker: default
      - _self_
    fail: false
    lr: 0.1
    tracker:
      project: cb
    hydra:
      callbacks:
        tracker:
          _target_: expr_tracker.hydra.TrackerCallback
    """
)


@pytest.fixture
def app(tmp_path):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "config.yaml").write_text(CONFIG)
    (tmp_path / "app.py").write_text(APP)
    return tmp_path


def _run(app, *args):
    return subprocess.run(
        [sys.executable, "app.py", *args], cwd=app, capture_output=True, text=True, timeout=120
    )


def _runs(app):
    return sorted((app / "runs" / "cb").iterdir())


@pytest.mark.slow
def test_single_run_finishes_and_records_hydra(app):
    proc = _run(app, "tracker.name=single", "lr=0.5")
    assert proc.returncode == 0, proc.stderr
    run_dir = app / "runs" / "cb" / "single"
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "finished"
    assert info["steps"] == 2  # the open row was committed at job end
    hydra = info["hydra"]
    assert hydra["mode"] == "RUN" and hydra["overrides"] == ["tracker.name=single", "lr=0.5"]
    from pathlib import Path

    assert (Path(hydra["config_dir"]) / "config.yaml").exists()
    assert (Path(hydra["config_dir"]) / "overrides.yaml").exists()
    config = json.loads((run_dir / "config.json").read_text())
    assert config == {"fail": False, "lr": 0.5}


@pytest.mark.slow
def test_failed_job_marks_run_failed_with_error(app):
    proc = _run(app, "tracker.name=bad", "fail=true")
    assert proc.returncode != 0
    info = json.loads((app / "runs" / "cb" / "bad" / "run.json").read_text())
    assert info["status"] == "failed"
    assert info["exception"]["type"] == "RuntimeError"
    assert "boom in the task" in info["exception"]["message"]
    assert info["steps"] == 2
    lines = (app / "runs" / "cb" / "bad" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["loss"] == 2.0


@pytest.mark.slow
def test_multirun_one_run_per_job_grouped(app):
    proc = _run(app, "-m", "lr=0.1,0.2", "hydra.sweep.dir=multirun/s1")
    assert proc.returncode == 0, proc.stderr
    runs = _runs(app)
    # multirun_s1-<launch stamp>-<launch id>-<num>-<overrides>: one stamp for the whole sweep
    stamps = {
        re.fullmatch(r"multirun_s1-(\d{8}-\d{6}-[0-9a-f]{6})-\d-lr=0\.\d", r.name)[1] for r in runs
    }
    assert len(stamps) == 1
    (stamp,) = stamps
    assert [r.name for r in runs] == [
        f"multirun_s1-{stamp}-0-lr=0.1",
        f"multirun_s1-{stamp}-1-lr=0.2",
    ]
    infos = [json.loads((r / "run.json").read_text()) for r in runs]
    assert {i["group"] for i in infos} == {f"app-multirun_s1-{stamp}"}
    assert [i["hydra"]["job_num"] for i in infos] == [0, 1]
    assert all(i["status"] == "finished" for i in infos)
    assert [json.loads((r / "config.json").read_text())["lr"] for r in runs] == [0.1, 0.2]


@pytest.mark.slow
def test_invalid_spec_fails_the_job_naming_the_config_key(app):
    proc = _run(app, "tracker.history.buffer.size=0")
    assert proc.returncode != 0
    assert "tracker.history.buffer.size" in proc.stderr


def test_names():
    assert sweep_stamp("multirun/2024-05-01/12-00-00") == "2024-05-01_12-00-00"
    assert job_run_name("s", 3, "+tracker/alerts=nan_guard,lr=0.1") == (
        "s-3-+tracker_alerts=nan_guard,lr=0.1"
    )
    long = job_run_name("s", 1, "x=" + "a" * 400)
    assert len(long.encode()) <= 200 and "/" not in long
