"""et.log_artifact / et.use_artifact through a run: lineage lines with steps, the "artifact"
event, Run methods, paths as artifacts, errors, the spec section."""

from __future__ import annotations

import json

import pytest

import expr_tracker as et
from expr_tracker.artifacts import ArtifactNameError, ArtifactTypeError, ArtifactVersion
from expr_tracker.errors import NoActiveRunError
from expr_tracker.spec import SpecError


@pytest.fixture
def data(tmp_path):
    d = tmp_path / "data"
    (d / "sub").mkdir(parents=True)
    (d / "train.csv").write_text("x,y\n1,2\n")
    (d / "sub" / "labels.txt").write_text("a\n")
    return d


def _lineage(run_dir, name="artifacts.jsonl"):
    return [json.loads(x) for x in (run_dir / name).read_text().splitlines()]


def test_log_and_use_record_lineage_with_the_step(tmp_path, data):
    run = et.init(project="p", name="r", dir=str(tmp_path / "runs"))
    events = []
    run.subscribe(lambda event, payload: events.append((event, payload)))
    et.log({"loss": 1.0})
    et.log({"loss": 0.5})
    v = et.log_artifact(data, aliases=["best"], metadata={"rows": 1})
    assert isinstance(v, ArtifactVersion)
    assert (v.name, v.version, v.type, v.aliases) == ("data", 0, "dataset", ["latest", "best"])
    assert v.path == tmp_path / "runs" / "p" / "artifacts" / "data" / "v0"
    assert v.files() == ["sub/labels.txt", "train.csv"]
    et.log({"loss": 0.25}, commit=False)  # open row at step 2 with data
    u = et.use_artifact("data:best", type="dataset")
    assert u.digest == v.digest and u.metadata == {"rows": 1}
    et.log({"loss": 0.1})
    et.finish()
    lines = _lineage(run.dir)
    assert [(x["action"], x["name"], x["version"], x["step"]) for x in lines] == [
        ("logged", "data", 0, 2),
        ("used", "data", 0, 2),
    ]
    assert lines[0]["new"] is True and lines[0]["digest"] == v.digest
    assert lines[0]["path"] == str(v.path)
    assert [e for e, _ in events] == ["artifact", "artifact"]
    payload = events[0][1]
    assert set(payload) == {
        "action",
        "name",
        "version",
        "type",
        "digest",
        "path",
        "aliases",
        "metadata",
        "step",
    }
    assert payload == {
        "action": "logged",
        "name": "data",
        "version": 0,
        "type": "dataset",
        "digest": v.digest,
        "path": str(v.path),
        "aliases": ["latest", "best"],
        "metadata": {"rows": 1},
        "step": 2,
    }
    assert events[1][1]["action"] == "used" and isinstance(events[1][1]["version"], int)
    manifest = json.loads((v.path.parent / "v0.manifest.json").read_text())
    assert manifest["run"]["name"] == "r" and manifest["run"]["dir"] == str(run.dir.absolute())


def test_identical_contents_return_the_existing_version(tmp_path, data):
    run = et.init(project="p", name="r", dir=str(tmp_path / "runs"))
    v0 = et.log_artifact(data)
    v0b = et.log_artifact(data, aliases=["again"])
    assert v0b.version == v0.version == 0 and "again" in v0b.aliases
    assert [x["new"] for x in _lineage(run.dir)] == [True, False]


def test_a_file_path_and_name_type_overrides(tmp_path, data):
    et.init(project="p", name="r", dir=str(tmp_path / "runs"))
    v = et.log_artifact(data / "train.csv")
    assert (v.name, v.files()) == ("train.csv", ["train.csv"])
    art = et.Artifact("weights", type="model")
    art.add_file(data / "train.csv", name="w.bin")
    v2 = et.log_artifact(art, name="weights-small", type="checkpoint")
    assert (v2.name, v2.type) == ("weights-small", "checkpoint")
    assert art.name == "weights"  # the artifact given is not changed
    bad = tmp_path / "has space"
    bad.mkdir()
    (bad / "f").write_text("f")
    with pytest.raises(ArtifactNameError, match="pass name="):
        et.log_artifact(bad)
    assert et.log_artifact(bad, name="spaced").name == "spaced"


def test_type_mismatch_and_unknown_names(tmp_path, data):
    et.init(project="p", name="r", dir=str(tmp_path / "runs"))
    et.log_artifact(data, type="dataset")
    with pytest.raises(ArtifactTypeError, match=r"data:v0 has type 'dataset', not 'model'"):
        et.use_artifact("data", type="model")
    with pytest.raises(et.ExprTrackerError, match="no artifact 'dat'"):
        et.use_artifact("dat")
    with pytest.raises(ArtifactNameError, match=r"artifact name '\.\./x'"):
        et.use_artifact("../x")


def test_run_methods_and_no_run(tmp_path, data):
    with pytest.raises(NoActiveRunError):
        et.log_artifact(data)
    with pytest.raises(NoActiveRunError):
        et.use_artifact("data")
    run = et.init(project="p", name="r", dir=str(tmp_path / "runs"))
    v = run.log_artifact(data)
    assert run.use_artifact(v).version == 0  # a version object is accepted too
    assert et.info()["artifacts"] | {"store": None, "root": None} == {
        "logged": 1,
        "used": 1,
        "lineage_errors": 0,
        "rewritten_in_place": 0,
        "index_lines_skipped": 0,
        "store": None,
        "root": None,
        "mode": "copy",
    }
    et.finish()
    with pytest.raises(NoActiveRunError, match="has finished"):
        run.use_artifact("data")


def test_streams_and_ranks_keep_their_own_lineage_file(tmp_path, data, monkeypatch):
    runs = str(tmp_path / "runs")
    et.init(project="p", name="r", dir=runs, stream="eval")
    et.log_artifact(data)
    et.finish()
    monkeypatch.setenv("RANK", "2")
    run = et.init(project="p", name="r", dir=runs)
    et.use_artifact("data")
    et.finish()
    assert [x["action"] for x in _lineage(run.dir, "artifacts.eval.jsonl")] == ["logged"]
    assert [x["action"] for x in _lineage(run.dir, "artifacts.rank2.jsonl")] == ["used"]
    from expr_tracker.artifacts import read_lineage

    recs = read_lineage(run.dir)
    assert sorted((r["stream"] or "", r["rank"]) for r in recs) == [("", 2), ("eval", 0)]


def test_copy_mode_from_the_spec(tmp_path, data):
    import os

    et.init(project="p", name="r", dir=str(tmp_path / "runs"), artifacts={"mode": "copy"})
    v = et.log_artifact(data)
    assert os.stat(v.get_path("train.csv")).st_ino != os.stat(data / "train.csv").st_ino


def test_a_bad_mode_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError) as err:
        et.init(project="p", name="r", dir=str(tmp_path / "runs"), artifacts={"mode": "symlink"})
    msg = str(err.value)
    assert "artifacts.mode" in msg and "symlink" in msg and "link" in msg and "copy" in msg
    with pytest.raises(SpecError, match="artifacts.dir"):
        et.init(project="p", name="r", dir=str(tmp_path / "runs"), artifacts={"dir": "x"})


def test_a_checkpoint_rewritten_in_place_keeps_the_logged_version(tmp_path):
    # the default (was `link`: a hard link of ckpt.pt) now stores a copy: torch.save to the
    # same path again rewrote the logged version's bytes, and its data was gone
    import hashlib
    import os

    run = et.init(project="p", name="r", dir=str(tmp_path / "runs"))
    assert run.info()["artifacts"]["mode"] == "copy"
    ckpt = tmp_path / "ckpt.pt"
    ckpt.write_bytes(b"epoch-1 weights")
    v0 = et.log_artifact(ckpt, type="model")
    digest, sha = v0.digest, v0.manifest["files"][0]["sha256"]
    assert os.stat(v0.get_path("ckpt.pt")).st_ino != os.stat(ckpt).st_ino
    with open(ckpt, "wb") as f:  # torch.save(model, "ckpt.pt"): the same inode, rewritten
        f.write(b"epoch-2 weights")
    used = et.use_artifact("ckpt.pt:v0")  # checks every file: nothing changed
    assert used.get_path("ckpt.pt").read_bytes() == b"epoch-1 weights"
    assert used.digest == digest and used.verify()
    assert hashlib.sha256(b"epoch-1 weights").hexdigest() == sha
    v1 = et.log_artifact(ckpt, type="model")
    assert (v1.version, v1.get_path("ckpt.pt").read_bytes()) == (1, b"epoch-2 weights")
    assert run.info()["artifacts"]["rewritten_in_place"] == 0
    et.finish()


def test_the_first_version_is_v0_and_use_artifact_takes_it(tmp_path, data):
    # versions counted from 1 (data:v1 was the first); wandb users type data:v0
    et.init(project="p", name="r", dir=str(tmp_path / "runs"))
    v = et.log_artifact(data)
    assert (v.version, v.qualified_name, v.path.name) == (0, "data:v0", "v0")
    got = et.use_artifact("data:v0")
    assert (got.version, got.digest, got.aliases) == (0, v.digest, ["latest"])
    (data / "train.csv").write_text("x,y\n3,4\n")
    assert et.log_artifact(data).version == 1
    assert et.use_artifact("data:v0").get_path("train.csv").read_text() == "x,y\n1,2\n"
    assert et.use_artifact("data:latest").version == 1
    et.finish()


def test_link_mode_links_and_a_rewrite_in_place_warns(tmp_path, caplog):
    import os

    run = et.init(project="p", name="r", dir=str(tmp_path / "runs"), artifacts={"mode": "link"})
    ckpt = tmp_path / "ckpt.pt"
    ckpt.write_bytes(b"epoch-1")
    v0 = et.log_artifact(ckpt, type="model")
    assert os.stat(v0.get_path("ckpt.pt")).st_ino == os.stat(ckpt).st_ino  # linked
    assert v0.manifest["files"][0]["stored"] == "link" and v0.manifest["mode"] == "link"
    with open(ckpt, "wb") as f:  # torch.save(model, "ckpt.pt"): the same inode, rewritten
        f.write(b"epoch-2")
    with caplog.at_level("WARNING", logger="expr_tracker"):
        v1 = et.log_artifact(ckpt, type="model")
    assert "ckpt.pt:v0 file 'ckpt.pt' is a hard link" in caplog.text
    assert "artifacts.mode: copy" in caplog.text
    assert run.info()["artifacts"]["rewritten_in_place"] == 1
    assert v1.manifest["files"][0]["stored"] == "copy"
    assert os.stat(v1.get_path("ckpt.pt")).st_ino != os.stat(ckpt).st_ino
    with open(ckpt, "wb") as f:
        f.write(b"epoch-3")
    v2 = et.log_artifact(ckpt, type="model")
    assert v2.version == 2 and v2.manifest["files"][0]["stored"] == "copy"
    assert v1.verify() and v1.get_path("ckpt.pt").read_bytes() == b"epoch-2"
    with pytest.raises(et.ExprTrackerError, match="no longer matches"):
        v0.verify()  # the one version a hard link cannot protect


def test_the_link_hazard_is_documented_where_the_mode_is_chosen():
    from pathlib import Path

    docs = (Path(__file__).parents[2] / "docs" / "artifacts.md").read_text()
    section = " ".join(docs.split("## Link or copy", 1)[1].split("\n## ", 1)[0].split())
    assert "`artifacts: {mode: copy}` (the default)" in section
    assert "`artifacts: {mode: link}` (for every call of a run) or" in section
    assert '`log_artifact(..., mode="link")` (for one call' in section
    assert "is the opt-in" in section
    assert "What link mode promises." in section and "never handed out changed" in section
    assert "a later in-place edit of the source changes the stored version" in section
    assert "torch.save" in section


def test_relogging_linked_files_costs_no_copy(tmp_path, data, monkeypatch):
    from expr_tracker.artifacts import store as store_mod

    et.init(project="p", name="r", dir=str(tmp_path / "runs"), artifacts={"mode": "link"})
    v1 = et.log_artifact(data)
    copies = []
    real = store_mod.copy_hashed
    monkeypatch.setattr(store_mod, "copy_hashed", lambda a, b: copies.append(a) or real(a, b))
    assert et.log_artifact(data).version == v1.version
    assert copies == []  # the sources are v1's links: hashed, found identical, nothing copied


def test_a_run_named_artifacts_cannot_log_into_its_own_directory(tmp_path, data):
    # its directory is the project's store: an artifact "metrics.jsonl" took the run's
    # metric file and `et runs` no longer listed the run
    et.init(project="p", name="artifacts", dir=str(tmp_path / "runs"))
    et.log({"a": 1})
    with pytest.raises(et.ExprTrackerError, match="named 'artifacts'"):
        et.log_artifact(data / "train.csv", name="metrics.jsonl")
    et.log({"a": 2})
    et.finish()
    run_dir = tmp_path / "runs" / "p" / "artifacts"
    assert not (run_dir / "index.jsonl").exists()
    assert (run_dir / "metrics.jsonl").is_file()


def test_wandb_style_keywords_of_add_file_and_add_dir(tmp_path, data):
    # wandb's own docs write add_file(local_path=...): it raised TypeError here
    import expr_tracker as wandb

    run = wandb.init(project="p", name="r", dir=str(tmp_path / "runs"))
    artifact = wandb.Artifact(name="model", type="model")
    assert artifact.add_file(local_path=str(data / "train.csv")) == "train.csv"
    assert artifact.add_dir(local_path=str(data / "sub"), name="labels") is artifact
    assert sorted(artifact.files) == ["labels/labels.txt", "train.csv"]
    run.log_artifact(artifact, aliases=["best"])
    used = run.use_artifact("model:best", type="model")
    assert used.files() == ["labels/labels.txt", "train.csv"]
    wandb.finish()


def test_a_version_object_of_another_project_is_not_taken_by_its_name(tmp_path):
    # use_artifact(v) looked up "data:v1" in the current project: other contents, silently
    from expr_tracker.artifacts import ArtifactNotFoundError

    runs = str(tmp_path / "runs")
    (tmp_path / "a.txt").write_text("A")
    (tmp_path / "b.txt").write_text("B")
    et.init(project="A", name="r", dir=runs)
    va = et.log_artifact(tmp_path / "a.txt", name="data")
    et.finish()
    et.init(project="B", name="r", dir=runs)
    vb = et.log_artifact(tmp_path / "b.txt", name="data")
    with pytest.raises(ArtifactNotFoundError, match="not of this run's project"):
        et.use_artifact(va)
    assert et.use_artifact(vb).digest == vb.digest  # its own project's version: fine
    et.finish()


def test_logging_the_working_directory_leaves_the_store_out(tmp_path, monkeypatch):
    # log_artifact(".") beside ./runs stored the store in itself: v2 held v1, v3 held v2 ...
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print(1)\n")
    et.init(project="p", name="r")
    v1 = et.log_artifact(".", name="code")
    v2 = et.log_artifact(".", name="code")
    et.finish()
    for v in (v1, v2):
        assert "train.py" in v.files()
        assert not [f for f in v.files() if f.startswith("runs/p/artifacts/")]
