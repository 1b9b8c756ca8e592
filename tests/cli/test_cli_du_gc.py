"""`et du` (bytes per run: metrics, spans, other, cache, artifacts; a hard-linked file
counted once in the total, `shared` where two lines hold it) and `et gc` (caches of runs
that are gone, leftovers of an interrupted rm, --max-cache, --artifacts: unreferenced
versions, the newest and aliased ones kept, numbers never given twice; --dry-run)."""

from __future__ import annotations

import io
import json
import os
import sys

import pytest

import expr_tracker as et
from expr_tracker.cli.main import main


def make_run(root, name, files=(), **kw):
    run = et.init(project="p", name=name, dir=str(root), config={"x": name})
    for i in range(4):
        with et.span("step"):
            et.log({"loss": float(i)})
    for path, art, aliases in files:
        run.log_artifact(str(path), name=art, type="model", aliases=aliases)
    et.finish()
    return root / "p" / name


def du(capsys, root, *argv):
    capsys.readouterr()
    assert main(["du", str(root), "--format", "json", *argv]) == 0
    return {r["run"]: r for r in json.loads(capsys.readouterr().out)}


def test_du_counts_each_category_and_hard_links_once(tmp_path, capsys):
    root = tmp_path / "runs"
    w = tmp_path / "w.bin"
    w.write_bytes(b"w" * 5000)
    a = make_run(root, "a", files=[(w, "model", None)])
    b = make_run(root, "b")
    (a / "ckpt.bin").write_bytes(b"c" * 10_000)
    os.link(a / "ckpt.bin", b / "ckpt.bin")  # one file, two runs
    recs = du(capsys, root)
    ra, rb, total = recs["p/a"], recs["p/b"], recs["total"]
    assert ra["metrics"] == sum(
        os.path.getsize(a / n)
        for n in os.listdir(a)
        if n.startswith("metrics") and not n.endswith(".lock")
    )
    assert ra["spans"] == os.path.getsize(a / "spans.jsonl") > 0
    assert ra["other"] >= 10_000 and rb["other"] >= 10_000
    assert ra["shared"] == rb["shared"] == 10_000
    assert ra["artifacts"] >= 5000  # the version it logged (files + manifest)
    store = next(k for k in recs if k.startswith("p/artifacts"))
    assert recs[store]["artifacts"] < 5000  # the index and locks: the version is run a's
    assert total["total"] == sum(r["total"] for k, r in recs.items() if k != "total") - 10_000
    # the query cache kept in the run counts as its cache
    assert main(["query", "select count(*) from metrics", str(root)]) == 0
    assert du(capsys, root)["p/a"]["cache"] > 0
    assert main(["du", str(root)]) == 0
    assert "shared" in capsys.readouterr().out
    assert main(["du", str(tmp_path / "nope")]) == 1


@pytest.fixture
def xdg(tmp_path, monkeypatch):
    home = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return home / "expr_tracker" / "query"


@pytest.mark.slow
def test_gc_removes_caches_of_runs_that_are_gone(tmp_path, capsys, xdg):
    import shutil

    root = tmp_path / "runs"
    cache = tmp_path / "ui-cache"
    make_run(root, "a")
    keep = make_run(root, "b")
    for where in (cache, xdg):  # --cache-dir, and the fallback under $XDG_CACHE_HOME
        assert (
            main(["query", "select count(*) from spans", str(root), "--cache-dir", str(where)]) == 0
        )
    assert len(os.listdir(cache)) == len(os.listdir(xdg)) == 2
    shutil.rmtree(root / "p" / "a")  # removed by hand: its caches elsewhere stay behind
    os.mkdir(root / "p" / ".a.removing-999999999")  # an rm cut short (no such pid)
    os.mkdir(root / "p" / f".c.removing-{os.getpid()}")  # one still going: kept
    outside = tmp_path / "outside-cache"
    (outside / "metrics.jsonl").mkdir(parents=True)
    (root / "p" / "z").mkdir()  # a cache folder that is a link out: never followed
    os.symlink(outside, root / "p" / "z" / ".et-cache")
    capsys.readouterr()
    assert main(["gc", str(root), "--cache-dir", str(cache), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("would remove") == 3 and len(os.listdir(cache)) == 2
    assert main(["gc", str(root), "--cache-dir", str(cache)]) == 0
    out = capsys.readouterr().out
    assert out.count("removed") == 3, out
    assert "interrupted et runs rm" in out and "which is gone" in out
    assert len(os.listdir(cache)) == len(os.listdir(xdg)) == 1  # run b's kept
    assert sorted(os.listdir(root / "p")) == [f".c.removing-{os.getpid()}", "b", "z"]
    assert (outside / "metrics.jsonl").is_dir()
    # --max-cache: the least recently refreshed caches go until the rest fit
    assert main(["query", "select count(*) from metrics", str(root)]) == 0
    in_run = keep / ".et-cache"
    assert sorted(os.listdir(in_run)) == ["metrics.jsonl"]
    old = in_run / "metrics.jsonl" / "manifest.json"
    os.utime(old, (1, 1))
    capsys.readouterr()
    assert main(["gc", str(root), "--cache-dir", str(cache), "--max-cache", "100GiB"]) == 0
    assert "freed 0 B" in capsys.readouterr().out
    assert main(["gc", str(root), "--cache-dir", str(cache), "--max-cache", "0"]) == 0
    out = capsys.readouterr().out
    assert out.count("over --max-cache") == 3, out
    assert os.listdir(in_run) == [] and os.listdir(cache) == [] and os.listdir(xdg) == []
    assert main(["gc", str(root), "--max-cache", "lots"]) == 2
    assert "--max-cache" in capsys.readouterr().err


@pytest.mark.slow
def test_gc_artifacts_removes_unreferenced_versions(tmp_path, capsys, monkeypatch):
    from expr_tracker.artifacts.store import ArtifactStore

    root = tmp_path / "runs"
    paths = []
    for i in range(4):
        p = tmp_path / f"w{i}.bin"
        p.write_bytes(bytes([i]) * 1000)
        paths.append(p)
    make_run(root, "a", files=[(paths[0], "model", None)])  # v0
    make_run(root, "b", files=[(paths[1], "model", ["best"])])  # v1, aliased
    make_run(root, "c", files=[(paths[2], "model", None)])  # v2 (newest)
    make_run(root, "d", files=[(paths[2], "model", None)])  # the same contents: uses v2
    assert main(["runs", "rm", "a", "b", "--dir", str(root), "--yes"]) == 0
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    assert main(["gc", str(root), "--artifacts"]) == 2
    assert "model:v0" in capsys.readouterr().err
    store = ArtifactStore(root / "p" / "artifacts")
    assert sorted(store.catalog()["model"]["versions"]) == [0, 1, 2]
    assert main(["gc", str(root), "--artifacts", "--yes"]) == 0
    out = capsys.readouterr().out
    assert "model:v0" in out and "model:v1" not in out and "model:v2" not in out
    item = store.catalog()["model"]
    assert sorted(item["versions"]) == [1, 2] and item["removed"] == {0}
    assert not (root / "p" / "artifacts" / "model" / "v0").exists()
    assert store.get("model", "best").version == 1
    # a new version takes the next number, never a removed one's
    make_run(root, "e", files=[(paths[3], "model", None)])
    assert store.get("model").version == 3
    assert main(["artifacts", "show", "model:v0", "--project-dir", str(root / "p")]) == 1
    assert main(["gc", str(root), "--artifacts", "--yes"]) == 0
    assert "model:" not in capsys.readouterr().out  # v1 aliased, v2 used by d, v3 newest


def test_gc_removes_partial_media_files_of_killed_writers(tmp_path, capsys):
    """A writer killed between writing ``media/.NAME.PID.tmp`` and renaming it leaves that
    file; et gc removes it once PID is gone, never one being written now or a link."""
    np = pytest.importorskip("numpy")
    root = tmp_path / "runs"
    et.init(project="p", name="m", dir=str(root))
    et.log({"h": et.Histogram(np.arange(100.0))})
    et.finish()
    media = root / "p" / "m" / "media"
    (kept,) = os.listdir(media)  # the histogram's file
    dead = media / f".{'0' * 64}.npz.999999999.tmp"  # what a SIGKILL mid-write leaves
    dead.write_bytes(b"x" * 300)
    live = media / f".{'1' * 64}.npz.{os.getpid()}.tmp"  # a write going on now
    live.write_bytes(b"y")
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"z")
    os.symlink(outside, media / f".{'2' * 64}.npz.999999999.tmp")
    capsys.readouterr()
    assert main(["gc", str(root), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("would remove") == 1 and "killed writer" in out and "300 B" in out
    assert dead.exists()
    assert main(["gc", str(root)]) == 0
    assert "removed" in capsys.readouterr().out
    assert sorted(os.listdir(media)) == sorted([kept, live.name, f".{'2' * 64}.npz.999999999.tmp"])
    assert outside.read_bytes() == b"z"
