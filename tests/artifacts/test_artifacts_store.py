"""The per-project store: versions (from v0) and dedup by digest, copies (the default) vs
hard links, references,
aliases, the index as the commit log (torn lines, leftovers of a killed publisher, stale
staging directories), integrity checks."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest

import expr_tracker as et
from expr_tracker.artifacts import (
    ArtifactCorruptedError,
    ArtifactError,
    ArtifactNotFoundError,
    ArtifactStore,
    ArtifactTypeError,
)
from expr_tracker.artifacts.store import version_digest


def _tree(root, files):
    for name, data in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


def _art(name, src, **kw):
    a = et.Artifact(name, **kw)
    a.add_dir(src)
    return a


@pytest.fixture
def store(tmp_path):
    return ArtifactStore(tmp_path / "proj" / "artifacts")  # the default mode: copy


@pytest.fixture
def link_store(tmp_path):
    return ArtifactStore(tmp_path / "proj" / "artifacts", mode="link")


def test_versions_count_up_and_identical_contents_dedupe(tmp_path, store):
    src = _tree(tmp_path / "src", {"a.txt": b"one", "d/b.bin": b"\0" * 10})
    v0, new0 = store.log(_art("ds", src))
    v0b, new0b = store.log(_art("ds", src), aliases=["best"])
    assert (v0.version, new0, v0b.version, new0b) == (0, True, 0, False)  # from v0, as wandb
    assert v0.qualified_name == "ds:v0" and v0.path.name == "v0"
    assert v0b.aliases == ["latest", "best"]  # the new alias went onto the existing version
    (src / "a.txt").write_bytes(b"two")  # in place: the copy in v0 keeps its content
    v1, new1 = store.log(_art("ds", src))
    assert (v1.version, new1) == (1, True) and v1.digest != v0.digest
    assert (v1.path / "a.txt").read_bytes() == b"two" and (v0.path / "a.txt").read_bytes() == b"one"
    assert store.get("ds").version == 1
    assert store.get("ds", "v0").digest == v0.digest
    assert store.get("ds", "best").version == 0
    assert [v.version for v in store.versions("ds")] == [0, 1]
    assert v0.files() == ["a.txt", "d/b.bin"] and v0.size == 13
    # back to v0's contents: v0 again, not v2
    (src / "a.txt").write_bytes(b"one")
    assert store.log(_art("ds", src))[0].version == 0


def test_one_type_per_artifact_name(tmp_path, store):
    src = _tree(tmp_path / "src", {"a.txt": b"one"})
    store.log(_art("ds", src, type="dataset"))
    for contents in (b"one", b"two"):  # the same contents (dedup) and new ones alike
        (src / "a.txt").unlink()
        (src / "a.txt").write_bytes(contents)
        with pytest.raises(ArtifactTypeError, match="has type 'dataset'.*'model'"):
            store.log(_art("ds", src, type="model"))
    assert [v.version for v in store.versions("ds")] == [0]
    assert not [p for p in (store.root / "ds").iterdir() if p.name.startswith(".staging")]
    assert store.log(_art("ds", src, type="dataset"))[0].version == 1


def test_manifest_and_digest(tmp_path, store):
    src = _tree(tmp_path / "src", {"a.txt": b"one"})
    art = _art("ds", src, type="dataset", description="d", metadata={"rows": 1})
    art.add_reference("s3://bucket/key.csv")
    v, _ = store.log(art, run={"project": "proj", "name": "r"})
    m = json.loads((store.root / "ds" / "v0.manifest.json").read_text())
    sha = hashlib.sha256(b"one").hexdigest()
    assert m["files"][0] | {"mtime_ns": 0} == {
        "name": "a.txt",
        "size": 3,
        "sha256": sha,
        "stored": "copy",
        "mtime_ns": 0,
    }
    assert m["references"] == [{"name": "key.csv", "uri": "s3://bucket/key.csv"}]
    assert (m["type"], m["description"], m["metadata"], m["run"]["name"]) == (
        "dataset",
        "d",
        {"rows": 1},
        "r",
    )
    entries = [["file", "a.txt", 3, sha], ["ref", "key.csv", "s3://bucket/key.csv"]]
    blob = json.dumps(entries, separators=(",", ":")).encode()
    assert m["digest"] == v.digest == hashlib.sha256(blob).hexdigest()
    assert version_digest(m["files"], m["references"]) == v.digest
    # metadata is not the content (the type is one per name: test_one_type_per_artifact_name)
    other = _art("ds", src, type="dataset", metadata={"rows": 2})
    other.add_reference("s3://bucket/key.csv")
    assert store.log(other)[0].version == 0


def test_link_mode_shares_the_inode(tmp_path, link_store):
    src = _tree(tmp_path / "src", {"big.bin": os.urandom(4096)})
    v, _ = link_store.log(_art("ds", src))
    stored, orig = os.stat(v.get_path("big.bin")), os.stat(src / "big.bin")
    assert stored.st_ino == orig.st_ino and orig.st_nlink == 2
    assert v.manifest["files"][0]["stored"] == "link"


def test_copy_mode_copies_and_protects(tmp_path):
    store = ArtifactStore(tmp_path / "artifacts", mode="copy")
    src = _tree(tmp_path / "src", {"big.bin": os.urandom(4096)})
    v, _ = store.log(_art("ds", src))
    stored, orig = os.stat(v.get_path("big.bin")), os.stat(src / "big.bin")
    assert stored.st_ino != orig.st_ino and orig.st_nlink == 1 and stored.st_nlink == 1
    assert stored.st_mode & 0o222 == 0  # read-only copy
    assert v.get_path("big.bin").read_bytes() == (src / "big.bin").read_bytes()
    assert v.manifest["files"][0]["stored"] == "copy"
    (src / "big.bin").write_bytes(b"edited in place")  # the store does not follow
    assert v.verify()


def test_link_mode_falls_back_to_a_copy_across_devices(tmp_path):
    shm = "/dev/shm"
    if not os.path.isdir(shm) or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another device")
    src = tmp_path / "unused"
    import tempfile

    with tempfile.TemporaryDirectory(dir=shm) as d:
        src = _tree(__import__("pathlib").Path(d), {"x.bin": b"abc" * 100})
        v, _ = ArtifactStore(tmp_path / "artifacts", mode="link").log(_art("ds", src))
        assert v.manifest["files"][0]["stored"] == "copy"
        assert os.stat(v.get_path("x.bin")).st_ino != os.stat(src / "x.bin").st_ino
    assert v.verify()  # the source is gone; the copy stays


def test_references_are_recorded_never_copied(tmp_path, store):
    local = _tree(tmp_path / "elsewhere", {"huge.bin": b"z" * 1000})
    art = et.Artifact("refs")
    art.add_reference(str(local / "huge.bin"))
    art.add_reference("s3://bucket/a/b.parquet", name="b")
    v, _ = store.log(art)
    assert v.files() == [] and v.size == 0
    assert v.references() == {"huge.bin": str(local / "huge.bin"), "b": "s3://bucket/a/b.parquet"}
    assert v.get_path("b") == "s3://bucket/a/b.parquet"
    assert list(v.path.iterdir()) == []  # nothing copied
    assert os.stat(local / "huge.bin").st_nlink == 1  # nor linked
    assert v.download(tmp_path / "dl") == tmp_path / "dl"


def test_aliases_move_and_latest_follows_the_newest(tmp_path, store):
    src = tmp_path / "f"
    versions = []
    for i in range(3):
        src.unlink(missing_ok=True)
        src.write_text(str(i))
        a = et.Artifact("m", type="model")
        a.add_file(src)
        versions.append(store.log(a, aliases=["best"] if i < 2 else ["prod"])[0])
    assert store.get("m", "best").version == 1
    assert store.get("m", "prod").version == 2
    assert store.get("m").aliases == ["latest", "prod"]
    assert store.get("m", "v0").aliases == []
    # re-logging v0's contents moves "best" back to v0; latest stays v2
    src.unlink()
    src.write_text("0")
    a = et.Artifact("m", type="model")
    a.add_file(src)
    assert store.log(a, aliases=["best"])[0].aliases == ["best"]
    assert store.get("m", "best").version == 0 and store.get("m").version == 2
    kinds = [r["kind"] for r in store.records()]
    assert kinds == ["version", "version", "version", "alias"]


def test_get_errors_name_what_exists(tmp_path, store):
    src = _tree(tmp_path / "src", {"a": b"a"})
    store.log(_art("digits", src), aliases=["best"])
    with pytest.raises(ArtifactNotFoundError, match=r"no artifact 'digit'.*did you mean 'digits'"):
        store.get("digit")
    with pytest.raises(ArtifactNotFoundError, match=r"no version v7 \(versions: v0\)"):
        store.get("digits", "v7")
    with pytest.raises(ArtifactNotFoundError, match=r"no alias 'prod' \(aliases: latest, best"):
        store.get("digits", "prod")
    v = store.get("digits")
    with pytest.raises(ArtifactNotFoundError, match=r"has no file 'b'; it has: a"):
        v.get_path("b")


def test_empty_artifact_and_missing_source(tmp_path, store):
    with pytest.raises(ArtifactError, match="is empty"):
        store.log(et.Artifact("e"))
    f = tmp_path / "f"
    f.write_text("x")
    a = et.Artifact("gone")
    a.add_file(f)
    f.unlink()
    with pytest.raises(ArtifactError, match="no longer exists; nothing was published"):
        store.log(a)
    assert store.records() == [] and not any(
        p.name.startswith(".staging") and p.is_dir() for p in (store.root / "gone").iterdir()
    )


def test_torn_index_line_is_ignored_and_repaired(tmp_path, store):
    src = _tree(tmp_path / "src", {"a": b"a"})
    store.log(_art("ds", src))
    with open(store.root / "index.jsonl", "ab") as f:
        f.write(b'{"kind":"version","name":"ds","vers')  # a writer killed mid-line
    assert [v.version for v in store.versions("ds")] == [0]
    (src / "a").unlink()
    (src / "a").write_bytes(b"b")
    assert store.log(_art("ds", src))[0].version == 1
    lines = (store.root / "index.jsonl").read_bytes().splitlines()
    assert len(lines) == 2 and all(json.loads(x)["kind"] == "version" for x in lines)


def test_leftovers_of_a_killed_publisher_are_never_listed_and_removed(tmp_path, store):
    src = _tree(tmp_path / "src", {"a": b"a"})
    store.log(_art("ds", src))
    adir = store.root / "ds"
    # killed after its rename, before its index line: v1 exists on disk, not in the index
    shutil.copytree(adir / "v0", adir / "v1")
    shutil.copy(adir / "v0.manifest.json", adir / "v1.manifest.json")
    staging = adir / ".staging-999999-dead"
    staging.mkdir()
    (staging / "half").write_bytes(b"h")
    os.utime(staging, (1, 1))  # long abandoned (no lock file: its writer is gone)
    fresh = adir / ".staging-999998-young"
    fresh.mkdir()  # no lock file yet, but young: a writer may be between create and flock
    assert [v.version for v in store.versions("ds")] == [0]
    assert store.get("ds").version == 0
    (src / "a").unlink()
    (src / "a").write_bytes(b"new")
    v, _ = store.log(_art("ds", src))
    assert v.version == 1 and (v.path / "a").read_bytes() == b"new"
    assert not staging.exists() and fresh.exists()
    assert store.get("ds", "v1").verify()


def test_a_live_writers_staging_is_kept(tmp_path, store):
    from expr_tracker.artifacts.files import locked

    adir = store.root / "ds"
    adir.mkdir(parents=True)
    staging = adir / ".staging-1-live"
    staging.mkdir()
    with locked(adir / ".staging-1-live.lock"):
        assert store.clean_staging("ds", min_age_s=0) == 0
        assert staging.exists()
    assert store.clean_staging("ds", min_age_s=0) == 1
    assert not staging.exists()
    assert not (adir / ".staging-1-live.lock").exists()


def test_in_place_edit_of_a_linked_source_is_detected(tmp_path, link_store):
    store = link_store
    src = _tree(tmp_path / "src", {"ckpt.pt": b"epoch-1"})
    v, _ = store.log(_art("ckpt", src))
    with open(src / "ckpt.pt", "r+b") as f:  # same size, same inode: what torch.save does
        f.write(b"epoch-2")
    os.utime(src / "ckpt.pt", ns=(1, 1))
    v = store.get("ckpt")
    with pytest.raises(ArtifactCorruptedError, match=r"ckpt:v0 .*ckpt.pt \(content changed\)"):
        v.check()
    with pytest.raises(ArtifactCorruptedError, match="mode: copy"):
        v.verify()
    (v.path / "ckpt.pt").unlink()  # a stored file removed by hand
    with pytest.raises(ArtifactCorruptedError, match="missing"):
        store.get("ckpt").check()


def test_download(tmp_path, store):
    src = _tree(tmp_path / "src", {"a.txt": b"a", "d/b.txt": b"b"})
    v, _ = store.log(_art("ds", src))
    assert v.download() == v.path
    root = tmp_path / "out"
    (root / "d").mkdir(parents=True)
    (root / "d" / "b.txt").write_text("old")
    assert v.download(root) == root
    assert (root / "a.txt").read_bytes() == b"a" and (root / "d" / "b.txt").read_bytes() == b"b"
    assert sorted(p.name for p in root.rglob("*")) == ["a.txt", "b.txt", "d"]


def test_unknown_mode_is_refused(tmp_path):
    with pytest.raises(ValueError, match="'link' or 'copy'"):
        ArtifactStore(tmp_path, mode="symlink")


def test_symbolic_links_to_files_store_the_file_not_the_link(tmp_path, store):
    # os.link links a symbolic link itself: a relative one dangled inside the store (the log
    # failed), an absolute one stored only a pointer back to the source
    src = _tree(tmp_path / "src", {"real/a.txt": b"a", "b.txt": b"b"})
    (src / "rel.txt").symlink_to("real/a.txt")
    (src / "abs.txt").symlink_to(tmp_path / "src" / "b.txt")
    v, _ = store.log(_art("ds", src))
    assert v.files() == ["abs.txt", "b.txt", "real/a.txt", "rel.txt"]
    for name, data in [("rel.txt", b"a"), ("abs.txt", b"b")]:
        p = v.get_path(name)
        assert not p.is_symlink() and p.read_bytes() == data
    (src / "b.txt").unlink()  # the source goes: the stored version keeps its content
    assert v.get_path("abs.txt").read_bytes() == b"b" and v.verify()


def test_download_of_references_only_makes_the_directory(tmp_path, store):
    a = et.Artifact("refs")
    a.add_reference("s3://bucket/k/model.pt")
    v, _ = store.log(a)
    out = v.download(tmp_path / "dl")
    assert out.is_dir() and list(out.iterdir()) == []
    assert v.get_path("model.pt") == "s3://bucket/k/model.pt"


def test_same_contents_never_return_a_version_whose_files_changed(tmp_path, link_store):
    # v0 hard-links a/ckpt.pt; editing it in place changes v0; the original contents logged
    # again from a fresh file returned v0 (holding the edit), and every use of it then failed
    store = link_store
    a = _tree(tmp_path / "a", {"ckpt.pt": b"AAAA"})
    v0, _ = store.log(_art("ck", a))
    with open(a / "ckpt.pt", "r+b") as f:  # in place, as torch.save does
        f.write(b"BBBB")
    b = _tree(tmp_path / "b", {"ckpt.pt": b"AAAA"})
    v1, new = store.log(_art("ck", b))
    assert (v1.version, new) == (1, True) and v1.digest == v0.digest
    assert v1.get_path("ckpt.pt").read_bytes() == b"AAAA" and v1.verify()
    assert any("ck:v0" in n for n in store.notices)
    # b/ckpt.pt is now linked by v1 (st_nlink 2): logged again, it is v1, no copy
    v1b, new = store.log(_art("ck", b))
    assert (v1b.version, new) == (1, False) and store.notices == []
    with pytest.raises(ArtifactCorruptedError):
        store.get("ck", "v0").check()
    assert store.get("ck").version == 1


def test_download_a_file_name_at_the_255_byte_limit(tmp_path, store):
    # the temporary name was the file's own plus ".<pid>.download": over 255 bytes
    src = tmp_path / "src.bin"
    src.write_bytes(b"x")
    long = "é" * 125 + ".bin"  # 254 bytes: a valid name
    a = et.Artifact("long")
    a.add_file(src, name=f"d/{long}")
    v, _ = store.log(a)
    out = v.download(tmp_path / "dl")
    assert (out / "d" / long).read_bytes() == b"x"
    assert sorted(p.name for p in (out / "d").iterdir()) == [long]  # no temporary left


def test_notices_belong_to_the_thread_that_logged(tmp_path, link_store, monkeypatch):
    # one store per run, shared by its threads: a log in another thread reset the notices
    # of a log in flight, and its warning was lost
    import threading

    store = link_store
    a = _tree(tmp_path / "a", {"ckpt.pt": b"AAAA"})
    store.log(_art("ck", a))
    with open(a / "ckpt.pt", "r+b") as f:
        f.write(b"BBBB")  # in place: the next log of a/ warns
    other = _tree(tmp_path / "o", {"x.txt": b"x"})
    publish = ArtifactStore._publish
    in_publish, go_on = threading.Event(), threading.Event()

    def slow_publish(self, artifact, *args, **kw):
        if artifact.name == "ck":
            in_publish.set()
            go_on.wait(10)
        return publish(self, artifact, *args, **kw)

    monkeypatch.setattr(ArtifactStore, "_publish", slow_publish)
    seen = []
    t = threading.Thread(target=lambda: (store.log(_art("ck", a)), seen.extend(store.notices)))
    t.start()
    assert in_publish.wait(10)
    store.log(_art("other", other))  # this thread's log, meanwhile
    assert store.notices == []
    go_on.set()
    t.join(10)
    assert len(seen) == 1 and "rewritten in place" in seen[0]


def test_a_lost_index_never_deletes_the_versions_on_disk(tmp_path, store):
    # index.jsonl deleted: the next log took every version as a crash leftover and removed
    # them all, then published its own as the first version
    src = _tree(tmp_path / "src", {"a.txt": b"1"})
    store.log(_art("ds", src))
    (src / "a.txt").unlink()
    (src / "a.txt").write_bytes(b"2")
    store.log(_art("ds", src))
    (store.root / "index.jsonl").unlink()
    other = _tree(tmp_path / "other", {"b.txt": b"3"})
    with pytest.raises(ArtifactError, match=r"does not list \(v0, v1\)"):
        store.log(_art("ds", other))
    left = sorted(p.name for p in (store.root / "ds").iterdir() if not p.name.startswith("."))
    assert left == ["v0", "v0.manifest.json", "v1", "v1.manifest.json"]
    assert (store.root / "ds" / "v1" / "a.txt").read_bytes() == b"2"


def _numbered_from_v1(store, name):
    """Renumber ``name``'s versions v1, v2, ...: a store written while versions counted from
    1 (directories, manifests and index lines alike; the digest holds no number)."""
    adir, index = store.root / name, store.root / "index.jsonl"
    for v in sorted(store.catalog()[name]["versions"], reverse=True):
        old = adir / f"v{v}.manifest.json"
        doc = json.loads(old.read_text())
        doc["version"] = v + 1
        (adir / f"v{v + 1}.manifest.json").write_text(json.dumps(doc))
        old.unlink()
        os.rename(adir / f"v{v}", adir / f"v{v + 1}")
    lines = [json.loads(x) for x in index.read_text().splitlines()]
    for rec in lines:
        if rec["name"] == name:
            rec["version"] += 1
    index.write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_a_store_whose_versions_start_at_v1_goes_on_from_its_highest(tmp_path, store):
    src = _tree(tmp_path / "src", {"a.txt": b"one"})
    store.log(_art("ds", src), aliases=["best"])
    (src / "a.txt").write_bytes(b"two")
    store.log(_art("ds", src))
    _numbered_from_v1(store, "ds")
    assert [v.version for v in store.versions("ds")] == [1, 2]
    assert store.get("ds").version == 2 and store.get("ds", "best").version == 1
    with pytest.raises(ArtifactNotFoundError, match=r"no version v0 \(versions: v1, v2\)"):
        store.get("ds", "v0")
    with pytest.raises(ArtifactNotFoundError, match=r"or a version v1\.\.v2"):
        store.get("ds", "nope")
    (src / "a.txt").write_bytes(b"three")
    v, new = store.log(_art("ds", src))
    assert (v.version, new, v.aliases) == (3, True, ["latest"])  # not v0: after the highest
    (src / "a.txt").write_bytes(b"one")
    assert store.log(_art("ds", src))[0].version == 1  # v1's contents: v1, as before
    assert store.get("ds").version == 3 and store.get("ds", "v1").verify()
    # a new artifact in the same store starts at v0
    assert store.log(_art("other", src))[0].version == 0
    assert [v.version for v in store.versions("ds")] == [1, 2, 3]
