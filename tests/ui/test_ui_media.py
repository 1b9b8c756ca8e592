"""The run page's Media section (docs/media.md "In the dashboard"): the media keys with
their steps, histograms' counts, the latest table; media files served only from the run's
media folder (names, links, FIFOs and changed files refused, Content-Type and nosniff set);
and in a real headless Chromium, the image slider and the histogram heatmap (screenshot
in test-artifacts/ui/media.png)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import numpy as np
import pytest
from helpers import ROOT
from ui_support import Server

import expr_tracker as et
from expr_tracker.ui.server import create_app

TestClient = pytest.importorskip("starlette.testclient").TestClient


@pytest.fixture(scope="module")
def media_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("uimedia") / "runs"
    et.init(project="demo", name="media", dir=str(root), system=False)
    rng = np.random.default_rng(0)
    for step in range(4):
        img = np.full((8, 8, 3), 60 * step, dtype=np.uint8)
        row = {"loss": 1.0 / (step + 1), "samples": et.Image(img, caption=f"s{step}")}
        row["weights"] = et.Histogram(rng.normal(step, 1.0, size=500), num_bins=16)
        if step == 3:
            row["preds"] = et.Table(
                columns=["id", "label", "img"],
                data=[[i, f"c{i}", et.Image(img)] for i in range(30)],
            )
        et.log(row)
    et.finish()
    _older_run(root)
    et.init(project="demo", name="big", dir=str(root), system=False)
    data = [[i, f"r{i % 7}", None if i % 10 == 0 else float(i % 13)] for i in range(1005)]
    et.log({"big": et.Table(columns=["i", "s", "x"], data=data)})
    et.finish()
    return root


def _older_run(root):
    """demo/old as earlier versions wrote it (histogram counts in the row, the table as
    .table.json), then a step whose .npz file is damaged."""
    run = et.init(project="demo", name="old", dir=str(root), system=False)
    et.log({"loss": 1.0})
    run_dir = run.dir
    et.finish()
    (run_dir / "media").mkdir()
    body = json.dumps({"columns": ["a", "b"], "data": [[1, "x"], [2, "y"]]}).encode()
    sha = hashlib.sha256(body).hexdigest()
    (run_dir / "media" / f"{sha}.table.json").write_bytes(body)
    bad = b"PK not a zip"
    bad_sha = hashlib.sha256(bad).hexdigest()
    (run_dir / "media" / f"{bad_sha}.npz").write_bytes(bad)
    hist = {"_type": "histogram", "values": [1, 3], "bins": [0.0, 0.5, 1.0]}
    table = {"_type": "table", "path": f"media/{sha}.table.json", "nrows": 2, "ncols": 2}
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"_step": 1, "_time": 2.0, "h": hist, "t": table}) + "\n")
        damaged = {"_type": "histogram", "path": f"media/{bad_sha}.npz", "num_bins": 2}
        f.write(json.dumps({"_step": 2, "_time": 3.0, "h": damaged}) + "\n")


@pytest.fixture(scope="module")
def client(media_runs, tmp_path_factory):
    app = create_app(media_runs, cache_dir=tmp_path_factory.mktemp("uimediac"))
    return TestClient(app, base_url="http://127.0.0.1")


def test_media_section_lists_keys_steps_and_content(client):
    d = client.get("/api/media", params={"run": "demo/media"}).json()
    by = {m["key"]: m for m in d["media"]}
    assert set(by) == {"samples", "weights", "preds"} and d["error"] is None
    assert by["samples"]["kind"] == "image" and by["samples"]["steps"] == [0, 1, 2, 3]
    assert by["samples"]["items"][2][0]["caption"] == "s2"
    w = by["weights"]
    assert w["kind"] == "histogram" and [sum(h["values"]) for h in w["items"]] == [500] * 4
    t = by["preds"]["table"]
    assert t["columns"] == ["id", "label", "img"] and t["nrows"] == 30
    assert t["data"][1][:2] == [1, "c1"] and t["data"][1][2]["_type"] == "image"
    # media keys are not charts of the run
    assert client.get("/api/run", params={"run": "demo/media"}).json()["metrics"] == ["loss"]


def test_an_older_run_reads_and_a_damaged_file_is_named(client):
    d = client.get("/api/media", params={"run": "demo/old"}).json()
    by = {m["key"]: m for m in d["media"]}
    assert by["h"]["steps"] == [1] and by["h"]["items"] == [
        {"values": [1, 3], "bins": [0.0, 0.5, 1.0]}
    ]
    assert by["t"]["table"] == {"columns": ["a", "b"], "data": [[1, "x"], [2, "y"]], "nrows": 2}
    assert "histogram 'h' at step 2" in d["error"] and "not a histogram .npz" in d["error"]


def test_a_large_table_is_paged_and_sorted_by_the_server(client):
    d = client.get("/api/media", params={"run": "demo/big"}).json()
    (m,) = d["media"]
    assert m["table"]["nrows"] == 1005 and len(m["table"]["data"]) == 1000
    q = {"run": "demo/big", "path": m["items"][-1]["path"], "limit": 5}
    page = client.get("/api/media/table", params={**q, "offset": 1000}).json()
    assert [r[0] for r in page["data"]] == [1000, 1001, 1002, 1003, 1004]
    top = client.get("/api/media/table", params={**q, "sort": "x", "desc": 1}).json()
    assert [r[2] for r in top["data"]] == [12.0] * 5 and top["nrows"] == 1005
    last = client.get("/api/media/table", params={**q, "sort": "x", "offset": 1000}).json()
    assert [r[2] for r in last["data"]] == [None] * 5  # missing last, either way
    by_i = client.get("/api/media/table", params={**q, "sort": "i", "desc": "1"}).json()
    assert by_i["data"][0][0] == 1004
    assert client.get("/api/media/table", params={**q, "sort": "nope"}).status_code == 400
    assert client.get("/api/media/table", params={**q, "limit": 0}).status_code == 400
    png = client.get("/api/media", params={"run": "demo/media"}).json()["media"]
    img = next(x for x in png if x["key"] == "samples")["items"][0][0]["path"]
    r = client.get("/api/media/table", params={**q, "run": "demo/media", "path": img})
    assert r.status_code == 422 and "not a table" in r.json()["error"]


def test_a_parquet_tables_pages_sort_as_python_sorts_them(tmp_path):
    # Arrow sorts and cuts a Parquet table's page; it must order rows as _sort_key does
    from expr_tracker.ui import media as ui_media

    rng = np.random.default_rng(3)
    n = 60
    f = rng.choice([1.5, -2.0, 0.0, float("nan"), None, 7.25], size=n).tolist()
    cols = {
        "f": f,
        "i": [None if k % 9 == 0 else int(v) for k, v in enumerate(rng.integers(-3, 4, n))],
        "s": [
            None if k % 7 == 0 else str(v)
            for k, v in enumerate(rng.choice(["b", "a", "é", "Z"], n))
        ],
        "b": [bool(v) for v in rng.integers(0, 2, n)],
        "mix": [1 if k % 3 == 0 else "x" if k % 3 == 1 else None for k in range(n)],
    }
    rows = [[k] + [cols[c][k] for c in cols] for k in range(n)]
    run = et.init(project="p", name="sorts", dir=str(tmp_path), system=False)
    et.log({"t": et.Table(columns=["k", *cols], data=rows)})
    ref = et.history()[0]["t"]
    et.finish()
    for sort in [None, "k", *cols]:
        for desc in (False, True):
            want = (
                rows
                if sort is None
                else ui_media._sorted_rows(rows, ["k", *cols].index(sort), desc)
            )
            for offset, limit in ((0, n), (7, 11), (n - 3, 10)):
                got = ui_media._table_page(run.dir, ref, offset, limit, sort, desc)
                assert got["nrows"] == n
                expect = want[offset : offset + limit]
                assert [r[0] for r in got["data"]] == [r[0] for r in expect], (sort, desc, offset)


def test_media_file_is_served_with_its_type_and_nosniff(client):
    d = client.get("/api/media", params={"run": "demo/media"}).json()
    path = d["media"][1]["items"][0][0]["path"] if d["media"][1]["key"] == "samples" else None
    path = path or next(m for m in d["media"] if m["key"] == "samples")["items"][0][0]["path"]
    r = client.get("/api/media/file", params={"run": "demo/media", "path": path})
    assert r.status_code == 200 and r.content.startswith(b"\x89PNG")
    assert r.headers["content-type"] == "image/png"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert "sandbox" in r.headers["content-security-policy"]


def test_media_file_refuses_what_is_not_a_media_file_of_the_run(client, media_runs, tmp_path):
    media = media_runs / "demo" / "media" / "media"
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"secret")
    link = media / ("a" * 64 + ".png")
    os.symlink(secret, link)
    fifo = media / ("b" * 64 + ".png")
    os.mkfifo(fifo)
    changed = media / ("c" * 64 + ".png")
    changed.write_bytes(b"not what the name says")
    try:
        for path, status in [
            ("media/../run.json", 422),
            ("../../../etc/passwd", 422),
            ("media/" + "a" * 64 + ".html", 422),
            ("media/" + "a" * 64 + ".png", 422),  # a symbolic link out
            ("media/" + "b" * 64 + ".png", 422),  # a FIFO
            ("media/" + "c" * 64 + ".png", 422),  # content not its hash
            ("media/" + "d" * 64 + ".png", 404),
        ]:
            r = client.get("/api/media/file", params={"run": "demo/media", "path": path})
            assert r.status_code == status, path
            assert r.headers["content-type"] == "application/json"
        r = client.get("/api/media/file", params={"run": "nope", "path": "media/x.png"})
        assert r.status_code == 404
    finally:
        for p in (link, fifo, changed):
            p.unlink()


@pytest.mark.slow
def test_browser_shows_image_slider_histogram_heatmap_and_table(media_runs, tmp_path):
    """A real Chromium (about 5 s: the browser's start)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium installed")
    sync_api = pytest.importorskip("playwright.sync_api")
    server = Server(media_runs, tmp_path / "cache")
    try:
        with sync_api.sync_playwright() as pw:
            b = pw.chromium.launch(
                executable_path=chromium, args=["--headless", "--no-sandbox"], headless=True
            )
            pg = b.new_page(viewport={"width": 1200, "height": 1400})
            errors: list[str] = []
            pg.on("pageerror", lambda e: errors.append(str(e)))
            pg.goto(server.open("#/run?run=demo%2Fmedia"), timeout=180_000)
            pg.wait_for_selector("#media section.media-image img", timeout=120_000)
            pg.wait_for_function(
                "() => document.querySelector('#media img').naturalWidth === 8", timeout=60_000
            )
            assert pg.locator("#media .media-step").inner_text() == "step 3"
            pg.locator("#media .media-slider").fill("1")
            assert pg.locator("#media .media-step").inner_text() == "step 1"
            assert pg.locator("#media figcaption").inner_text() == "s1"
            pg.wait_for_selector("#media .media-heatmap .heatmaplayer", timeout=120_000)
            assert pg.locator("#media table.media-table tbody tr").count() == 25
            pg.locator("#media table.media-table th", has_text="id").click()
            pg.locator("#media table.media-table th", has_text="id").click()  # descending
            assert pg.locator("#media table.media-table tbody td").first.inner_text() == "29"
            out = ROOT / "test-artifacts" / "ui"
            out.mkdir(parents=True, exist_ok=True)
            pg.locator("#media").screenshot(path=str(out / "media.png"))
            # a table past what the section sends: pages and sorts through the server
            pg.goto(server.open("#/run?run=demo%2Fbig"), timeout=180_000)
            first = pg.locator("#media table.media-table tbody td").first
            pg.wait_for_selector("#media table.media-table tbody tr", timeout=120_000)
            head = pg.locator("#media table.media-table th", has_text="i")
            head.first.click()
            head.first.click()  # descending, over all 1,005 rows
            pg.wait_for_function(
                "() => document.querySelector('#media table.media-table tbody td')"
                ".textContent === '1004'",
                timeout=60_000,
            )
            assert first.inner_text() == "1004"
            assert "of 41" in pg.locator("#media .controls .muted").inner_text()
            assert errors == []
            b.close()
    finally:
        server.close()
