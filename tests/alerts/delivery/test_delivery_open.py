"""open_delivery: a run's delivery from plain values, with no Run object."""

from __future__ import annotations

import json

from expr_tracker.alerts.delivery import AlertMessage, run_end_message
from expr_tracker.assemble.delivery import open_delivery


def test_open_delivery_takes_plain_values_and_hands_back_close_and_stats(tmp_path):
    got = []
    spec = {
        "channels": [{"type": "callable", "name": "cb", "options": {"fn": got.append}}],
        "notify_on": ["finish"],
    }
    path = tmp_path / "alerts.jsonl"
    delivery = open_delivery(
        spec,
        path,
        context=lambda: {"project": "p", "run": "r", "step": 3},
        finish=lambda: run_end_message(["finish"], project="p", name="r", steps=4),
        start=False,
    )
    assert delivery.dispatcher.submit(AlertMessage("hello"), wait=True).ok
    delivery.close()
    assert [m.title for m in got] == ["hello", "Run p/r finished"]
    assert got[0].fields == {"project": "p", "run": "r", "step": 3}
    assert got[1].fields["steps"] == 4 and got[1].fields["status"] == "finished"
    records = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r["title"] for r in records] == ["hello", "Run p/r finished"]
    assert all(r["delivered"] for r in records)
    stats = delivery.stats()
    assert stats["channels"]["cb"]["sent"] == 2 and stats["skipped"] == {}


def test_run_end_message_for_a_failure():
    try:
        raise ValueError("diverged")
    except ValueError as exc:
        info = (type(exc), exc, exc.__traceback__)
    msg = run_end_message(["failure"], project="p", name="r", exception=info)
    assert msg.level == "error" and msg.title == "Run p/r failed: ValueError"
    assert "ValueError: diverged" in msg.traceback and msg.fields["status"] == "failed"
    assert run_end_message(["finish"], project="p", name="r", exception=info).traceback is None
    assert run_end_message([], project="p", name="r") is None
    assert run_end_message(["failure"], project="p", name="r") is None
