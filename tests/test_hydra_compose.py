"""The tracker config group composed through Hydra's compose API, and et.init(spec=cfg.tracker)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("hydra")

from hydra import compose, initialize_config_module  # noqa: E402
from hydra.core.global_hydra import GlobalHydra  # noqa: E402

import expr_tracker as et  # noqa: E402
from expr_tracker.spec import RunSpec, SpecError, resolve  # noqa: E402


@pytest.fixture
def hydra_compose():
    """compose(overrides) with the search-path plugin active (any config module works)."""
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="expr_tracker.conf", version_base="1.3"):
        yield lambda overrides: compose(overrides=list(overrides))
    GlobalHydra.instance().clear()


@pytest.fixture(autouse=True)
def _no_env(monkeypatch, tmp_path):
    for var in ("ET_CONFIG", "ET_ALERT_CONFIG", "ET_SLACK_WEBHOOK_URL", "WEBHOOK_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    yield
    et.finish()


def test_default_equals_model_defaults(hydra_compose):
    cfg = hydra_compose(["+tracker=default"])
    spec = resolve(cfg.tracker, environ={}).spec
    assert spec.model_dump(exclude={"name"}) == RunSpec().model_dump(exclude={"name"})


def test_default_overrides_without_plus(hydra_compose):
    cfg = hydra_compose(["+tracker=default", "tracker.history.buffer.size=100"])
    assert resolve(cfg.tracker, environ={}).spec.history.buffer.size == 100


@pytest.mark.parametrize(
    "sets, names",
    [
        (["nan_guard"], {"nan_loss"}),
        (["divergence"], {"loss_spike", "loss_diverging"}),
        (["hung_run"], {"hung_run"}),
        (
            ["nan_guard", "divergence", "hung_run"],
            {"nan_loss", "loss_spike", "loss_diverging", "hung_run"},
        ),
    ],
)
def test_rule_sets_merge_by_name(hydra_compose, sets, names):
    cfg = hydra_compose(["+tracker=default", f"+tracker/alerts=[{','.join(sets)}]"])
    assert set(cfg.tracker.alerts.rules) == names
    spec = resolve(cfg.tracker, environ={}).spec
    assert {r.name for r in spec.alerts.rules} == names


def test_rule_sets_compile():
    from expr_tracker.alerts.rules import AlertRule

    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="expr_tracker.conf", version_base="1.3"):
        cfg = compose(
            overrides=["+tracker=default", "+tracker/alerts=[nan_guard,divergence,hung_run]"]
        )
    GlobalHydra.instance().clear()
    rules = resolve(cfg.tracker, environ={}).spec.alerts.rules
    assert {r.name for r in rules} == {"nan_loss", "loss_spike", "loss_diverging", "hung_run"}
    compiled = [AlertRule(**rule.model_dump()) for rule in rules]  # parses and compiles
    assert [r.name for r in compiled] == [r.name for r in rules]


def test_minimal_is_metrics_only(hydra_compose):
    spec = resolve(hydra_compose(["+tracker=minimal"]).tracker, environ={}).spec
    assert not spec.spans.enabled and not spec.alerts.enabled


def test_timeline_requires_stream(hydra_compose):
    with pytest.raises(SpecError) as err:
        resolve(hydra_compose(["+tracker=timeline"]).tracker, environ={})
    assert "tracker.stream" in str(err.value)
    spec = resolve(
        hydra_compose(["+tracker=timeline", "tracker.stream=loader"]).tracker, environ={}
    ).spec
    assert spec.stream == "loader" and spec.spans.enabled and not spec.spans.metrics


def test_profile_plugins(hydra_compose):
    spec = resolve(hydra_compose(["+tracker=profile"]).tracker, environ={}).spec
    assert [p.type for p in spec.spans.plugins] == ["cpu_time", "gpu_stats"]


def test_init_with_dictconfig_resolves_interpolations(hydra_compose, tmp_path):
    cfg = hydra_compose(
        ["+tracker=default", "++tracker.project=proj", "++tracker.name=${tracker.project}-x"]
    )
    run = et.init(spec=cfg.tracker, config={"lr": 0.1})
    assert run.name == "proj-x"
    et.log({"loss": 1.0})
    et.finish()
    spec_json = json.loads((tmp_path / "runs" / "proj" / "proj-x" / "spec.json").read_text())
    assert spec_json["name"] == "proj-x"


def test_init_error_names_hydra_config_path(hydra_compose):
    cfg = hydra_compose(["+tracker=default", "tracker.history.buffer.size=-1"])
    with pytest.raises(SpecError) as err:
        et.init(spec=cfg.tracker)
    text = str(err.value)
    assert "config key `tracker.history.buffer.size`" in text
    assert "must be an integer >= 1" in text
    assert err.value.issues[0].config_key == "tracker.history.buffer.size"
