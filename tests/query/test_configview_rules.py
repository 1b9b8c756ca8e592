"""A run's config with defaults hidden and a baseline's differences
(``query/configview.py``) and ``et config run``."""

from __future__ import annotations

import json
import math

import pytest

from expr_tracker.cli.main import main
from expr_tracker.query.configview import config_view, override_keys

CFG = {"lr": 0.1, "seed": 1, "optimizer": {"name": "adam", "beta": 0.9}, "model": {"depth": 4}}


def test_override_keys():
    keys = override_keys(
        ["lr=0.1", "+extra=1", "++a.b=2", "optimizer=adam", "model/encoder=big",
         "db@backup=mysql", "~gone", "hydra.verbose=true", "x@_global_=y", 3]
    )  # fmt: skip
    assert keys == [("lr",), ("extra",), ("a", "b"), ("optimizer",), ("model", "encoder"),
                    ("backup",)]  # fmt: skip


def test_defaults_are_the_keys_no_override_set():
    v = config_view(CFG, overrides=["lr=0.1", "optimizer=adam"])
    assert v["defaults_known"]
    shown = {r["key"]: r["default"] for r in v["rows"]}
    assert shown == {"lr": False, "seed": True, "optimizer.name": False,
                     "optimizer.beta": False, "model.depth": True}  # fmt: skip
    unknown = config_view(CFG)  # not a Hydra job: every key shown
    assert not unknown["defaults_known"] and {r["default"] for r in unknown["rows"]} == {None}


def test_baseline_differences():
    base = {"lr": 0.01, "seed": 1.0, "optimizer": {"name": "adam"}, "old": True, "f": math.nan}
    v = config_view({**CFG, "f": math.nan, "flag": True}, baseline={**base, "flag": 1})
    d = {r["key"]: (r["differs"], r["baseline"], r["in_baseline"]) for r in v["rows"]}
    assert d["lr"] == (True, 0.01, True)
    assert d["seed"][0] is False  # 1 and 1.0 are one value
    assert d["optimizer.beta"] == (True, None, False)
    assert d["f"][0] is False  # NaN is NaN
    assert d["flag"][0] is True  # True is not 1
    assert v["only_in_baseline"] == [{"key": "old", "baseline": True}]
    none = config_view(CFG, baseline=None)  # a baseline without a config: all differ
    assert all(r["differs"] for r in none["rows"])


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    for name, cfg, overrides in (("a", CFG, ["lr=0.1"]), ("b", {**CFG, "lr": 0.3}, None)):
        d = root / "p" / name
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps(cfg))
        info = {"status": "finished", "name": name, "project": "p"}
        if overrides is not None:
            info["hydra"] = {"overrides": overrides, "job_name": "train"}
        (d / "run.json").write_text(json.dumps(info))
        (d / "metrics.jsonl").write_text('{"_step": 0, "loss": 1.0}\n')
    return root


def test_cli(runs, capsys):
    assert main(["config", "run", "p/a", "--dir", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "lr" in out and "model.depth" not in out and "4 keys defaults" in out
    assert main(["config", "run", "p/a", "--dir", str(runs), "--all"]) == 0
    assert "model.depth" in capsys.readouterr().out
    code = main(["config", "run", "a", "--baseline", "b", "--dir", str(runs), "--format", "json"])
    rows = json.loads(capsys.readouterr().out)
    assert code == 0 and [(r["key"], r["value"], r["baseline"]) for r in rows] == [("lr", 0.1, 0.3)]
    assert main(["config", "run", "nope", "--dir", str(runs)]) == 1
    assert "nope" in capsys.readouterr().err
