"""The bucket layout's read side (hostile manifests), the folder store, URL errors, and
sync/gc over ``file://`` (no S3 needed)."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from expr_tracker.sync import layout
from expr_tracker.sync.bucket import BucketError, read_log, read_manifest
from expr_tracker.sync.collect import collect
from expr_tracker.sync.store import FileStore, PreconditionFailed, StoreError, open_store
from expr_tracker.sync.upload import sync_dir

pytest.importorskip("pyarrow")


def write_lines(path: Path, start: int, n: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        for i in range(start, start + n):
            f.write(json.dumps({"_step": i, "loss": 0.5}).encode() + b"\n")


@pytest.fixture
def synced(tmp_path):
    """A run synced to a folder bucket: ``(runs, store, manifest)``."""
    runs = tmp_path / "runs"
    write_lines(runs / "proj" / "r1" / "metrics.jsonl", 0, 10)
    (runs / "proj" / "r1" / "media").mkdir()
    (runs / "proj" / "r1" / "media" / "a.png").write_bytes(b"png")
    url = f"file://{tmp_path / 'bucket'}"
    rep = sync_dir(runs, url, state_dir=tmp_path / "state")
    assert rep.errors == [] and rep.commits == 1
    store = open_store(url)
    m, _ = read_manifest(store, "proj", "r1", None, 0)
    return runs, store, m


def test_keys_are_hive_partitions_with_values_encoded():
    assert layout.manifest_key("p/x", "r 1", None, 0) == (
        "_manifests/project=p%2Fx/run=r%201/stream=.rank=0.json"
    )
    raw, pq = layout.part_keys(
        "p", "r", "data", 2, "metrics", "metrics.data.rank2.jsonl", 5, "ab" * 32
    )
    assert pq == f"metrics/project=p/run=r/stream=data/rank=2/part-000000000005-{'ab' * 16}.parquet"
    assert raw.startswith("_raw/project=p/run=r/metrics.data.rank2.jsonl/part-000000000005-")
    assert layout.parse_manifest_key(layout.manifest_key("p/x", "..", "s", 3)) == (
        "p/x",
        "..",
        "s",
        3,
    )
    assert layout.parse_manifest_key("_manifests/project=a/run=b/../x.json") is None


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda m: m["logs"]["metrics"]["parts"][0].update(raw="../../etc/passwd"), "other part"),
        (
            lambda m: m["logs"]["metrics"]["parts"][0].update(
                raw="_raw/project=proj/run=other/metrics.jsonl/x"
            ),
            "other part",
        ),
        (lambda m: m["logs"]["metrics"]["parts"][0].update(line=3), "does not follow"),
        (
            lambda m: m["logs"]["metrics"].update(file="../metrics.jsonl"),
            "is not a metrics file name",
        ),
        (lambda m: m.update(run="r2"), "another producer"),
        (lambda m: m["logs"]["metrics"].update(file="metrics.rank1.jsonl"), "not a metrics file"),
        (
            lambda m: m["files"].update(
                {"run.rank1.json": {"key": "x", "sha256": "0" * 64, "size": 1}}
            ),
            "file of this producer",
        ),
        (
            lambda m: m["files"].update({"../x": {"key": "x", "sha256": "0" * 64, "size": 1}}),
            "file of this producer",
        ),
        (lambda m: m["blobs"].update({"media/../../x": {"sha256": "0" * 64, "size": 1}}), "media"),
        (lambda m: m["logs"].update(secrets={"file": "secrets", "parts": []}), "logs"),
        (lambda m: m.update(version=2), "version"),
    ],
)
def test_a_hostile_manifest_is_refused_saying_why(synced, damage, why):
    _runs, _store, m = synced
    bad = copy.deepcopy(m)
    damage(bad)
    with pytest.raises(ValueError, match=why):
        layout.check_sync_manifest(bad, "proj", "r1", None, 0)


def test_a_hostile_manifest_in_the_bucket_stops_sync_and_protects_gc(synced, tmp_path):
    runs, store, m = synced
    key = layout.manifest_key("proj", "r1", None, 0)
    bad = copy.deepcopy(m)
    bad["logs"]["metrics"]["parts"][0]["raw"] = "../outside.jsonl"
    store.put(key, json.dumps(bad).encode())
    store.put(
        "_raw/project=proj/run=r1/metrics.jsonl/part-000000000099-" + "f" * 32 + ".jsonl", b"x\n"
    )
    before = {k for k, _s, _m in store.list("")}
    write_lines(runs / "proj" / "r1" / "metrics.jsonl", 10, 1)
    rep = sync_dir(runs, store.url, state_dir=tmp_path / "state")
    assert len(rep.errors) == 1 and "not a valid manifest" in rep.errors[0]
    gc = collect(store, grace=0)
    assert gc.deleted == 0 and len(gc.problems) == 1
    assert {k for k, _s, _m in store.list("")} == before
    with pytest.raises(BucketError):
        read_manifest(store, "proj", "r1", None, 0)


def test_a_part_changed_in_the_bucket_is_an_error_when_read(synced):
    _runs, store, m = synced
    part = m["logs"]["metrics"]["parts"][0]
    store.put(part["raw"], b'{"_step": 0, "loss": 99}\n')
    with pytest.raises(BucketError, match="changed"):
        list(read_log(store, m, "metrics"))


def test_folder_store_conditional_writes_and_keys(tmp_path):
    store = FileStore(tmp_path / "b")
    e1 = store.put("m/x.json", b"1", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        store.put("m/x.json", b"2", if_none_match=True)
    e2 = store.put("m/x.json", b"3", if_match=e1)
    with pytest.raises(PreconditionFailed):
        store.put("m/x.json", b"4", if_match=e1)
    assert store.get("m/x.json") == (b"3", e2)
    for key in ("../x", "a/../../x", "/etc/passwd", "a//b", ""):
        with pytest.raises(StoreError, match="not valid"):
            store.put(key, b"x")
    (tmp_path / "secret").write_text("s")
    os.symlink(tmp_path / "secret", tmp_path / "b" / "m" / "link")
    with pytest.raises(StoreError):
        store.get("m/link")  # a link out of the bucket folder is not followed


@pytest.mark.parametrize(
    "url, why",
    [
        ("http://host/x", "scheme 'http'"),
        ("s3://", "s3://bucket/prefix"),
        ("s3://key:secret@bucket/x", "no credentials"),
        ("s3://bucket/a/../b", "'..'"),
        ("file://otherhost/x", "local path"),
    ],
)
def test_a_bad_url_names_itself_and_what_is_valid(url, why):
    with pytest.raises(ValueError, match=why) as exc:
        open_store(url)
    assert "secret" not in str(exc.value) or url.startswith("s3://key")


def test_media_and_small_files_are_in_the_manifest(synced):
    _runs, store, m = synced
    import hashlib

    assert m["blobs"] == {"media/a.png": {"sha256": hashlib.sha256(b"png").hexdigest(), "size": 3}}
    assert store.get(layout.blob_key(m["blobs"]["media/a.png"]["sha256"]))[0] == b"png"


def test_a_symlinked_log_pointing_outside_the_run_is_not_uploaded(tmp_path):
    runs = tmp_path / "runs"
    outside = tmp_path / "private.jsonl"
    write_lines(outside, 0, 3)
    (runs / "proj" / "r1").mkdir(parents=True)
    os.symlink(outside, runs / "proj" / "r1" / "metrics.jsonl")
    rep = sync_dir(runs, f"file://{tmp_path / 'bucket'}", state_dir=tmp_path / "state")
    assert len(rep.errors) == 1 and "metrics.jsonl" in rep.errors[0]
    assert not list(FileStore(tmp_path / "bucket").list("_raw/"))


def test_a_replaced_shorter_run_is_refused(tmp_path):
    runs = tmp_path / "runs"
    path = runs / "proj" / "r1" / "metrics.jsonl"
    write_lines(path, 0, 10)
    url = f"file://{tmp_path / 'bucket'}"
    assert sync_dir(runs, url, state_dir=tmp_path / "s").errors == []
    path.unlink()
    write_lines(path, 0, 2)
    rep = sync_dir(runs, url, state_dir=tmp_path / "s")
    assert len(rep.errors) == 1 and "fewer than" in rep.errors[0]


def test_gc_keeps_young_objects_and_what_is_not_ours(synced):
    _runs, store, _m = synced
    orphan = "_raw/project=proj/run=r1/metrics.jsonl/part-000000000099-" + "e" * 32 + ".jsonl"
    store.put(orphan, b"x\n")
    store.put("README.txt", b"hand-made")
    assert collect(store).young == 1  # the default grace keeps a part a live sync just made
    rep = collect(store, grace=0, dry_run=True)
    assert rep.deleted_keys == [orphan] and store.exists(orphan)
    rep = collect(store, grace=0)
    assert rep.deleted == 1 and not store.exists(orphan) and store.exists("README.txt")


def test_et_gc_takes_a_bucket_url_or_a_runs_folder(synced, capsys):
    """One `et gc`: a URL cleans the bucket, a folder its runs' caches; a folder-only option
    given with a URL is refused (exit 2) rather than ignored."""
    from expr_tracker.cli.main import main

    _runs, store, _m = synced
    orphan = "_raw/project=proj/run=r1/metrics.jsonl/part-000000000099-" + "e" * 32 + ".jsonl"
    store.put(orphan, b"x\n")
    assert main(["gc", store.url, "--artifacts"]) == 2
    assert "--artifacts apply to a runs folder" in capsys.readouterr().err
    assert store.exists(orphan)
    assert main(["gc", store.url, "--grace", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["deleted"] == 1 and not store.exists(orphan)


def test_mirror_copies_committed_lines_and_fetches_only_new_parts(tmp_path):
    from expr_tracker.sync.mirror import mirror

    runs = tmp_path / "runs"
    path = runs / "proj" / "r1" / "metrics.jsonl"
    write_lines(path, 0, 50)
    (runs / "proj" / "r1" / "run.json").write_text('{"project": "proj", "name": "r1"}')
    url = f"file://{tmp_path / 'bucket'}"
    sync_dir(runs, url, state_dir=tmp_path / "s")
    first = mirror(url, cache_dir=tmp_path / "copy")
    copy = tmp_path / "copy" / "proj" / "r1"
    assert first.problems == [] and (copy / "metrics.jsonl").read_bytes() == path.read_bytes()
    assert (copy / "run.json").read_bytes() == (runs / "proj" / "r1" / "run.json").read_bytes()
    write_lines(path, 50, 5)
    sync_dir(runs, url, state_dir=tmp_path / "s")
    second = mirror(url, cache_dir=tmp_path / "copy")
    assert (copy / "metrics.jsonl").read_bytes() == path.read_bytes()
    new = len(path.read_bytes()) - first.fetched + len((copy / "run.json").read_bytes())
    assert second.fetched == new  # the five new lines only


def test_mirror_refuses_names_that_are_not_folder_names(tmp_path):
    from expr_tracker.sync.mirror import mirror

    store = FileStore(tmp_path / "bucket")
    for project in ("..", ".hidden"):
        m = {"version": 1, "project": project, "run": "r", "stream": "", "rank": 0}
        m.update(logs={}, files={}, blobs={})
        store.put(layout.manifest_key(project, "r", None, 0), json.dumps(m).encode())
    res = mirror(store.url, cache_dir=tmp_path / "copy" / "inner")
    assert len(res.problems) == 2 and all("not plain folder names" in p for p in res.problems)
    assert sorted(os.listdir(tmp_path / "copy")) == ["inner"]
    assert os.listdir(tmp_path / "copy" / "inner") == []


def test_et_runs_lists_a_bucket(tmp_path):
    import subprocess
    import sys

    from helpers import ROOT

    runs = tmp_path / "runs"
    write_lines(runs / "proj" / "r1" / "metrics.jsonl", 0, 7)
    url = f"file://{tmp_path / 'bucket'}"
    sync_dir(runs, url, state_dir=tmp_path / "s")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [sys.executable, "-m", "expr_tracker.cli.main", "runs", url, "--format", "json"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [(row["run"], row["steps"]) for row in rows] == [("proj/r1", 7)]


def test_two_hosts_ranks_of_one_run_land_in_one_run(tmp_path):
    """Rank 0 on host a and rank 1 on host b, each synced from its own disk: one run in the
    bucket with both producers, read back as one run of two producers."""
    from expr_tracker.sync.bucket import list_producers
    from expr_tracker.sync.mirror import mirror

    host_a = tmp_path / "host-a" / "runs" / "proj" / "launch-1"
    host_b = tmp_path / "host-b" / "runs" / "proj" / "launch-1"
    write_lines(host_a / "metrics.jsonl", 0, 4)
    write_lines(host_b / "metrics.rank1.jsonl", 0, 6)
    url = f"file://{tmp_path / 'bucket'}"
    for host in (host_a, host_b):
        assert sync_dir(host.parent.parent, url, state_dir=tmp_path / "s").errors == []
    store = open_store(url)
    assert list_producers(store) == [("proj", "launch-1", None, 0), ("proj", "launch-1", None, 1)]
    copy = mirror(url, cache_dir=tmp_path / "copy").path / "proj" / "launch-1"
    assert sorted(os.listdir(copy)) == ["metrics.jsonl", "metrics.rank1.jsonl"]


def test_an_unchanged_run_folder_is_skipped_before_its_files_are_read(tmp_path, monkeypatch):
    """A re-sync skips a run folder whose entries match the record of its last clean sync
    without reading run.json (one scandir); a changed folder is synced again."""
    from expr_tracker.sync import upload

    runs = tmp_path / "runs"
    for name in ("a", "b"):
        write_lines(runs / "proj" / name / "metrics.jsonl", 0, 5)
    url = f"file://{tmp_path / 'bucket'}"
    assert sync_dir(runs, url, state_dir=tmp_path / "s").commits == 2
    read = []
    real = upload.producers_of
    monkeypatch.setattr(upload, "producers_of", lambda d: read.append(d.name) or real(d))
    again = sync_dir(runs, url, state_dir=tmp_path / "s")
    assert (again.runs, again.producers, again.unchanged, again.bytes, read) == (2, 2, 2, 0, [])
    write_lines(runs / "proj" / "b" / "metrics.jsonl", 5, 3)
    third = sync_dir(runs, url, state_dir=tmp_path / "s")
    assert (third.commits, third.unchanged, read) == (1, 1, ["b"])
    m, _ = read_manifest(open_store(url), "proj", "b", None, 0)
    assert m["logs"]["metrics"]["lines"] == 8
