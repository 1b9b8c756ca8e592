"""``et.config`` / ``run.config`` (expr_tracker/runconfig.py): attribute and item access,
update with allow_val_change, setdefaults, the "config" event, config.json kept in step
atomically (a process killed right after an update keeps it)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import expr_tracker as et
from expr_tracker.runconfig import RunConfig, config_mapping


def _config_json(run):
    return json.loads((run.dir / "config.json").read_text())


def test_attribute_and_item_access_and_mapping_views():
    run = et.init(project="p", name="r", config={"lr": 0.1, "model": {"depth": 2}})
    assert et.config.lr == 0.1 and et.config["model"] == {"depth": 2}
    assert "lr" in et.config and "nope" not in et.config
    assert sorted(et.config.keys()) == ["lr", "model"]
    assert dict(et.config.items()) == {"lr": 0.1, "model": {"depth": 2}}
    assert et.config.as_dict() == {"lr": 0.1, "model": {"depth": 2}} == run.config
    assert et.config.get("nope", 3) == 3 and len(et.config) == 2
    with pytest.raises(AttributeError, match="no key 'nope'"):
        _ = et.config.nope


def test_changes_are_saved_and_emitted():
    run = et.init(project="p", name="r", config={"lr": 0.1})
    events = []
    run.subscribe(lambda event, payload: events.append((event, payload)))
    et.config.update({"bs": 32, "lr": 0.1})  # lr unchanged: not an event
    et.config.epochs = 3
    et.config["seed"] = 7
    et.config.setdefaults({"bs": 64, "warmup": 100})  # bs kept
    assert _config_json(run) == {"lr": 0.1, "bs": 32, "epochs": 3, "seed": 7, "warmup": 100}
    assert events == [
        ("config", {"changes": {"bs": 32}}),
        ("config", {"changes": {"epochs": 3}}),
        ("config", {"changes": {"seed": 7}}),
        ("config", {"changes": {"warmup": 100}}),
    ]


def test_changing_a_value_needs_allow_val_change():
    run = et.init(project="p", name="r", config={"lr": 0.1})
    with pytest.raises(et.ConfigChangeError) as info:
        et.config.update({"lr": 0.2, "bs": 8})
    message = str(info.value)
    assert "'lr'" in message and "0.1" in message and "0.2" in message
    assert "allow_val_change" in message
    assert "bs" not in run.config and _config_json(run) == {"lr": 0.1}  # nothing applied
    with pytest.raises(et.ConfigChangeError):
        et.config.lr = 0.3
    et.config.update({"lr": 0.2}, allow_val_change=True)
    assert et.config.lr == 0.2 and _config_json(run) == {"lr": 0.2}


def test_the_same_nan_again_is_no_change():
    # `wandb.config.update(args)` twice, args holding a NaN default: NaN != NaN
    run = et.init(project="p", name="r", config={"clip": float("nan"), "m": {"w": [float("nan")]}})
    et.config.update({"clip": float("nan"), "m": {"w": [float("nan")]}})
    et.config.setdefaults({"clip": 1.0})
    with pytest.raises(et.ConfigChangeError, match="'clip'"):
        et.config.update({"clip": 1.0})
    assert math.isnan(run.config.clip)


def test_init_allow_val_change_is_the_run_default():
    et.init(project="p", name="r", config={"lr": 0.1}, allow_val_change=True)
    et.config.lr = 0.5
    assert et.config.lr == 0.5


def test_values_are_stored_as_json_data_and_credentials_hidden_on_disk():
    @dataclasses.dataclass
    class Opt:
        name: str = "adam"
        betas: tuple = (0.9, 0.99)

    run = et.init(project="p", name="r")
    et.config.update(argparse.Namespace(optim=Opt(), path=None))
    et.config.update({"webhook_url": "https://hooks.slack.com/services/T/B/secret"})
    assert et.config.optim == {"name": "adam", "betas": [0.9, 0.99]}
    assert "secret" not in (run.dir / "config.json").read_text()
    assert "secret" in et.config.webhook_url  # in memory the value is kept


def test_a_runs_config_is_taken_as_a_config():
    # an eval run configured from the training run: config=wandb.config, update(run.config)
    main = et.init(project="p", name="train", config={"lr": 0.1, "bs": 4})
    ev = et.Run(project="p", name="eval", config=et.config, config_exclude_keys=["bs"])
    assert ev.config.as_dict() == {"lr": 0.1}
    for source in (main.config, et.config):
        other = RunConfig()
        other.update(source)  # was silently nothing (RunConfig) / TypeError (et.config)
        assert other.as_dict() == {"lr": 0.1, "bs": 4}
    again = et.Run(project="p", name="eval2", config=main.config)
    assert json.loads((again.dir / "config.json").read_text()) == {"lr": 0.1, "bs": 4}
    ev.finish()
    again.finish()


def test_config_mapping_rejects_other_types():
    with pytest.raises(TypeError, match="mapping, an argparse.Namespace"):
        config_mapping(42)


def test_only_the_producer_that_writes_config_json_keeps_it(tmp_path):
    # another rank (or a disabled run): no path, the file is never touched
    cfg = RunConfig({"a": 1}, path=None)
    cfg.update({"b": 2})
    assert cfg == {"a": 1, "b": 2}
    assert list(tmp_path.iterdir()) == []


def test_unwritable_config_file_warns_and_keeps_memory(tmp_path):
    warned = []
    path = tmp_path / "missing-dir" / "config.json"
    cfg = RunConfig({}, path=path, warn=lambda key, *args: warned.append(key))
    cfg.update({"a": 1})
    assert cfg.a == 1 and warned == [("write", "config.json")]


def test_update_survives_the_process_being_killed(tmp_path):
    code = textwrap.dedent(
        """
        import os, signal, sys
        import expr_tracker as et
        et.init(project="p", name="r", dir=sys.argv[1], config={"lr": 0.1})
        et.config.update({"lr_schedule": "cosine", "bs": 64})
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    p = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "runs")], capture_output=True, timeout=60
    )
    assert p.returncode == -signal.SIGKILL
    run_dir = tmp_path / "runs" / "p" / "r"
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved == {"lr": 0.1, "lr_schedule": "cosine", "bs": 64}
    assert not [n for n in os.listdir(run_dir) if n.endswith(".tmp")]  # no temp file left
    # the resumed run keeps the keys the killed attempt added; values given now win (another
    # config continues the run only with resume="must": docs/streams.md "Run identity")
    run = et.init(
        project="p", name="r", dir=str(tmp_path / "runs"), config={"lr": 0.2}, resume="must"
    )
    assert run.resumed
    assert et.config.as_dict() == {"lr": 0.2, "lr_schedule": "cosine", "bs": 64}
    assert json.loads((run_dir / "config.json").read_text()) == et.config.as_dict()
