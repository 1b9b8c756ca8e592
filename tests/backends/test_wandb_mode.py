"""wandb's ``mode="offline"`` given to et.init (as a wandb user writes it) keeps the wandb
mirror offline too; without it, wandb decides (``WANDB_MODE``), and ``backend_kwargs`` wins.
A stand-in ``wandb`` module records the keywords ``wandb.init`` gets."""

from __future__ import annotations

import sys
import types

import pytest

import expr_tracker as et


class _Run:
    offline = True

    def __init__(self):
        self.config = types.SimpleNamespace(update=lambda *a, **k: None)
        self.summary = types.SimpleNamespace(update=lambda *a, **k: None)

    def log(self, *a, **k):
        pass

    def finish(self, exit_code=0):
        pass


@pytest.fixture
def fake_wandb(monkeypatch):
    calls = []
    mod = types.ModuleType("wandb")

    def init(**kw):
        calls.append(kw)
        return _Run()

    mod.init = init
    monkeypatch.setitem(sys.modules, "wandb", mod)
    yield calls
    et.finish()


@pytest.mark.parametrize(
    "given, mode",
    [
        ({"mode": "offline"}, "offline"),
        ({"mode": "dryrun"}, "offline"),
        ({}, None),
        ({"mode": "offline", "backend_kwargs": {"wandb": {"mode": "online"}}}, "online"),
    ],
)
def test_mode_offline_reaches_the_wandb_mirror(tmp_path, fake_wandb, given, mode):
    run = et.init(project="p", name="r", dir=str(tmp_path), backends=["wandb"], **given)
    et.log({"a": 1})
    et.finish()
    assert run.info()["backends"]["wandb"]["sent"] == 1
    (kw,) = fake_wandb
    assert kw.get("mode") == mode
