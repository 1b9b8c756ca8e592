"""`et history`: empty results exit 0; --follow waits for a live run's first row and stops
when the run has ended and every row is printed."""

from __future__ import annotations

import csv
import io
import json
import os
import socket
import subprocess
import sys
import time

import pytest

import expr_tracker as et
from expr_tracker.cli.history import follow
from expr_tracker.cli.main import main


@pytest.fixture
def run_dir(tmp_path):
    run = et.init(project="proj", name="a", dir=str(tmp_path / "runs"))
    for i in range(5):
        et.log({"loss": 1.0 / (i + 1)})
    et.finish()
    return run.dir


# --------------------------------------------------------------------------- empty results


@pytest.mark.parametrize("rng", ["100:200", "7:5", "5:5"])
def test_empty_step_range_table_exits_0(run_dir, capsys, rng):
    assert main(["history", str(run_dir), "--step-range", rng]) == 0
    cap = capsys.readouterr()
    assert cap.out.split() == ["step", "time"]  # an empty table: the header only
    assert f"no rows in --step-range {rng}" in cap.err


@pytest.mark.parametrize("rng", ["100:200", "7:5"])
def test_empty_step_range_json_and_csv(run_dir, capsys, rng):
    assert main(["history", str(run_dir), "--step-range", rng, "--format", "jsonl"]) == 0
    assert capsys.readouterr().out == ""
    assert main(["history", str(run_dir), "--step-range", rng, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    args = ["history", str(run_dir), "--step-range", rng, "--format", "csv", "--metrics", "loss"]
    assert main(args) == 0
    assert list(csv.reader(io.StringIO(capsys.readouterr().out))) == [["_step", "_time", "loss"]]


def test_empty_table_with_metrics_and_n0(run_dir, capsys):
    args = ["history", str(run_dir), "--step-range", "100:", "--metrics", "loss"]
    assert main(args) == 0
    assert capsys.readouterr().out.split() == ["step", "time", "loss"]
    assert main(["history", str(run_dir), "-n", "0"]) == 0
    cap = capsys.readouterr()
    assert cap.out.split() == ["step", "time"] and cap.err == ""


# --------------------------------------------------------------------------- follow: the end


def _info(path, status, pid=None):
    path.write_text(
        json.dumps({"status": status, "pid": pid or os.getpid(), "host": socket.gethostname()})
    )


def _et(*args):
    return subprocess.Popen(
        [sys.executable, "-m", "expr_tracker.cli.main", "history", *args, "--interval", "0.02"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_follow_of_a_finished_run_prints_its_rows_and_exits(run_dir, capsys):
    args = ["history", str(run_dir), "-f", "--format", "jsonl", "--interval", "0.01"]
    assert main(args) == 0
    assert [json.loads(x)["_step"] for x in capsys.readouterr().out.splitlines()] == [0, 1, 2, 3, 4]


def test_follow_stops_after_the_last_row_once_done(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"a": 0, "_step": 0}\n')
    got = []
    state = {"done": False, "asked": 0}

    def done():
        state["asked"] += 1
        return state["done"]

    def sleep(_s):
        # the writer appends its last row and *then* says it finished
        with open(path, "ab") as f:
            f.write(b'{"a": 1, "_step": 1}\n')
        state["done"] = True

    follow(path, 0, got.extend, sleep=sleep, done=done)
    assert [r["_step"] for r in got] == [0, 1]


def test_follow_waits_for_the_file_of_a_live_run_then_exits_when_it_ends(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    _info(run / "run.json", "running")  # this test's process: alive
    proc = _et(str(run), "-f", "--format", "jsonl")
    try:
        assert "waiting for metrics.jsonl" in proc.stderr.readline()
        (run / "metrics.jsonl").write_text('{"loss": 1.0, "_step": 0}\n')
        assert json.loads(proc.stdout.readline()) == {"loss": 1.0, "_step": 0}
        with open(run / "metrics.jsonl", "a") as f:
            f.write('{"loss": 0.5, "_step": 1}\n')
        _info(run / "run.json", "finished")
        rc = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0
    out = proc.stdout.read()  # not communicate(): readline() left the rest in the buffer
    proc.stdout.close()
    proc.stderr.close()
    assert json.loads(out) == {"loss": 0.5, "_step": 1}


def test_follow_table_takes_columns_from_the_first_rows(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    _info(run / "run.json", "running")
    proc = _et(str(run), "-f")
    try:
        proc.stderr.readline()
        (run / "metrics.jsonl").write_text('{"loss": 1.0, "_step": 0}\n')
        assert proc.stdout.readline().split() == ["step", "time", "loss"]
        _info(run / "run.json", "failed")
        rc = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0
    out = proc.stdout.read()  # not communicate(): readline() left the rest in the buffer
    proc.stdout.close()
    proc.stderr.close()
    assert out.split() == ["0", "1"]  # step 0, loss 1 (no _time)


def test_follow_exits_when_the_run_crashed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.data.jsonl").write_text('{"x": 1, "_step": 0}\n{"x": 2, "_st')  # torn
    _info(run / "run.data.json", "running", pid=dead.pid)
    before = (run / "run.data.json").read_text()
    proc = _et(str(run), "--stream", "data", "-f", "--format", "csv")
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert out.splitlines() == ["_step,_time,x", "0,,1"]
    assert (run / "run.data.json").read_text() == before  # read only: not repaired


def test_follow_with_a_live_real_run(tmp_path):
    run = et.init(project="p", name="live", dir=str(tmp_path / "runs"))
    proc = _et(str(run.dir), "-f", "--format", "jsonl")
    try:
        time.sleep(0.3)
        for i in range(3):
            et.log({"loss": float(i)})
        et.finish()
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert [json.loads(x)["_step"] for x in out.splitlines()] == [0, 1, 2]


def test_follow_errors_when_no_row_can_come(tmp_path, capsys):
    assert main(["history", str(tmp_path / "nope"), "-f"]) == 1
    assert "no run" in capsys.readouterr().err
    bare = tmp_path / "bare"
    bare.mkdir()
    assert main(["history", str(bare), "-f"]) == 1  # no run.json: nothing says a run is coming
    assert "no metrics.jsonl" in capsys.readouterr().err
    _info(bare / "run.json", "finished")
    # the run ended without writing a row: nothing will come, and that is not an error
    assert main(["history", str(bare), "-f"]) == 0
    assert "no rows" in capsys.readouterr().err
