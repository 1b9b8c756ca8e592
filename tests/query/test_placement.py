"""An output written under a temporary name beside it and renamed into place, or refused
(expr_tracker/query/placement.py): the one placement of `et export` and `et query -o`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from expr_tracker.query.placement import OutputAppeared, Placement, temp_beside


def _host(out) -> str:
    return temp_beside(out).name.split(".")[-3]  # .NAME.HOST.PID.partial


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_file_is_renamed_into_place_and_nothing_else_stays(tmp_path):
    out = tmp_path / "o.csv"
    place = Placement(out, overwrite=False)
    assert place.tmp == temp_beside(out) and place.tmp.parent == tmp_path
    assert place.tmp.name.startswith(".o.csv.") and place.tmp.name.endswith(".partial")
    place.tmp.write_text("a\n")
    place.commit()
    assert out.read_text() == "a\n" and [p.name for p in tmp_path.iterdir()] == ["o.csv"]


def test_an_output_that_appeared_is_never_replaced(tmp_path):
    out = tmp_path / "o.csv"
    place = Placement(out, overwrite=False)
    place.tmp.write_text("ours\n")
    out.write_text("theirs\n")
    with pytest.raises(OutputAppeared):
        place.commit()
    place.abort()
    assert out.read_text() == "theirs\n" and [p.name for p in tmp_path.iterdir()] == ["o.csv"]


def test_overwrite_replaces_a_file_but_a_folder_only_when_allowed(tmp_path):
    out = tmp_path / "o"
    out.write_text("old\n")
    place = Placement(out, overwrite=True)
    place.tmp.write_text("new\n")
    place.commit()
    assert out.read_text() == "new\n"
    folder = tmp_path / "d"
    (folder / "mine").mkdir(parents=True)
    place = Placement(folder, overwrite=True)
    place.tmp.write_text("new\n")
    with pytest.raises(OSError):
        place.commit()  # no `replaceable` check: a folder stays
    place.abort()
    assert (folder / "mine").is_dir()


def test_what_a_killed_writer_left_is_removed_and_nothing_else(tmp_path):
    out = tmp_path / "o.csv"
    host = _host(out)
    dead = tmp_path / f".o.csv.{host}.{_dead_pid()}.partial"
    older = tmp_path / f".o.csv.{_dead_pid()}.partial"  # as earlier versions named it
    alive = tmp_path / f".o.csv.{host}.{os.getppid()}.partial"
    other = tmp_path / f".o.csv.elsewhere.{_dead_pid()}.partial"  # another host's
    for p in (dead, older, alive, other):
        p.write_text("x")
    Placement(out, overwrite=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, other.name])


def test_et_query_o_writes_through_the_same_placement(tmp_path, capsys):
    pytest.importorskip("duckdb")
    from expr_tracker.cli.main import main

    runs = tmp_path / "runs"
    runs.mkdir()
    out = tmp_path / "q.csv"
    stale = tmp_path / f".q.csv.{_host(out)}.{_dead_pid()}.partial"
    stale.write_text("half")
    assert main(["query", "SELECT 1 AS x", str(runs), "--format", "csv", "-o", str(out)]) == 0
    assert out.read_text() == "x\n1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.csv", "runs"]
