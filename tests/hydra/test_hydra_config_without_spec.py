"""`et.init(spec=cfg.tracker, config=cfg)`: the tracker node is the spec (spec.json), never
hyper-parameters in config.json, whatever its key; composed with Hydra's own compose API."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("hydra")

from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.core.global_hydra import GlobalHydra  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

import expr_tracker as et  # noqa: E402
from expr_tracker.spec.sources import config_without_spec  # noqa: E402

APP_CONFIG = """
defaults:
  - tracker: default
  - _self_
lr: 0.1
model:
  hidden: 32
tracker:
  project: app
  name: r
  dir: ${oc.env:ET_TEST_RUNS}
"""

# the group placed under another key (Hydra's package override in the defaults list)
NESTED_CONFIG = """
defaults:
  - tracker@logging.et: default
  - _self_
lr: 0.1
logging:
  level: info
  et:
    project: app
    name: nested
    dir: ${oc.env:ET_TEST_RUNS}
"""


@pytest.fixture
def compose_app(tmp_path, monkeypatch):
    """compose(overrides) of a real app config dir that selects the shipped `tracker` group."""
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "config.yaml").write_text(APP_CONFIG)
    (conf / "nested.yaml").write_text(NESTED_CONFIG)
    monkeypatch.setenv("ET_TEST_RUNS", str(tmp_path / "runs"))
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        yield lambda *overrides, name="config": compose(config_name=name, overrides=list(overrides))
    GlobalHydra.instance().clear()


def _files(run):
    config = json.loads((run.dir / "config.json").read_text())
    spec = json.loads((run.dir / "spec.json").read_text())
    return config, spec


def test_whole_hydra_config_records_no_tracker_rows(compose_app):
    cfg = compose_app("tracker.history.buffer.size=7")
    assert "tracker" in cfg and len(OmegaConf.to_container(cfg.tracker)) > 10
    run = et.init(spec=cfg.tracker, config=cfg)
    et.log({"loss": 1.0})
    et.finish()
    config, spec = _files(run)
    assert config == {"lr": 0.1, "model": {"hidden": 32}}
    assert dict(run.config) == config
    assert spec["history"]["buffer"]["size"] == 7  # the tracker's settings: in spec.json


def test_the_node_is_recognised_whatever_its_key(compose_app):
    cfg = compose_app(name="nested")
    assert "tracker" not in cfg and "history" in cfg.logging.et
    run = et.init(spec=cfg.logging.et, config=cfg)
    et.finish()
    config, spec = _files(run)
    assert run.name == "nested"
    assert config == {"lr": 0.1, "logging": {"level": "info"}}
    assert spec["name"] == "nested" and spec["project"] == "app"


def test_a_resolved_container_drops_the_node_too(compose_app):
    """The form examples/train_digits.py used: `config=OmegaConf.to_container(cfg, resolve=True)`."""
    cfg = compose_app("tracker.name=plain")
    run = et.init(spec=cfg.tracker, config=OmegaConf.to_container(cfg, resolve=True))
    et.finish()
    assert _files(run)[0] == {"lr": 0.1, "model": {"hidden": 32}}


def test_an_interpolation_to_the_node_is_the_node(compose_app):
    cfg = compose_app(
        "tracker.name=alias", "+tracker_alias=${tracker}", "+tracker_project=${tracker.project}"
    )
    run = et.init(spec=cfg.tracker, config=cfg)
    et.finish()
    # the alias is the same node; a value read from it is the user's own key and stays
    assert _files(run)[0] == {"lr": 0.1, "model": {"hidden": 32}, "tracker_project": "app"}


def test_tracker_settings_are_not_identity(compose_app, capfd):
    """Another buffer size is not another experiment: the same name continues the run."""
    run = et.init(spec=(cfg := compose_app("tracker.name=same")).tracker, config=cfg)
    et.finish()
    cfg2 = compose_app("tracker.name=same", "tracker.history.buffer.size=3")
    run2 = et.init(spec=cfg2.tracker, config=cfg2)
    et.finish()
    assert run2.dir == run.dir and run2.name == "same"
    cfg3 = compose_app("tracker.name=same", "lr=0.2")
    run3 = et.init(spec=cfg3.tracker, config=cfg3)
    et.finish()
    assert run3.name == "same-2"  # a hyper-parameter is


def test_config_without_spec_leaves_other_configs_alone():
    cfg = OmegaConf.create({"lr": 0.1, "tracker": {"project": "p"}})
    other = OmegaConf.create({"project": "p"})
    assert config_without_spec(cfg, other) is cfg  # not below cfg: nothing to drop
    assert config_without_spec(cfg, cfg) is cfg  # the spec is the whole config
    assert config_without_spec(cfg, None) is cfg
    plain = {"lr": 0.1, "sub": {"tracker": {"project": "p"}}, "empty": {}}
    assert config_without_spec(plain, {"project": "p"}) == {"lr": 0.1, "sub": {}, "empty": {}}
    assert config_without_spec(plain, {}) is plain  # an empty spec matches nothing
    assert config_without_spec(plain, {"project": "q"}) is plain
    assert config_without_spec(plain, "tracker.yaml") is plain
