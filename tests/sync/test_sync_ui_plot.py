"""``et ui`` and ``et plot`` on a bucket URL (docs/team.md "The dashboard over a bucket"):
a real ``et ui s3://...`` on 127.0.0.1 over a real S3 endpoint (moto_server) answering the
runs table and a series over HTTP, refreshing its copy on a page load and refusing every
write; the same in process over ``file://``; ``et plot`` of a bucket's run; the run
commands that change runs refusing a bucket or its copy."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

import expr_tracker as et
from expr_tracker.cli.main import main
from expr_tracker.sync.mirror import mirror_root
from expr_tracker.sync.upload import sync_dir

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")
TestClient = pytest.importorskip("starlette.testclient").TestClient


def train(root, name, *, steps=20):
    et.init(project="proj", name=name, dir=str(root), system=False, config={"lr": 0.1})
    for i in range(steps):
        et.log({"loss": 1.0 / (i + 1)})
    et.finish()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, method: str = "GET", token: str = "tok") -> tuple[int, dict]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(
        url, method=method, headers={"Authorization": f"token {token}"}, data=None
    )
    try:
        with opener.open(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


@pytest.mark.slow  # ~4 s: a whole et ui process (its imports, the first copy of the bucket)
def test_et_ui_serves_an_s3_bucket_read_only(s3_bucket, tmp_path):
    train(tmp_path / "runs", "a")
    assert sync_dir(tmp_path / "runs", s3_bucket.url).errors == []
    port = _free_port()
    env = s3_bucket.env()
    env["ET_UI_TOKEN"] = "tok"
    cmd = [sys.executable, "-m", "expr_tracker.cli.main", "ui", s3_bucket.url, "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, "et ui exited"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "et ui did not listen within 60 s"
                time.sleep(0.1)
        base = f"http://127.0.0.1:{port}"
        status, page = _get(f"{base}/api/runs")
        assert status == 200 and page["source"] == s3_bucket.url
        assert [r["run"] for r in page["runs"]] == ["proj/a"]
        assert page["runs"][0]["steps"] == 20
        status, ser = _get(f"{base}/api/series?run=proj/a&metric=loss&width=100")
        assert status == 200 and len(ser["traces"]) == 1
        assert ser["traces"][0]["y"][0] == 1.0 and ser["traces"][0]["step"][-1] == 19
        # a write of any kind is refused, saying why
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            status, body = _get(f"{base}/api/runs", method)
            assert status == 405 and "read-only" in body["error"]
            assert s3_bucket.url in body["error"]
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert b"read-only" in err and b"testing-secret-value" not in err


@pytest.fixture
def file_bucket(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    train(tmp_path / "runs", "a")
    url = f"file://{tmp_path / 'bucket'}"
    assert sync_dir(tmp_path / "runs", url).errors == []
    return url, tmp_path


def _app(url: str, monkeypatch):
    """The app ``et ui URL`` serves, made as cli/ui.py makes it (in process)."""
    from expr_tracker.cli.ui import _bucket
    from expr_tracker.ui import server

    monkeypatch.setattr(server, "REFRESH_TTL", 0.0)
    root, refresh = _bucket(url, None)
    app = server.create_app(root, token=None, source=url, refresh=refresh)
    return TestClient(app, base_url="http://127.0.0.1")


def test_a_project_url_serves_that_project_and_refreshes_it(file_bucket, monkeypatch):
    url, tmp = file_bucket
    client = _app(f"{url}/proj", monkeypatch)
    assert [r["run"] for r in client.get("/api/runs").json()["runs"]] == ["proj/a"]
    train(tmp / "runs", "b")
    assert sync_dir(tmp / "runs", url).errors == []
    got = client.get("/api/runs").json()
    assert sorted(r["run"] for r in got["runs"]) == ["proj/a", "proj/b"]
    assert "refresh_error" not in got and "refresh_problems" not in got
    detail = client.get("/api/run", params={"run": "proj/b"})
    assert detail.status_code == 200 and "loss" in json.dumps(detail.json())
    # a live page's polling follows the run's syncs
    et.init(project="proj", name="a", dir=str(tmp / "runs"), system=False, resume="must")
    et.log({"loss": 0.01})
    et.finish()
    assert sync_dir(tmp / "runs", url).errors == []
    polled = client.get("/api/points", params={"run": "proj/a", "after": 19}).json()
    assert polled["max_step"] == 20
    r = client.post("/api/runs")
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"
    assert "read-only" in r.json()["error"]


def test_a_refresh_that_fails_is_reported_and_the_copy_served(file_bucket, monkeypatch):
    from expr_tracker.cli.ui import _bucket
    from expr_tracker.sync.store import StoreError
    from expr_tracker.ui import server

    url, tmp = file_bucket
    root, _ = _bucket(url, None)
    calls = []

    def refresh():
        calls.append(1)
        raise StoreError(f"list {url}/_manifests/: SlowDown (HTTP 503)")

    app = server.create_app(root, token=None, source=url, refresh=refresh)
    client = TestClient(app, base_url="http://127.0.0.1")
    got = client.get("/api/runs").json()
    assert [r["run"] for r in got["runs"]] == ["proj/a"]  # the copy, as it was
    assert "SlowDown" in got["refresh_error"]
    client.get("/api/runs")
    assert len(calls) == 1  # at most one refresh per REFRESH_TTL


def test_a_local_dashboard_refuses_writes_too(tmp_path):
    from expr_tracker.ui.server import create_app

    train(tmp_path / "runs", "a")
    client = TestClient(create_app(tmp_path / "runs", token=None), base_url="http://127.0.0.1")
    r = client.delete("/api/run?run=proj/a")
    assert r.status_code == 405 and "et runs tag" in r.json()["error"]
    assert "source" not in client.get("/api/runs").json()


def test_et_plot_of_a_bucket_run_writes_its_chart(s3_bucket, tmp_path):
    pytest.importorskip("plotext")
    train(tmp_path / "runs", "a")
    assert sync_dir(tmp_path / "runs", s3_bucket.url).errors == []
    chart = tmp_path / "chart.txt"
    with open(chart, "w") as out:
        sys.stdout, saved = out, sys.stdout
        try:
            code = main(["plot", f"{s3_bucket.url}/proj/a", "loss", "--width", "60",
                         "--height", "12", "--no-color"])  # fmt: skip
        finally:
            sys.stdout = saved
    assert code == 0
    text = chart.read_text()
    assert "loss" in text and text.count("\n") >= 10
    # --dir naming the bucket, the run by name
    assert main(["plot", "proj/a", "--dir", s3_bucket.url, "--width", "60", "--height", "12"]) == 0


def test_run_commands_refuse_a_bucket_and_its_copy(file_bucket, capsys):
    url, tmp = file_bucket
    assert main(["runs", "tag", f"{url}/proj/a", "+best"]) == 1
    assert "read-only" in capsys.readouterr().err
    assert main(["runs", "archive", "proj/a", "--dir", url]) == 1
    assert "read-only" in capsys.readouterr().err
    assert main(["runs", url]) == 0  # makes the copy
    capsys.readouterr()
    from expr_tracker.sync.store import open_store

    run_dir = mirror_root(open_store(url).url) / "proj" / "a"
    assert run_dir.is_dir()
    assert main(["runs", "tag", str(run_dir), "+best"]) == 1
    assert "local copy is read-only" in capsys.readouterr().err
    assert "best" not in (run_dir / "run.json").read_text()
