"""``AlertMessage.level`` is an ``et.AlertLevel`` (equal to its name, ordered by severity) in
every message a channel receives; ``alerts.on_rank: null`` delivers on every rank, as
``all`` does (docs/alerts.md "Alert types", docs/channels.md)."""

from __future__ import annotations

import json

import pytest

import expr_tracker as et
from expr_tracker.alerts.delivery.message import AlertMessage, event_to_message, run_end_message
from expr_tracker.testing import capture_alerts


def test_message_level_is_an_alert_level():
    m = AlertMessage("t", level="Fatal")
    assert m.level is et.AlertLevel.CRITICAL and type(m.level) is et.AlertLevel
    assert m.level == "critical" and isinstance(m.level, str)
    assert m.level > "error" and m.level >= et.AlertLevel.ERROR and not m.level < "warn"
    assert m.rank == 4 and f"{m.level}" == "critical" and str(m.level) == "critical"
    assert AlertMessage("t").level is et.AlertLevel.WARNING
    with pytest.raises(ValueError, match="not an alert level"):
        AlertMessage("t", level="loud")
    # written as the plain name in what leaves the process
    d = m.to_dict()
    assert type(d["level"]) is str and json.loads(json.dumps(d))["level"] == "critical"
    values = m.values()
    assert type(values["level"]) is str and values["LEVEL"] == "CRITICAL"
    assert m.plain_text().startswith("[CRITICAL] t")
    assert m.copy(level="debug").level is et.AlertLevel.DEBUG
    # the dedup key of a message is the same as with the plain string
    assert m.key() == AlertMessage("t", level="critical").key()


def test_rule_and_run_end_messages_carry_alert_levels():
    class Event:
        rule = "r"
        level = "err"
        title = "x"
        message = "m"
        step = 3

    assert event_to_message(Event()).level is et.AlertLevel.ERROR
    done = run_end_message(["finish"], project="p", name="n")
    assert done.level is et.AlertLevel.INFO


def test_rule_alerts_reach_channels_with_an_alert_level(tmp_path):
    got = []
    et.init(
        project="p",
        name="lv",
        dir=tmp_path / "runs",
        alert={
            "channels": [{"type": "callable", "name": "cb", "options": {"fn": got.append}}],
            "policy": {"async_send": False, "rate_limit_per_minute": None},
        },
        alert_rules=["loss > 1 => crit: high"],
    )
    with capture_alerts() as captured:
        et.log({"loss": 2.0})
        et.alert("manual", level="warn")
    et.finish()
    by_title = {m.title: m for m in got}
    assert by_title["manual"].level is et.AlertLevel.WARNING
    (rule_msg,) = [m for m in got if m.rule]
    assert rule_msg.level is et.AlertLevel.CRITICAL and rule_msg.level == "critical"
    assert all(type(m.level) is et.AlertLevel for m in captured.messages)
    records = [
        json.loads(x)
        for x in (tmp_path / "runs" / "p" / "lv" / "alerts.jsonl").read_text().splitlines()
    ]
    assert {r["level"] for r in records} <= {"critical", "warning"}


@pytest.mark.parametrize("on_rank", [None, "all"])
def test_on_rank_null_delivers_on_every_rank(tmp_path, monkeypatch, on_rank):
    monkeypatch.setenv("RANK", "3")
    got = []
    run = et.init(
        project="p",
        name="ranks",
        dir=tmp_path / "runs",
        alert={
            "on_rank": on_rank,
            "channels": [{"type": "callable", "name": "cb", "options": {"fn": got.append}}],
            "policy": {"async_send": False, "rate_limit_per_minute": None},
        },
    )
    assert run.rank == 3 and run.spec.alerts.on_rank == "all"
    assert et.alert("from rank 3")
    et.finish()
    assert [m.title for m in got] == ["from rank 3"]


def test_on_rank_default_still_rank_zero_only(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    got = []
    et.init(
        project="p",
        name="ranks0",
        dir=tmp_path / "runs",
        alert={"channels": [{"type": "callable", "name": "cb", "options": {"fn": got.append}}]},
    )
    assert et.alert("muted") is False
    et.finish()
    assert got == []
