"""``et ui``'s /api/overlay (Starlette's TestClient, runs written as JSONL files): per-pixel
minimum and maximum equal to a brute-force scan of the rows, NaN and inf kept, a zoomed
window, a run still being written (its summaries extend), the summaries kept in the run's
own query cache, and bad requests named."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from expr_tracker.history import pyramid as pm
from expr_tracker.query import pyramids
from expr_tracker.ui.server import create_app

TestClient = pytest.importorskip("starlette.testclient").TestClient

N = 700
RUNS = ["p/r0", "p/r1", "p/r2"]


def _values(k: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(k)
    ys = rng.standard_normal(n)
    ys[100 + k] = 40.0 + k  # a spike
    if k == 1:
        ys[333] = math.nan
        ys[501] = math.inf
        ys[502] = -math.inf
    return ys


def _lines(ys: np.ndarray, start: int) -> str:
    out = []
    for i, y in enumerate(ys.tolist(), start):
        v = (
            "NaN"
            if math.isnan(y)
            else "Infinity"
            if y == math.inf
            else "-Infinity"
            if y == -math.inf
            else repr(y)
        )
        out.append(f'{{"loss":{v},"acc":{i / 10},"_step":{i},"_time":{1e9 + i}}}\n')
    return "".join(out)


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    data = {}
    for k, rid in enumerate(RUNS):
        d = root / rid
        d.mkdir(parents=True)
        ys = _values(k, N - 100 * k)  # runs of different lengths
        (d / "metrics.jsonl").write_text(_lines(ys, 0))
        data[rid] = ys
    return root, data


def _truth(ys: np.ndarray, lo: float, hi: float, width: int) -> dict[int, tuple]:
    xs = np.arange(ys.size, dtype=np.float64)
    edges = lo + (hi - lo) * (np.arange(width + 1) / width)
    out = {}
    for p in range(width):
        m = (xs >= edges[p]) & ((xs < edges[p + 1]) if p < width - 1 else (xs <= hi))
        y = ys[m]
        if not y.size:
            continue
        f = y[np.isfinite(y)]
        out[p] = (
            float(f.min()) if f.size else None,
            float(f.max()) if f.size else None,
            int(np.isnan(y).sum()),
            int((y == math.inf).sum()),
            int((y == -math.inf).sum()),
        )
    return out


def _check(trace: dict, ys: np.ndarray, lo: float, hi: float, width: int) -> None:
    px = trace["pixels"]
    got = {
        i: (px["min"][k], px["max"][k], px["nan"][k], px["pinf"][k], px["ninf"][k])
        for k, i in enumerate(px["i"])
    }
    assert got == _truth(ys, lo, hi, width)


def test_overlay_is_exact_per_pixel_and_keeps_nan_and_inf(runs):
    root, data = runs
    client = TestClient(create_app(root), base_url="http://127.0.0.1")
    r = client.get("/api/overlay", params={"run": RUNS, "metric": "loss", "width": 50, "pixels": 1})
    assert r.status_code == 200, r.text
    d = r.json()
    assert (d["lo"], d["hi"], d["x"]) == (0.0, N - 1.0, "step")
    assert [x["run"] for x in d["runs"]] == RUNS
    for run in d["runs"]:
        (t,) = run["traces"]
        ys = data[run["run"]]
        _check(t, ys, 0.0, N - 1.0, 50)
        assert t["total"] == ys.size
        assert max(v for v in t["y"] if v is not None) == float(np.nanmax(ys[np.isfinite(ys)]))
    nf = {(p["step"], p["kind"]) for p in d["runs"][1]["traces"][0]["nonfinite"]}
    kinds = sorted(k for _, k in nf)
    assert kinds == ["-inf", "inf", "nan"]
    # the summaries live in each run's own query cache
    for rid in RUNS:
        files = os.listdir(root / rid / ".et-cache" / "metrics.jsonl" / "pyramids")
        assert sum(f.endswith("-meta.json") for f in files) == 1
    # a zoom: 3 pixels per step around the NaN of run 1; every row its own pixel
    r = client.get(
        "/api/overlay",
        params={"run": RUNS[1:], "metric": "loss", "width": 90, "lo": 320, "hi": 350, "pixels": 1},
    )
    d = r.json()
    t = d["runs"][0]["traces"][0]
    _check(t, data["p/r1"], 320.0, 350.0, 90)
    assert {(p["step"], p["kind"]) for p in t["nonfinite"]} == {(333, "nan")}
    assert t["total"] == 31 and t["x"][0] == 320 and t["x"][-1] == 350


def test_a_run_being_written_extends_its_summaries(runs):
    root, data = runs
    client = TestClient(create_app(root), base_url="http://127.0.0.1")
    q = {"run": RUNS[:1], "metric": "loss", "width": 40, "pixels": 1}
    assert client.get("/api/overlay", params=q).json()["hi"] == N - 1.0
    folder = root / RUNS[0] / ".et-cache" / "metrics.jsonl" / "pyramids"
    (meta,) = [f for f in os.listdir(folder) if f.endswith("-meta.json")]
    before = json.loads((folder / meta).read_text())
    xs_file = folder / f"{meta[: -len('meta.json')]}{before['gen']}-xs.f8"
    ino = xs_file.stat().st_ino
    more = np.linspace(-5, 5, 300)
    more[123] = -99.0
    with open(root / RUNS[0] / "metrics.jsonl", "a") as f:
        f.write(_lines(more, N))
        f.write('{"loss": 7.0, "_step": 10')  # a torn last line: not covered yet
    d = client.get("/api/overlay", params=q).json()
    ys = np.concatenate([data[RUNS[0]], more])
    assert d["hi"] == ys.size - 1.0
    _check(d["runs"][0]["traces"][0], ys, 0.0, ys.size - 1.0, 40)
    after = json.loads((folder / meta).read_text())
    assert after["n"] == ys.size and after["lines"] == before["lines"] + 300
    assert after["fingerprint"] != before["fingerprint"]
    # appended in place: the same generation and files, grown by the new rows only
    assert after["gen"] == before["gen"] and xs_file.stat().st_ino == ino
    assert xs_file.stat().st_size == ys.size * 8


def test_a_rewritten_run_is_summarised_again(runs):
    root, _data = runs
    client = TestClient(create_app(root), base_url="http://127.0.0.1")
    q = {"run": RUNS[:1], "metric": "loss", "width": 10, "pixels": 1}
    client.get("/api/overlay", params=q)
    ys = np.full(50, 3.0)
    (root / RUNS[0] / "metrics.jsonl").write_text(_lines(ys, 0))  # rewritten, shorter
    d = client.get("/api/overlay", params=q).json()
    t = d["runs"][0]["traces"][0]
    assert d["hi"] == 49.0 and set(t["pixels"]["max"]) == {3.0} and t["total"] == 50


@pytest.mark.parametrize(
    ("params", "status", "says"),
    [
        ({"metric": "loss"}, 400, "at least one run"),
        ({"run": ["p/r0", "p/r0"], "metric": "loss"}, 400, "twice"),
        ({"run": ["p/r0"], "metric": "loss", "width": 0}, 400, "width=0"),
        ({"run": ["p/r0"], "metric": "loss", "lo": 5, "hi": 1}, 400, "lo=5.0 > hi=1.0"),
        ({"run": ["p/r0"], "metric": "loss", "lo": 5000}, 400, "lo must be <= hi"),
        ({"run": ["p/r0"], "metric": "nope"}, 404, "'nope'"),
        ({"run": ["p/zz"], "metric": "loss"}, 404, "p/zz"),
    ],
)
def test_bad_requests_are_named(runs, params, status, says):
    root, _ = runs
    client = TestClient(create_app(root), base_url="http://127.0.0.1")
    r = client.get("/api/overlay", params=params)
    assert r.status_code == status and says in r.json()["error"], r.text


def _pyramids(root, rid):
    return root / rid / ".et-cache" / "metrics.jsonl" / "pyramids"


def _answer_within(client, params, seconds=20.0):
    """The answer, asked on a thread: a FIFO waited on would hang it."""
    import threading

    box = {}
    t = threading.Thread(
        target=lambda: box.setdefault("r", client.get("/api/overlay", params=params))
    )
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "the overlay blocked on a planted file"
    return box["r"]


@pytest.mark.parametrize("what", ["symlink", "fifo", "garbage", "meta-fifo"])
def test_planted_pyramid_files_are_never_followed_nor_waited_on(runs, tmp_path, what):
    root, data = runs
    client = TestClient(create_app(root), base_url="http://127.0.0.1")
    q = {"run": RUNS[:2], "metric": "loss", "width": 30, "pixels": 1}
    first = client.get("/api/overlay", params=q).json()
    folder = _pyramids(root, RUNS[1])
    (meta,) = [f for f in os.listdir(folder) if f.endswith("-meta.json")]
    prefix = meta[: -len("meta.json")]
    gen = prefix + json.loads((folder / meta).read_text())["gen"]
    secret = tmp_path / "secret.npy"
    np.save(secret, np.zeros(3))
    before = secret.read_bytes()
    target = folder / (prefix + "meta.json" if what == "meta-fifo" else gen + "-ys.f8")
    target.unlink()
    if what == "symlink":
        os.symlink(secret, target)
    elif what in ("fifo", "meta-fifo"):
        os.mkfifo(target)
    else:  # the right sizes, the wrong numbers: rows out of range
        lev = folder / (gen + "-level0.node")
        arr = np.fromfile(lev, dtype=pm.NODE)
        arr["imax"] = 10**9
        target.write_bytes((folder / (gen + "-xs.f8")).read_bytes())
        os.chmod(lev, 0o644)
        arr.tofile(lev)
    # as a fresh process (nothing kept open): the planted file is refused and rebuilt
    pyramids.forget()
    r = _answer_within(client, q)
    assert r.status_code == 200, r.text
    d = r.json()
    assert d == first
    _check(d["runs"][1]["traces"][0], data[RUNS[1]], 0.0, N - 1.0, 30)
    assert secret.read_bytes() == before  # never written through
    if what == "meta-fifo":
        assert target.is_file() and not target.is_symlink()  # replaced by its own file
    else:  # rebuilt as a new generation; the old one, planted file included, removed
        assert not os.path.lexists(target)
        assert any(f.endswith("-ys.f8") for f in os.listdir(folder))


def test_a_linked_pyramids_folder_is_not_used(runs, tmp_path):
    root, data = runs
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cache = root / RUNS[0] / ".et-cache" / "metrics.jsonl"
    client = TestClient(create_app(root), base_url="http://127.0.0.1")
    client.get("/api/series", params={"run": RUNS[0], "metric": "loss"})  # makes the cache
    assert not (cache / "pyramids").exists()
    os.symlink(elsewhere, cache / "pyramids")
    r = client.get(
        "/api/overlay", params={"run": RUNS[:1], "metric": "loss", "width": 20, "pixels": 1}
    )
    assert r.status_code == 200
    _check(r.json()["runs"][0]["traces"][0], data[RUNS[0]], 0.0, N - 1.0, 20)
    assert os.listdir(elsewhere) == []  # answered in memory, nothing written there


def test_one_unreadable_run_is_named_and_the_others_drawn(runs):
    """A FIFO named like a run's file: that run gets a problem, not the whole overlay a 422."""
    root, data = runs
    fifo = root / "p" / "fifo"
    fifo.mkdir(parents=True)
    os.mkfifo(fifo / "metrics.jsonl")
    client = TestClient(create_app(root), base_url="http://127.0.0.1")
    asked = [*RUNS, "p/fifo"]
    r = client.get("/api/overlay", params={"run": asked, "metric": "loss", "width": 20})
    assert r.status_code == 200, r.text
    by = {x["run"]: x for x in r.json()["runs"]}
    assert all(len(by[rid]["traces"]) == 1 and "problem" not in by[rid] for rid in RUNS)
    assert by["p/fifo"]["traces"] == [] and "FIFO" in by["p/fifo"]["problem"]
    alone = client.get("/api/overlay", params={"run": "p/fifo", "metric": "loss", "width": 20})
    assert alone.status_code == 422 and "FIFO" in alone.text
