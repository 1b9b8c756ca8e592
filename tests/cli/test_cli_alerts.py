"""`et alerts RUN`: a run's alerts from alerts.jsonl (table at 80 columns, one JSON document,
JSON lines), --since, --kind, --stream/--rank, missing runs, a closed pipe."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

import expr_tracker as et
from expr_tracker.cli.main import main

RULES = [
    "loss > 5 => error: loss is {loss} at step {step}, a message long enough to wrap twice over",
    {"name": "nan_guard", "condition": "isnan(loss)", "level": "critical"},
]


@pytest.fixture
def run_dir(tmp_path):
    """A real run: two rules fire (one on a NaN), delivered to a memory channel."""
    run = et.init(
        project="p",
        name="r",
        dir=str(tmp_path),
        alert={"channels": [{"type": "memory", "name": "mem"}]},
        alert_rules=RULES,
    )
    for loss in (1.0, 9.0, 1.0, math.nan, 2.0):
        et.log({"loss": loss})
    et.finish()
    return run.dir


def et_alerts(capsys, *argv):
    code = main(["alerts", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_table_is_readable_at_80_columns(run_dir, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = et_alerts(capsys, run_dir)
    assert code == 0
    lines = out.splitlines()
    assert all(len(line) <= 80 for line in lines), out
    assert lines[0].split() == ["step", "time", "event", "rule", "level", "detail"]
    assert "nan_guard" in out and "firing" in out and "resolved" in out and "delivered" in out
    # a long message wraps instead of being cut
    assert "twice" in out and "over" in out and "…" not in out


def test_json_is_one_strict_document(run_dir, capsys):
    code, out, _ = et_alerts(capsys, run_dir, "--format", "json")
    assert code == 0
    records = json.loads(out)  # one document: the whole output parses
    assert isinstance(records, list) and {r["kind"] for r in records} == {"transition", "delivery"}
    (nan_firing,) = [r for r in records if r["rule"] == "nan_guard" and r.get("event") == "firing"]
    assert nan_firing["metrics"] == {"loss": None} and nan_firing["step"] == 3  # NaN -> null
    assert "NaN" not in out


def test_jsonl_since_and_kind(run_dir, capsys):
    code, out, _ = et_alerts(capsys, run_dir, "--format", "jsonl", "--since", "3")
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and lines and all(r["step"] >= 3 for r in lines)
    assert {(r["kind"], r["rule"]) for r in lines} >= {("transition", "nan_guard")}
    code, out, _ = et_alerts(capsys, run_dir, "--format", "jsonl", "--kind", "transition")
    events = [(json.loads(line)["event"], json.loads(line)["step"]) for line in out.splitlines()]
    assert events == [("firing", 1), ("resolved", 2), ("firing", 3), ("resolved", 4)]


def test_since_keeps_stepless_records_after_the_first_one_kept(tmp_path, capsys):
    path = tmp_path / "alerts.jsonl"
    recs = [
        {"kind": "transition", "step": 1, "event": "firing", "rule": "a"},
        {"kind": "delivery", "step": None, "title": "early notice", "delivered": True},
        {"kind": "transition", "step": 5, "event": "firing", "rule": "b"},
        {"kind": "delivery", "step": None, "title": "run finished", "delivered": True},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"torn')
    code, out, err = et_alerts(capsys, path, "--since", "5", "--format", "jsonl")
    assert code == 0 and [
        json.loads(x).get("rule") or json.loads(x)["title"] for x in out.splitlines()
    ] == ["b", "run finished"]
    assert "skipped 1 line" in err


def test_stream_and_rank(tmp_path, capsys):
    run = et.init(project="p", name="s", dir=str(tmp_path), stream="eval", alert_rules=["x > 1"])
    et.log({"x": 2})
    et.finish()
    code, out, _ = et_alerts(capsys, run.dir, "--stream", "eval", "--format", "json")
    assert code == 0 and [r["event"] for r in json.loads(out) if r["kind"] == "transition"] == [
        "firing"
    ]
    code, _, err = et_alerts(capsys, run.dir)  # the main stream has no run here
    assert code == 1 and "metrics.eval.jsonl" in err
    # rank 2's shard: alerts.eval.rank2.jsonl beside metrics.eval.rank2.jsonl
    (run.dir / "metrics.eval.rank2.jsonl").write_text('{"_step": 0, "x": 3}\n')
    (run.dir / "alerts.eval.rank2.jsonl").write_text(
        json.dumps({"kind": "transition", "rule": "r2", "event": "firing", "step": 0}) + "\n"
    )
    code, out, _ = et_alerts(capsys, run.dir, "--stream", "eval", "--rank", "2", "--format", "json")
    assert code == 0 and [r["rule"] for r in json.loads(out)] == ["r2"]


def test_missing_run_and_a_run_without_alerts(tmp_path, capsys):
    code, _, err = et_alerts(capsys, tmp_path / "nope")
    assert code == 1 and "no run at" in err
    run = et.init(project="p", name="quiet", dir=str(tmp_path))
    et.log({"x": 1})
    et.finish()
    code, out, _ = et_alerts(capsys, run.dir, "--format", "json")
    assert (code, json.loads(out)) == (0, [])
    code, out, err = et_alerts(capsys, run.dir)
    assert code == 0 and out == "" and "no alerts recorded" in err
    code, _, err = et_alerts(capsys, run.dir, "--rank", "-1")
    assert code == 2 and "--rank" in err


@pytest.mark.slow
def test_closed_pipe_exits_0(tmp_path):
    path = tmp_path / "alerts.jsonl"
    rec = {"kind": "transition", "rule": "r", "event": "firing", "message": "x" * 200}
    path.write_text("".join(json.dumps({**rec, "step": i}) + "\n" for i in range(1000)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for fmt in ("jsonl", "table"):
        proc = subprocess.Popen(
            [sys.executable, "-m", "expr_tracker.cli.main", "alerts", str(path), "--format", fmt],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        proc.stdout.readline()
        proc.stdout.close()  # like `| head -1`
        err = proc.communicate(timeout=60)[1].decode()  # waits, and closes the pipes
        assert proc.returncode == 0, err
        assert "Traceback" not in err and "BrokenPipe" not in err, err
