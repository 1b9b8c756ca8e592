"""``define_metric`` (expr_tracker/history/metricdefs.py and Run.define_metric): summary
aggregations on real rows, globs, ``none``, user assignments, resume after a kill, the
step metric readers index by, and the "define_metric" event."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import textwrap

import pytest

import expr_tracker as et
from expr_tracker.history.metricdefs import MetricDefs, parse_summary

LOSSES = [3.0, 1.0, float("nan"), 2.0, 0.5, 4.0]


def _summary(run):
    return json.loads((run.dir / "summary.json").read_text())


def test_aggregations_on_real_rows():
    run = et.init(project="p", name="r")
    et.define_metric("loss", summary="min,max,mean")
    et.define_metric("acc", summary="last")
    et.define_metric("lr", summary="first")
    et.define_metric("grad", summary="none")
    et.define_metric("val", summary="best", goal="maximize")
    for i, loss in enumerate(LOSSES):
        et.log({"loss": loss, "acc": i / 10, "lr": 1.0 / (i + 1), "grad": i, "val": i % 3, "x": i})
    et.finish()
    s = _summary(run)
    finite = [v for v in LOSSES if not math.isnan(v)]
    assert s["loss"] == {"min": 0.5, "max": 4.0, "mean": pytest.approx(sum(finite) / len(finite))}
    assert s["acc"] == {"last": 0.5} and s["lr"] == {"first": 1.0} and s["val"] == {"best": 2}
    assert "grad" not in s
    assert s["x"] == 5  # no definition: the last value, as before
    assert run.summary["loss"]["min"] == 0.5  # reading the summary agrees with the file


def test_glob_exact_wins_and_latest_glob_wins():
    run = et.init(project="p", name="r")
    et.define_metric("val/*", summary="min")
    et.define_metric("val/acc", summary="max")
    et.define_metric("train/*", summary="none")
    et.define_metric("train/l*", summary="mean")
    for v in (3, 1, 2):
        et.log({"val/loss": v, "val/acc": v, "train/loss": v, "train/step_time": v})
    et.finish()
    s = _summary(run)
    assert s["val/loss"] == {"min": 1} and s["val/acc"] == {"max": 3}
    assert s["train/loss"] == {"mean": 2.0} and "train/step_time" not in s


def test_user_assignment_wins():
    run = et.init(project="p", name="r")
    et.define_metric("loss", summary="min")
    et.log({"loss": 2.0})
    et.summary["loss"] = "overridden"
    et.log({"loss": 1.0})
    et.finish()
    assert _summary(run)["loss"] == "overridden"


def test_overwrite_false_merges_with_the_earlier_definition():
    run = et.init(project="p", name="r")
    et.define_metric("loss", step_metric="it", summary="min")
    d = et.define_metric("loss", hidden=True, overwrite=False)
    assert (d.step_metric, d.summary, d.hidden) == ("it", ("min",), True)
    d = run.define_metric("loss", hidden=True)
    assert (d.step_metric, d.summary) == (None, None)


def test_event_and_persisted_definitions():
    run = et.init(project="p", name="r")
    events = []
    run.subscribe(lambda event, payload: events.append((event, payload)))
    et.define_metric("val/loss", step_metric="iter", summary="min,max", hidden=False)
    assert events == [
        (
            "define_metric",
            {
                "name": "val/loss",
                "step_metric": "iter",
                "summary": "min,max",
                "hidden": False,
                "goal": None,
            },
        )
    ]
    saved = json.loads((run.dir / "metric_defs.json").read_text())
    assert saved["definitions"][0]["step_metric"] == "iter"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"summary": "minimum"}, "minimum"),
        ({"summary": "none,min"}, "cannot be combined"),
        ({"summary": 3}, "not valid"),
        ({"goal": "up"}, "minimize"),
        ({"step_metric": ""}, "step_metric"),
        ({"hidden": "yes"}, "hidden"),
    ],
)
def test_bad_definitions_name_what_is_valid(kwargs, match):
    et.init(project="p", name="r")
    with pytest.raises((ValueError, TypeError), match=match):
        et.define_metric("loss", **kwargs)


def test_parse_summary():
    assert parse_summary("min, MAX") == ("min", "max") and parse_summary(None) is None
    assert parse_summary(["mean", "mean"]) == ("mean",)


def test_keys_without_a_definition_cost_one_lookup():
    defs = MetricDefs()
    defs.define("val/*", summary="min")
    defs.update({"train/loss": 1.0, "val/loss": 2.0, "_step": 0})
    assert defs._cache == {"train/loss": None, "val/loss": defs.lookup("val/loss"), "_step": None}
    assert set(defs.state) == {"val/loss"}


def test_no_definition_leaves_the_row_path_alone():
    run = et.init(project="p", name="r")
    et.define_metric("loss", step_metric="it")  # no summary: nothing aggregates
    assert not run.summary.defs.aggregating
    et.log({"loss": 1.0})
    assert run.summary.defs.state == {}


def test_resume_continues_the_aggregation_after_a_kill(tmp_path):
    code = textwrap.dedent(
        """
        import os, signal, sys
        import expr_tracker as et
        run = et.init(project="p", name="r", dir=sys.argv[1])
        et.define_metric("val/loss", summary="min,mean")
        for v in (5.0, 0.25, 3.0):
            et.log({"val/loss": v})
        run.flush()                      # summary.json and metric_defs.json saved here
        for v in (0.125, 7.0):
            et.log({"val/loss": v})
        run.history.flush()              # these rows are on disk, the summary is not
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    runs = tmp_path / "runs"
    p = subprocess.run([sys.executable, "-c", code, str(runs)], capture_output=True, timeout=60)
    assert p.returncode == -signal.SIGKILL, p.stderr
    run = et.init(project="p", name="r", dir=str(runs))  # no define_metric call this time
    assert run.resumed
    et.log({"val/loss": 1.0})
    et.finish()
    values = [5.0, 0.25, 3.0, 0.125, 7.0, 1.0]
    assert _summary(run)["val/loss"] == {"min": 0.125, "mean": pytest.approx(sum(values) / 6)}


def test_history_index_by_step_metric_live_and_offline():
    run = et.init(project="p", name="r")
    et.define_metric("iter")
    et.define_metric("val/*", step_metric="iter")
    for it in range(0, 50, 10):
        row = {"iter": it, "train/loss": 1.0 / (it + 1)}
        if it % 20 == 0:
            row["val/loss"] = it / 100
        et.log(row)
    live = et.history(output_type="pandas", metrics=["val/loss"], index=True, dropna=True)
    assert list(live.index) == [0, 20, 40] and list(live["val/loss"]) == [0.0, 0.2, 0.4]
    assert live.index.name == "iter"
    explicit = et.history(output_type="pandas", metrics="train/loss", index="iter")
    assert list(explicit.index) == [0, 10, 20, 30, 40]
    et.finish()
    offline = et.read_history(run.dir, output_type="pandas", metrics="val/loss", index=True)
    assert offline.index.name == "iter" and len(offline) == 5
    pl_frame = et.read_history(run.dir, output_type="polars", metrics="val/loss", index=True)
    assert pl_frame.columns[0] == "iter"
    with pytest.raises(ValueError, match="output_type='pandas'"):
        et.read_history(run.dir, metrics="val/loss", index=True)
    with pytest.raises(ValueError, match="step_metric"):
        et.read_history(run.dir, output_type="pandas", metrics="train/loss", index=True)
    with pytest.raises(ValueError, match="needs metrics"):
        et.read_history(run.dir, output_type="pandas", index=True)
    with pytest.raises(TypeError, match="index="):
        et.read_history(run.dir, output_type="pandas", metrics="val/loss", index=3)
