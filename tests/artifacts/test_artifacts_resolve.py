"""Issue 23's artifacts API: ``mode=`` per ``log_artifact`` call, ``ArtifactVersion.dir``
and ``.run``, ``add_dir`` chaining, a missing artifact as ``FileNotFoundError``,
``use_artifact`` of an object returning that object resolved, and what link mode promises:
a later edit of a linked source is detected whenever the version is handed out
(docs/artifacts.md "Link or copy")."""

from __future__ import annotations

import json
import os

import pytest

import expr_tracker as et
from expr_tracker.artifacts import (
    ArtifactCorruptedError,
    ArtifactNotFoundError,
    ArtifactVersion,
)
from expr_tracker.artifacts import store as store_mod


@pytest.fixture
def data(tmp_path):
    d = tmp_path / "data"
    (d / "sub").mkdir(parents=True)
    (d / "train.csv").write_text("x,y\n1,2\n")
    (d / "sub" / "labels.txt").write_text("a\n")
    return d


@pytest.fixture
def run(tmp_path):
    r = et.init(project="p", name="prep", dir=str(tmp_path / "runs"))
    yield r
    et.finish()


def _manifest(version: ArtifactVersion) -> dict:
    return json.loads((version.path.parent / f"v{version.version}.manifest.json").read_text())


def _edit_in_place_keeping_mtime(path, new: bytes) -> None:
    """What ``rsync --inplace -t`` or ``cp -p`` onto an existing file do: the same inode,
    the same size, the old modification time restored."""
    st = os.stat(path)
    assert len(new) == st.st_size
    with open(path, "r+b") as f:
        f.write(new)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == st.st_mtime_ns


# -- mode= per call ------------------------------------------------------------------------


def test_mode_per_call_overrides_the_runs_mode(run, data, tmp_path):
    assert run.artifacts.store.mode == "copy"
    linked = et.log_artifact(data, name="linked", mode="link")
    copied = et.log_artifact(data, name="copied")  # the run's mode: copy
    src = data / "train.csv"
    assert os.path.samefile(linked.path / "train.csv", src)
    assert not os.path.samefile(copied.path / "train.csv", src)
    assert _manifest(linked)["mode"] == "link" and _manifest(copied)["mode"] == "copy"
    assert {f["stored"] for f in _manifest(linked)["files"]} == {"link"}
    assert {f["stored"] for f in _manifest(copied)["files"]} == {"copy"}
    assert run.artifacts.store.mode == "copy"  # the call did not change the run's mode


def test_mode_copy_per_call_in_a_link_run(tmp_path, data):
    et.init(project="p", name="r", dir=str(tmp_path / "runs"), artifacts={"mode": "link"})
    try:
        v = et.log_artifact(data, mode="copy")
        assert not os.path.samefile(v.path / "train.csv", data / "train.csv")
        assert _manifest(v)["mode"] == "copy"
    finally:
        et.finish()


@pytest.mark.parametrize("mode", ["symlink", "COPY", "", 1, True])
def test_a_bad_mode_is_refused_before_anything_is_stored(run, data, tmp_path, mode):
    with pytest.raises(ValueError, match=r"artifacts mode .* is not valid: use 'link' or 'copy'"):
        et.log_artifact(data, mode=mode)
    assert not (tmp_path / "runs" / "p" / "artifacts").exists()
    assert run.artifacts.logged == 0


# -- link mode: an edit of the source is detected whenever the version is handed out ---------


def _hand_outs(version: ArtifactVersion, tmp_path):
    return {
        "use_artifact": lambda: et.use_artifact(version.qualified_name),
        "get_path": lambda: version.get_path("train.csv"),
        "dir": lambda: version.dir,
        "download()": lambda: version.download(),
        "download(root)": lambda: version.download(tmp_path / "out"),
        "check": version.check,
        "verify": version.verify,
    }


def test_a_linked_source_edited_in_place_with_its_mtime_restored_is_detected(
    run, data, tmp_path, monkeypatch
):
    """Stamps that are not racy are recorded (mtime and ctime); restoring the mtime after an
    in-place edit used to pass the cheap check, handing out the edited file as v0."""
    monkeypatch.setattr(store_mod, "RACY_NS", 0)  # every stamp counts as settled
    v = et.log_artifact(data, mode="link")
    entry = {f["name"]: f for f in _manifest(v)["files"]}["train.csv"]
    assert isinstance(entry["mtime_ns"], int) and isinstance(entry["ctime_ns"], int)
    assert et.use_artifact("data:v0").dir == v.path  # untouched: handed out
    _edit_in_place_keeping_mtime(data / "train.csv", b"x,y\n6,6\n")
    for what, hand_out in _hand_outs(v, tmp_path).items():
        with pytest.raises(ArtifactCorruptedError, match="content changed") as info:
            hand_out()
        assert "train.csv" in str(info.value) and "mode='copy'" in str(info.value), what
    assert not (tmp_path / "out" / "train.csv").exists()


def test_a_linked_file_with_racy_stamps_is_rehashed_on_every_check(run, tmp_path):
    """Hashed within RACY_NS of its last write, a file could be written again in the same
    tick of the file system's clock without any stamp moving: none are recorded."""
    src = tmp_path / "ckpt.bin"
    src.write_bytes(b"A" * 64)
    v = et.log_artifact(src, mode="link")
    entry = _manifest(v)["files"][0]
    assert entry["stored"] == "link" and "mtime_ns" not in entry and "ctime_ns" not in entry
    _edit_in_place_keeping_mtime(src, b"B" * 64)
    with pytest.raises(ArtifactCorruptedError, match="content changed"):
        et.use_artifact("ckpt.bin")


def test_a_linked_file_touched_but_not_changed_is_still_handed_out(
    run, data, tmp_path, monkeypatch
):
    monkeypatch.setattr(store_mod, "RACY_NS", 0)
    v = et.log_artifact(data, mode="link")
    os.chmod(data / "train.csv", 0o600)  # moves the change time only: re-hashed, same bytes
    assert et.use_artifact(v) is v and v.dir == v.path
    assert v.get_path("train.csv").read_text() == "x,y\n1,2\n"


def test_a_file_written_while_it_is_hashed_is_stored_as_a_copy(run, tmp_path, monkeypatch):
    from expr_tracker.artifacts import files

    src = tmp_path / "growing.log"
    src.write_bytes(b"line 1\n")
    real = files.hash_fd
    calls = []

    def hash_then_append(fd):
        out = real(fd)
        if not calls:
            calls.append(fd)
            with open(src, "ab") as f:  # the writer is still at it
                f.write(b"line 2\n")
        return out

    monkeypatch.setattr(files, "hash_fd", hash_then_append)
    v = et.log_artifact(src, mode="link")
    monkeypatch.setattr(files, "hash_fd", real)
    entry = _manifest(v)["files"][0]
    assert entry["stored"] == "copy"
    assert not os.path.samefile(v.path / "growing.log", src)
    v.verify()  # what is stored is what was hashed
    assert (v.path / "growing.log").read_bytes() == b"line 1\nline 2\n"


# -- ArtifactVersion.dir and .run -----------------------------------------------------------


def test_dir_is_the_checked_version_directory(run, data):
    v = et.log_artifact(data)
    assert v.dir == v.path and (v.dir / "train.csv").read_text() == "x,y\n1,2\n"
    os.chmod(v.path / "train.csv", 0o644)
    (v.path / "train.csv").write_text("x,y\n0,0\n")  # someone edits the store's copy
    with pytest.raises(ArtifactCorruptedError, match="train.csv"):
        v.dir  # noqa: B018


def test_run_is_the_logging_runs_name(run, data, tmp_path):
    v = et.log_artifact(data)
    assert v.run == "prep"
    assert v.run_info["name"] == "prep" and v.run_info["project"] == "p"
    assert v.to_dict()["run"] == v.run_info  # the manifest's shape, for et artifacts show
    et.finish()
    et.init(project="p", name="train", dir=str(tmp_path / "runs"))
    assert et.use_artifact("data").run == "prep"  # who logged it, not who uses it


# -- add_dir chains -------------------------------------------------------------------------


def test_add_dir_returns_the_artifact(run, data, tmp_path):
    (tmp_path / "extra.txt").write_text("e")
    art = et.Artifact("ds").add_dir(data, name="d")
    assert isinstance(art, et.Artifact)
    v = et.log_artifact(et.Artifact("ds2").add_dir(data).add_dir(data, name="copy2"))
    assert v.files() == ["copy2/sub/labels.txt", "copy2/train.csv", "sub/labels.txt", "train.csv"]
    assert sorted(art.files) == ["d/sub/labels.txt", "d/train.csv"]


# -- a missing artifact is a FileNotFoundError too -------------------------------------------


@pytest.mark.parametrize("ref", ["nope", "data:v7", "data:no-such-alias"])
def test_a_missing_artifact_is_a_file_not_found_error(run, data, ref):
    et.log_artifact(data)
    with pytest.raises(FileNotFoundError) as info:
        et.use_artifact(ref)
    assert isinstance(info.value, ArtifactNotFoundError) and isinstance(info.value, LookupError)
    assert isinstance(info.value, et.ExprTrackerError)
    try:  # code written for a missing file
        et.use_artifact(ref)
    except OSError as exc:
        assert "data" in str(exc) or "nope" in str(exc)


def test_a_missing_file_of_a_version_is_a_file_not_found_error(run, data):
    v = et.log_artifact(data)
    with pytest.raises(FileNotFoundError, match="has no file 'nope.csv'"):
        v.get_path("nope.csv")


# -- use_artifact(object) returns that object, resolved -------------------------------------


def test_use_artifact_of_a_version_returns_it_refreshed(run, data, tmp_path):
    v0 = et.log_artifact(data)
    assert v0.aliases == ["latest"]
    (data / "train.csv").write_text("x,y\n3,4\n")
    v1 = et.log_artifact(data, aliases=["best"])
    assert v1.version == 1
    used = et.use_artifact(v0)
    assert used is v0 and v0.aliases == []  # latest moved on to v1
    assert et.use_artifact(v1, type="dataset") is v1 and v1.aliases == ["latest", "best"]
    lines = [json.loads(x) for x in (run.dir / "artifacts.jsonl").read_text().splitlines()]
    assert [(x["action"], x["version"]) for x in lines][-2:] == [("used", 0), ("used", 1)]


def test_use_artifact_of_a_logged_artifact_returns_it_resolved(run, data):
    art = et.Artifact("model", type="model").add_dir(data)
    with pytest.raises(AttributeError, match="not a stored version until"):
        art.version  # noqa: B018
    assert art.resolved is None
    v = et.log_artifact(art, aliases=["best"])
    assert art.resolved is not None and art.version == 0 and art.digest == v.digest
    used = et.use_artifact(art, type="model")
    assert used is art
    assert art.dir == v.path and art.get_path("train.csv").read_text() == "x,y\n1,2\n"
    assert art.aliases == ["latest", "best"] and art.run == "prep"
    assert sorted(art.files) == ["sub/labels.txt", "train.csv"]  # still the sources
    art.add_file(data / "train.csv", name="again.csv")  # other contents: unresolved
    assert art.resolved is None
    with pytest.raises(AttributeError):
        art.digest  # noqa: B018


def test_use_artifact_of_an_artifact_never_logged_here_resolves_by_contents(run, data):
    et.log_artifact(data, name="ds")  # v0
    (data / "train.csv").write_text("x,y\n3,4\n")
    et.log_artifact(data, name="ds")  # v1
    (data / "train.csv").write_text("x,y\n1,2\n")
    again = et.Artifact("ds").add_dir(data)  # v0's contents, built anew (another process)
    assert et.use_artifact(again) is again and again.version == 0
    (data / "train.csv").write_text("x,y\n9,9\n")
    fresh = et.Artifact("ds").add_dir(data)
    with pytest.raises(FileNotFoundError, match="log it first"):
        et.use_artifact(fresh)
    assert fresh.resolved is None


def test_use_artifact_of_a_linked_artifact_edited_since_raises(run, data, monkeypatch):
    monkeypatch.setattr(store_mod, "RACY_NS", 0)
    art = et.Artifact("ds").add_dir(data)
    et.log_artifact(art, mode="link")
    _edit_in_place_keeping_mtime(data / "train.csv", b"x,y\n5,5\n")
    with pytest.raises(ArtifactCorruptedError, match="content changed"):
        et.use_artifact(art)
