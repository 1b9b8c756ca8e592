"""`et history` (table / JSON lines / CSV / --follow) and `et runs`."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import strict_loads

import expr_tracker as et
from expr_tracker.cli.history import follow
from expr_tracker.cli.main import main


@pytest.fixture
def run_dir(tmp_path):
    run = et.init(project="proj", name="a", dir=str(tmp_path / "runs"))
    for i in range(30):
        et.log({"loss": 1.0 / (i + 1), "acc": i / 30})
    et.log({"loss": float("nan"), "note": "x"})
    et.finish()
    return run.dir


def test_table(run_dir, capsys):
    assert main(["history", str(run_dir), "-n", "3"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["step", "time", "loss", "acc", "note"]
    assert [ln.split()[0] for ln in lines[1:]] == ["28", "29", "30"]
    assert "0.0344828" in out and "nan" in lines[-1]


def test_json_lines_are_strict(run_dir, capsys):
    assert main(["history", str(run_dir), "-n", "-1", "--format", "jsonl"]) == 0
    rows = [strict_loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["_step"] for r in rows] == list(range(31))
    assert rows[-1]["loss"] is None and rows[-1]["note"] == "x"
    # json: the same rows as one strict document, an array
    assert main(["history", str(run_dir), "-n", "-1", "--format", "json"]) == 0
    assert strict_loads(capsys.readouterr().out) == rows


def test_csv_with_metrics_and_step_range(run_dir, capsys):
    args = ["history", str(run_dir), "--format", "csv", "--metrics", "loss", "--step-range", "5:8"]
    assert main(args) == 0
    table = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert table[0] == ["_step", "_time", "loss"]
    assert [r[0] for r in table[1:]] == ["5", "6", "7"]
    assert float(table[1][2]) == pytest.approx(1 / 6)


def test_errors_have_exit_codes(tmp_path, run_dir, capsys):
    assert main(["history", str(tmp_path / "nope")]) == 1
    assert "no run" in capsys.readouterr().err
    assert main(["history", str(run_dir), "--step-range", "x"]) == 2
    assert "step_range" in capsys.readouterr().err
    assert main(["history", str(run_dir), "--stream", "other"]) == 1
    assert "metrics.other.jsonl" in capsys.readouterr().err


def test_a_stream_name_no_run_can_have_is_refused_as_et_init_does(run_dir, capsys):
    """A stream longer than et.init allows (64 characters) names no file: said so, as for
    an unsafe one, not "cannot read ...: file name too long" (issue 21, point 7)."""
    assert main(["history", str(run_dir), "--stream", "x" * 250]) == 1
    err = capsys.readouterr().err
    assert "at most 64 characters" in err and "too long" not in err, err


def test_follow_prints_rows_as_they_land(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"a": 0, "_step": 0}\n')
    got = []
    script = [
        b'{"a": 1, "_step": 1}\n{"a": 2, ',  # a line still being written
        b'"_step": 2}\n',
        b"",
    ]

    def sleep(_s):
        if script:
            with open(path, "ab") as f:
                f.write(script.pop(0))

    end = follow(path, path.stat().st_size, got.extend, stop=lambda: not script, sleep=sleep)
    assert [r["_step"] for r in got] == [1, 2]
    assert end == path.stat().st_size


#: starts the `et` entry point as from an interactive shell: Ctrl-C raises KeyboardInterrupt.
#: A child inherits an *ignored* SIGINT (Python then installs no KeyboardInterrupt handler),
#: and pytest itself runs with SIGINT ignored when a script starts it in the background
#: (`pytest ... &` in a non-interactive shell, some CI runners): the interrupt test then
#: hung until its timeout. Restoring the default here keeps the test independent of that.
ET_AS_FROM_A_TERMINAL = (
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module('expr_tracker.cli.main', run_name='__main__')"
)


def test_follow_command_until_interrupted(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"loss": 1.0, "_step": 0}\n')
    args = ["history", str(path), "--follow", "--format", "jsonl", "--interval", "0.02"]
    proc = subprocess.Popen(
        [sys.executable, "-c", ET_AS_FROM_A_TERMINAL, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # readiness: the child prints its first row only after Python's own SIGINT handler
        # is installed and it has entered the command; the second row only from the loop
        first = proc.stdout.readline()
        assert strict_loads(first)["_step"] == 0
        with open(path, "a") as f:
            f.write('{"loss": 0.5, "_step": 1}\n')
        second = proc.stdout.readline()
        assert strict_loads(second) == {"loss": 0.5, "_step": 1}
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()  # never leave a follower behind, whatever failed above
            proc.wait()
    err = proc.communicate()[1]  # the rest of the output, and the pipes closed
    assert rc == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


def test_follow_interrupt_works_when_the_launcher_ignored_sigint(tmp_path):
    """The same, with this process's SIGINT ignored while the child starts (what `pytest &`
    does): the test above must not depend on how pytest was started. The interrupt comes
    right after the first rows are printed, before or while the follow loop starts: Ctrl-C
    exits 0 there too (it used to exit 130 outside the loop)."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"loss": 1.0, "_step": 0}\n')
    args = ["history", str(path), "--follow", "--format", "csv", "--interval", "0.02"]
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", ET_AS_FROM_A_TERMINAL, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        assert proc.stdout.readline() == "_step,_time,loss\n"
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.communicate()[1]  # the rest of the output, and the pipes closed
    assert rc == 0, err


# --------------------------------------------------------------------------- et runs


def dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_runs_lists_newest_first_with_status(tmp_path, capsys):
    root = tmp_path / "runs"
    et.init(project="proj", name="old", dir=str(root))
    for i in range(10):
        et.log({"train/loss": 1.0 / (i + 1), "lr": 0.1, "time_ms/step": 3.0})
    et.finish()
    time.sleep(0.01)
    crashed = et.init(project="proj", name="crashed", dir=str(root))
    et.log({"loss": 2.0})
    et.finish()
    info_path = crashed.dir / "run.json"
    info = json.loads(info_path.read_text())
    info.update(status="running", pid=dead_pid(), ended_at=None)
    info_path.write_text(json.dumps(info))
    stray = root / "other" / "by-hand"
    stray.mkdir(parents=True)
    (stray / "metrics.jsonl").write_text('{"acc": 0.5, "_step": 0}\n{"acc": 0.7, "_step": 4}\n')
    os.utime(stray / "metrics.jsonl", (1, 1))  # oldest

    assert main(["runs", str(root), "--format", "json"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert [r["run"] for r in runs] == ["proj/crashed", "proj/old", "other/by-hand"]
    by = {r["run"]: r for r in runs}
    assert by["proj/crashed"]["status"] == "crashed"
    assert json.loads(info_path.read_text())["status"] == "running"  # listing only reads
    assert by["proj/old"]["status"] == "finished" and by["proj/old"]["steps"] == 10
    assert by["proj/old"]["metrics"] == {"train/loss": 0.1}
    assert by["other/by-hand"] == {**by["other/by-hand"], "status": "unknown", "steps": 5}
    assert by["other/by-hand"]["metrics"] == {"acc": 0.7}

    assert main(["runs", str(root)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:3] == ["run", "status", "steps"]
    assert "crashed" in out and "train/loss=0.1" in out
    assert main(["runs", str(tmp_path / "missing")]) == 1
