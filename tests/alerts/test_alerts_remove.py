"""``et.list_alert_rules()`` / ``et.remove_alert_rule(name)`` and the engine's
``remove_rule``: a removed rule is not evaluated on later rows, its state is dropped, a
``removed`` transition is recorded and nothing is notified; removing from another thread
never breaks an evaluation in progress."""

from __future__ import annotations

import json
import threading

import pytest

import expr_tracker as et
from expr_tracker import _current
from expr_tracker.alerts import AlertEngine
from expr_tracker.alerts.testing import EventCapture
from expr_tracker.errors import NoActiveRunError
from expr_tracker.testing import InMemoryChannel


@pytest.fixture(autouse=True)
def _no_configured_alert(monkeypatch):
    monkeypatch.setattr(_current, "configured_alert", {})


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


# ------------------------------------------------------------------------- the public API


def test_list_alert_rules_without_a_run_or_with_alerts_off_is_empty(tmp_path):
    assert et.list_alert_rules() == []
    et.init(project="p", dir=str(tmp_path), alert=False)
    assert et.list_alert_rules() == []
    with pytest.raises(KeyError, match="alerts are disabled"):
        et.remove_alert_rule("anything")
    et.finish()


def test_remove_alert_rule_without_a_run_raises():
    with pytest.raises(NoActiveRunError):
        et.remove_alert_rule("spike")


def test_list_gives_the_registered_alert_rule_objects_in_order(tmp_path):
    et.init(
        project="p",
        dir=str(tmp_path),
        alert_rules=[{"name": "from_spec", "condition": "loss > 9", "level": "crit"}],
    )
    added = et.add_alert_rule("acc < 0.1 => warn: low", name="added")
    rules = et.list_alert_rules()
    assert [r.name for r in rules] == ["from_spec", "added"]
    assert all(isinstance(r, et.AlertRule) for r in rules)
    assert rules[1] is added
    assert rules[0].level == "critical" and rules[0].level >= et.AlertLevel.ERROR
    assert rules[0].source == "loss > 9"
    rules.clear()  # a copy: the run's rules are untouched
    assert len(et.list_alert_rules()) == 2
    et.finish()


def test_removed_rule_stops_firing_on_later_rows(tmp_path):
    run = et.init(
        project="p",
        dir=str(tmp_path),
        alert={"channels": {"mem": {"type": "memory", "policy": {"async_send": False}}}},
        alert_rules=[
            {"name": "high", "condition": "loss > 5", "level": "error", "mode": "level",
             "cooldown": 0},
            {"name": "nan", "condition": "isnan(loss)", "level": "critical"},
        ],
    )  # fmt: skip
    mem = InMemoryChannel.get("mem")
    et.log({"loss": 9.0})
    assert mem.titles == ["high"]  # delivered before log returned (async_send false)
    removed = et.remove_alert_rule("high")
    assert isinstance(removed, et.AlertRule) and removed.name == "high"
    assert [r.name for r in et.list_alert_rules()] == ["nan"]
    for _ in range(3):
        et.log({"loss": 9.0})  # level mode with cooldown 0 would notify on each row
    et.log({"loss": float("nan")})
    assert mem.titles == ["high", "nan"]  # the other rule still works
    stats = et.info()["alerts"]["rules"]
    assert "high" not in stats and stats["nan"]["fires"] == 1
    et.finish()
    records = [r for r in _records(run.dir / "alerts.jsonl") if r["kind"] == "transition"]
    assert [(r["rule"], r["event"]) for r in records] == [
        ("high", "firing"),
        ("high", "removed"),
        ("nan", "firing"),
    ]
    gone = records[1]
    assert gone["notify"] is False and gone["state"] == "removed" and gone["step"] == 0
    assert "while firing" in gone["message"]


def test_removing_a_firing_rule_sends_no_resolved_notice(tmp_path):
    et.init(
        project="p",
        dir=str(tmp_path),
        alert={"channels": {"mem": {"type": "memory", "policy": {"async_send": False}}}},
        alert_rules=[{"name": "high", "condition": "loss > 5", "notify_recovery": True}],
    )
    mem = InMemoryChannel.get("mem")
    et.log({"loss": 9.0})
    et.remove_alert_rule(et.list_alert_rules()[0])  # the AlertRule object works too
    et.log({"loss": 1.0})  # would have resolved it
    et.finish()
    assert mem.titles == ["high"]


def test_a_removed_rule_can_be_added_again_with_a_fresh_state(tmp_path):
    et.init(
        project="p",
        dir=str(tmp_path),
        alert={"channels": {"mem": {"type": "memory", "policy": {"async_send": False}}}},
    )
    mem = InMemoryChannel.get("mem")
    rule = et.add_alert_rule("loss > 5 => error: high", name="high", for_steps=2)
    et.log({"loss": 9.0})  # pending (1 of 2)
    et.remove_alert_rule("high")
    et.add_alert_rule(rule)
    et.log({"loss": 9.0})  # the streak restarted: still pending
    assert mem.titles == []
    et.log({"loss": 9.0})
    assert mem.titles == ["high"]
    et.finish()


def test_unknown_name_raises_key_error_listing_the_rules(tmp_path):
    et.init(
        project="p",
        dir=str(tmp_path),
        alert_rules=[{"name": "loss_spike", "condition": "loss > 1"}],
    )
    with pytest.raises(KeyError) as info:
        et.remove_alert_rule("loss_spik")
    text = str(info.value)
    assert "'loss_spik'" in text and "did you mean 'loss_spike'" in text
    assert "registered: 'loss_spike'" in text
    with pytest.raises(KeyError, match="no alert rule 42"):
        et.remove_alert_rule(42)
    assert [r.name for r in et.list_alert_rules()] == ["loss_spike"]  # nothing removed
    et.finish()


def test_remove_from_another_thread_while_the_training_thread_logs(tmp_path):
    """Rows committed concurrently with the removal are evaluated completely, before or
    after it: no exception, and once remove_alert_rule returned the rule never fires."""
    et.init(
        project="p",
        dir=str(tmp_path),
        alert={"channels": {"mem": {"type": "memory"}}},
        alert_rules=[
            {"name": "flip", "condition": "x > 0", "mode": "level", "cooldown": 0},
        ],
    )
    removed = threading.Event()
    errors: list[BaseException] = []

    def remover():
        try:
            et.remove_alert_rule("flip")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        removed.set()

    thread = threading.Thread(target=remover)
    for i in range(200):
        if i == 50:
            thread.start()
        et.log({"x": 1})
    thread.join()
    assert errors == [] and removed.is_set()
    run = et.get_run()
    records = _records(run.dir / "alerts.jsonl")
    events = [r["event"] for r in records if r["kind"] == "transition"]
    assert events[-1] == "removed" and events.count("removed") == 1
    fires_at_removal = events.count("firing") + events.count("repeat")
    for _ in range(20):
        et.log({"x": 1})
    records = _records(run.dir / "alerts.jsonl")
    events = [r["event"] for r in records if r["kind"] == "transition"]
    assert events.count("firing") + events.count("repeat") == fires_at_removal
    et.finish()


# -------------------------------------------------------------------------- the engine


def test_engine_remove_waits_for_an_evaluation_in_progress():
    """An evaluation holding the engine lock (here: stopped inside it, in the clock the
    engine reads while processing a row) completes before remove_rule takes the rule out;
    the row's transition comes before the removal in the record."""
    inside = threading.Event()
    release = threading.Event()
    block = {"on": False}

    def clock():
        if block["on"]:
            block["on"] = False
            inside.set()
            release.wait(10)
        return 0.0

    rec, note = EventCapture(), EventCapture()
    engine = AlertEngine(["x > 0 => error: x"], clock=clock, record=rec, notify=note)
    name = engine.rules[0].name
    block["on"] = True
    step = threading.Thread(target=engine.on_step, args=({"_step": 0, "x": 1.0},))
    step.start()
    assert inside.wait(10)  # the row is being processed, under the engine lock
    result: list = []
    remover = threading.Thread(target=lambda: result.append(engine.remove_rule(name)))
    remover.start()
    release.set()
    step.join()
    remover.join()
    assert result[0].name == name
    assert [e.kind for e in rec.events] == ["firing", "removed"]
    assert [e.kind for e in note.events] == ["firing"]  # removed is recorded, not notified
    engine.on_step({"_step": 1, "x": 1.0})
    assert engine.rules == [] and engine.stats()["rules"] == {}
    assert engine.remove_rule(name) is None


def test_engine_remove_after_close_records_nothing():
    cap = EventCapture()
    engine = AlertEngine(["x > 0 => error: x"], record=cap)
    engine.close()
    assert engine.remove_rule(engine.rules[0].name) is not None
    assert cap.events == []


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_forked_child_that_inherited_the_run_gets_the_fork_error(tmp_path):
    import os

    et.init(project="p", dir=str(tmp_path), alert_rules=[{"name": "a", "condition": "x > 1"}])
    pid = os.fork()
    if pid == 0:  # the child: both calls raise ForkedRunError, the parent's rules stay
        code = 0
        for call in (et.list_alert_rules, lambda: et.remove_alert_rule("a")):
            try:
                call()
                code = 1
            except et.ForkedRunError:
                pass
            except BaseException:  # noqa: BLE001
                code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert [r.name for r in et.list_alert_rules()] == ["a"]
    et.finish()
