"""``et ui`` in a real headless Chromium (Debian's ``chromium``, driven by Playwright): the
runs table, a chart's point count read from the Plotly graph div, live points of a run still
writing, the compare view and hostile metric names rendered as text with no dialog fired.
Screenshots go to ``test-artifacts/ui/`` (and with ``ET_UPDATE_DOCS_SCREENSHOTS=1`` also to
``docs/img/``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT
from ui_support import (
    HOSTILE,
    HOSTILE_IMG,
    HOSTILE_RUN,
    LIVE_WRITER,
    Server,
    env,
    write_rank_runs,
)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("no chromium installed (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

pytestmark = pytest.mark.slow

ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = ROOT / "test-artifacts" / "ui"
DOCS_IMG = ROOT / "docs" / "img"
#: the screenshots docs/ui.md shows
DOCS_SHOTS = {"runs", "run", "chart-nan", "compare", "runs-columns"}


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1200, "height": 720})
    pg = ctx.new_page()
    pg.dialogs = []  # type: ignore[attr-defined]
    pg.errors = []  # type: ignore[attr-defined]

    def on_dialog(d):
        pg.dialogs.append(d.message)  # type: ignore[attr-defined]
        d.dismiss()

    pg.on("dialog", on_dialog)
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))  # type: ignore[attr-defined]
    # nothing but the server: a request elsewhere (a CDN) fails the test
    outside: list[str] = []
    pg.outside = outside  # type: ignore[attr-defined]

    def gate(route):
        url = route.request.url
        if url.startswith("http://127.0.0.1:"):
            route.continue_()
        else:
            outside.append(url)
            route.abort()

    pg.route("**/*", gate)
    yield pg
    assert pg.errors == [], pg.errors  # type: ignore[attr-defined]
    assert pg.dialogs == [], pg.dialogs  # type: ignore[attr-defined]
    assert outside == [], outside
    ctx.close()


def start_live_writer(pg, root, steps: int, interval_s: float) -> subprocess.Popen:
    """A subprocess logging ``steps`` rows to ``root/demo/live``, one per ``interval_s``;
    returns once its metrics file has a row (waiting in ``pg``'s event loop, ≤ 20 s)."""
    writer = subprocess.Popen(
        [sys.executable, "-c", LIVE_WRITER, str(root), str(steps), str(interval_s)], env=env()
    )
    metrics = root / "demo" / "live" / "metrics.jsonl"
    for _ in range(400):
        if metrics.exists() and metrics.stat().st_size > 0:
            break
        pg.wait_for_timeout(50)
    return writer


def shot(pg, name: str, locator=None) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    (locator or pg).screenshot(path=str(path))
    if os.environ.get("ET_UPDATE_DOCS_SCREENSHOTS") == "1" and name in DOCS_SHOTS:
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, DOCS_IMG / f"ui-{name}.png")


def chart_data(pg, metric: str):
    """The Plotly traces of the chart of ``metric`` (name, role, x and y) from the page."""
    return pg.evaluate(
        """(m) => {
            const d = [...document.querySelectorAll('div.chart')].find((e) => e.dataset.metric === m);
            if (!d || !d.data) return null;
            return d.data.map((t) => ({name: t.name, role: t.meta && t.meta.role, x: Array.from(t.x, Number), y: Array.from(t.y)}));
        }""",
        metric,
    )


def wait_chart(pg, metric: str):
    pg.wait_for_function(
        """(m) => [...document.querySelectorAll('div.chart')].some((e) => e.dataset.metric === m && e.dataset.loaded)""",
        arg=metric,
        timeout=30_000,
    )
    return chart_data(pg, metric)


def test_runs_table(page, ui_server):
    page.goto(ui_server.open())
    page.wait_for_selector("#runs-body tr")
    assert "token" not in page.url  # the first visit's token became a cookie
    rows = page.locator("#runs-body tr")
    assert rows.count() == 3
    texts = {rows.nth(i).get_attribute("data-run"): rows.nth(i).inner_text() for i in range(3)}
    assert set(texts) == {"demo/alpha", "demo/beta", "demo/gamma"}
    assert "finished" in texts["demo/alpha"] and "40" in texts["demo/alpha"]
    assert "crashed" in texts["demo/gamma"]
    assert HOSTILE_IMG in texts["demo/alpha"]  # the tag shows as text
    assert page.locator("#runs-body img").count() == 0
    page.fill("#filter-text", "beta")
    assert page.locator("#runs-body tr").count() == 1
    page.fill("#filter-text", "")
    page.select_option("#filter-tag", "base")
    assert page.locator("#runs-body tr").count() == 2
    page.select_option("#filter-status", "crashed")
    assert page.locator("#runs-body tr").get_attribute("data-run") == "demo/gamma"
    page.select_option("#filter-tag", "")
    page.select_option("#filter-status", "")
    page.select_option("#filter-group", "g1")
    assert page.locator("#runs-body tr").get_attribute("data-run") == "demo/alpha"
    page.select_option("#filter-group", "")
    shot(page, "runs")


def test_run_page_charts(page, ui_server):
    page.goto(ui_server.open("#/run?run=demo%2Falpha"))
    data = wait_chart(page, "train/loss")
    raw = [t for t in data if t["role"] == "raw"]
    assert len(raw) == 1 and len(raw[0]["x"]) == 40  # every step of a short series
    assert raw[0]["y"][10] is None and raw[0]["y"][20] is None  # NaN, inf: gaps in the line
    marks = [t for t in data if t["role"] == "nonfinite"]
    assert len(marks) == 1 and sorted(marks[0]["x"]) == [10.0, 20.0]  # ... drawn as marks
    alerts = [t for t in data if t["role"] == "alerts"]
    # loss > 30: fires at step 20 (inf), resolves at 21, fires again at 31
    assert alerts and alerts[0]["x"] == [20.0, 21.0, 31.0]
    # groups by prefix: train, eval, time_ms (spans)
    groups = page.eval_on_selector_all("section.group", "els => els.map(e => e.dataset.group)")
    assert {"train", "eval", "time_ms"} <= set(groups)
    # the user's metrics first, as logged; span timings in their own section after them
    sections = page.eval_on_selector_all(
        "section.metric-section", "els => els.map(e => e.dataset.section)"
    )
    assert sections == ["metrics", "spans"]
    first = page.eval_on_selector_all(
        "div.chart", "els => els.slice(0, 2).map(e => e.dataset.metric)"
    )
    assert first == ["train/loss", "eval/acc"]
    # smoothing (the server's, on the raw series) keeps the raw series, faint, and adds it
    page.select_option("#smooth-kind", "ema")
    page.wait_for_function(
        """() => [...document.querySelectorAll('div.chart')].some(
              (e) => e.dataset.metric === 'train/loss' && e.data.some((t) => t.meta.role === 'smooth'))"""
    )
    data = chart_data(page, "train/loss")
    assert {t["role"] for t in data} >= {"raw", "smooth"}
    assert "smooth=ema%3A0.9" in page.url  # kept in the address
    page.check("#log-y")
    page.wait_for_function(
        """() => document.querySelector('div.chart').layout.yaxis.type === 'log'"""
    )
    assert page.locator("#config").inner_text().count("model.depth") == 1
    page.wait_for_selector("#spans tbody tr")
    assert "fwd" in page.locator("#spans").inner_text()
    href = page.get_attribute("#trace-link", "href")
    assert href.startswith("/api/trace?")
    # a define_metric step metric as the x axis
    page.select_option("#x-axis", "epoch")
    page.wait_for_function(
        """() => { const d = document.querySelector('div.chart[data-metric="eval/acc"]');
                   return d.data && Math.max(...d.data[0].x) === 3.9; }"""
    )
    page.select_option("#x-axis", "step")
    page.wait_for_function(
        """() => { const d = document.querySelector('div.chart[data-metric="eval/acc"]');
                   return d.data && Math.max(...d.data[0].x) === 39; }"""
    )
    page.uncheck("#log-y")
    page.select_option("#smooth-kind", "")
    page.wait_for_function(
        "() => document.querySelector('div.chart').layout.yaxis.type === 'linear'"
    )
    shot(page, "chart-nan", page.locator('section[data-group="train"]'))
    page.goto(page.url.replace("demo%2Falpha", "demo%2Fbeta"))
    page.wait_for_function(
        "() => document.getElementById('run-title')?.textContent === 'demo/beta'"
    )
    wait_chart(page, "train/loss")
    assert len(chart_data(page, "train/loss")[0]["x"]) == 25
    shot(page, "run")


def test_hostile_names_render_as_text(page, ui_server):
    page.goto(ui_server.open("#/run?run=demo%2Falpha"))
    for name in (HOSTILE, HOSTILE_IMG):
        data = wait_chart(page, name)
        assert len(data[0]["x"]) == 40
    # the chart titles hold the names as text; no element came from them
    titles = page.eval_on_selector_all("div.chart .gtitle", "els => els.map(e => e.textContent)")
    assert HOSTILE in titles and HOSTILE_IMG in titles
    assert page.locator("main script").count() == 0
    assert page.locator("main img").count() == 0
    assert HOSTILE in page.locator("#config").inner_text()
    page.wait_for_timeout(300)  # an onerror would fire by now


def test_compare_view(page, ui_server):
    page.goto(ui_server.open())
    page.wait_for_selector("#runs-body tr")
    for run in ("demo/alpha", "demo/beta"):
        page.locator(f'#runs-body tr[data-run="{run}"] input[type=checkbox]').check()
    page.click("#compare")
    data = wait_chart(page, "train/loss")
    names = sorted(t["name"] for t in data if t["role"] == "raw")
    assert names == ["demo/alpha", "demo/beta"]
    assert sorted(len(t["x"]) for t in data if t["role"] == "raw") == [25, 40]
    differs = page.locator("#compare-config tr.differs").all_inner_texts()
    assert any(t.startswith("lr") for t in differs)
    assert not any(t.startswith("model.depth") for t in differs)
    shot(page, "compare")
    # the run page's controls, kept in the address: a reload smooths on relative time
    page.select_option("#smooth-kind", "mean")
    page.select_option("#x-axis", "relative")
    page.goto(page.url)
    page.reload()
    page.wait_for_function(
        """() => { const d = document.querySelector('div.chart[data-metric="train/loss"]');
                   return d && d.data && d.data.filter((t) => t.meta.role === 'smooth').length === 2
                     && d.layout.xaxis.title.text === 'seconds since the first row'; }"""
    )
    assert page.input_value("#smooth-arg") == "20"


def test_live_run_gets_new_points(page, tmp_path):
    root = tmp_path / "runs"
    # 200 s of steps (killed at the end): still running however slowly the page loads
    writer = start_live_writer(page, root, 4000, 0.05)
    try:
        server = Server(root, tmp_path / "cache")
        try:
            page.goto(server.open("#/run?run=demo%2Flive"))
            first = len(wait_chart(page, "train/loss")[0]["x"])
            # more points arrive without a reload (the page polls for steps after its last)
            page.wait_for_function(
                """(n) => { const d = document.querySelector('div.chart[data-metric="train/loss"]');
                            return d.data[0].x.length > n + 5; }""",
                arg=first,
                timeout=30_000,
            )
            xs = chart_data(page, "train/loss")[0]["x"]
            assert xs == sorted(xs) and len(set(xs)) == len(xs)  # no step twice
            assert page.locator("#run-status").inner_text() == "running"
            shot(page, "live")
        finally:
            server.close()
    finally:
        writer.kill()
        writer.wait()


RANK_LIVE = """
import os, sys, time, expr_tracker as et
run = et.init(project="demo", name="ranks", dir=sys.argv[1])
for i in range(40):
    et.log({"loss": float(i)})
    run.flush()
    time.sleep(float(sys.argv[2]))
et.finish()
"""


def test_live_run_of_two_ranks_keeps_every_point(page, tmp_path):
    # torchrun: rank 1 lags rank 0; the page polled every producer from the run's highest
    # step, so rank 1's rows in between never reached the chart. At the end each rank's
    # line has every step, and the status turns to finished by itself.
    root = tmp_path / "runs"
    procs = []
    for rank, pause in ((0, "0.05"), (1, "0.15")):
        e = env()
        e["RANK"] = str(rank)
        procs.append(subprocess.Popen([sys.executable, "-c", RANK_LIVE, str(root), pause], env=e))
    try:
        files = [root / "demo" / "ranks" / n for n in ("metrics.jsonl", "metrics.rank1.jsonl")]
        for _ in range(400):
            if all(f.exists() and f.stat().st_size > 0 for f in files):
                break
            page.wait_for_timeout(50)
        server = Server(root, tmp_path / "cache")
        try:
            page.goto(server.open("#/run?run=demo%2Franks"))
            wait_chart(page, "loss")
            for p in procs:
                p.wait(timeout=60)
            page.wait_for_function(
                "() => document.getElementById('run-status').textContent === 'finished'",
                timeout=30_000,
            )
            page.wait_for_timeout(2500)  # one more poll after the last rows
            raw = {t["name"]: t for t in chart_data(page, "loss") if t["role"] == "raw"}
            assert sorted(raw) == ["loss (main)", "loss (main/rank1)"]
            for t in raw.values():
                assert t["x"] == [float(i) for i in range(40)], t["name"]
                assert t["y"] == [float(i) for i in range(40)], t["name"]
        finally:
            server.close()
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_page_loads_nothing_outside(page, ui_server):
    page.goto(ui_server.open("#/run?run=demo%2Fbeta"))
    wait_chart(page, "eval/acc")
    assert Path(ui_server.url)  # the gate in the fixture fails on any request elsewhere


def test_hostile_run_name_with_ranks(page, tmp_path):
    root = tmp_path / "runs"
    write_rank_runs(root)
    server = Server(root, tmp_path / "cache")
    try:
        page.goto(server.open())
        page.wait_for_selector("#runs-body tr")
        link = page.locator("#runs-body a")
        assert link.inner_text() == f"p;'q/{HOSTILE_RUN}"
        assert page.locator("#runs-body img").count() == 0
        link.click()
        data = wait_chart(page, "loss")
        raw = [t for t in data if t["role"] == "raw"]
        assert [t["name"] for t in raw] == ["loss (main)", "loss (main/rank1)"]
        assert page.locator("#run-title").inner_text() == f"p;'q/{HOSTILE_RUN}"
        assert page.locator("main img").count() == 0
        page.wait_for_timeout(300)
    finally:
        server.close()


LONG = """
import sys, expr_tracker as et
et.init(project="p", name="long", dir=sys.argv[1])
for i in range(20000):
    et.log({"loss": 1000.0 if i == 12345 else (i % 10) / 10})
et.finish()
"""


def test_long_series_downsampled_and_requeried_on_zoom(page, tmp_path):
    root = tmp_path / "runs"
    subprocess.run([sys.executable, "-c", LONG, str(root)], check=True, env=env(), timeout=120)
    server = Server(root, tmp_path / "cache")
    try:
        page.goto(server.open("#/run?run=p%2Flong"))
        (raw,) = [t for t in wait_chart(page, "loss") if t["role"] == "raw"]
        width = page.evaluate("document.querySelector('div.chart').clientWidth")
        assert len(raw["x"]) <= 4 * width < 20000  # cut for the pixels
        assert max(raw["y"]) == 1000.0 and raw["x"][0] == 0 and raw["x"][-1] == 19999
        # zoom: the page asks the server for the range, at full resolution there
        page.evaluate(
            "Plotly.relayout(document.querySelector('div.chart'), {'xaxis.range': [12300, 12400]})"
        )
        page.wait_for_function(
            """() => { const x = document.querySelector('div.chart').data[0].x;
                       return x.length === 101 && x[0] === 12300 && x[100] === 12400; }""",
            timeout=30_000,
        )
        (zoomed,) = [t for t in chart_data(page, "loss") if t["role"] == "raw"]
        assert zoomed["y"][45] == 1000.0  # step 12345
    finally:
        server.close()


SPREAD = """
import sys, time, expr_tracker as et
et.init(project="p", name="spread", dir=sys.argv[1])
for i in range(50):
    et.log({"loss": float(i)})
    time.sleep(0.02)
et.finish()
"""


def test_zoom_on_wall_time_outside_utc(browser, tmp_path):
    # Plotly answers a date axis' zoom as local-time text; the page read it as UTC, so in
    # New York a zoom asked for a range five hours away and the chart went empty
    root = tmp_path / "runs"
    subprocess.run([sys.executable, "-c", SPREAD, str(root)], check=True, env=env(), timeout=120)
    server = Server(root, tmp_path / "cache")
    ctx = browser.new_context(
        viewport={"width": 1200, "height": 720}, timezone_id="America/New_York"
    )
    try:
        pg = ctx.new_page()
        errors: list[str] = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.goto(server.open("#/run?run=p%2Fspread"))
        wait_chart(pg, "loss")
        pg.select_option("#x-axis", "time")
        pg.wait_for_function(
            """() => { const d = document.querySelector('div.chart');
                       return d.data[0].x[0] instanceof Date && d.data[0].x.length === 50; }""",
            timeout=30_000,
        )
        want = pg.evaluate(
            """() => { const d = document.querySelector('div.chart'), ax = d._fullLayout.xaxis;
                const [a, b] = ax.range.map((r) => ax.r2l(r));
                const lo = ax.l2r(a + 0.3 * (b - a)), hi = ax.l2r(a + 0.6 * (b - a));
                const inside = d.data[0].x.filter((x) => { const l = ax.d2l(x);
                    return l >= ax.r2l(lo) && l <= ax.r2l(hi); }).length;
                Plotly.relayout(d, {'xaxis.range[0]': lo, 'xaxis.range[1]': hi});
                return inside; }"""
        )
        assert 5 <= want <= 25
        pg.wait_for_function(
            "(n) => document.querySelector('div.chart').data[0].x.length === n",
            arg=want,
            timeout=90_000,  # the range asked again: seconds on a loaded 2-core machine
        )
        assert errors == []
    finally:
        ctx.close()
        server.close()


def test_runs_table_filters_follow_new_statuses(page, tmp_path):
    # opened while a sweep runs: the status filter offered "running" only, and after the runs
    # finished "finished" could not be chosen without a reload
    root = tmp_path / "runs"
    writer = start_live_writer(page, root, 60, 0.05)
    try:
        server = Server(root, tmp_path / "cache")
        try:
            page.goto(server.open())
            page.wait_for_selector("#runs-body tr")
            page.fill("#filter-text", "live")
            writer.wait(timeout=60)
            page.wait_for_function(
                "() => document.querySelector('#runs-body tr td.status-finished') !== null",
                timeout=30_000,
            )
            opts = page.eval_on_selector_all("#filter-status option", "os => os.map(o => o.value)")
            assert opts == ["", "finished"]
            page.select_option("#filter-status", "finished", timeout=5_000)
            assert page.locator("#runs-body tr").count() == 1
            assert page.input_value("#filter-text") == "live"  # the filters stay
        finally:
            server.close()
    finally:
        writer.kill()
        writer.wait()


def test_run_deleted_while_its_page_is_open(page, tmp_path):
    # the page kept saying "running" (and "● live") for a run whose folder was removed
    root = tmp_path / "runs"
    writer = start_live_writer(page, root, 2000, 0.05)
    try:
        server = Server(root, tmp_path / "cache")
        try:
            page.goto(server.open("#/run?run=demo%2Flive"))
            wait_chart(page, "train/loss")
            assert page.locator("#run-status").inner_text() == "running"
            writer.kill()
            writer.wait()
            shutil.rmtree(root / "demo" / "live")
            page.wait_for_function(
                "() => document.getElementById('run-status').textContent === 'deleted'",
                timeout=30_000,
            )
            assert page.locator("#live").inner_text() == ""
        finally:
            server.close()
    finally:
        writer.kill()
        writer.wait()


def test_compare_zoom_asks_the_range_again(page, tmp_path):
    # the compare charts kept the series cut for the full width: zooming into a long run
    # showed a handful of points, not its steps
    root = tmp_path / "runs"
    subprocess.run([sys.executable, "-c", LONG, str(root)], check=True, env=env(), timeout=120)
    short = (
        "import sys, expr_tracker as et\n"
        "et.init(project='p', name='short', dir=sys.argv[1])\n"
        "for i in range(12340, 12350): et.log({'loss': 0.5}, step=i)\n"
    )
    subprocess.run([sys.executable, "-c", short, str(root)], check=True, env=env(), timeout=120)
    server = Server(root, tmp_path / "cache")
    try:
        page.goto(server.open("#/compare?run=p%2Flong&run=p%2Fshort"))
        data = wait_chart(page, "loss")
        assert sorted(t["name"] for t in data if t["role"] == "raw") == ["p/long", "p/short"]
        page.evaluate(
            "Plotly.relayout(document.querySelector('div.chart'), {'xaxis.range': [12300, 12400]})"
        )
        page.wait_for_function(
            """() => { const t = document.querySelector('div.chart').data
                         .find((t) => t.name === 'p/long' && t.meta.role === 'raw');
                       return t && t.x.length === 101 && t.x[0] === 12300; }""",
            timeout=30_000,
        )
        raw = {t["name"]: t for t in chart_data(page, "loss") if t["role"] == "raw"}
        assert raw["p/long"]["y"][45] == 1000.0  # step 12345, the spike
        assert raw["p/short"]["x"] == [float(s) for s in range(12340, 12350)]
    finally:
        server.close()


def test_without_the_token_no_data_and_an_unreadable_run_says_why(page, tmp_path, ui_runs):
    root = tmp_path / "runs"
    for name in ("alpha", "beta"):
        shutil.copytree(
            ui_runs / "demo" / name,
            root / "demo" / name,
            ignore=shutil.ignore_patterns(".et-cache"),
        )
    (root / "demo" / "beta" / "run.json").write_text('{"status": "fini')  # damaged
    server = Server(root, tmp_path / "cache")
    try:
        # a page opened without the token (another user, another site) gets the login form
        page.goto(server.url + "/")
        assert page.locator("form input[name=token]").count() == 1
        assert page.locator("#runs-body").count() == 0
        page.fill("input[name=token]", server.token)
        page.press("input[name=token]", "Enter")
        page.wait_for_selector("#runs-body tr")
        assert "token" not in page.url
        rows = page.locator("#runs-body tr")
        assert rows.count() == 2
        beta = page.locator('#runs-body tr[data-run="demo/beta"]').inner_text()
        assert "unreadable" in beta and "run.json: not valid JSON" in beta
        assert "finished" in page.locator('#runs-body tr[data-run="demo/alpha"]').inner_text()
    finally:
        server.close()


def test_a_resumed_run_shows_its_whole_life(page, tmp_path):
    """A run continued under its name (issue 21, point 4): the runs table's duration is the
    wall time from the first start to the latest end, `active` the attempts' sum, `started`
    the first start; the run page the same. Before, both showed the latest attempt only."""
    import json
    import time

    import expr_tracker as et

    root = tmp_path / "runs"
    for _ in range(2):  # the same name and config: the second start continues the run
        et.init(project="demo", name="twice", dir=str(root), config={"lr": 0.1})
        et.log({"loss": 1.0})
        time.sleep(0.3)
        et.finish()
        time.sleep(1.0)  # between the attempts: wall time, not active time
    info = json.loads((root / "demo" / "twice" / "run.json").read_text())
    assert len(info["previous_attempts"]) == 1
    server = Server(root, tmp_path / "cache")
    try:
        page.goto(server.open())
        page.wait_for_selector("#runs-body tr")
        heads = page.eval_on_selector_all("#runs thead th", "hs => hs.map(h => h.textContent)")
        cells = page.eval_on_selector_all("#runs-body tr td", "ts => ts.map(t => t.textContent)")
        want = page.evaluate(
            "(i) => [fmtDuration(i.wall_duration_s), fmtDuration(i.active_duration_s),"
            " fmtTime(i.first_started_at), fmtDuration(i.duration_s)]",
            info,
        )
        wall, active, first, latest = want
        assert wall != active and active != latest
        row = dict(zip(heads, cells, strict=True))
        assert (row["duration"], row["active"], row["started"]) == (wall, active, first)
        page.goto(server.open("#/run?run=demo%2Ftwice"))
        page.wait_for_selector("#run-duration")
        assert page.inner_text("#run-duration") == f"duration: {wall}"
        assert page.inner_text("#run-active") == f"active: {active}"
        assert page.inner_text("#run-started") == f"started: {first}"
        assert not page.errors  # type: ignore[attr-defined]
    finally:
        server.close()


def test_a_late_media_script_breaks_nothing(page, ui_server):
    """``media.js`` arriving after ``app.js`` has fetched a run's data (a slow or loaded
    machine: CI saw it once) is no ``mediaSection is not defined``: the page waits for
    it, then renders the run (the fixture fails the test on any page error)."""
    held = []
    page.route("**/static/media.js", lambda route: held.append(route))
    page.goto(ui_server.open("#/run?run=demo%2Falpha"), wait_until="commit")
    # long enough for app.js, had it run, to have fetched the run and rendered it
    page.wait_for_timeout(1500)
    assert len(held) == 1
    held[0].continue_()
    assert len(wait_chart(page, HOSTILE)[0]["x"]) == 40
