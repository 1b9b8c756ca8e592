"""Media through et.log: the row's references, the files under media/, arrays as numbers or
histograms, the folder's bound, et.history and the readers (docs/media.md)."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

import expr_tracker as et
from expr_tracker.history.untrusted import UnsafeFileError
from expr_tracker.media import load_histogram, load_image, load_table, read_media


def _init(tmp_path, **kw):
    return et.init(project="p", name="r", dir=str(tmp_path / "runs"), system=False, **kw)


def test_images_tables_and_histograms_land_in_the_row_and_on_disk(tmp_path):
    pd = pytest.importorskip("pandas")
    run = _init(tmp_path)
    img = np.random.default_rng(0).integers(0, 256, size=(16, 12, 3), dtype=np.uint8)
    df = pd.DataFrame({"n": [1, 2], "s": ["a", "b"]})
    et.log({"loss": 0.5, "img": et.Image(img, caption="c"), "tab": et.Table(dataframe=df)})
    et.log({"gallery": [et.Image(img), et.Image(img[:, :, 0])], "h": et.Histogram([1, 2, 2])})
    rows = et.history()
    run_dir = run.dir
    et.finish()
    ref = rows[0]["img"]
    assert ref["_type"] == "image" and ref["path"] == f"media/{ref['sha256']}.png"
    assert (ref["width"], ref["height"], ref["caption"]) == (12, 16, "c")
    assert np.array_equal(load_image(run_dir, ref), img)
    back = load_table(run_dir, rows[0]["tab"])
    pd.testing.assert_frame_equal(back, df)
    assert [g["path"] for g in rows[1]["gallery"]][0] == ref["path"]  # stored once
    h = rows[1]["h"]
    assert h["path"] == f"media/{h['sha256']}.npz" and (h["num_bins"], h["count"]) == (64, 3)
    counts, edges = load_histogram(run_dir, h)
    assert counts.tolist() == [1] + [0] * 62 + [2] and (edges[0], edges[-1]) == (1.0, 2.0)
    assert rows[0]["tab"]["path"].endswith(".parquet") and rows[0]["tab"]["columns"] == ["n", "s"]
    names = sorted(os.listdir(run_dir / "media"))
    assert len(names) == 4 and not [n for n in names if n.startswith(".")]
    # the reader gets the same references from the file
    assert et.read_history(run_dir)[0]["img"] == ref


def test_arrays_become_numbers_or_a_histogram_with_one_warning(tmp_path, caplog):
    torch = pytest.importorskip("torch")
    run = _init(tmp_path)
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        et.log(
            {
                "s": np.float32(2.5),
                "one": np.array([3.0]),
                "t0": torch.tensor(1.5),
                "arr": np.arange(100.0),
                "t2": torch.ones(4, 5),
                "pair": np.histogram([1, 2, 2, 3], bins=3),
                "plain": [1, 2, 3],
            }
        )
        et.log({"arr": np.arange(10)})
    row = et.history()[0]
    run.media.flush()  # the files are written by the run's media thread
    assert (row["s"], row["one"], row["t0"], row["plain"]) == (2.5, 3.0, 1.5, [1, 2, 3])
    assert row["arr"]["_type"] == "histogram" and row["arr"]["count"] == 100
    assert load_histogram(run.dir, row["t2"])[0].sum() == 20
    counts, edges = load_histogram(run.dir, row["pair"])
    assert counts.tolist() == [1, 2, 1]
    assert edges.tolist() == np.histogram([1, 2, 2, 3], bins=3)[1].tolist()
    warned = [r for r in caplog.records if "64-bin histogram" in r.getMessage()]
    assert len(warned) == 1 and "et.Histogram" in warned[0].getMessage()
    assert et.info()["media"]["arrays_as_histograms"] == 3


def test_the_media_bound_drops_with_one_error(tmp_path, caplog):
    run = _init(tmp_path)
    run.media.max_bytes = 200
    big = np.random.default_rng(1).integers(0, 256, size=(32, 32), dtype=np.uint8)
    with caplog.at_level(logging.ERROR, logger="expr_tracker"):
        et.log({"a": et.Image(big), "x": 1.0})
        et.log({"a": et.Image(big + 1), "x": 2.0})
    rows = et.history()
    assert rows[0]["a"] is None and rows[0]["x"] == 1.0 and rows[1]["a"] is None
    assert et.info()["media"]["dropped"] == 2
    assert sum("media.max_bytes" in r.getMessage() for r in caplog.records) == 1


def test_a_failing_conversion_never_breaks_log(tmp_path, monkeypatch):
    run = _init(tmp_path)

    def boom(*a):
        raise OSError("disk gone")

    monkeypatch.setattr(run.media, "put", boom)
    assert et.log({"a": et.Image(np.zeros((2, 2), dtype=np.uint8)), "x": 1.0}) == 0
    assert et.history()[0] == {**et.history()[0], "a": None, "x": 1.0}


def test_wandb_objects_are_logged_as_ours(tmp_path):
    wandb = pytest.importorskip("wandb")
    run = _init(tmp_path)
    counts, edges = np.histogram([1, 2, 2, 3], bins=3)
    et.log(
        {
            "img": wandb.Image(np.zeros((4, 4, 3), dtype=np.uint8)),
            "h": wandb.Histogram(np_histogram=(counts, edges)),
            "t": wandb.Table(columns=["a"], data=[[1]]),
        }
    )
    row = et.history()[0]
    run.media.flush()
    assert row["img"]["_type"] == "image" and (row["img"]["width"], row["img"]["height"]) == (4, 4)
    assert load_histogram(run.dir, row["h"])[0].tolist() == [1, 2, 1] and row["t"]["nrows"] == 1


def test_reading_refuses_names_links_and_changed_files(tmp_path):
    run_dir = tmp_path / "run"
    media = run_dir / "media"
    media.mkdir(parents=True)
    data = b"\x89PNG not really"
    import hashlib

    sha = hashlib.sha256(data).hexdigest()
    (media / f"{sha}.png").write_bytes(data)
    assert read_media(run_dir, {"path": f"media/{sha}.png"}) == (data, "image/png")
    for bad in ("media/../x.png", f"media/{sha}.exe", "/etc/passwd", f"media/sub/{sha}.png", None):
        with pytest.raises(ValueError):
            read_media(run_dir, {"path": bad})
    outside = tmp_path / "secret.png"
    outside.write_bytes(data)
    sha2 = "b" * 64
    os.symlink(outside, media / f"{sha2}.png")
    with pytest.raises(UnsafeFileError):
        read_media(run_dir, f"media/{sha2}.png")
    sha3 = "c" * 64
    os.mkfifo(media / f"{sha3}.png")
    with pytest.raises(UnsafeFileError):
        read_media(run_dir, f"media/{sha3}.png")
    (media / f"{'d' * 64}.png").write_bytes(data)  # content not matching its name
    with pytest.raises(ValueError, match="SHA-256"):
        read_media(run_dir, f"media/{'d' * 64}.png")
