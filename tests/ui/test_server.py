"""``et ui``'s endpoints: Starlette's TestClient over runs written by ``et.log`` in
subprocesses, and one real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
from ui_support import HOSTILE, HOSTILE_IMG, HOSTILE_RUN, env, write_rank_runs

from expr_tracker.cli.ui import _loopback
from expr_tracker.ui import server
from expr_tracker.ui.server import create_app

TestClient = pytest.importorskip("starlette.testclient").TestClient


def local(app, **kw):
    """A client of ``app`` as a browser on this machine talks to it (``Host: 127.0.0.1``)."""
    return TestClient(app, base_url="http://127.0.0.1", **kw)


LONG = textwrap.dedent(
    """
    import sys, expr_tracker as et
    et.init(project="p", name="long", dir=sys.argv[1])
    et.define_metric("loss", step_metric="x/half")
    for i in range(5000):
        v = 1.0
        if i == 1234: v = 1000.0       # a spike
        if i == 4321: v = -1000.0      # a dip
        if i == 777: v = float("nan")
        if i == 2500: v = float("-inf")
        et.log({"loss": v, "x/half": i / 2})
    et.finish()
    """
)


@pytest.fixture(scope="module")
def long_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("uilong") / "runs"
    subprocess.run([sys.executable, "-c", LONG, str(root)], check=True, env=env(), timeout=120)
    return root


@pytest.fixture(scope="module")
def client(ui_runs, tmp_path_factory):
    return local(create_app(ui_runs, cache_dir=tmp_path_factory.mktemp("uic")))


def test_runs_endpoint(client):
    r = client.get("/api/runs")
    assert r.status_code == 200
    runs = {x["run"]: x for x in r.json()["runs"]}
    assert set(runs) == {"demo/alpha", "demo/beta", "demo/gamma"}
    assert runs["demo/gamma"]["status"] == "crashed" and runs["demo/gamma"]["steps"] == 5
    assert runs["demo/beta"]["status"] == "finished"
    a = runs["demo/alpha"]
    assert a["status"] == "finished" and a["steps"] == 40 and a["group"] == "g1"
    assert a["tags"] == ["base", HOSTILE_IMG] and a["duration_s"] >= 0


def test_run_endpoint(client):
    d = client.get("/api/run", params={"run": "demo/alpha"}).json()
    assert set(d["metrics"]) >= {"train/loss", "eval/acc", HOSTILE, HOSTILE_IMG, "time_ms/fwd"}
    assert ["model.depth", 4] in d["config"] and ["note", HOSTILE] in d["config"]
    events = [(a["event"], a["step"]) for a in d["alerts"]]
    assert events == [("firing", 20), ("resolved", 21), ("firing", 31)]
    assert all(a["message"] for a in d["alerts"] if a["event"] != "resolved")


def test_series_all_points_and_nonfinite(client):
    r = client.get("/api/series", params={"run": "demo/alpha", "metric": "train/loss"})
    (t,) = r.json()["traces"]
    assert t["total"] == 40 and t["x"] == [float(i) for i in range(40)]
    assert t["y"][10] is None and t["y"][20] is None and t["y"][39] == 39.0
    assert t["nonfinite"] == [
        {"x": 10.0, "step": 10, "kind": "nan"},
        {"x": 20.0, "step": 20, "kind": "inf"},
    ]
    json.loads(r.text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


def test_series_downsampled_keeps_spikes(long_run, tmp_path):
    c = local(create_app(long_run, cache_dir=tmp_path))
    (t,) = c.get("/api/series", params={"run": "p/long", "metric": "loss", "width": 50}).json()[
        "traces"
    ]
    assert t["total"] == 5000
    assert len(t["x"]) <= 4 * 50 + 2
    ys = [y for y in t["y"] if y is not None]
    assert max(ys) == 1000.0 and min(ys) == -1000.0  # the spike and the dip survive
    assert {(p["step"], p["kind"]) for p in t["nonfinite"]} == {(777, "nan"), (2500, "-inf")}
    assert t["x"][0] == 0.0 and t["x"][-1] == 4999.0
    # zoomed: the range at the chart's resolution
    (z,) = c.get(
        "/api/series",
        params={"run": "p/long", "metric": "loss", "width": 50, "lo": 1200, "hi": 1260},
    ).json()["traces"]
    assert z["total"] == 61 and z["x"][0] == 1200.0 and z["x"][-1] == 1260.0
    assert 1000.0 in z["y"]
    # a step metric as the x axis: x/half
    (h,) = c.get(
        "/api/series", params={"run": "p/long", "metric": "loss", "x": "x/half", "width": 4000}
    ).json()["traces"]
    assert h["x"][h["step"].index(1234)] == 617.0
    # wall time as the x axis: epoch seconds
    (w,) = c.get(
        "/api/series", params={"run": "p/long", "metric": "loss", "x": "time", "width": 10}
    ).json()["traces"]
    assert all(x > 1e9 for x in w["x"])


def test_points_after_a_step(client):
    r = client.get("/api/points", params={"run": "demo/alpha", "after": 36}).json()
    assert r["max_step"] == 39 and r["reset"] is False
    (t,) = r["metrics"]["train/loss"]
    assert t["step"] == [37, 38, 39]
    r = client.get("/api/points", params={"run": "demo/alpha", "after": 39}).json()
    assert r["metrics"] == {} and r["max_step"] == 39


def test_spans_and_trace(client):
    rows = client.get("/api/spans", params={"run": "demo/alpha"}).json()["rows"]
    (fwd,) = [r for r in rows if r["name"] == "fwd"]
    assert fwd["count"] == 40 and fwd["mean_ms"] >= 0
    part = client.get("/api/spans", params={"run": "demo/alpha", "start": 0, "stop": 10}).json()
    assert [r["count"] for r in part["rows"] if r["name"] == "fwd"] == [10]
    r = client.get("/api/trace", params={"run": "demo/alpha", "start": 0, "stop": 5})
    assert r.status_code == 200 and "attachment" in r.headers["content-disposition"]
    events = [e for e in r.json()["traceEvents"] if e.get("ph") == "X"]
    assert len(events) == 5
    assert client.get("/api/trace", params={"run": "demo/beta"}).status_code == 404


def test_compare_endpoint(client):
    d = client.get("/api/compare", params=[("run", "demo/alpha"), ("run", "demo/beta")]).json()
    by = {r["key"]: r for r in d["config"]}
    assert by["lr"]["equal"] is False and by["lr"]["values"] == [0.1, 0.2]
    assert by["model.depth"]["equal"] is True
    assert "train/loss" in d["metrics"]
    assert client.get("/api/compare", params={"run": "demo/alpha"}).status_code == 400


@pytest.mark.parametrize(
    "run",
    ["../..", "/etc", "..", "demo/../demo/alpha", "demo/alpha/../../..", "", "demo%2Falpha"],
)
def test_run_ids_are_looked_up_never_joined(client, ui_runs, run):
    for path in ("run", "series", "points", "spans", "trace"):
        r = client.get(f"/api/{path}", params={"run": run, "metric": "train/loss"})
        assert r.status_code in (400, 404), (path, run, r.status_code)
    # an absolute path of a real run is not a run id either
    r = client.get("/api/run", params={"run": str(ui_runs / "demo" / "alpha")})
    assert r.status_code == 404


def test_symlink_out_of_dir_is_not_served(tmp_path, ui_runs):
    root = tmp_path / "served"
    root.mkdir()
    os.symlink(ui_runs / "demo", root / "outside")
    c = local(create_app(root, cache_dir=tmp_path / "c"))
    assert c.get("/api/runs").json()["runs"] == []
    assert c.get("/api/run", params={"run": "demo/alpha"}).status_code == 404


def test_bad_parameters(client):
    bad = [
        {"run": "demo/alpha", "metric": "train/loss", "width": "wide"},
        {"run": "demo/alpha", "metric": "train/loss", "width": 0},
        {"run": "demo/alpha", "metric": "train/loss", "lo": "nan"},
        {"run": "demo/alpha", "metric": "train/loss", "lo": 5, "hi": 1},
        {"run": "demo/alpha"},
    ]
    for params in bad:
        r = client.get("/api/series", params=params)
        assert r.status_code == 400 and r.json()["error"], params
    r = client.get("/api/series", params={"run": "demo/alpha", "metric": "nope"})
    assert r.status_code == 404 and "nope" in r.json()["error"]


def test_only_get_and_safe_headers(client):
    for path in ("/", "/api/runs", "/api/run"):
        assert client.post(path).status_code == 405
        assert client.delete(path).status_code == 405
    r = client.get("/")
    assert "default-src 'self'" in r.headers["content-security-policy"]
    assert r.headers["x-content-type-options"] == "nosniff"
    assert client.get("/static/../server.py").status_code == 404
    assert client.get("/static/nope.js").status_code == 404
    js = client.get("/static/plotly.min.js")
    assert js.status_code == 200 and b"plotly" in js.content[:2000].lower()
    js = client.get("/static/app.js").text
    assert "innerHTML" not in js and "insertAdjacentHTML" not in js and "outerHTML" not in js


def test_no_writes_but_the_cache(tmp_path, long_run):
    def tree():
        return {
            p: (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(long_run.rglob("*"))
            if p.is_file()
        }

    before = tree()
    c = local(create_app(long_run, cache_dir=tmp_path / "cache"))
    for path, params in [
        ("runs", {}),
        ("run", {"run": "p/long"}),
        ("series", {"run": "p/long", "metric": "loss"}),
        ("points", {"run": "p/long", "after": 10}),
        ("spans", {"run": "p/long"}),
    ]:
        assert c.get(f"/api/{path}", params=params).status_code == 200
    assert tree() == before
    assert any((tmp_path / "cache").rglob("*.parquet"))


def test_missing_extra_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    with pytest.raises(ImportError, match=r"expr-tracker\[ui\]"):
        server.import_web()
    monkeypatch.delitem(sys.modules, "uvicorn")
    monkeypatch.setitem(sys.modules, "duckdb", None)
    with pytest.raises(ImportError, match=r"expr-tracker\[ui\]"):
        server.import_web()
    monkeypatch.setitem(sys.modules, "plotly", None)
    with pytest.raises(ImportError, match=r"expr-tracker\[ui\]"):
        server.plotly_js()


def test_cli_checks(tmp_path):
    assert _loopback("127.0.0.1") and _loopback("::1") and _loopback("localhost")
    assert (
        not _loopback("0.0.0.0") and not _loopback("192.168.1.5") and not _loopback("example.org")
    )
    p = subprocess.run(
        [sys.executable, "-m", "expr_tracker.cli.main", "ui", str(tmp_path / "nope")],
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "nope" in p.stderr and "not a folder" in p.stderr
    p = subprocess.run(
        [sys.executable, "-m", "expr_tracker.cli.main", "ui", str(tmp_path), "--port", "0"],
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "--port 0 is not valid: 1..65535" in p.stderr


def test_real_uvicorn_on_loopback(ui_server):
    import httpx

    r = httpx.get(ui_server.url + "/api/runs", timeout=30, headers=ui_server.auth)
    assert r.status_code == 200 and len(r.json()["runs"]) == 3
    r = httpx.get(
        ui_server.url + "/api/series",
        params={"run": "demo/beta", "metric": "train/loss"},
        headers=ui_server.auth,
    )
    (t,) = r.json()["traces"]
    assert len(t["x"]) == 25 and math.isclose(t["y"][0], 100.0)
    assert "server" not in r.headers


def test_step_metric_is_an_x_option(long_run, tmp_path):
    c = local(create_app(long_run, cache_dir=tmp_path))
    d = c.get("/api/run", params={"run": "p/long"}).json()
    assert d["step_metrics"] == {"loss": "x/half"} and d["x_options"] == ["x/half"]
    assert d["steps"] == 5000 and d["status"] == "finished"


def test_sql_m4_matches_m4(long_run, tmp_path):
    """Above ``sql_min`` points the same M4 runs in DuckDB: the points kept are m4's (a
    series without ties), the spike, dip and non-finite points likewise."""
    from expr_tracker.ui import series
    from expr_tracker.ui.catalog import Catalog

    cat = Catalog(long_run, tmp_path)
    for width, lo, hi in [
        (50, None, None),
        (7, 100.0, 4000.0),
        (4000, None, None),
        (1, None, None),
    ]:
        kw = {"width": width, "lo": lo, "hi": hi}
        py = series.series(cat, "p/long", "x/half", **kw)["traces"][0]
        sql = series.series(cat, "p/long", "x/half", sql_min=0, **kw)["traces"][0]
        assert sql == py, (width, lo, hi)
        py = series.series(cat, "p/long", "loss", **kw)["traces"][0]
        sql = series.series(cat, "p/long", "loss", sql_min=0, **kw)["traces"][0]
        assert sql["nonfinite"] == py["nonfinite"] and sql["total"] == py["total"]
        ys = [y for y in sql["y"] if y is not None]
        assert (min(ys), max(ys)) == (
            min(y for y in py["y"] if y is not None),
            max(y for y in py["y"] if y is not None),
        )
        assert sql["step"][0] == py["step"][0] and sql["step"][-1] == py["step"][-1]


def test_a_run_deleted_while_served(tmp_path, ui_runs):
    import shutil

    root = tmp_path / "runs"
    shutil.copytree(ui_runs, root, ignore=shutil.ignore_patterns(".et-cache"))
    c = local(create_app(root, cache_dir=tmp_path / "cache"))
    assert c.get("/api/run", params={"run": "demo/beta"}).status_code == 200
    shutil.rmtree(root / "demo" / "beta")
    for path in ("run", "series", "points"):
        r = c.get(f"/api/{path}", params={"run": "demo/beta", "metric": "train/loss"})
        assert r.status_code == 404, (path, r.text)
    r = c.get("/api/runs")
    assert r.status_code == 200
    assert "demo/beta" not in [x["run"] for x in r.json()["runs"]]


def test_hostile_run_name_and_rank_shards(tmp_path):
    root = tmp_path / "runs"
    write_rank_runs(root)
    c = local(create_app(root, cache_dir=tmp_path / "cache"))
    (run,) = c.get("/api/runs").json()["runs"]
    assert run["run"] == f"p;'q/{HOSTILE_RUN}" and run["producers"] == ["main", "main/rank1"]
    assert run["steps"] == 30
    traces = c.get("/api/series", params={"run": run["run"], "metric": "loss"}).json()["traces"]
    assert [(t["producer"], t["y"][0], len(t["x"])) for t in traces] == [
        ("main", 0.0, 30),
        ("main/rank1", 100.0, 30),
    ]
    pts = c.get("/api/points", params={"run": run["run"], "after": 27}).json()["metrics"]["loss"]
    assert [(t["producer"], t["step"]) for t in pts] == [
        ("main", [28, 29]),
        ("main/rank1", [28, 29]),
    ]


def test_web_stack_imported_only_when_serving():
    code = (
        "import sys, expr_tracker, expr_tracker.ui.runs, expr_tracker.ui.series, expr_tracker.ui.server\n"
        "from expr_tracker.cli.main import build_parser\n"
        "build_parser().parse_args(['ui', '--help'])\n"
    )
    check = (
        "import sys, runpy\n"
        "try:\n"
        f"    exec({code!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = [m for m in ('starlette', 'uvicorn', 'plotly', 'duckdb', 'pyarrow') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", check], env=env(), capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "[]"


def test_a_linked_file_out_of_dir_is_not_read(tmp_path, ui_runs):
    """Discovery follows links (as ``et runs``); the dashboard reads only what resolves
    inside its folder: a ``metrics.jsonl`` linking out of it is left out, a run folder
    linked from inside the folder to inside it is served."""
    import shutil

    root = tmp_path / "served"
    run = root / "demo" / "linked"
    run.mkdir(parents=True)
    os.symlink(ui_runs / "demo" / "beta" / "metrics.jsonl", run / "metrics.jsonl")
    inside = root / "demo" / "copy"
    shutil.copytree(ui_runs / "demo" / "beta", inside, ignore=shutil.ignore_patterns(".et-cache"))
    os.symlink(inside, root / "alias")
    c = local(create_app(root, cache_dir=tmp_path / "c"))
    runs = {r["run"]: r for r in c.get("/api/runs").json()["runs"]}
    assert runs.get("demo/linked", {}).get("steps") is None  # its linked file is not read
    r = c.get("/api/series", params={"run": "demo/linked", "metric": "train/loss"})
    assert r.status_code == 404
    served = [r for r in runs.values() if r["steps"] == 25]
    assert len(served) == 1  # the copy, reached twice (itself and the alias), served once


def test_points_ask_each_producer_from_its_own_step(tmp_path):
    # a live page of a torchrun run: rank 1 lags rank 0; asking every producer from the
    # run's highest step lost rank 1's rows in between (and a stopped stream's forever)
    root = tmp_path / "runs"
    write_rank_runs(root)
    c = local(create_app(root, cache_dir=tmp_path / "cache"))
    (run,) = c.get("/api/runs").json()["runs"]
    assert run["producer_steps"] == {"main": 29, "main/rank1": 29}
    r = c.get(
        "/api/points",
        params={"run": run["run"], "after": -1, "since": ["main:29", "main/rank1:26"]},
    ).json()
    assert [(t["producer"], t["step"]) for t in r["metrics"]["loss"]] == [
        ("main/rank1", [27, 28, 29])
    ]
    assert r["max_steps"] == {"main": 29, "main/rank1": 29} and r["max_step"] == 29
    for bad in ("main", "main:x", ":3"):
        r = c.get("/api/points", params={"run": run["run"], "since": bad})
        assert r.status_code == 400 and "since" in r.json()["error"], bad


def test_points_reset_tells_where_each_producer_ends(long_run, tmp_path, monkeypatch):
    # more new rows than a poll carries: the page reloads its charts; the answer must say
    # where the run is, or the next poll asks from the same step and resets again, forever
    from expr_tracker.ui import series

    monkeypatch.setattr(series, "MAX_NEW_ROWS", 100)
    c = local(create_app(long_run, cache_dir=tmp_path / "c"))
    r = c.get("/api/points", params={"run": "p/long", "after": 10}).json()
    assert r["reset"] is True and r["metrics"] == {}
    assert r["max_steps"] == {"main": 4999} and r["max_step"] == 4999
    r = c.get("/api/points", params={"run": "p/long", "since": "main:4999"}).json()
    assert r["reset"] is False and r["metrics"] == {}


NAN_STEP_METRIC = textwrap.dedent(
    """
    import sys, expr_tracker as et
    et.init(project="p", name="nanx", dir=sys.argv[1])
    et.define_metric("val/*", step_metric="epoch")
    for i in range(30):
        ep = float("nan") if i == 10 else (float("inf") if i == 20 else i / 10)
        et.log({"epoch": ep, "val/acc": i})
    et.finish()
    """
)


def test_points_leave_out_a_non_finite_x(tmp_path):
    # /api/series leaves out rows whose step metric is NaN/inf; the live poll sent them as
    # x "NaN"/"Infinity" strings that the page appended to the chart
    root = tmp_path / "runs"
    subprocess.run([sys.executable, "-c", NAN_STEP_METRIC, str(root)], check=True, env=env())
    c = local(create_app(root, cache_dir=tmp_path / "c"))
    s = c.get("/api/series", params={"run": "p/nanx", "metric": "val/acc", "x": "epoch"}).json()
    r = c.get("/api/points", params={"run": "p/nanx", "x": "epoch"}).json()
    (t,) = r["metrics"]["val/acc"]
    assert all(isinstance(v, float) for v in t["x"])
    assert t["step"] == s["traces"][0]["step"] and 10 not in t["step"] and 20 not in t["step"]


def test_cli_port_in_use_is_one_clear_line(tmp_path):
    # uvicorn's "ERROR: [Errno 98] ..." came after "serving at ...", exit status 3
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        p = subprocess.run(
            [sys.executable, "-m", "expr_tracker.cli.main", "ui", str(tmp_path)]
            + ["--port", str(port)],
            env=env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert p.returncode == 1 and "serving" not in p.stderr, p.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in p.stderr and "in use" in p.stderr
    assert "Traceback" not in p.stderr and "--port" in p.stderr
