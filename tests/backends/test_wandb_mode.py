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


def test_entity_and_job_type_reach_the_wandb_mirror(tmp_path, fake_wandb):
    # wandb.init(entity="team") rewritten as et.init(entity="team", backends=["wandb"]): the
    # mirror must not log to the default entity instead
    et.init(
        project="p",
        name="r",
        dir=str(tmp_path),
        backends=["wandb"],
        entity="team",
        job_type="train",
    )
    et.finish()
    et.init(
        project="p",
        name="r2",
        dir=str(tmp_path),
        backends=["wandb"],
        entity="team",
        backend_kwargs={"wandb": {"entity": "other"}},
    )
    et.finish()
    first, second = fake_wandb
    assert (first["entity"], first["job_type"]) == ("team", "train")
    assert second["entity"] == "other" and second.get("job_type") is None
