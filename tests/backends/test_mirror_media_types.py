"""Mirrors send media as the library's own types (docs/media.md "Mirrors"): the converter
with the real wandb and trackio classes, and one real offline wandb run."""

from __future__ import annotations

import json

import numpy as np
import pytest

import expr_tracker as et
from expr_tracker.backends import mediaconv
from expr_tracker.backends.mediaconv import MediaConverter

PIX = np.arange(6 * 4 * 3, dtype=np.uint8).reshape(6, 4, 3)


def _rows(tmp_path):
    run = et.init(project="p", name="r", dir=str(tmp_path / "runs"), system=False)
    table = et.Table(columns=["id", "im", "h"])
    table.add_data(0, et.Image(PIX), et.Histogram([1.0, 2.0]))
    et.log({"loss": 1.0, "img": et.Image(PIX, caption="c"), "tab": table})
    et.log({"gallery": [et.Image(PIX), et.Image(PIX[::-1].copy())], "h": et.Histogram([1, 2, 2])})
    rows = et.history()
    run_dir = run.dir
    et.finish()
    return run_dir, rows


@pytest.mark.parametrize("name", ["wandb", "trackio"])
def test_references_become_the_librarys_types(tmp_path, name):
    lib = pytest.importorskip(name)
    run_dir, rows = _rows(tmp_path)
    warnings: list[str] = []
    conv = MediaConverter(lib, run_dir, warnings.append, name)
    first = conv.row({k: v for k, v in rows[0].items() if not k.startswith("_")})
    assert first["loss"] == 1.0
    assert isinstance(first["img"], lib.Image) and isinstance(first["tab"], lib.Table)
    tab = first["tab"]
    if name == "wandb":
        assert list(tab.columns) == ["id", "im", "h"]
        cells = tab.data[0]
    else:  # trackio 0.43 keeps rows as dicts
        assert list(tab.data[0]) == ["id", "im", "h"]
        cells = list(tab.data[0].values())
    assert isinstance(cells[1], lib.Image) and isinstance(cells[2], lib.Histogram)
    second = conv.row({k: v for k, v in rows[1].items() if not k.startswith("_")})
    assert [type(g) for g in second["gallery"]] == [lib.Image, lib.Image]
    assert isinstance(second["h"], lib.Histogram)
    assert warnings == []
    plain = {"loss": 2.0, "tag": "x", "cfg": {"a": 1}}
    assert conv.row(plain) is plain  # nothing to convert: the same dict


def test_a_bad_reference_is_left_out_with_one_warning(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setattr(mediaconv, "FILE_WAIT_S", 0.05)
    run_dir, rows = _rows(tmp_path)
    warnings: list[str] = []
    conv = MediaConverter(wandb, run_dir, warnings.append, "wandb")
    hostile = {"_type": "image", "path": "../../etc/passwd"}
    missing = {"_type": "image", "path": "media/" + "a" * 64 + ".png"}
    for _ in range(2):
        out = conv.row({"x": hostile, "y": missing, "loss": 1.0, "img": rows[0]["img"]})
        assert set(out) == {"loss", "img"}
    assert len(warnings) == 2 and "'x'" in warnings[0] and "not valid" in warnings[0]
    # a library without a type: that key is left out, the rest goes on
    conv = MediaConverter(type("Lib", (), {}), run_dir, warnings.append, "lib")
    assert conv.row({"h": rows[1]["h"], "loss": 1.0}) == {"loss": 1.0}
    assert "no Histogram type" in warnings[-1]


@pytest.mark.slow  # a real wandb run: its service process starts (~3-6 s)
def test_wandb_offline_run_holds_image_histogram_and_table(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from test_wandb_mirror import _env, of_kind, wandb_records

    for k, v in _env(tmp_path).items():
        monkeypatch.setenv(k, v)
    run = et.init(
        project="p", name="wb", dir=str(tmp_path / "runs"), system=False, backends=["wandb"]
    )
    table = et.Table(columns=["id", "im"])
    table.add_data(0, et.Image(PIX))
    et.log({"img": et.Image(PIX), "h": et.Histogram([1, 2, 2]), "tab": table})
    et.finish()
    assert run.info()["backends"]["wandb"]["sent"] == 1
    import wandb

    # run.finish() returns before wandb's service has written its transaction log (the file
    # can still be its 7-byte header); a script's exit waits for the service, here teardown
    wandb.teardown()
    [path] = (tmp_path / "wb").rglob("*.wandb")
    items: dict = {}  # wandb writes a media value's fields as nested keys
    for h in of_kind(wandb_records(path), "history"):
        for it in h.item:
            if len(it.nested_key) == 2:
                items.setdefault(it.nested_key[0], {})[it.nested_key[1]] = json.loads(it.value_json)
    assert items["img"]["_type"] == "image-file" and items["img"]["width"] == 4
    assert items["h"]["_type"] == "histogram" and sum(items["h"]["values"]) == 3
    assert items["tab"]["_type"] == "table-file" and items["tab"]["nrows"] == 1
