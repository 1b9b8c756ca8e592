"""Every reader on a bucket URL (``et history``, ``et query``, ``et compare``, ``et export``,
``et trace`` over ``file://`` and ``s3://``), two hosts' ranks of one run read as one run,
and a mirror that reads only the manifests that changed."""

from __future__ import annotations

import json
import os
import socket

import pytest

import expr_tracker as et
from expr_tracker.cli.main import main
from expr_tracker.sync.mirror import mirror, mirror_url
from expr_tracker.sync.upload import sync_dir

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")


def train(root, name, *, steps=10, offset=0.0):
    et.init(project="proj", name=name, dir=str(root), system=False, config={"lr": offset})
    for i in range(steps):
        with et.span("fwd"):
            pass
        et.log({"loss": offset + 1.0 / (i + 1)})
    et.finish()


@pytest.fixture
def two_hosts(tmp_path, monkeypatch):
    """One launch (``launch-1``) whose rank 0 ran on host-a and rank 1 on host-b, each on
    its own disk, both synced to one ``file://`` bucket: ``(url, tmp_path)``."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    url = f"file://{tmp_path / 'bucket'}"
    for host, rank in (("host-a", 0), ("host-b", 1)):
        monkeypatch.setattr(socket, "gethostname", lambda host=host: host)
        u = os.uname()  # run.json's host is uname's node name (socket's, without socket)
        fake = os.uname_result((u.sysname, host, u.release, u.version, u.machine))
        monkeypatch.setattr(os, "uname", lambda fake=fake: fake)
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        train(tmp_path / host / "runs", "launch-1", steps=5 + rank)
        assert sync_dir(tmp_path / host / "runs", url).errors == []
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return url, tmp_path


def test_two_hosts_ranks_read_as_one_run_side_by_side(two_hosts, capsys):
    url, tmp = two_hosts
    assert main(["query", "SELECT rank, count(*) FROM metrics WHERE metric = 'loss' GROUP BY ALL ORDER BY 1",
                 url, "--format", "json"]) == 0  # fmt: skip
    rows = json.loads(capsys.readouterr().out)
    assert [list(r.values()) for r in rows] == [[0, 5], [1, 6]]
    assert main(["history", f"{url}/proj/launch-1", "--rank", "1", "-n", "100"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") >= 6 and "loss" in out


def test_et_trace_puts_every_host_and_rank_on_one_timeline(two_hosts, capsys):
    url, tmp = two_hosts
    out = tmp / "trace.json"
    assert main(["trace", f"{url}/proj/launch-1", "-o", str(out)]) == 0
    events = json.loads(out.read_text())["traceEvents"]
    names = sorted(e["args"]["name"] for e in events if e.get("name") == "process_name")
    assert any("rank 0" in n and "host-a" in n for n in names), names
    assert any("rank 1" in n and "host-b" in n for n in names), names
    spans = [e for e in events if e.get("ph") == "X"]
    assert len({e["pid"] for e in spans}) == 2 and len(spans) == 11


def test_compare_and_export_take_bucket_urls(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    train(tmp_path / "runs", "a", offset=0.0)
    train(tmp_path / "runs", "b", offset=1.0)
    url = f"file://{tmp_path / 'bucket'}"
    assert sync_dir(tmp_path / "runs", url).errors == []
    assert main(["compare", "a", "b", "--dir", url]) == 0
    assert "loss" in capsys.readouterr().out
    assert main(["compare", f"{url}/proj/a", f"{url}/proj/b"]) == 0
    capsys.readouterr()
    out = tmp_path / "export.parquet"
    assert main(["export", f"{url}/proj", "-o", str(out)]) == 0
    import pyarrow.parquet as pq

    table = pq.read_table(out)
    assert set(table.column("run").to_pylist()) == {"proj/a", "proj/b"}


def test_a_url_naming_nothing_is_an_error_saying_what_was_looked_for(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["history", f"file://{tmp_path / 'empty'}/proj/none"]) == 1
    err = capsys.readouterr().err
    assert "no run synced there" in err and "<project>/<run>" in err


def test_mirror_reads_only_the_manifests_that_changed(tmp_path):
    runs = tmp_path / "runs"
    for i in range(3):
        train(runs, f"r{i}", steps=3)
    url = f"file://{tmp_path / 'bucket'}"
    assert sync_dir(runs, url, state_dir=tmp_path / "s").errors == []
    first = mirror(url, cache_dir=tmp_path / "copy")
    assert (first.producers, first.unchanged, first.problems) == (3, 0, [])
    again = mirror(url, cache_dir=tmp_path / "copy")
    assert (again.producers, again.unchanged, again.fetched) == (3, 3, 0)
    et.init(project="proj", name="r1", dir=str(runs), system=False)  # resumed: more lines
    et.log({"loss": 0.1})
    et.finish()
    assert sync_dir(runs, url, state_dir=tmp_path / "s").errors == []
    third = mirror(url, cache_dir=tmp_path / "copy")
    assert (third.unchanged, third.problems) == (2, []) and third.fetched > 0
    local = runs / "proj" / "r1" / "metrics.jsonl"
    assert (third.path / "proj" / "r1" / "metrics.jsonl").read_bytes() == local.read_bytes()
    one = mirror_url(f"{url}/proj/r2", cache_dir=tmp_path / "copy")
    assert one.target == tmp_path / "copy" / "proj" / "r2" and one.producers == 1


def test_a_url_lookup_leaves_no_empty_copy_behind(s3_bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    train(tmp_path / "runs", "r", steps=2)
    url = s3_bucket.url
    assert sync_dir(tmp_path / "runs", url).errors == []
    copies = tmp_path / "xdg" / "expr_tracker" / "bucket"
    one = mirror_url(f"{url}/proj/r")  # read as a bucket first: nothing there
    assert one.producers == 1 and os.listdir(copies) == [one.path.name]
    with pytest.raises(ValueError, match="no run synced there"):
        mirror_url(f"{url}/proj/none")
    assert os.listdir(copies) == [one.path.name]


def test_readers_on_s3(s3_bucket, tmp_path, capsys):
    train(tmp_path / "runs", "s", steps=4)
    assert sync_dir(tmp_path / "runs", s3_bucket.url).errors == []
    sql = "SELECT run, count(*) AS n FROM metrics WHERE metric = 'loss' GROUP BY run"
    assert main(["query", sql, s3_bucket.url, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"run": "proj/s", "n": 4}]
    assert main(["history", f"{s3_bucket.url}/proj/s", "-n", "2"]) == 0
    assert "loss" in capsys.readouterr().out
