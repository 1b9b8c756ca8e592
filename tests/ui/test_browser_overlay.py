"""The compare page's overlay of many runs in a real headless Chromium: with x the step and
no smoothing it draws every run from ``/api/overlay`` (each run's line reaching its true
per-pixel minimum and maximum, the spikes and NaN/inf marked); with smoothing on it goes back
to each run's ``/api/series`` (smoothing is computed on the raw series). Screenshot
``test-artifacts/ui/compare-overlay.png`` (with ``ET_UPDATE_DOCS_SCREENSHOTS=1`` also
``docs/img/ui-compare-overlay.png``)."""

from __future__ import annotations

import math

import pytest
from test_browser import browser, page  # noqa: F401
from test_browser_groups import WAIT_MS, _open, shot, wait_chart
from ui_support import Server

import expr_tracker as et

pytestmark = pytest.mark.slow  # a real browser and server (seconds)

RUNS = 6
STEPS = 3000


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("overlay") / "runs"
    for k in range(RUNS):
        et.init(project="ov", name=f"r{k}", dir=str(root), config={"seed": k})
        for step in range(STEPS):
            y = 2.0 / (1 + step / 300) + 0.05 * math.sin(step * (k + 1))
            if step == 1000 + 7 * k:
                y = 10.0 + k  # one spike per run, one step wide
            if k == 2 and step == 2000:
                y = float("nan")
            et.log({"loss": y}, step=step)
        et.finish()
    server = Server(root, tmp_path_factory.mktemp("overlay-cache"))
    yield server
    server.close()


def _raw_traces(pg):
    return pg.evaluate(
        """() => {
            const d = document.querySelector('div.chart[data-metric="loss"]');
            return {source: d.dataset.source, traces: d.data.map((t) => ({role: t.meta.role,
                name: t.name, y: Array.from(t.y), n: t.x.length}))};
        }"""
    )


def test_compare_draws_the_overlay_of_many_runs(page, served):  # noqa: F811
    runs = "&".join(f"run=ov%2Fr{k}" for k in range(RUNS))
    _open(page, served.open(f"#/compare?{runs}"))
    wait_chart(page, "loss")
    d = _raw_traces(page)
    assert d["source"] == "overlay"
    raw = [t for t in d["traces"] if t["role"] == "raw"]
    assert sorted(t["name"] for t in raw) == [f"ov/r{k}" for k in range(RUNS)]
    for t in raw:  # every run's spike is drawn, whatever the chart's width
        k = int(t["name"].rsplit("r", 1)[1])
        assert max(v for v in t["y"] if v is not None) == pytest.approx(10.0 + k)
    (marks,) = [t for t in d["traces"] if t["role"] == "nonfinite"]
    assert marks["n"] == 1
    shot(page, "compare-overlay", page.locator('div.chart[data-metric="loss"]'))
    # smoothing on: each run's raw series is smoothed by the server, as before
    page.select_option("#smooth-kind", "ema")
    page.wait_for_function(
        """() => { const d = document.querySelector('div.chart[data-metric="loss"]');
                   return d && d.dataset.source === 'series'
                          && d.data.some((t) => t.meta.role === 'smooth'); }""",
        timeout=WAIT_MS,
    )
    assert not page.errors  # type: ignore[attr-defined]
