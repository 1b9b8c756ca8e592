"""``et.run``, ``et.config`` and ``et.summary`` follow the current run (expr_tracker/proxies.py,
the module ``__getattr__`` of expr_tracker/__init__.py)."""

from __future__ import annotations

import json

import pytest

import expr_tracker as et
from expr_tracker import config as captured_config
from expr_tracker import summary as captured_summary


def test_run_is_the_current_run_or_none():
    assert et.run is None
    run = et.init(project="p", name="r")
    assert et.run is run and isinstance(et.run, et.Run)
    et.finish()
    assert et.run is None


def test_proxies_captured_before_init_follow_the_current_run():
    first = et.init(project="p", name="a", config={"lr": 0.1})
    assert captured_config.lr == 0.1
    captured_summary["best"] = 1
    et.finish()
    second = et.init(project="p", name="b", config={"lr": 0.2})
    assert captured_config.lr == 0.2
    assert "best" not in captured_summary
    assert first.summary["best"] == 1 and second is et.run


def test_use_without_a_run_raises_saying_to_call_init():
    for use in (
        lambda: et.config.lr,
        lambda: et.config.update({"a": 1}),
        lambda: et.config["a"],
        lambda: et.summary["a"],
        lambda: et.summary.update({"a": 1}),
        lambda: et.summary(),
        lambda: "a" in et.config,
    ):
        with pytest.raises(et.NoActiveRunError, match=r"call et\.init"):
            use()
    # repr and bool never raise (debuggers, logging)
    assert "no active run" in repr(et.config) and not et.config and not et.summary


def test_summary_mapping_and_callable():
    run = et.init(project="p", name="r")
    events = []
    run.subscribe(lambda event, payload: events.append((event, payload)))
    et.log({"loss": 0.5})
    et.summary["best"] = 0.9
    et.summary.update({"epochs": 3, "final": "ok"})
    assert et.summary["loss"] == 0.5 and et.summary["best"] == 0.9
    assert et.summary() is run.summary  # the old callable form
    assert "epochs" in et.summary and len(et.summary) >= 4
    assert events == [
        ("summary", {"changes": {"best": 0.9}}),
        ("summary", {"changes": {"epochs": 3, "final": "ok"}}),
    ]
    et.finish()
    saved = json.loads((run.dir / "summary.json").read_text())
    assert saved["best"] == 0.9 and saved["epochs"] == 3 and saved["loss"] == 0.5
