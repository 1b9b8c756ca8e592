"""The run page's System section (docs/system.md): the system stream's producers listed
per node apart from the run's metrics, drawn over wall time one producer per chart, left
out of the live poll; and in a real headless Chromium, the section with its charts
(screenshot in test-artifacts/ui/system.png)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest
from helpers import ROOT
from ui_support import Server, env

from expr_tracker.ui.server import create_app

TestClient = pytest.importorskip("starlette.testclient").TestClient

#: a run with a system stream on two "nodes" (rank 0's and rank 8's files), as a two-node
#: torchrun launch leaves it; the second node's file is written by a second process
WRITER = textwrap.dedent(
    """
    import os, sys, time, expr_tracker as et
    rank = int(sys.argv[2])
    if rank:
        os.environ["RANK"] = str(rank)
    run = et.init(project="demo", name="sys", dir=sys.argv[1], system_interval="50ms",
                  config={"same": 1}, resume="allow")
    for i in range(5):
        et.log({"train/loss": 1.0 / (i + 1)})
    end = time.monotonic() + 20
    while run.system.rows < 3 and time.monotonic() < end:
        time.sleep(0.02)
    et.finish()
    """
)


@pytest.fixture(scope="module")
def sys_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("uisys") / "runs"
    for rank in ("0", "8"):
        subprocess.run(
            [sys.executable, "-c", WRITER, str(root), rank], check=True, env=env(), timeout=120
        )
    return root


@pytest.fixture(scope="module")
def client(sys_runs, tmp_path_factory):
    app = create_app(sys_runs, cache_dir=tmp_path_factory.mktemp("uisysc"))
    return TestClient(app, base_url="http://127.0.0.1")


def test_run_page_lists_system_nodes_apart(client):
    d = client.get("/api/run", params={"run": "demo/sys"}).json()
    assert d["metrics"] == ["train/loss"]  # no system metric among the run's own
    assert [n["producer"] for n in d["system"]] == ["system", "system/rank8"]
    for node in d["system"]:
        assert node["host"]  # every row names its host
        assert {"cpu/host_pct", "mem/process_rss_bytes", "disk/used_pct"} <= set(node["metrics"])
        assert "host" not in node["metrics"]
    assert set(d["producer_steps"]) == {"main", "main/rank8"}  # epoch-ms steps stay out


def test_series_of_one_node_over_time(client):
    r = client.get(
        "/api/series",
        params={
            "run": "demo/sys",
            "metric": "cpu/host_pct",
            "x": "time",
            "producer": "system/rank8",
        },
    ).json()
    assert [t["producer"] for t in r["traces"]] == ["system/rank8"]
    assert len(r["traces"][0]["x"]) >= 3
    both = client.get("/api/series", params={"run": "demo/sys", "metric": "cpu/host_pct"}).json()
    assert {t["producer"] for t in both["traces"]} == {"system", "system/rank8"}


def test_live_poll_leaves_the_system_stream_out(client):
    params = {"run": "demo/sys", "after": -1, "skip_stream": "system"}
    r = client.get("/api/points", params=params).json()
    assert set(r["max_steps"]) == {"main", "main/rank8"} and r["max_step"] == 4
    assert set(r["metrics"]) == {"train/loss"}
    r = client.get("/api/points", params={"run": "demo/sys", "after": -1}).json()
    assert r["max_step"] > 10**12  # with it: wall time in ms, which the page must not take


@pytest.mark.slow
def test_browser_shows_the_system_section(sys_runs, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium installed")
    sync_api = pytest.importorskip("playwright.sync_api")
    server = Server(sys_runs, tmp_path / "cache")
    try:
        with sync_api.sync_playwright() as pw:
            b = pw.chromium.launch(
                executable_path=chromium, args=["--headless", "--no-sandbox"], headless=True
            )
            pg = b.new_page(viewport={"width": 1200, "height": 900})
            errors: list[str] = []
            pg.on("pageerror", lambda e: errors.append(str(e)))
            pg.goto(server.open("#/run?run=demo%2Fsys"), timeout=180_000)
            pg.wait_for_selector("#system section.system-node", timeout=120_000)
            pg.wait_for_function(
                """() => [...document.querySelectorAll('#system div.chart')].filter(
                      (e) => e.dataset.loaded).length >= 4""",
                timeout=180_000,
            )
            heads = pg.eval_on_selector_all(
                "#system section.system-node", "els => els.map(e => e.dataset.producer)"
            )
            assert heads == ["system", "system/rank8"]
            text = pg.locator("#system").inner_text()
            assert "System" in text and "(system/rank8)" in text
            # the run's own charts hold no system metric
            own = pg.eval_on_selector_all(
                "#charts div.chart", "els => els.map(e => e.dataset.metric)"
            )
            assert own == ["train/loss"]
            out = ROOT / "test-artifacts" / "ui"
            out.mkdir(parents=True, exist_ok=True)
            pg.locator("#system").screenshot(path=str(out / "system.png"))
            assert errors == []
            b.close()
    finally:
        server.close()
