"""Shared fixtures: every test runs in its own temporary directory with a clean environment."""

from __future__ import annotations

import os
import re
import sys

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
    # piped tables are $COLUMNS wide (else 200): a COLUMNS left in the worker's environment
    # by an earlier test or by the runner would change every table; tests that need one set it
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)
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


# ``pytestmark = pytest.mark.slow`` (alone or first in a list) at the top of a test module
WHOLE_MODULE_SLOW = re.compile(r"^pytestmark\s*=\s*\[?\s*pytest\.mark\.slow\b", re.MULTILINE)
_NOT_COLLECTED = pytest.StashKey[list]()


def deselects_slow(markexpr: str) -> bool:
    """Whether ``-m markexpr`` leaves out every test marked ``slow``: ``not slow`` is one of
    its terms joined by ``and`` (``not slow``, ``not slow and not gpu``). An expression with
    ``or`` or parentheses is not read: its modules are collected as usual."""
    if not markexpr or re.search(r"\bor\b|[()]", markexpr):
        return False
    return any(re.fullmatch(r"not\s+slow", t.strip()) for t in re.split(r"\band\b", markexpr))


def pytest_ignore_collect(collection_path, config):
    """A module marked slow as a whole is not even imported when ``-m`` leaves slow tests out
    (``-m "not slow"``): the framework tests (transformers, lightning, accelerate) import
    seconds of code at module level, and every test in them would be deselected anyway."""
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    if not deselects_slow(config.option.markexpr):
        return None
    try:
        text = collection_path.read_text(encoding="utf-8")
    except OSError:
        return None
    if WHOLE_MODULE_SLOW.search(text) is None:
        return None
    config.stash.setdefault(_NOT_COLLECTED, []).append(collection_path)
    return True


def pytest_report_collectionfinish(config, start_path, items):
    left_out = config.stash.get(_NOT_COLLECTED, [])
    if not left_out:
        return None
    return f"not collected: {len(left_out)} modules marked slow as a whole (by -m)"


def _may_have_cuda() -> bool:
    """False where no CUDA device can exist (Linux without the NVIDIA driver loaded), so that
    collecting the ``gpu`` tests does not import torch (seconds) only to learn that."""
    return not sys.platform.startswith("linux") or os.path.exists("/proc/driver/nvidia/version")


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items or os.environ.get("ET_RUN_GPU_TESTS"):
        return
    has_cuda = False
    if _may_have_cuda():
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
