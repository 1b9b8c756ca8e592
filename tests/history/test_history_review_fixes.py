"""Review fixes: step_range vs the default n, rank shards in the CLI, polars mixed columns,
meta-column order, runs that ended without rows, piped table widths."""

from __future__ import annotations

import inspect
import json
import logging
import math
import subprocess
import sys

import pytest

import expr_tracker as et
from expr_tracker.cli.main import main
from expr_tracker.history import read_history
from expr_tracker.history.query import DEFAULT_N, query_history


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def make_run(tmp_path, name="a", steps=300, rank=None, monkeypatch=None):
    if rank is not None:
        monkeypatch.setenv("RANK", str(rank))
    run = et.init(project="proj", name=name, dir=str(tmp_path / "runs"))
    for i in range(steps):
        et.log({"loss": 1.0 / (i + 1)})
    et.finish()
    if rank is not None:
        monkeypatch.delenv("RANK")
    return run.dir


# --------------------------------------------------------------------------- 1. step_range


def test_step_range_without_n_returns_the_whole_range_live_and_offline(tmp_path, capsys):
    run = et.init(project="proj", name="live", dir=str(tmp_path / "runs"))
    for i in range(300):
        et.log({"loss": float(i)})
    steps = [r["_step"] for r in et.history(step_range=(100, 200))]
    assert steps == list(range(100, 200))  # not the newest 50 of it
    assert [r["_step"] for r in et.history(50, step_range=(100, 200))] == list(range(150, 200))
    assert [r["_step"] for r in et.history(n=5, step_range="100:200")] == list(range(195, 200))
    assert len(et.history()) == 50  # the default n still applies without a range
    et.finish()

    assert len(et.history(run=run.dir, step_range="0:100")) == 100
    assert len(read_history(run.dir, step_range="0:100")) == 100
    assert len(read_history(run.dir, 10, step_range="0:100")) == 10
    assert len(query_history(run.dir, step_range=(0, 120))) == 120
    assert len(query_history(run.dir, n=50, step_range=(0, 120))) == 50
    assert len(et.history(-1, run=run.dir, step_range=(0, None))) == 300


def test_default_n_is_a_visible_50_told_apart_by_identity():
    default = inspect.signature(et.history).parameters["n"].default
    assert default is DEFAULT_N and default == 50 and isinstance(default, int)
    assert repr(default) == "50" and "= 50," in str(inspect.signature(et.history))
    assert int("50") is not DEFAULT_N  # an explicit 50 is another object: it cuts a range


def test_cli_step_range_prints_every_step_unless_n_is_given(tmp_path, capsys):
    run_dir = make_run(tmp_path)
    assert main(["history", str(run_dir), "--step-range", "100:200", "--format", "jsonl"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["_step"] for r in rows] == list(range(100, 200))
    args = ["history", str(run_dir), "--step-range", "100:200", "-n", "5", "--format", "jsonl"]
    assert main(args) == 0
    assert [json.loads(x)["_step"] for x in capsys.readouterr().out.splitlines()] == list(
        range(195, 200)
    )
    assert main(["history", str(run_dir), "--format", "jsonl"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 20  # the default without a range


# --------------------------------------------------------------------------- 2. rank shards


def test_runs_status_is_the_worst_of_the_producers(tmp_path, capsys, monkeypatch):
    run_dir = make_run(tmp_path, steps=5)
    make_run(tmp_path, steps=3, rank=1, monkeypatch=monkeypatch)
    shard_info = run_dir / "run.rank1.json"
    info = json.loads(shard_info.read_text())
    info.update(status="running", pid=dead_pid(), ended_at=None)  # rank 1 SIGKILLed
    shard_info.write_text(json.dumps(info))
    only = make_run(tmp_path, name="only-rank1", steps=2, rank=1, monkeypatch=monkeypatch)
    assert not (only / "run.json").exists()

    assert main(["runs", str(tmp_path / "runs"), "--format", "json"]) == 0
    by = {r["run"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(by) == {"proj/a", "proj/only-rank1"}
    assert by["proj/a"]["status"] == "crashed" and by["proj/a"]["producers"] == 2
    assert by["proj/a"]["producer_status"] == {"run.json": "finished", "run.rank1.json": "crashed"}
    assert by["proj/a"]["steps"] == 5  # rank 0's metrics
    assert by["proj/only-rank1"]["status"] == "finished"
    assert by["proj/only-rank1"]["steps"] == 2 and by["proj/only-rank1"]["producers"] == 1
    assert json.loads(shard_info.read_text())["status"] == "running"  # only reads

    assert main(["runs", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:4] == ["run", "status", "steps", "producers"]
    assert "2 (run.rank1 crashed)" in out

    info.update(status="failed")
    shard_info.write_text(json.dumps(info))
    assert main(["runs", str(tmp_path / "runs"), "--format", "json"]) == 0
    by = {r["run"]: r for r in json.loads(capsys.readouterr().out)}
    assert by["proj/a"]["status"] == "failed"


def test_history_rank_option_shard_note_and_shard_only_error(tmp_path, capsys, monkeypatch):
    run_dir = make_run(tmp_path, steps=5)
    make_run(tmp_path, steps=3, rank=1, monkeypatch=monkeypatch)
    assert main(["history", str(run_dir), "--format", "jsonl"]) == 0
    cap = capsys.readouterr()
    assert len(cap.out.splitlines()) == 5
    assert "metrics.rank1.jsonl" in cap.err and "--rank" in cap.err  # the note, on stderr
    assert main(["history", str(run_dir), "--rank", "1", "--format", "jsonl"]) == 0
    cap = capsys.readouterr()
    assert [json.loads(x)["_step"] for x in cap.out.splitlines()] == [0, 1, 2]
    assert "note" not in cap.err
    assert main(["history", str(run_dir), "--rank", "-1"]) == 2
    assert main(["history", str(run_dir), "--rank", "7"]) == 1
    assert "metrics.rank7.jsonl" in capsys.readouterr().err

    only = make_run(tmp_path, name="only", steps=2, rank=1, monkeypatch=monkeypatch)
    assert main(["history", str(only)]) == 1
    err = capsys.readouterr().err
    assert "metrics.rank1.jsonl" in err and "--rank" in err and "rank=1" in err
    assert main(["history", str(only), "--rank", "1", "--format", "jsonl"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_trace_rank_option(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    run = et.init(project="proj", name="t", dir=str(tmp_path / "runs"))
    for _ in range(2):
        with et.span("step"):
            et.log({"loss": 1.0})
    et.finish()
    monkeypatch.delenv("RANK")
    out = tmp_path / "t.json"
    assert main(["trace", str(run.dir), "--rank", "1", "-o", str(out)]) == 0
    assert "2 spans" in capsys.readouterr().out
    assert main(["trace", str(run.dir), "--rank", "0", "-o", str(out)]) == 1
    assert "ranks with span files: 1" in capsys.readouterr().err
    assert main(["trace", str(run.dir), "--rank", "x", "-o", str(out)]) == 2


# --------------------------------------------------------------------------- 4. polars


def test_polars_mixed_column_warns_once_naming_it(tmp_path, caplog):
    pytest.importorskip("polars")
    import polars as pl

    run = et.init(project="proj", name="mixed", dir=str(tmp_path / "runs"))
    for v in (1.0, "oops", math.nan, math.inf, 2):
        et.log({"mixed_metric": v, "fine": 1.5})
    et.log({"fine": 2})
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        df = et.history(-1, output_type="polars")
        et.history(-1, output_type="polars")
    et.finish()
    assert df.schema["fine"] == pl.Float64 and df.schema["_step"] == pl.Int64  # numbers stay
    assert df.schema["mixed_metric"] == pl.String
    warned = [r.getMessage() for r in caplog.records if "mixed_metric" in r.getMessage()]
    assert len(warned) == 1 and "pandas" in warned[0]
    assert not [r for r in caplog.records if "'fine'" in r.getMessage()]
    pdf = et.history(-1, run=run.dir, output_type="pandas")
    assert list(pdf["mixed_metric"][:2]) == [1.0, "oops"]  # pandas keeps the values


# --------------------------------------------------------------------------- 5. order


def test_meta_columns_come_last_with_and_without_metrics(tmp_path):
    et.init(project="proj", name="order", dir=str(tmp_path / "runs"))
    et.log({"a": 1, "b": 2})
    plain = et.history(1)[0]
    picked = et.history(1, metrics=["b", "a"])[0]
    filled = et.history(1, metrics="a,zz", fill_missing=True)[0]
    et.finish()
    assert list(plain) == ["a", "b", "_step", "_time"]
    assert list(picked) == ["b", "a", "_step", "_time"]
    assert list(filled) == ["a", "zz", "_step", "_time"]


# --------------------------------------------------------------------------- 6. no rows


def test_history_cli_on_a_run_that_ended_without_rows(tmp_path, capsys):
    run = et.init(project="proj", name="empty", dir=str(tmp_path / "runs"))
    et.finish()
    assert not (run.dir / "metrics.jsonl").exists()
    assert main(["history", str(run.dir)]) == 0
    cap = capsys.readouterr()
    assert "no rows" in cap.err and cap.out == ""
    assert main(["history", str(run.dir), "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines() == ["_step,_time"]
    # a run still running (not followed) without a metrics file is still an error
    info = json.loads((run.dir / "run.json").read_text())
    info.update(status="running", ended_at=None)
    (run.dir / "run.json").write_text(json.dumps(info))
    assert main(["history", str(run.dir)]) == 1


# --------------------------------------------------------------------------- 7. widths


def test_config_show_piped_uses_the_same_width_as_history(capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["config", "show"]) == 0
    lines = capsys.readouterr().out.splitlines()
    widest = max(len(ln) for ln in lines)
    assert 80 < widest <= 200  # not rich's 80-column default for a pipe
    monkeypatch.setenv("COLUMNS", "90")
    assert main(["config", "show"]) == 0
    assert max(len(ln) for ln in capsys.readouterr().out.splitlines()) <= 90
    assert main(["config", "show", "--width", "100"]) == 0
    assert max(len(ln) for ln in capsys.readouterr().out.splitlines()) <= 100
