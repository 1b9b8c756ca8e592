"""The tracker config group composed through Hydra's compose API, and et.init(spec=cfg.tracker)."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_mirror_settings_override_without_plus(hydra_compose):
    cfg = hydra_compose(
        [
            "+tracker=default",
            "tracker.backends=[wandb,trackio]",
            "tracker.backend_on_rank=all",
            "tracker.backend_queue_size=10",
            "tracker.backend_finish_timeout=5s",
            "+tracker.backend_kwargs.wandb.entity=team",
        ]
    )
    spec = resolve(cfg.tracker, environ={}).spec
    assert spec.backends == ["wandb", "trackio"] and spec.backend_on_rank == "all"
    assert (spec.backend_queue_size, spec.backend_finish_timeout) == (10, 5.0)
    assert spec.backend_kwargs == {"wandb": {"entity": "team"}}


def test_default_yaml_lists_every_spec_key():
    """`tracker/default.yaml` promises every tunable key can be overridden without `+`:
    each field of the spec models is listed (but the user's own `config`, and the delivery
    `alerts.policy`, whose values would shadow ET_ALERT_CONFIG's)."""
    import yaml

    data = yaml.safe_load(
        (Path(et.__file__).parent / "conf" / "tracker" / "default.yaml").read_text()
    )
    missing = []

    def walk(model, values, prefix):
        for key, field in model.model_fields.items():
            if f"{prefix}{key}" in ("config", "alerts.policy"):
                continue
            if key not in values:
                missing.append(prefix + key)
            elif hasattr(field.annotation, "model_fields") and isinstance(values[key], dict):
                walk(field.annotation, values[key], f"{prefix}{key}.")

    walk(RunSpec, data, "")
    assert missing == []


@pytest.mark.parametrize(
    "sets, names",
    [
        (["nan_guard"], {"et_nan_guard"}),
        (["divergence"], {"et_spike", "et_diverging"}),
        (["hung_run"], {"et_hung_run"}),
        (
            ["nan_guard", "divergence", "hung_run"],
            {"et_nan_guard", "et_spike", "et_diverging", "et_hung_run"},
        ),
    ],
)
def test_rule_sets_merge_by_name(hydra_compose, sets, names):
    cfg = hydra_compose(["+tracker=default", f"+tracker/alerts=[{','.join(sets)}]"])
    assert set(cfg.tracker.alerts.rules) == names
    spec = resolve(cfg.tracker, environ={}).spec
    assert {r.name for r in spec.alerts.rules} == names


def test_rule_sets_compile():
    from expr_tracker.alerts.rules import make_rule

    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="expr_tracker.conf", version_base="1.3"):
        cfg = compose(
            overrides=[
                "+tracker=default",
                "+tracker/alerts=[nan_guard,divergence,hung_run,system]",
            ]
        )
    GlobalHydra.instance().clear()
    rules = resolve(cfg.tracker, environ={}).spec.alerts.rules
    assert {r.name for r in rules} == {
        "et_nan_guard",
        "et_spike",
        "et_diverging",
        "et_hung_run",
        "et_gpu_memory",
        "et_gpu_stalled",
        "et_disk_full",
    }
    compiled = [make_rule(rule) for rule in rules]  # parses and compiles
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


# -- the shipped rule sets guard the app's own metric (issue 10) -----------------------------


def test_rule_sets_guard_the_metric_named_by_guard_metric(hydra_compose):
    from expr_tracker.alerts.rules import AlertRule

    sets = "+tracker/alerts=[nan_guard,divergence]"
    cfg = hydra_compose(["+tracker=default", sets, "tracker.alerts.guard_metric=train/loss"])
    rules = [
        AlertRule(**r.model_dump(exclude={"stream"}))
        for r in resolve(cfg.tracker, environ={}).spec.alerts.rules
    ]
    assert {r.name: r.metrics for r in rules} == {
        "et_nan_guard": ("train/loss",),
        "et_spike": ("train/loss",),
        "et_diverging": ("train/loss",),
    }
    # the default, with or without +tracker=default: loss
    for overrides in (["+tracker=default", sets], [sets]):
        spec = resolve(hydra_compose(overrides).tracker, environ={}).spec
        assert {
            AlertRule(**r.model_dump(exclude={"stream"})).metrics for r in spec.alerts.rules
        } == {("loss",)}
    # a name the bare grammar cannot spell still works (the sets quote it)
    cfg = hydra_compose([sets, "+tracker.alerts.guard_metric=val loss-2"])
    spec = resolve(cfg.tracker, environ={}).spec
    assert {AlertRule(**r.model_dump(exclude={"stream"})).metrics for r in spec.alerts.rules} == {
        ("val loss-2",)
    }


@pytest.fixture
def app_compose(tmp_path):
    """compose() for an app whose own config has a working rule named like a shipped one."""
    from hydra import initialize_config_dir

    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "config.yaml").write_text(
        "defaults:\n  - tracker: default\n  - _self_\n"
        "tracker:\n  alerts:\n    rules:\n"
        "      nan_loss: {condition: 'isnan(train/loss)', level: critical}\n"
        "      loss_spike: {condition: 'zscore(train/loss[20]) > 3'}\n"
        "      hung_run: {condition: 'no_data(1h)', level: warning}\n"
    )
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        yield lambda overrides: compose(config_name="config", overrides=list(overrides))
    GlobalHydra.instance().clear()


def test_a_rule_set_never_replaces_an_app_rule(app_compose):
    cfg = app_compose(["+tracker/alerts=[nan_guard,divergence,hung_run]"])
    rules = {r.name: r for r in resolve(cfg.tracker, environ={}).spec.alerts.rules}
    assert rules["nan_loss"].condition == "isnan(train/loss)"
    assert rules["nan_loss"].level == "critical"
    assert rules["loss_spike"].condition == "zscore(train/loss[20]) > 3"
    assert rules["hung_run"].condition == "no_data(1h)" and rules["hung_run"].level == "warning"
    assert {"et_nan_guard", "et_spike", "et_diverging", "et_hung_run"} <= set(rules)


APP = """
import math, sys
import hydra
import expr_tracker as et

@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg):
    et.init(spec=cfg.tracker)
    for step in range(5):
        et.log({"train/loss": math.nan if step == 3 else 1.0 / (step + 1)})
    et.finish()

if __name__ == "__main__":
    main()
"""


def test_a_rule_set_on_a_metric_the_run_never_logs_is_reported(tmp_path):
    """The app logs train/loss; nan_guard with the default guard_metric reads `loss`: the
    finish warning names the rule, the metric and the close match. With guard_metric set,
    the guard fires on the NaN and nothing is reported."""
    import subprocess
    import sys

    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "config.yaml").write_text(
        "defaults:\n  - tracker: default\n  - _self_\ntracker:\n  project: app\n"
    )
    (tmp_path / "app.py").write_text(APP)

    def run(*overrides):
        return subprocess.run(
            [sys.executable, "app.py", "+tracker/alerts=nan_guard", *overrides],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )

    proc = run("tracker.name=default_metric")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert "alert rule 'et_nan_guard' reads metric 'loss', which was never logged" in out
    assert "did you mean 'train/loss'?" in out

    proc = run("tracker.name=own_metric", "tracker.alerts.guard_metric=train/loss")
    assert proc.returncode == 0, proc.stderr
    assert "never logged" not in proc.stdout + proc.stderr
    lines = (tmp_path / "runs" / "app" / "own_metric" / "alerts.jsonl").read_text().splitlines()
    fired = [json.loads(x) for x in lines if json.loads(x).get("event") == "firing"]
    assert [(r["rule"], r["step"]) for r in fired] == [("et_nan_guard", 3)]


def test_a_composed_config_with_rule_sets_passes_et_config_validate(hydra_compose, tmp_path):
    from omegaconf import OmegaConf

    from expr_tracker.spec import validate_file

    cfg = hydra_compose(
        [
            "+tracker=default",
            "+tracker/alerts=[nan_guard,divergence,hung_run]",
            "tracker.alerts.guard_metric=train/loss",
        ]
    )
    path = tmp_path / "composed.yaml"
    path.write_text(OmegaConf.to_yaml(cfg.tracker, resolve=True))
    assert validate_file(str(path)) == []
