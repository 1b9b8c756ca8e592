"""Fixtures of the sync tests: a real S3 endpoint on loopback (``moto_server``, the ``dev``
extra's ``moto[server]``), started once per session; each test gets its own bucket and an
environment that points the standard AWS variables at it. Where ``moto_server`` is missing
or does not start, the tests that need it are skipped with the reason."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import ROOT

_PROXIES = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _moto_binary() -> str | None:
    here = Path(sys.executable).parent / "moto_server"
    return str(here) if here.exists() else shutil.which("moto_server")


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory):
    """``http://127.0.0.1:PORT`` of a ``moto_server`` run by this session."""
    binary = _moto_binary()
    if binary is None:
        pytest.skip("moto_server not installed (pip install 'moto[server]': the dev extra)")
    port = _free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    env = {k: v for k, v in os.environ.items() if k not in _PROXIES}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [binary, "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    url = f"http://127.0.0.1:{port}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            pytest.skip(
                f"moto_server exited at start ({proc.returncode}): {log.read_text()[-300:]}"
            )
        try:
            opener.open(f"{url}/moto-api/", timeout=1).read()
            break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                pytest.skip("moto_server did not answer within 120 s")
            time.sleep(0.1)
    yield url
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass
class Bucket:
    url: str  # s3://bucket/prefix
    bucket: str
    prefix: str
    endpoint: str

    def env(self) -> dict[str, str]:
        """The environment a subprocess (``et sync``) needs to reach the bucket."""
        env = {k: v for k, v in os.environ.items() if k not in _PROXIES}
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        return env


@pytest.fixture
def s3_bucket(moto_endpoint, monkeypatch, tmp_path):
    """A fresh bucket on the session's ``moto_server``, with ``AWS_ENDPOINT_URL`` and test
    credentials set, the sync state under ``tmp_path``."""
    import boto3

    for var in (*_PROXIES, "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing-secret-value")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    name = f"et-{uuid.uuid4().hex[:20]}"
    boto3.client("s3", endpoint_url=moto_endpoint).create_bucket(Bucket=name)
    return Bucket(url=f"s3://{name}/team", bucket=name, prefix="team", endpoint=moto_endpoint)
