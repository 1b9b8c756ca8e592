"""Rules that act (docs/alerts.md "Actions") and the one-line ``for N``: ``=> stop`` and
``=> prune`` parsed, recorded, taken once, and what the run and the loop see."""

from __future__ import annotations

import json
import sys
import types

import pytest

import expr_tracker as et
from expr_tracker.alerts import AlertEngine, AlertRule, RuleError, make_rule
from expr_tracker.alerts.testing import replay, rows_from_series
from expr_tracker.alerts.unittests import run_unit_tests

# -- the one-line form -------------------------------------------------------------------------


def test_for_n_is_for_steps_and_round_trips():
    rule = AlertRule.parse("gpu0/memory_used_pct > 95 for 3 => warning: high")
    assert (rule.for_steps, rule.level, rule.action) == (3, "warning", None)
    assert str(rule) == "gpu0/memory_used_pct > 95 for 3 => warning: high"
    assert AlertRule.parse(str(rule)) == rule
    # fires after 3 consecutive true steps, not before
    cap = replay([rule], rows_from_series({"gpu0/memory_used_pct": [96, 96, 90, 96, 96, 96, 96]}))
    assert [e.step for e in cap.fired()] == [5]


@pytest.mark.parametrize("bad", ["loss > 1 for 0 => error", "loss > 1 for 5m => error"])
def test_for_n_needs_a_whole_number_of_steps(bad):
    with pytest.raises(RuleError, match="whole number of consecutive steps"):
        AlertRule.parse(bad)


def test_for_inside_a_quoted_name_is_part_of_the_name():
    rule = AlertRule.parse("'wait for 3' > 1 => info")
    assert rule.metrics == ("wait for 3",) and rule.for_steps == 1


def test_a_condition_field_ending_in_for_says_to_use_for_steps():
    with pytest.raises(RuleError, match="for_steps"):
        make_rule({"condition": "loss > 1 for 3", "level": "error"})


def test_spec_entries_take_for_and_actions():
    from expr_tracker.spec import resolve

    spec = resolve(
        {"alerts": {"rules": {"slow": "loss > 1 for 4 => stop: too slow"}}}, environ={}
    ).spec
    (entry,) = spec.alerts.rules
    assert (entry.condition, entry.for_steps, entry.action, entry.level) == (
        "loss > 1",
        4,
        "stop",
        None,
    )
    rule = make_rule(entry)
    assert (rule.name, rule.level, rule.action) == ("slow", "error", "stop")


# -- actions in the engine ---------------------------------------------------------------------


def test_action_rules_default_to_error_and_name_by_action():
    stop = AlertRule.parse("loss > 5 => stop: diverged")
    assert (stop.action, stop.level) == ("stop", "error")
    assert stop.name.endswith("]") and "[stop#" in stop.name
    assert AlertRule.parse(str(stop)) == stop
    assert make_rule({"condition": "loss > 5", "action": "prune", "level": "info"}).level == "info"
    # names of rules without an action are unchanged by the new field
    assert AlertRule.parse("loss > 5 => error").name == "loss > 5 [error#dd461e]"
    with pytest.raises(RuleError, match="action must be one of stop, prune"):
        make_rule({"condition": "loss > 5", "action": "halt"})


def test_the_action_is_taken_once_on_firing_and_recorded():
    taken, records = [], []
    engine = AlertEngine(
        ["loss > 5 for 2 => stop: diverged"],
        on_action=taken.append,
        record=lambda ev: records.append(ev.to_record()),
        notify=lambda ev: None,
    )
    for i, v in enumerate([1, 6, 7, 8, 1, 9, 9]):
        engine.on_step({"_step": i, "loss": float(v)})
    assert [(e.step, e.action) for e in taken] == [(2, "stop"), (6, "stop")]
    firing = [r for r in records if r["event"] == "firing"]
    assert [r["action"] for r in firing] == ["stop", "stop"]
    assert all("action" not in r for r in records if r["event"] != "firing")


def test_an_action_is_taken_on_a_rank_that_does_not_deliver():
    taken = []
    engine = AlertEngine(["loss > 5 => prune"], on_action=taken.append, deliver=False)
    engine.on_step({"_step": 0, "loss": 9.0})
    assert [e.action for e in taken] == ["prune"]


# -- the run -----------------------------------------------------------------------------------


def test_should_stop_turns_true_at_the_step_boundary(tmp_path):
    assert et.should_stop() is False  # no run
    with et.init(project="p", name="r", dir=tmp_path, alert_rules=["loss > 5 => stop: high"]):
        seen = []
        for loss in [1.0, 2.0, 9.0, 1.0, 1.0]:
            et.log({"loss": loss})
            seen.append(et.should_stop())
            if et.should_stop():
                break
        assert seen == [False, False, True]
        request = et.run.stop_request
        assert (request.action, request.step, request.message) == ("stop", 2, "high")
    info = json.loads((tmp_path / "p" / "r" / "run.json").read_text())
    assert info["status"] == "finished"  # a stop ends the run well
    assert info["stop_request"]["action"] == "stop"
    lines = [
        json.loads(x) for x in (tmp_path / "p" / "r" / "alerts.jsonl").read_text().splitlines()
    ]
    assert [x.get("action") for x in lines if x.get("event") == "firing"] == ["stop"]


def test_prune_outside_optuna_stops_and_ends_pruned(tmp_path):
    with et.init(project="p", name="r", dir=tmp_path, alert_rules=["loss > 5 => prune: bad"]):
        for loss in [9.0, 1.0, 1.0]:
            et.log({"loss": loss})  # never raises outside an Optuna objective
        assert et.should_stop()
    info = json.loads((tmp_path / "p" / "r" / "run.json").read_text())
    assert info["status"] == "pruned"
    from expr_tracker.history.rundirs import worst_status

    assert worst_status(["finished", "pruned"]) == "pruned"
    assert worst_status(["pruned", "failed"]) == "failed"


@pytest.fixture
def fake_optuna(monkeypatch):
    """A stand-in with Optuna's shapes: ``optuna.TrialPruned`` and ``Study.optimize``'s
    ``optuna.study._optimize._run_trial(study, func, catch)``, which calls the objective and
    records a ``TrialPruned`` as a pruned trial."""
    optuna = types.ModuleType("optuna")

    class TrialPruned(Exception):
        pass

    optuna.TrialPruned = TrialPruned
    optimize = types.ModuleType("optuna.study._optimize")
    code = (
        "def _run_trial(study, func, catch):\n"
        "    try:\n"
        "        return 'complete', func(None)\n"
        "    except TrialPruned as exc:\n"
        "        return 'pruned', str(exc)\n"
    )
    optimize.__dict__["TrialPruned"] = TrialPruned
    exec(compile(code, "optuna/study/_optimize.py", "exec"), optimize.__dict__)
    monkeypatch.setitem(sys.modules, "optuna", optuna)
    monkeypatch.setitem(sys.modules, "optuna.study._optimize", optimize)
    return optimize


def test_prune_inside_an_optuna_objective_raises_trial_pruned(tmp_path, fake_optuna):
    logged = []

    def objective(trial):
        et.init(project="p", name="t", dir=tmp_path, alert_rules=["loss > 5 for 2 => prune: bad"])
        for step in range(10):
            et.log({"loss": 9.0})
            logged.append(step)
        return 1.0

    state, message = fake_optuna._run_trial(None, objective, ())
    assert state == "pruned" and "bad" not in message and "step 1" in message
    # fired while logging step 2 (the commit of step 1); the next log() raised
    assert logged == [0, 1]
    assert et.run is None  # the pruned run was finished, the next trial can start
    info = json.loads((tmp_path / "p" / "t" / "run.json").read_text())
    assert info["status"] == "pruned" and info["stop_request"]["step"] == 1
    rows = (tmp_path / "p" / "t" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 3  # the values of the raising log() were kept


# -- et rules test -----------------------------------------------------------------------------


def test_unit_files_assert_actions(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(
        "rules:\n"
        "  - name: diverged\n"
        "    condition: loss > 5\n"
        "    action: stop\n"
        "    for_steps: 2\n"
        "  - name: spike\n"
        "    condition: loss > 5\n"
        "tests:\n"
        "  - input_series: {loss: '1 6 7 8'}\n"
        "    expected_alerts:\n"
        "      - {rule: diverged, action: stop, steps: [2]}\n"
        "      - {rule: spike, steps: [1]}\n"
    )
    failures, _, n = run_unit_tests(path)
    assert (failures, n) == ([], 1)
    path.write_text(
        path.read_text()
        .replace("action: stop, steps: [2]", "action: prune, steps: [2]")
        .replace("{rule: spike, steps: [1]}", "{rule: spike, action: stop, steps: [1]}")
    )
    failures, _, _ = run_unit_tests(path)
    assert failures == [
        "test #1: rule 'diverged' has action stop, expected prune",
        "test #1: rule 'spike' has action none, expected stop",
    ]
