"""The run page's JSON: metrics in first-logged order and their sections (pinned, the
user's, span timings), the config view against a baseline, and smoothing computed on the
raw series (``/api/run``, ``/api/series?smooth=``)."""

from __future__ import annotations

import json
import math

import pytest
from ui_support import HOSTILE, HOSTILE_IMG

from expr_tracker.history.smoothing import Smoothing, smooth
from expr_tracker.ui.server import create_app

TestClient = pytest.importorskip("starlette.testclient").TestClient


@pytest.fixture(scope="module")
def client(ui_runs, tmp_path_factory):
    app = create_app(ui_runs, cache_dir=tmp_path_factory.mktemp("uisec"))
    return TestClient(app, base_url="http://127.0.0.1")


def test_user_metrics_first_in_logged_order_then_spans(client):
    d = client.get("/api/run", params={"run": "demo/alpha"}).json()
    sections = {s["name"]: s["metrics"] for s in d["sections"]}
    assert list(sections) == ["metrics", "spans"]
    # the keys of et.log in the order given, not alphabetical
    assert sections["metrics"] == ["train/loss", "eval/acc", HOSTILE, HOSTILE_IMG, "epoch"]
    assert sections["spans"] and all(
        m.startswith(("time_ms/", "count/")) for m in sections["spans"]
    )
    d = client.get("/api/run", params={"run": "demo/alpha", "pin": "epoch,nope,eval/acc"}).json()
    assert d["sections"][0] == {"name": "pinned", "metrics": ["epoch", "eval/acc"]}
    assert d["sections"][1]["metrics"] == ["train/loss", HOSTILE, HOSTILE_IMG]


def test_config_view_against_a_baseline(client):
    d = client.get("/api/run", params={"run": "demo/alpha"}).json()
    v = d["config_view"]
    assert v["defaults_known"] is False and v["baseline_run"] is None  # not a Hydra job
    d = client.get("/api/run", params={"run": "demo/alpha", "baseline": "demo/beta"}).json()
    rows = {r["key"]: r for r in d["config_view"]["rows"]}
    assert rows["lr"]["differs"] and rows["lr"]["baseline"] == 0.2
    assert not rows["model.depth"]["differs"]
    assert rows["note"]["differs"] and not rows["note"]["in_baseline"]
    r = client.get("/api/run", params={"run": "demo/alpha", "baseline": "demo/nope"})
    assert r.status_code == 404
    r = client.get("/api/run", params={"run": "demo/alpha", "baseline": "demo/alpha"})
    assert r.status_code == 400 and "the run itself" in r.json()["error"]


def test_smoothing_is_computed_on_the_raw_series(client):
    q = {"run": "demo/beta", "metric": "train/loss", "width": 5, "smooth": "ema:0.8"}
    d = client.get("/api/series", params=q).json()
    assert d["smooth"] == "ema:0.8"
    (t,) = d["traces"]
    raw = [100.0 / (i + 1) for i in range(25)]
    want = smooth(raw, Smoothing("ema", 0.8))
    # every kept smoothed point is the smoothing of all 25 raw points, not of the 5 buckets
    assert t["total"] == 25 and len(t["smooth"]["x"]) < 25
    for step, y in zip(t["smooth"]["step"], t["smooth"]["y"], strict=True):
        assert y == pytest.approx(want[step])
    # a zoom cuts the range but does not restart the smoothing at its edge
    z = client.get("/api/series", params={**q, "lo": 20, "hi": 24, "width": 100}).json()
    (zt,) = z["traces"]
    assert zt["smooth"]["step"] == [20, 21, 22, 23, 24]
    assert zt["smooth"]["y"] == pytest.approx(want[20:])
    m = client.get("/api/series", params={**q, "smooth": "mean:3"}).json()["traces"][0]
    assert m["smooth"]["y"][-1] == pytest.approx(sum(raw[-3:]) / 3)


def test_smoothing_keeps_nan_and_inf_as_gaps(client):
    q = {"run": "demo/alpha", "metric": "train/loss", "smooth": "ema:0.5"}
    (t,) = client.get("/api/series", params=q).json()["traces"]
    ys = dict(zip(t["smooth"]["step"], t["smooth"]["y"], strict=True))
    assert ys[10] is None and ys[20] is None  # NaN, inf: gaps in the smoothed line too
    finite = [float(i) for i in range(40) if i not in (10, 20)]
    want = smooth(finite, Smoothing("ema", 0.5))
    assert ys[39] == pytest.approx(want[-1]) and not math.isnan(ys[11])


def test_bad_smoothing_and_relative_time(client):
    r = client.get(
        "/api/series", params={"run": "demo/beta", "metric": "train/loss", "smooth": "ema:2"}
    )
    assert r.status_code == 400 and "ema:W" in r.json()["error"]
    q = {"run": "demo/beta", "metric": "train/loss", "x": "relative"}
    (t,) = client.get("/api/series", params=q).json()["traces"]
    assert t["x"][0] == 0.0 and all(b >= a for a, b in zip(t["x"], t["x"][1:], strict=False))
    json.dumps(t)
