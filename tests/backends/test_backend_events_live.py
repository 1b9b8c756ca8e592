"""The run events a mirror consumes come from the real calls (not from run.emit in a test):
et.config changes, et.summary assignments, et.define_metric and artifacts logged and used
reach a backend object in the order they happened, with the contracted payloads."""

from __future__ import annotations

from backends.test_custom_backend import Recorder

import expr_tracker as et


def test_config_summary_define_metric_and_artifacts_reach_a_backend(tmp_path):
    rec = Recorder()
    src = tmp_path / "data.txt"
    src.write_text("abc")
    et.init(
        project="p", name="events", dir=str(tmp_path / "runs"), backends=[rec], config={"lr": 0.1}
    )
    try:
        et.config.update({"batch": 32})
        et.define_metric("val/loss", summary="min")
        et.log({"val/loss": 2.0})
        et.summary["best"] = 0.5
        logged = et.log_artifact(str(src), name="data", aliases=["good"])
        used = et.use_artifact("data:good")
    finally:
        et.finish()
    events = [c for c in rec.calls if c[0] != "log"]
    kinds = [e[0] for e in events]
    assert kinds[:5] == ["config", "define_metric", "summary", "artifact", "artifact"], kinds
    assert events[0][1]["changes"] == {"batch": 32}
    assert events[1][1]["name"] == "val/loss" and events[1][1]["summary"] == "min"
    assert events[2][1]["changes"] == {"best": 0.5}
    logged_ev, used_ev = events[3][1], events[4][1]
    assert logged_ev["action"] == "logged" and used_ev["action"] == "used"
    assert logged_ev["name"] == used_ev["name"] == "data"
    assert logged_ev["version"] == used_ev["version"] == logged.version == used.version
    assert logged_ev["digest"] == logged.digest
    assert logged_ev["step"] == 1  # the step the next log() writes
    assert "good" in logged_ev["aliases"]
    assert rec.rows() == [(0, {"val/loss": 2.0})]
    # the final summary at finish carries the define_metric aggregation and the assignment
    final = [e for e in events if e[0] == "summary" and e[1].get("final")]
    assert final and final[-1][1]["changes"]["best"] == 0.5
    assert final[-1][1]["changes"]["val/loss"] == {"min": 2.0}
    assert rec.exit_code == 0
