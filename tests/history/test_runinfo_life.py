"""A run's whole life from its ``run*.json`` (``history.runinfo.run_life``): the readers'
(``et runs``, ``et compare``, the ``runs`` view, ``et ui``) one rule for live, killed,
multi-producer and older runs and for values that are no times (docs/streams.md "Run
identity", Durations). The real attempts: tests/build/test_run_durations.py."""

from __future__ import annotations

import os
import socket

import pytest

from expr_tracker.history.runinfo import previous_attempt, run_life

HOST = socket.gethostname()
DEAD_PID = 2**22 + 12345  # above pid_max: no such process


def attempt(start, end, duration=None, status="finished"):
    return {"status": status, "started_at": start, "ended_at": end, "duration_s": duration}


def test_a_finished_run_of_three_attempts():
    info = {
        "status": "finished",
        "started_at": 1000.0,
        "ended_at": 1010.0,
        "duration_s": 9.5,  # monotonic: wins over ended - started
        "previous_attempts": [attempt(100.0, 110.0, 10.0), attempt(500.0, None, 4.0, "crashed")],
    }
    assert run_life(info) == {
        "first_started_at": 100.0,
        "wall_duration_s": 910.0,
        "active_duration_s": 23.5,
    }


def test_a_live_attempt_counts_to_now_and_a_killed_one_to_its_last_row():
    base = {"started_at": 1000.0, "ended_at": None, "duration_s": None, "host": HOST}
    base["previous_attempts"] = [attempt(100.0, 110.0, 10.0)]
    live = {**base, "status": "running", "pid": os.getpid()}
    assert run_life(live, last_time=1003.0, now=1020.0) == {
        "first_started_at": 100.0,
        "wall_duration_s": 920.0,
        "active_duration_s": 30.0,
    }
    dead = {**base, "status": "running", "pid": DEAD_PID}  # its process is gone
    assert run_life(dead, last_time=1003.0, now=1020.0)["active_duration_s"] == 13.0
    crashed = {**base, "status": "crashed", "pid": DEAD_PID}
    life = run_life(crashed, last_time=1003.0, now=1020.0)
    assert (life["wall_duration_s"], life["active_duration_s"]) == (903.0, 13.0)
    # no row of its own (the last one is an earlier attempt's): it counts 0 s
    assert run_life(crashed, last_time=105.0, now=1020.0)["active_duration_s"] == 10.0


def test_producers_count_the_time_at_least_one_ran():
    rank0 = {"status": "finished", "started_at": 100.0, "ended_at": 110.0, "duration_s": 10.0}
    rank1 = {"status": "finished", "started_at": 105.0, "ended_at": 120.0, "duration_s": 15.0}
    evaluator = {"status": "finished", "started_at": 200.0, "ended_at": 201.0, "duration_s": 1.0}
    assert run_life([rank0, rank1, evaluator]) == {
        "first_started_at": 100.0,
        "wall_duration_s": 101.0,
        "active_duration_s": 21.0,
    }


def test_an_earlier_versions_run_json():
    # no first_started_at, attempts without duration_s: the earliest start; ended ones by
    # their end, a killed one 0 s
    info = {
        "status": "finished",
        "started_at": 300.0,
        "ended_at": 301.0,
        "duration_s": 1.0,
        "previous_attempts": [
            {"status": "finished", "started_at": 100.0, "ended_at": 102.0},
            {"status": "crashed", "started_at": 200.0, "ended_at": None},
        ],
    }
    assert run_life(info) == {
        "first_started_at": 100.0,
        "wall_duration_s": 201.0,
        "active_duration_s": 3.0,
    }


@pytest.mark.parametrize(
    "bad", [None, "1000", True, float("nan"), float("inf"), -5.0, 1.7e18, [1], {"a": 1}]
)
def test_values_that_are_no_times_are_left_out_never_raised(bad):
    info = {
        "status": "finished",
        "started_at": 1000.0,
        "ended_at": 1002.0,
        "duration_s": bad,
        "first_started_at": bad,
        "previous_attempts": [{"started_at": bad, "duration_s": bad}, "x", None, 3],
    }
    life = run_life(info)
    assert life == {
        "first_started_at": 1000.0,
        "wall_duration_s": 2.0,
        "active_duration_s": 2.0,
    }
    assert run_life({"started_at": bad}) == dict.fromkeys(life)
    assert run_life([None, "x", {"previous_attempts": bad}]) == dict.fromkeys(life)


def test_previous_attempt_keeps_its_duration(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        '{"loss": 1, "_step": 0, "_time": 1000.5}\n{"loss": 2, "_step": 1, "_time": 1002.25}\n'
    )
    killed = {"status": "crashed", "started_at": 1000.0, "ended_at": None, "pid": 1}
    rec = previous_attempt(killed, metrics)
    assert (rec["duration_s"], rec["last_seen_at"]) == (2.25, 1002.25)
    done = {"status": "finished", "started_at": 1.0, "ended_at": 3.0, "duration_s": 1.5}
    assert previous_attempt(done, metrics)["duration_s"] == 1.5
    assert "last_seen_at" not in previous_attempt(done, metrics)
    # nothing written by it (the file's last row is older): 0 s; no file: 0 s
    late = {**killed, "started_at": 2000.0}
    assert previous_attempt(late, metrics)["duration_s"] == 0.0
    assert previous_attempt(killed, tmp_path / "missing.jsonl")["duration_s"] == 0.0
