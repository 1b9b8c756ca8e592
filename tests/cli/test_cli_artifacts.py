"""`et artifacts list` and `et artifacts show`: tables, json, jsonl, lineage, errors."""

from __future__ import annotations

import json

import pytest

import expr_tracker as et
from expr_tracker.cli.main import main


@pytest.fixture
def runs(tmp_path):
    runs = tmp_path / "runs"
    src = tmp_path / "data"
    src.mkdir()
    (src / "train.csv").write_text("x\n1\n")
    et.init(project="p", name="maker", dir=str(runs))
    et.log({"loss": 1.0})
    et.log_artifact(src, aliases=["best"])
    (src / "train.csv").unlink()
    (src / "train.csv").write_text("x\n1\n2\n")
    et.log_artifact(src)
    m = et.Artifact("model", type="model", metadata={"acc": 0.9})
    m.add_file(src / "train.csv", name="w/weights.bin")
    m.add_reference("s3://bucket/big.ckpt")
    et.log_artifact(m)
    et.finish()
    et.init(project="p", name="user", dir=str(runs), stream="eval")
    et.log({"acc": 0.5})
    et.log({"acc": 0.6})
    et.use_artifact("data:best")
    et.finish()
    return runs


def et_cli(capsys, *argv):
    code = main(["artifacts", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_list_table(runs, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = et_cli(capsys, "list", runs)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["name", "versions", "latest", "type", "size", "aliases"]
    # versions from v0 (as wandb): two versions, the newest v1; "best" is the first
    assert lines[1].split() == ["data", "2", "v1", "dataset", "6", "B", "best→v0"]
    assert lines[2].split()[:5] == ["model", "1", "v0", "model", "6"]
    # the project directory and the store directory name the same thing
    assert et_cli(capsys, "list", runs / "p")[1] == out
    assert et_cli(capsys, "list", runs / "p" / "artifacts")[1] == out


def test_list_json_and_jsonl(runs, capsys):
    code, out, _ = et_cli(capsys, "list", runs, "--format", "json")
    records = json.loads(out)
    assert code == 0 and [r["name"] for r in records] == ["data", "model"]
    assert records[0] | {"created_at": 0, "path": ""} == {
        "project": "p",
        "name": "data",
        "versions": 2,
        "latest": 1,
        "type": "dataset",
        "size": 6,
        "aliases": {"best": 0},
        "created_at": 0,
        "path": "",
    }
    code, out, _ = et_cli(capsys, "list", runs, "--format", "jsonl")
    assert [json.loads(x)["name"] for x in out.splitlines()] == ["data", "model"]


def test_list_without_artifacts_and_a_missing_dir(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert et_cli(capsys, "list", tmp_path / "empty")[:2] == (
        0,
        f"no artifacts under {tmp_path / 'empty'}\n",
    )
    assert et_cli(capsys, "list", tmp_path / "empty", "--format", "json")[1] == "[]\n"
    code, _, err = et_cli(capsys, "list", tmp_path / "nope")
    assert code == 1 and "is not a directory" in err


def test_show_text_with_lineage(runs, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    code, out, _ = et_cli(capsys, "show", "data:best", "--project-dir", runs)
    assert code == 0
    assert "data:v0  (p)" in out and "latest" not in out.split("aliases:")[1].splitlines()[0]
    assert "train.csv" in out and "copy" in out
    lineage = out[out.index("action") :].splitlines()[1:]
    assert [line.split()[:4] for line in lineage] == [
        ["maker", "main", "logged", "1"],
        ["user", "eval", "used", "2"],
    ]
    code, out, _ = et_cli(capsys, "show", "model", "--project-dir", runs / "p")
    assert "reference s3://bucket/big.ckpt" in out and "metadata.acc:" in out
    assert "no run recorded using it" not in out and "maker" in out


def test_show_json(runs, capsys):
    code, out, _ = et_cli(capsys, "show", "data", "--project-dir", runs, "--format", "json")
    doc = json.loads(out)
    assert code == 0 and (doc["name"], doc["version"], doc["aliases"]) == ("data", 1, ["latest"])
    assert [f["name"] for f in doc["files"]] == ["train.csv"]
    assert [(x["run"], x["action"], x["version"]) for x in doc["lineage"]] == [
        ("maker", "logged", 1)
    ]
    code, out, _ = et_cli(capsys, "show", "data:v0", "--project-dir", runs, "--format", "jsonl")
    doc = json.loads(out)
    assert len(out.splitlines()) == 1 and (doc["version"], doc["aliases"]) == (0, ["best"])
    # version 0 is a version like any other: its lineage is listed, not taken for "all"
    assert [(x["run"], x["action"], x["version"]) for x in doc["lineage"]] == [
        ("maker", "logged", 0),
        ("user", "used", 0),
    ]


def test_show_errors(runs, capsys, tmp_path):
    code, _, err = et_cli(capsys, "show", "nope", "--project-dir", runs)
    assert code == 1 and "no artifact 'nope'" in err and "projects with artifacts: p" in err
    code, _, err = et_cli(capsys, "show", "data:v9", "--project-dir", runs)
    assert code == 1 and "no version v9 (versions: v0, v1)" in err
    code, _, err = et_cli(capsys, "show", "../x", "--project-dir", runs)
    assert code == 2 and "artifact name '../x'" in err
    # the same name in two projects: which one is a usage error
    src = tmp_path / "d2"
    src.mkdir()
    (src / "f").write_text("f")
    et.init(project="q", name="r", dir=str(runs))
    et.log_artifact(src, name="data")
    et.finish()
    code, _, err = et_cli(capsys, "show", "data", "--project-dir", runs)
    assert code == 2 and "several projects (p, q)" in err
    assert et_cli(capsys, "show", "data", "--project-dir", runs / "q")[0] == 0


def test_et_runs_does_not_list_the_store(runs, capsys):
    src = runs.parent / "looks-like-a-run"
    src.mkdir()
    (src / "metrics.jsonl").write_text('{"_step": 0}\n')
    et.init(project="p", name="third", dir=str(runs))
    et.log_artifact(src)
    et.finish()
    assert main(["runs", str(runs), "--format", "json"]) == 0
    names = sorted(r["run"] for r in json.loads(capsys.readouterr().out))
    assert names == ["p/maker", "p/third", "p/user"]


def test_show_text_lists_the_first_files_of_a_huge_artifact(tmp_path, capsys, monkeypatch):
    # 30000 files took rich ~12 s to lay out (and flooded the terminal); json lists them all
    from expr_tracker.cli import artifacts as cli_artifacts

    monkeypatch.setattr(cli_artifacts, "SHOW_FILES", 3)
    src = tmp_path / "ds"
    src.mkdir()
    for i in range(5):
        (src / f"{i}.txt").write_text(str(i))
    et.init(project="p", name="r", dir=str(tmp_path / "runs"))
    et.log_artifact(src)
    et.finish()
    code, out, _ = et_cli(capsys, "show", "ds", "--project-dir", tmp_path / "runs" / "p")
    assert code == 0 and "2.txt" in out and "3.txt" not in out
    assert "... and 2 more (--format json lists them all)" in out
    code, out, _ = et_cli(
        capsys, "show", "ds", "--format", "json", "--project-dir", tmp_path / "runs"
    )
    assert len(json.loads(out)["files"]) == 5


# ----------------------------------------------- a store from anyone (docs "Security")


def _in_thread(fn, fifos=(), seconds=20.0):
    """``fn()`` in a thread: fails (instead of hanging the suite) when still blocked after
    ``seconds``, releasing the blocked open by opening the FIFOs for writing."""
    import os
    import threading

    box = {}
    t = threading.Thread(target=lambda: box.setdefault("value", fn()), daemon=True)
    t.start()
    t.join(seconds)
    hung = t.is_alive()
    for f in fifos if hung else ():
        try:
            os.close(os.open(f, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
    t.join(5)
    assert not hung, "blocked on a FIFO"
    return box["value"]


def test_list_skips_a_line_nested_20000_deep_and_says_so(runs, capsys):
    index = runs / "p" / "artifacts" / "index.jsonl"
    with open(index, "a") as f:
        f.write("[" * 20_000 + "]" * 20_000 + "\n")
    code, out, err = et_cli(capsys, "list", runs, "--format", "json")
    assert code == 0 and [r["name"] for r in json.loads(out)] == ["data", "model"]
    assert f"warning: {index}: 1 bad line(s) skipped" in err


def test_show_a_tampered_manifest_exits_1_naming_the_entry(runs, capsys):
    import os

    path = runs / "p" / "artifacts" / "data" / "v1.manifest.json"
    m = json.loads(path.read_text())
    m["files"][0]["name"] = "../../../../etc/passwd"
    os.chmod(path, 0o644)
    path.write_text(json.dumps(m))
    code, out, err = et_cli(capsys, "show", "data", "--project-dir", runs)
    assert code == 1 and out == ""
    assert "manifest of v1" in err and "'../../../../etc/passwd'" in err and "'..'" in err


def test_show_does_not_hang_on_a_fifo_lineage_file(runs, capsys):
    import os

    fifo = runs / "p" / "maker" / "artifacts.eval.jsonl"
    os.mkfifo(fifo)
    code, out, err = _in_thread(
        lambda: et_cli(capsys, "show", "data:best", "--project-dir", runs), [fifo]
    )
    assert code == 0 and "used" in out  # the readable lineage is still shown
    assert f"warning: {fifo}: a FIFO, not a regular file" in err


def test_show_text_escapes_control_characters_json_keeps_them(tmp_path, capsys):
    src = tmp_path / "d"
    src.mkdir()
    (src / "f.txt").write_text("x")
    clip = "\x1b]52;c;aGk=\x07"  # OSC 52: writes the terminal's clipboard
    a = et.Artifact("ds", description=f"desc {clip}", metadata={f"k{clip}": f"v{clip}"})
    a.add_dir(src)
    et.init(project="p", name="r", dir=str(tmp_path / "runs"))
    et.log_artifact(a)
    et.finish()
    code, out, _ = et_cli(capsys, "show", "ds", "--project-dir", tmp_path / "runs")
    assert code == 0 and "\x1b" not in out and "\x07" not in out
    assert "desc \\x1b]52;c;aGk=\\x07" in out and "metadata.k\\x1b]52" in out
    code, out, _ = et_cli(
        capsys, "show", "ds", "--format", "json", "--project-dir", tmp_path / "runs"
    )
    assert json.loads(out)["description"] == f"desc {clip}"
