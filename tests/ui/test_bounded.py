"""Bounded cost for whoever reaches the port (docs/ui.md "Security"): ``/api/trace`` is
streamed as ``et trace`` writes it (never built whole in memory; the peak is measured by
``benchmarks/bench_ui_trace.py``), and at most ``heavy_limit`` traces or compares are
served at once, others answered 503 with ``Retry-After``."""

from __future__ import annotations

import json
import threading

import pytest

from expr_tracker.trace import write_trace
from expr_tracker.ui import spans
from expr_tracker.ui.catalog import Catalog
from expr_tracker.ui.server import create_app

TestClient = pytest.importorskip("starlette.testclient").TestClient


def local(app):
    return TestClient(app, base_url="http://127.0.0.1")


def test_trace_is_streamed_as_et_trace_writes_it(ui_server, ui_runs, tmp_path):
    import httpx

    params = {"run": "demo/alpha", "start": 0, "stop": 30}
    with httpx.stream(
        "GET", ui_server.url + "/api/trace", params=params, headers=ui_server.auth, timeout=60
    ) as r:
        assert r.status_code == 200
        # streamed: no length known in advance, sent in chunks
        assert "content-length" not in r.headers and r.headers["transfer-encoding"] == "chunked"
        assert "attachment" in r.headers["content-disposition"]
        body = r.read()
    write_trace(ui_runs / "demo" / "alpha", tmp_path / "t.json", step_range=(0, 30))
    assert json.loads(body) == json.loads((tmp_path / "t.json").read_bytes())
    assert sum(e["ph"] == "X" for e in json.loads(body)["traceEvents"]) == 30


def test_trace_chunks_are_bounded(ui_runs, tmp_path):
    cat = Catalog(ui_runs, tmp_path)
    from expr_tracker.trace import iter_trace

    chunks = list(iter_trace(ui_runs / "demo" / "alpha", chunk_bytes=512, root=cat.root_real))
    assert len(chunks) > 3 and all(len(c) < 512 + 4096 for c in chunks)
    assert json.loads(b"".join(chunks))["displayTimeUnit"] == "ms"


def test_heavy_requests_are_bounded(ui_runs, tmp_path, monkeypatch):
    gate = threading.Event()
    entered = threading.Event()
    real = spans.trace_chunks

    def held(*a, **kw):
        it = real(*a, **kw)

        def gen():
            yield next(it)
            entered.set()
            gate.wait(60)  # the first trace is still being sent
            yield from it

        return gen()

    monkeypatch.setattr(spans, "trace_chunks", held)
    app = create_app(ui_runs, cache_dir=tmp_path, heavy_limit=1)
    first: list = []
    t = threading.Thread(
        target=lambda: first.append(local(app).get("/api/trace", params={"run": "demo/alpha"}))
    )
    t.start()
    try:
        assert entered.wait(60)
        c = local(app)
        for path, params in [
            ("trace", {"run": "demo/alpha"}),
            ("compare", [("run", "demo/alpha"), ("run", "demo/beta")]),
        ]:
            r = c.get(f"/api/{path}", params=params)
            assert r.status_code == 503 and r.headers["retry-after"] == "5", path
            assert "busy" in r.json()["error"]
        assert c.get("/api/runs").status_code == 200  # the rest is not held up
    finally:
        gate.set()
        t.join(60)
    assert first[0].status_code == 200 and json.loads(first[0].content)["traceEvents"]
    # the slot is given back when the stream ends, and after an error
    c = local(app)
    assert c.get("/api/trace", params={"run": "demo/beta"}).status_code == 404
    assert c.get("/api/compare", params=[("run", "demo/alpha"), ("run", "nope")]).status_code == 404
    r = c.get("/api/compare", params=[("run", "demo/alpha"), ("run", "demo/beta")])
    assert r.status_code == 200
    assert c.get("/api/trace", params={"run": "demo/alpha"}).status_code == 200
