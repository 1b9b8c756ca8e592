"""The dashboard's grouped charts and sweep page in a real headless Chromium: seeds grouped
with their band (the line's values checked against the statistics), the sweep page's
parallel coordinates drawn with one line per run, its importance table and its scatters.
Screenshots go to ``test-artifacts/ui/`` (``groups.png``, ``sweep.png``; with
``ET_UPDATE_DOCS_SCREENSHOTS=1`` also to ``docs/img/``)."""

from __future__ import annotations

import math
import os
import random
import shutil

import pytest
from test_browser import ARTIFACTS, DOCS_IMG, browser, page  # noqa: F401
from ui_support import Server

import expr_tracker as et

pytestmark = pytest.mark.slow

#: the lr=0.1 group's mean at each step (seeds 0, 1, 2 log loss = 1 + seed - step / 100)
SEEDS = 3


def shot(pg, name: str, locator=None) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    (locator or pg).screenshot(path=str(path))
    if os.environ.get("ET_UPDATE_DOCS_SCREENSHOTS") == "1":
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, DOCS_IMG / f"ui-{name}.png")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("groups") / "runs"
    for lr in (0.1, 0.01):
        for seed in range(SEEDS):
            et.init(
                project="seeds",
                name=f"lr{lr}-s{seed}",
                dir=str(root),
                config={"lr": lr, "seed": seed, "model": {"depth": 4}},
            )
            for step in range(30 if seed != 2 else 20):  # seed 2 stops early
                loss = lr * 10 + seed - step / 100
                if lr == 0.1 and seed == 0 and step == 5:
                    loss = float("nan")
                et.log({"train/loss": loss}, step=step)
            et.summary["val/acc"] = 0.5 + lr + seed / 100
            et.finish()
    rnd = random.Random(0)
    for i in range(12):
        lr = 10 ** rnd.uniform(-4, -1)
        et.init(
            project="hp",
            name=f"t{i}",
            dir=str(root),
            group="sweep1",
            config={"lr": lr, "opt": rnd.choice(["adam", "<b>sgd</b>"]), "wd": rnd.random()},
        )
        et.log({"val/acc": 0.9 - 0.1 * (math.log10(lr) + 2.5) ** 2})
        et.finish()
    server = Server(root, tmp_path_factory.mktemp("groups-cache"))
    yield server
    server.close()


#: generous waits: plotly.js (3.5 MB) takes half a minute to arrive on a loaded 2-core box
WAIT_MS = 180_000


def _open(pg, url: str) -> None:
    pg.set_default_timeout(WAIT_MS)
    pg.goto(url, wait_until="commit")


def wait_chart(pg, metric: str) -> None:
    pg.wait_for_function(
        """(m) => { const d = document.querySelector(`div.chart[data-metric="${m}"]`);
                    return d && d.dataset.loaded; }""",
        arg=metric,
        timeout=WAIT_MS,
    )


def _group_traces(pg, metric: str):
    return pg.evaluate(
        """(m) => {
            const d = document.querySelector(`div.chart[data-metric="${m}"]`);
            return d.data.map((t) => ({role: t.meta.role, group: t.meta.group,
                x: Array.from(t.x, Number), y: Array.from(t.y), n: t.customdata ? Array.from(t.customdata) : null,
                fill: t.fill || null}));
        }""",
        metric,
    )


def test_grouped_chart_with_its_band(page, served):  # noqa: F811
    runs = "&".join(f"run=seeds%2Flr{lr}-s{s}" for lr in (0.1, 0.01) for s in range(SEEDS))
    _open(page, served.open(f"#/groups?{runs}&by=auto&band=minmax"))
    page.wait_for_selector("#groups tbody tr")
    rows = page.locator("#groups tbody tr").all_inner_texts()
    assert [r.split("\t")[0] for r in rows] == ["lr=0.1", "lr=0.01"]
    wait_chart(page, "train/loss")
    traces = _group_traces(page, "train/loss")
    centers = {t["group"]: t for t in traces if t["role"] == "center"}
    assert set(centers) == {"lr=0.1", "lr=0.01"}
    bands = [t for t in traces if t["role"] == "band"]
    assert len(bands) == 2 and all(t["fill"] == "tonexty" for t in bands)
    c = centers["lr=0.01"]
    assert c["x"] == list(range(30))  # every step some run logged, no other
    # steps 0..19: three seeds (0.1 + seed - step/100): mean 1.1 - step/100; 20..29: two
    assert c["n"][:20] == [3] * 20 and c["n"][20:] == [2] * 10
    assert c["y"][0] == pytest.approx(1.1) and c["y"][25] == pytest.approx(0.6 - 0.25)
    lo = next(t for t in traces if t["role"] == "band-lo" and t["group"] == "lr=0.01")
    hi = next(t for t in bands if t["group"] == "lr=0.01")
    assert lo["y"][0] == pytest.approx(0.1) and hi["y"][0] == pytest.approx(2.1)  # min-max
    nan_group = centers["lr=0.1"]
    assert nan_group["n"][5] == 2  # the NaN is left out, not averaged
    assert nan_group["y"][5] == pytest.approx((2.0 + 3.0) / 2 - 0.05)
    shot(page, "groups")
    # the controls: a band and the centre are asked again
    page.select_option("#group-band", "none")
    page.wait_for_function(
        """() => { const d = document.querySelector('div.chart[data-metric="train/loss"]');
                   return d && d.dataset.loaded && d.data.every((t) => t.meta.role === 'center'); }"""
    )
    page.fill("#group-by", "nope")
    page.press("#group-by", "Enter")
    page.wait_for_selector("p.error")
    assert "'nope' is no config key" in page.locator("p.error").inner_text()


def test_sweep_page(page, served):  # noqa: F811
    _open(page, served.open("#/sweep?group=sweep1&metric=val%2Facc"))
    page.wait_for_selector("#parcoords")
    lines = page.locator("#parcoords path[data-run]")
    assert lines.count() == 12  # one line per run
    runs = sorted(lines.nth(i).get_attribute("data-run") for i in range(12))
    assert runs == sorted(f"hp/t{i}" for i in range(12))
    # each line crosses every axis (3 keys + the metric): 4 points
    d = lines.first.get_attribute("d")
    assert d.count("M") == 1 and d.count("L") == 3
    axes = page.eval_on_selector_all(
        "#parcoords g.axis text[font-weight=bold]", "els => els.map(e => e.textContent)"
    )
    assert axes == ["lr (log)", "opt", "wd", "val/acc"]
    first = page.locator("#importance tbody tr").first.inner_text().split("\t")
    assert first[:2] == ["lr", "number"]
    page.wait_for_function(
        "() => document.querySelectorAll('#scatters div.chart[data-loaded]').length === 3"
    )
    # the category's tick labels are text, not markup
    assert page.locator("main b").count() == 0
    shot(page, "sweep")
    # another metric of the same runs: the seed runs are not in group sweep1
    assert page.locator("#sweep-count").inner_text().startswith("12 runs")
