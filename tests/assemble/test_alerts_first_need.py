"""A run started with no rule, channel or notify_on builds its alert engine and delivery on
first need (docs/architecture.md "Cold start"), and then behaves as one built at the start."""

from __future__ import annotations

import json

import pytest

import expr_tracker as et


def start(tmp_path, **kw):
    return et.init(project="p", name="r", dir=str(tmp_path), system={"enabled": False}, **kw)


def records(run):
    path = run.dir / "alerts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(autouse=True)
def _finish():
    yield
    et.finish()


def test_no_engine_until_a_rule_is_added_then_it_fires(tmp_path, capfd):
    run = start(tmp_path)
    assert run._alerts is None and run._dispatcher is None  # nothing built at init
    et.log({"loss": 0.5})
    et.add_alert_rule("loss > 1 => error: high")
    assert run.alerts is not None and run.dispatcher is not None
    et.log({"loss": 2.0})
    et.finish()
    assert [r["event"] for r in records(run) if r.get("event") == "firing"] == ["firing"]
    assert "high" in capfd.readouterr().err  # the console delivery, as at the start


def test_a_direct_alert_goes_through_the_runs_delivery(tmp_path):
    run = start(tmp_path)
    assert et.alert("stuck", "no progress", level="warning") is True
    et.finish()
    assert any(r.get("title") == "stuck" or "stuck" in json.dumps(r) for r in records(run))


def test_info_has_the_alert_sections_of_a_run_built_at_the_start(tmp_path):
    run = start(tmp_path)
    info = run.info()
    assert info["alerts"]["rules"] == {} and "console" in info["delivery"]["channels"]


def test_rules_channels_or_notify_on_build_it_at_the_start(tmp_path):
    for kw in (
        {"alert_rules": ["loss > 1 => error: high"]},
        {"notify_on": ["finish"]},
        {"alert": {"channels": [{"type": "console"}]}},
    ):
        run = start(tmp_path, **kw)
        assert run._alerts is not None, kw
        et.finish()


def test_disabled_alerts_build_nothing_ever(tmp_path):
    run = start(tmp_path, alert=False)
    assert run.alerts is None and run.dispatcher is None and run.alert_rules() == []


def test_a_finished_run_builds_no_engine(tmp_path):
    run = start(tmp_path)
    et.finish()
    assert run.alerts is None and run.alert_rules() == []


def test_a_forked_child_sends_as_without_a_run_and_builds_nothing(tmp_path, monkeypatch):
    from expr_tracker.alerts.delivery import direct

    run = start(tmp_path)
    with monkeypatch.context() as m:
        m.setattr(type(run), "forked", property(lambda self: True))
        assert direct._run_dispatcher() is None  # the run-less dispatcher, as before
        assert run.alerts is None and run.alerts_deferred
