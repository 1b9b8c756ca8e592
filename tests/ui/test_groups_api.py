"""``et ui``'s /api/groups and /api/sweep over runs written by et.log (Starlette's
TestClient): the groups and their bands, errors naming the bad parameter, and no SQL from a
request."""

from __future__ import annotations

import pytest

import expr_tracker as et
from expr_tracker.ui.server import create_app

TestClient = pytest.importorskip("starlette.testclient").TestClient

pytestmark = pytest.mark.slow  # writes six runs and builds their caches (seconds)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    root = tmp_path_factory.mktemp("uigroups") / "runs"
    for lr in (0.1, 0.01):
        for seed in range(3):
            et.init(
                project="s",
                name=f"lr{lr}-s{seed}",
                dir=str(root),
                config={"lr": lr, "seed": seed},
                group="g" if seed < 2 else None,
            )
            for step in range(10):
                et.log({"loss": lr * 10 + seed + step, "acc": 0.5 + lr + seed / 10}, step=step)
            et.finish()
    app = create_app(root, cache_dir=tmp_path_factory.mktemp("uigroups-cache"))
    return TestClient(app, base_url="http://127.0.0.1")


RUNS = [f"s/lr{lr}-s{s}" for lr in (0.1, 0.01) for s in range(3)]


def test_groups_and_one_metric_band(client):
    r = client.get("/api/groups", params={"run": RUNS, "by": "auto"})
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["group_keys"] == ["lr"]
    assert [g["label"] for g in d["groups"]] == ["lr=0.1", "lr=0.01"]
    assert d["groups"][1]["runs"] == RUNS[3:]
    assert d["metrics"] == ["acc", "loss"]
    r = client.get("/api/groups", params={"run": RUNS, "by": "lr", "metric": "loss", "band": "sem"})
    d = r.json()
    s = d["series"][0]
    assert s["label"] == "lr=0.1" and s["runs"] == 3 and s["x"] == list(range(10))
    assert s["center"][0] == pytest.approx(2.0) and s["n"] == [3] * 10
    # sem of (1, 2, 3): 1 / sqrt(3)
    assert s["hi"][0] - s["center"][0] == pytest.approx(1 / 3**0.5)


@pytest.mark.parametrize(
    ("params", "status", "says"),
    [
        ({"by": "auto", "band": "iqr"}, 400, "band='iqr' is not valid"),
        ({"by": "auto", "agg": "max"}, 400, "agg='max' is not valid"),
        ({"by": "depth"}, 400, "'depth' is no config key"),
        ({"by": "auto", "metric": "nope"}, 404, "none of the runs has a metric 'nope'"),
        ({"by": "auto", "width": "0"}, 400, "width=0"),
    ],
)
def test_groups_errors_name_the_parameter(client, params, status, says):
    r = client.get("/api/groups", params={"run": RUNS, **params})
    assert r.status_code == status and says in r.json()["error"], r.text


def test_groups_unknown_run_and_no_runs(client):
    r = client.get("/api/groups", params={"run": ["s/nope", RUNS[0]]})
    assert r.status_code == 404
    r = client.get("/api/groups")
    assert r.status_code == 400 and "give the runs" in r.json()["error"]


def test_sweep_endpoint_and_no_sql_from_a_request(client):
    r = client.get("/api/sweep", params={"metric": "acc"})
    assert r.status_code == 200, r.text
    d = r.json()
    assert len(d["runs"]) == 6 and d["metric"] == "acc"
    assert {k["key"] for k in d["keys"]} == {"lr", "seed"}
    assert "acc" in d["metrics"] and "loss" in d["metrics"]
    # a where= is not a parameter of the page: ignored, never run as SQL
    r = client.get("/api/sweep", params={"metric": "acc", "where": "1 = 0"})
    assert len(r.json()["runs"]) == 6
    r = client.get("/api/sweep", params={"metric": "acc", "group": "g"})
    assert len(r.json()["runs"]) == 4
    r = client.get("/api/sweep", params={"metric": "acc", "run": RUNS[:2]})
    assert [x["run"] for x in r.json()["runs"]] == RUNS[:2]
    r = client.get("/api/sweep", params={"metric": "ac"})
    assert r.status_code == 400 and "did you mean 'acc'" in r.json()["error"]


def test_sweep_leaves_out_a_run_linked_from_outside(tmp_path):
    root = tmp_path / "served"
    outside = tmp_path / "outside"
    for where, name in ((root, "in"), (outside, "secret")):
        et.init(project="p", name=name, dir=str(where), config={"lr": len(name)})
        et.log({"acc": 0.5})
        et.finish()
    (root / "linked").symlink_to(outside / "p" / "secret")
    app = create_app(root, cache_dir=tmp_path / "cache")
    client = TestClient(app, base_url="http://127.0.0.1")
    r = client.get("/api/sweep", params={"metric": "acc"})
    assert r.status_code == 200, r.text
    assert [x["run"] for x in r.json()["runs"]] == ["p/in"]
