"""`et runs rm|mv|archive|tag`: asking (and --yes), a live run refused (its process alive,
its writer lock held), nothing reached through a symbolic link out of the runs folder, a
folder holding other runs or no run refused, a removed run's name reused with nothing left
behind (its caches elsewhere, its lineage), renaming and tags written into run.json."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap

import pytest
from helpers import ROOT

import expr_tracker as et
from expr_tracker.cli.main import main


def make_run(root, name, project="p", loss=0.5, **kw):
    et.init(project=project, name=name, dir=str(root), config={"lr": loss}, **kw)
    for _ in range(3):
        et.log({"loss": loss})
    et.finish()
    return root / project / name


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    for n in ("a", "b"):
        make_run(root, n)
    return root


def listed(root, capsys):
    capsys.readouterr()
    assert main(["runs", str(root), "--archived", "--format", "json"]) == 0
    return sorted(r["run"] for r in json.loads(capsys.readouterr().out))


def answer(monkeypatch, text):
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))


def test_rm_asks_and_removes(runs, capsys, monkeypatch):
    answer(monkeypatch, "n\n")
    assert main(["runs", "rm", "a", "--dir", str(runs)]) == 2
    err = capsys.readouterr().err
    assert "remove 1 run? [y/N]" in err and "nothing was removed" in err
    assert (runs / "p" / "a").is_dir()
    answer(monkeypatch, "")  # no answer (stdin closed): no
    assert main(["runs", "rm", "a", "--dir", str(runs)]) == 2
    answer(monkeypatch, "y\n")
    assert main(["runs", "rm", "a", "--dir", str(runs)]) == 0
    assert "removed" in capsys.readouterr().out
    assert not (runs / "p" / "a").exists()
    assert main(["runs", "rm", "b", "--dir", str(runs), "--yes"]) == 0
    assert listed(runs, capsys) == []
    assert os.listdir(runs / "p") == []  # no hidden leftover either


@pytest.mark.slow
def test_rm_name_reused_leaves_nothing_behind(tmp_path, capsys):
    root = tmp_path / "runs"
    cache = tmp_path / "ui-cache"
    run = et.init(project="p", name="a", dir=str(root), config={"lr": 1})
    (tmp_path / "w.bin").write_bytes(b"weights")
    run.log_artifact(str(tmp_path / "w.bin"), name="model", type="model")
    for i in range(5):
        et.log({"loss": float(i)})
    et.finish()
    assert (
        main(["query", "select count(*) from metrics", str(root), "--cache-dir", str(cache)]) == 0
    )
    assert len(os.listdir(cache)) == 1  # the run's cache kept elsewhere
    assert main(["runs", "rm", "p/a", "--dir", str(root), "--yes", "--cache-dir", str(cache)]) == 0
    assert os.listdir(cache) == []
    # the same name again: a new run, not the resume of the removed one
    et.init(project="p", name="a", dir=str(root), config={"lr": 2})
    et.log({"loss": 9.0})
    et.finish()
    capsys.readouterr()
    info = json.loads((root / "p" / "a" / "run.json").read_text())
    assert "previous_attempts" not in info
    rows = [json.loads(x) for x in (root / "p" / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["_step"] for r in rows] == [0]
    assert (
        main(["artifacts", "show", "model", "--project-dir", str(root / "p"), "--format", "json"])
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["lineage"] == []  # the removed run's lineage went with it


LIVE = textwrap.dedent(
    """
    import sys, time, expr_tracker as et
    et.init(project="p", name="live", dir=sys.argv[1])
    et.log({"loss": 1.0})
    et.run.flush()
    print("ready", flush=True)
    sys.stdin.readline()
    et.finish()
    """
)


@pytest.mark.slow
def test_a_live_run_is_refused(runs, capsys):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.Popen(
        [sys.executable, "-c", LIVE, str(runs)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert p.stdout.readline().strip() == "ready"
        for argv in (
            ["rm", "live", "--yes"],
            ["mv", "live", "other"],
            ["archive", "live"],
            ["tag", "live", "+t"],
        ):
            assert main(["runs", *argv, "--dir", str(runs)]) == 1, argv
            err = capsys.readouterr().err
            assert "is live" in err and f"pid {p.pid}" in err, err
        assert (runs / "p" / "live" / "metrics.jsonl").exists()
        # several runs named: one live, none removed
        assert main(["runs", "rm", "a", "live", "--dir", str(runs), "--yes"]) == 1
        assert (runs / "p" / "a").is_dir()
    finally:
        p.communicate("\n", timeout=60)
    assert main(["runs", "rm", "live", "--dir", str(runs), "--yes"]) == 0


def test_a_run_whose_writer_lock_is_held_is_refused(runs, capsys):
    import fcntl

    info = runs / "p" / "a" / "run.json"
    data = json.loads(info.read_text())
    assert data["status"] == "finished"  # its run.json says nothing of a writer
    fd = os.open(runs / "p" / "a" / "metrics.jsonl.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, b"pid=1 host=elsewhere\n")
        assert main(["runs", "rm", "a", "--dir", str(runs), "--yes"]) == 1
        assert "a writer holds metrics.jsonl.lock: pid=1 host=elsewhere" in capsys.readouterr().err
    finally:
        os.close(fd)
    assert (runs / "p" / "a").is_dir()


def test_links_out_of_the_runs_folder_are_never_followed(tmp_path, capsys):
    root = tmp_path / "runs"
    make_run(root, "a")
    outside = tmp_path / "outside"
    victim = make_run(outside, "victim", project="q")
    precious = tmp_path / "precious.txt"
    precious.write_text("keep")
    # a run folder that is a link to a run elsewhere
    os.symlink(victim, root / "p" / "linked")
    assert main(["runs", "rm", str(root / "p" / "linked"), "--dir", str(root), "--yes"]) == 1
    assert "symbolic link" in capsys.readouterr().err
    os.unlink(root / "p" / "linked")
    # a project folder that is a link: the run's real path lies outside
    os.symlink(outside / "q", root / "q")
    assert main(["runs", "rm", "q/victim", "--dir", str(root), "--yes"]) == 1
    assert "outside the runs folder" in capsys.readouterr().err
    assert (victim / "metrics.jsonl").exists()
    # links inside a run are removed as links, never followed
    os.symlink(precious, root / "p" / "a" / "notes.txt")
    os.symlink(tmp_path, root / "p" / "a" / "up")
    os.symlink(precious, root / "p" / "a" / "metrics.jsonl.lock.x")
    assert main(["runs", "rm", "a", "--dir", str(root), "--yes"]) == 0
    assert precious.read_text() == "keep" and (victim / "metrics.jsonl").exists()
    # a lock file that is a link: refused, its target untouched
    make_run(root, "c")
    (root / "p" / "c" / "metrics.jsonl.lock").unlink()
    os.symlink(precious, root / "p" / "c" / "metrics.jsonl.lock")
    assert main(["runs", "tag", "c", "+x", "--dir", str(root)]) == 1
    assert "is a symbolic link, not a lock file" in capsys.readouterr().err
    assert precious.read_text() == "keep"


def test_what_is_not_one_run_is_refused(tmp_path, capsys):
    root = tmp_path / "runs"
    make_run(root, "a")
    (root / "p" / "plain").mkdir()
    assert main(["runs", "rm", str(root / "p" / "plain"), "--dir", str(root), "--yes"]) == 1
    assert "holds no run" in capsys.readouterr().err
    assert main(["runs", "rm", str(root), "--dir", str(root), "--yes"]) == 1
    assert "the runs folder itself" in capsys.readouterr().err
    # a run folder holding another run (a run logged inside another's folder)
    make_run(root / "p" / "a", "inner", project="sub")
    assert main(["runs", "rm", "p/a", "--dir", str(root), "--yes"]) == 1
    assert "holds other runs too (sub/inner)" in capsys.readouterr().err
    assert main(["runs", "rm", "nosuch", "--dir", str(root), "--yes"]) == 1
    assert "names no run" in capsys.readouterr().err
    assert (root / "p" / "a" / "sub" / "inner").is_dir()


def test_mv_renames_folder_and_run_json(runs, capsys):
    assert main(["runs", "mv", "a", "renamed", "--dir", str(runs)]) == 0
    assert "renamed a -> renamed" in capsys.readouterr().out
    assert not (runs / "p" / "a").exists()
    info = json.loads((runs / "p" / "renamed" / "run.json").read_text())
    assert info["name"] == "renamed"
    assert listed(runs, capsys) == ["p/b", "p/renamed"]
    # a start under the new name resumes it
    et.init(project="p", name="renamed", dir=str(runs))
    et.log({"loss": 0.1})
    et.finish()
    rows = (runs / "p" / "renamed" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(rows[-1])["_step"] == 3
    assert main(["runs", "mv", "renamed", "b", "--dir", str(runs)]) == 1
    assert "exists" in capsys.readouterr().err
    for bad in ("x/y", "..", ".hidden", ""):
        assert main(["runs", "mv", "b", bad, "--dir", str(runs)]) == 2
        assert "NEWNAME" in capsys.readouterr().err


def test_tag_adds_and_removes(runs, capsys):
    make_run(runs, "t", tags=["keep", "draft"])
    assert main(["runs", "tag", "t", "+best", "-draft", "+keep", "--dir", str(runs)]) == 0
    assert "tags keep, best" in capsys.readouterr().out
    assert json.loads((runs / "p" / "t" / "run.json").read_text())["tags"] == ["keep", "best"]
    assert main(["runs", "tag", "t", "--remove", "keep", "--dir", str(runs)]) == 0
    capsys.readouterr()
    assert main(["runs", str(runs), "--where", "tags = best", "--format", "json"]) == 0
    assert [r["run"] for r in json.loads(capsys.readouterr().out)] == ["p/t"]
    assert main(["runs", "tag", "t", "--dir", str(runs)]) == 2
    assert main(["runs", "tag", "t", "+", "--dir", str(runs)]) == 2


def test_a_folder_named_like_a_command_is_listed_with_a_path(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make_run(tmp_path / "rm", "a")
    assert main(["runs", "./rm", "--format", "json"]) == 0
    assert [r["run"] for r in json.loads(capsys.readouterr().out)] == ["p/a"]
