"""``et runs`` at scale: the table made directly when every cell fits (the same characters
as rich's ``Table``), and the listing of a bucket's copy kept between listings
(``describe_runs``), each kept line dropped when its run's files change."""

from __future__ import annotations

import copy
import io
import json
import os
import time

import pytest

import expr_tracker as et
from expr_tracker.cli import output
from expr_tracker.cli import runs as cli_runs
from expr_tracker.cli.main import main


def _rows():
    base = {
        "run": "p/a",
        "status": "finished",
        "reason": None,
        "steps": 50,
        "producers": 1,
        "producer_status": {"run.json": "finished"},
        "started_at": 1.7e9,
        "duration_s": 12.5,
        "first_started_at": 1.7e9,
        "wall_duration_s": 3700.0,
        "active_duration_s": 3600.0,
        "metrics": {"loss": 0.25, "acc": float("nan")},
        "columns": {"config.lr": 0.001, "tags": ["x", "y"]},
    }
    rows = [base]
    for i, (run, status, extra) in enumerate(
        [
            ("p/日本語のラン", "running", {}),
            ("p/b", "unreadable", {"reason": "run.json: permission denied"}),
            (
                "p/c",
                "crashed",
                {
                    "producers": 2,
                    "producer_status": {"run.json": "finished", "run.rank1.json": "crashed"},
                },
            ),
        ]  # fmt: skip
    ):
        r = copy.deepcopy(base)
        r.update(run=run, status=status, steps=i * 1000, **extra)
        rows.append(r)
    return rows


@pytest.mark.parametrize("width", [200, 140, 70])
@pytest.mark.parametrize("columns", [(), ("config.lr", "tags")])
def test_the_direct_table_is_the_one_rich_lays_out(width, columns):
    rows, labels = _rows(), [c.split(".")[-1] for c in columns]
    got = []
    for direct in (True, False):
        buf = io.StringIO()
        con = output.console(buf, width)
        con.print(cli_runs.runs_renderable(rows, width, columns, labels, direct=direct))
        got.append(buf.getvalue())
    assert got[0] == got[1]
    if width >= 140:  # the cells fit: the direct lines
        assert "日本語のラン" in got[0] and "permission denied" in got[0]


def _train(root, name):
    et.init(project="p", name=name, dir=str(root), system=False)
    for i in range(5):
        et.log({"loss": 1.0 / (i + 1)})
    et.finish()


def test_a_bucket_copy_listing_is_kept_and_each_changed_run_read_again(
    tmp_path, monkeypatch, capsys
):
    from expr_tracker.sync.upload import sync_dir

    monkeypatch.setattr(cli_runs, "_SETTLE_NS", 0)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    for name in ("a", "b"):
        _train(tmp_path / "runs", name)
    url = f"file://{tmp_path / 'bucket'}"
    assert sync_dir(tmp_path / "runs", url).errors == []
    assert main(["runs", url, "--format", "json"]) == 0
    first = json.loads(capsys.readouterr().out)
    from expr_tracker.sync.mirror import mirror_root
    from expr_tracker.sync.store import open_store

    copy_dir = mirror_root(open_store(url).url)
    kept = json.loads((copy_dir / cli_runs.LISTING_FILE).read_text())
    assert sorted(kept["runs"]) == ["p/a", "p/b"]

    calls = []
    real = cli_runs.describe_run
    monkeypatch.setattr(
        cli_runs, "describe_run", lambda d, *a, **k: calls.append(d.name) or real(d, *a, **k)
    )
    assert main(["runs", url, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == first and calls == []

    # run a gets more steps in the bucket: only it is read again
    et.init(project="p", name="a", dir=str(tmp_path / "runs"), system=False, resume="must")
    et.log({"loss": 0.01})
    et.finish()
    assert sync_dir(tmp_path / "runs", url).errors == []
    time.sleep(0.01)
    assert main(["runs", url, "--format", "json"]) == 0
    again = {r["run"]: r for r in json.loads(capsys.readouterr().out)}
    assert calls == ["a"] and again["p/a"]["steps"] == 6 and again["p/b"]["steps"] == 5

    # a kept file that is not ours is ignored: everything is read again
    (copy_dir / cli_runs.LISTING_FILE).write_text('{"version": 1, "runs": [1]}')
    calls.clear()
    assert main(["runs", url, "--format", "json"]) == 0
    capsys.readouterr()
    assert sorted(calls) == ["a", "b"]


def test_a_running_run_is_never_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(cli_runs, "_SETTLE_NS", 0)
    et.init(project="p", name="live", dir=str(tmp_path / "runs"), system=False)
    et.log({"loss": 1.0})
    try:
        d = tmp_path / "runs" / "p" / "live"
        keep = tmp_path / "kept.json"
        rows = cli_runs.describe_runs([d], None, tmp_path / "runs", keep=keep)
        assert rows[0]["status"] == "running"
        assert json.loads(keep.read_text())["runs"] == {} if keep.exists() else True
    finally:
        et.finish()
    rows = cli_runs.describe_runs([d], None, tmp_path / "runs", keep=keep)
    assert rows[0]["status"] == "finished"
    assert list(json.loads(keep.read_text())["runs"]) == ["p/live"]
    os.chmod(d / "run.json", 0o600)  # a metadata change (ctime) counts as a change
    st = json.loads(keep.read_text())["runs"]["p/live"]["sig"]
    assert cli_runs._run_sig(d, time.time_ns()) != st
