"""et export copies the media files its rows reference (docs/media.md "Exporting")."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest

import expr_tracker as et
from expr_tracker.cli.main import main
from expr_tracker.media import load_histogram, load_image, load_table
from expr_tracker.query.export import ExportError, export_runs

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

PIX = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)


def _run(root: Path, name: str = "r") -> Path:
    run = et.init(project="p", name=name, dir=str(root), system=False)
    table = et.Table(columns=["id", "im", "hist"])
    table.add_data(0, et.Image(PIX[:, :, 0]), et.Histogram([5, 6, 6]))
    et.log({"loss": 1.0, "img": et.Image(PIX), "tab": table, "h": et.Histogram([1, 2, 2])})
    et.log({"loss": 0.5, "gallery": [et.Image(PIX), et.Image(PIX[::-1].copy())]})
    d = Path(run.dir)
    et.finish()
    return d


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_one_file_gets_media_beside_it_and_references_that_resolve(tmp_path):
    run_dir = _run(tmp_path / "runs")
    out = tmp_path / "out" / "r.jsonl"
    res = export_runs(run_dir, out)
    # 3 images, a table, 2 histograms (one a table cell)
    assert res["media"]["files"] == 6 and res["media"]["refused"] == 0
    assert sorted(p.name.split(".", 1)[1] for p in (out.parent / "media").iterdir()) == [
        "npz",
        "npz",
        "parquet",
        "png",
        "png",
        "png",
    ]
    rows = _rows(out)
    img = json.loads(rows[0]["img"])
    assert img["path"].startswith("media/")
    # the references resolve against the output's folder, with the readers of a run
    assert np.array_equal(load_image(out.parent, img), PIX)
    df = load_table(out.parent, json.loads(rows[0]["tab"]))
    assert np.array_equal(load_image(out.parent, df["im"][0]), PIX[:, :, :1])
    assert load_histogram(out.parent, df["hist"][0])[0].sum() == 3
    assert load_histogram(out.parent, json.loads(rows[0]["h"]))[0][0] == 1
    # a second export to the same folder copies nothing again
    again = export_runs(run_dir, tmp_path / "out" / "r2.jsonl")
    assert again["media"]["files"] == 0


def test_media_dir_rewrites_references_and_no_media_copies_nothing(tmp_path):
    run_dir = _run(tmp_path / "runs")
    out = tmp_path / "out" / "r.parquet"
    res = export_runs(run_dir, out, media_dir=tmp_path / "assets" / "m")
    assert res["media"]["files"] == 6
    import pyarrow.parquet as pq

    cells = pq.read_table(out).column("gallery").to_pylist()
    refs = json.loads([c for c in cells if c][0])
    assert all(r["path"].startswith("../assets/m/") for r in refs)
    assert (out.parent / refs[0]["path"]).is_file()
    plain = tmp_path / "plain.jsonl"
    assert export_runs(run_dir, plain, media=False)["media"] is None
    assert not (tmp_path / "media").exists()
    assert json.loads(_rows(plain)[0]["img"])["path"].startswith("media/")
    with pytest.raises(ExportError, match="media-dir"):
        export_runs(run_dir, tmp_path / "x.jsonl", media_dir=run_dir / "media")


def test_partitioned_export_holds_media_and_can_be_overwritten(tmp_path):
    _run(tmp_path / "runs", "a")
    _run(tmp_path / "runs", "b")
    out = tmp_path / "export"
    res = export_runs(tmp_path / "runs", out, layout="long")
    assert res["media"]["files"] == 6  # the same content in both runs: stored once
    assert res["media"]["dir"] == str(out / "_media")  # not the temporary name it had
    parts = sum(f.stat().st_size for f in out.rglob("*.parquet") if "_media" not in f.parts)
    assert res["bytes"] == parts  # the metrics' bytes, as for one file; media apart
    assert len(list((out / "_media").iterdir())) == 6
    import pyarrow.dataset as ds

    texts = ds.dataset(out, format="parquet").to_table().column("text").to_pylist()
    refs = [json.loads(t) for t in texts if t and '"_type":"image"' in t]
    paths = {r["path"] for v in refs for r in (v if isinstance(v, list) else [v])}
    assert paths and all(p.startswith("_media/") and (out / p).is_file() for p in paths)
    export_runs(tmp_path / "runs", out, overwrite=True)  # _media is part of an export


def test_hostile_or_damaged_references_are_refused_not_copied(tmp_path, caplog):
    run_dir = _run(tmp_path / "runs")
    bad = "media/" + "0" * 64 + ".png"  # a name that is a hash, but of other content
    (run_dir / bad).write_bytes(b"not that")
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"_step": 5, "x": {"_type": "image", "path": "../../etc/passwd"}}))
        f.write("\n" + json.dumps({"_step": 6, "y": {"_type": "image", "path": bad}}) + "\n")
    out = tmp_path / "o.jsonl"
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        res = export_runs(run_dir, out)
    assert res["media"]["refused"] == 2 and res["media"]["files"] == 6
    assert "etc/passwd" in caplog.text and "SHA-256" in caplog.text
    assert sorted(os.listdir(tmp_path / "media")) == sorted(
        p.name for p in (run_dir / "media").iterdir() if p.name != "0" * 64 + ".png"
    )


def test_cli_flags(tmp_path, capsys):
    run_dir = _run(tmp_path / "runs")
    assert main(["export", str(run_dir), "-o", str(tmp_path / "a.csv")]) == 0
    assert "6 media file(s)" in capsys.readouterr().out
    assert main(["export", str(run_dir), "-o", str(tmp_path / "b.csv"), "--no-media"]) == 0
    assert "media" not in capsys.readouterr().out
    code = main(["export", str(run_dir), "-o", str(tmp_path / "c.csv"), "--media-dir", "m"])
    assert code == 0
