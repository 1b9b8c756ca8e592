"""Shared fixtures: every test runs in its own temporary directory with a clean environment."""

from __future__ import annotations

import os

import pytest
from helpers import read_lines

ENV_VARS = (
    "ET_CONFIG",
    "ET_ALERT_CONFIG",
    "ET_LARK_WEBHOOK_URL",
    "ET_SLACK_WEBHOOK_URL",
    "ET_DINGTALK_WEBHOOK_URL",
    "ET_WECOM_WEBHOOK_URL",
    "ET_WEBHOOK_URL",
    "WEBHOOK_URL",
    "RANK",
    "LOCAL_RANK",
)


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """A fresh cwd, no tracker variables from the outer environment, no run left behind."""
    monkeypatch.chdir(tmp_path)
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    yield
    import expr_tracker as et

    run = et.get_run()
    if run is not None and not run.forked:
        try:
            et.finish()
        except Exception:  # noqa: BLE001 - a test that broke its run must not break others
            pass


@pytest.fixture
def run_dir(tmp_path):
    return tmp_path / "runs" / "proj" / "r1"


@pytest.fixture
def no_proxy(monkeypatch):
    """No HTTP(S) proxy from the outer environment: local test servers are reached directly
    (modules that talk to them: ``pytestmark = pytest.mark.usefixtures("no_proxy")``)."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def rows_of():
    return read_lines


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items or os.environ.get("ET_RUN_GPU_TESTS"):
        return
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in gpu_items:
        item.add_marker(skip)
