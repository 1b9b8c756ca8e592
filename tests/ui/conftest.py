"""Fixtures of the ``et ui`` tests (helpers in ui_support.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def ui_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with runs demo/alpha (hostile metric names, NaN, inf, spans, config, alerts),
    demo/beta and demo/gamma (crashed: its process died without finishing), written by
    ``et.log`` in subprocesses."""
    from ui_support import write_runs  # skips without the extras

    root = tmp_path_factory.mktemp("ui") / "runs"
    write_runs(root)
    return root


@pytest.fixture(scope="session")
def ui_server(ui_runs: Path, tmp_path_factory: pytest.TempPathFactory):
    """A real ``et ui`` (uvicorn) serving ``ui_runs`` on 127.0.0.1."""
    from ui_support import Server

    s = Server(ui_runs, tmp_path_factory.mktemp("ui-cache"))
    yield s
    s.close()
