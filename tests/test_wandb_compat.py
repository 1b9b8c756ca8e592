"""wandb's ``init`` keywords (expr_tracker/wandb_compat.py): applied where they mean
something, warned about once otherwise, never an error for a wandb keyword."""

from __future__ import annotations

import argparse
import json
import logging

import pytest

import expr_tracker as et
from expr_tracker import wandb_compat
from expr_tracker.spec import SpecError
from expr_tracker.wandb_compat import wandb_init_call


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    monkeypatch.setattr(wandb_compat, "_warner", wandb_compat.Warner(wandb_compat.log))


def test_every_wandb_init_keyword_is_accepted(caplog):
    import inspect

    import wandb

    accepted = dict.fromkeys(inspect.signature(wandb.init).parameters)
    values = {
        "entity": "team",
        "project": "p",
        "dir": "runs",
        "id": "r1",
        "name": None,
        "notes": "n",
        "tags": ("a",),
        "config": {"lr": 0.1, "secret_key": "x"},
        "config_exclude_keys": ["secret_key"],
        "config_include_keys": None,
        "allow_val_change": True,
        "group": "g",
        "job_type": "train",
        "mode": "offline",
        "force": True,
        "reinit": False,
        "resume": "auto",
        "resume_from": "run?_step=3",
        "fork_from": "run?_step=3",
        "save_code": True,
        "tensorboard": True,
        "sync_tensorboard": True,
        "monitor_gym": True,
        "settings": {"x_disable_stats": True},
        "anonymous": "allow",
    }
    assert set(accepted) <= set(values), set(accepted) - set(values)
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        run = et.init(**values)
    assert (run.name, run.entity, run.job_type, run.group, run.tags) == (
        "r1",
        "team",
        "train",
        "g",
        ["a"],
    )
    assert et.config.as_dict() == {"lr": 0.1}
    et.config.lr = 0.3  # allow_val_change=True
    for key in ("settings", "save_code", "anonymous", "sync_tensorboard", "force", "fork_from"):
        assert f"et.init({key}=...)" in caplog.text
    # once per process, not per call
    et.finish()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        et.init(project="p", name="r2", save_code=True)
    assert "save_code" not in caplog.text


def test_unknown_non_wandb_keyword_is_still_an_error():
    with pytest.raises(SpecError, match="unknown keyword argument"):
        et.init(project="p", name="r", learning_rate=0.1)


def test_modes():
    assert wandb_init_call(None, None, None, {"mode": "dryrun"}).given["mode"] == "offline"
    assert wandb_init_call(None, None, None, {"mode": "disabled"}).given["mode"] == "disabled"
    with pytest.raises(SpecError) as info:
        et.init(project="p", name="r", mode="offlin")
    text = str(info.value)
    assert "mode" in text and "offlin" in text and "disabled" in text and "online" in text


def test_online_warns_once_and_writes_locally(caplog):
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        run = et.init(project="p", name="r", mode="online")
        et.log({"x": 1})
    assert "local-only" in caplog.text and caplog.text.count("local-only") == 1
    et.finish()
    assert (run.dir / "metrics.jsonl").read_text().count("\n") == 1


def test_resume_values():
    assert wandb_init_call(None, None, None, {"resume": True}).given["resume"] == "allow"
    assert wandb_init_call(None, None, None, {"resume": "auto"}).given["resume"] == "allow"
    assert "resume" not in wandb_init_call(None, None, None, {"resume": False}).given
    assert wandb_init_call(None, None, None, {"resume": "must"}).given["resume"] == "must"
    with pytest.raises(SpecError, match="resume"):
        et.init(project="p", name="r", resume="sometimes")


def test_bad_reinit_names_the_valid_values():
    with pytest.raises(SpecError, match="finish_previous"):
        et.init(project="p", name="r", reinit="again")


def test_id_wins_over_name_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        run = et.init(project="p", name="display", id="abc")
    assert run.name == "abc" and "id is used" in caplog.text


def test_config_forms(tmp_path):
    ns = argparse.Namespace(lr=0.1, bs=8)
    run = et.init(project="p", name="a", config=ns, config_include_keys=["lr"])
    assert run.config == {"lr": 0.1}
    et.finish()
    yml = tmp_path / "config-defaults.yaml"
    yml.write_text("wandb_version: 1\nlr:\n  desc: learning rate\n  value: 0.01\nepochs: 3\n")
    run = et.init(project="p", name="b", config=str(yml))
    assert run.config == {"lr": 0.01, "epochs": 3}
    assert json.loads((run.dir / "config.json").read_text()) == {"lr": 0.01, "epochs": 3}
    et.finish()
    with pytest.raises(SpecError, match="cannot read the config file"):
        et.init(project="p", name="c", config=str(tmp_path / "missing.yaml"))


def test_omegaconf_config_with_exclude_keys():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"lr": 0.1, "base": 2, "derived": "${base}", "tracker": {"x": 1}})
    run = et.init(project="p", name="r", config=cfg, config_exclude_keys=["tracker"])
    assert run.config == {"lr": 0.1, "base": 2, "derived": 2}


def test_hostile_id_and_bad_field_types_are_spec_errors(tmp_path):
    with pytest.raises(SpecError, match="name: '../escape' is not valid"):
        et.init(project="p", id="../escape")
    with pytest.raises(SpecError, match="entity"):
        et.init(project="p", name="r", entity=5)
    assert not (tmp_path / "escape").exists() and not (tmp_path / "runs").exists()
