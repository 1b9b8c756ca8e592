"""``et.run``, ``et.config`` and ``et.summary`` follow the current run (expr_tracker/proxies.py,
the module ``__getattr__`` of expr_tracker/__init__.py)."""

from __future__ import annotations

import copy
import json
import os
import pickle

import pytest
from helpers import run_py

import expr_tracker as et
from expr_tracker import config as captured_config
from expr_tracker import summary as captured_summary
from expr_tracker.runconfig import RunConfig


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


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_reads_config_and_summary_and_cannot_change_them(tmp_path):
    # a Dataset holding wandb.config, read in a forked DataLoader worker (wandb allows it)
    code = """
    import json, os, sys, expr_tracker as et
    run = et.init(project="p", name="r", dir=sys.argv[1], config={"seq_len": 8})
    et.summary["best"] = 0.5
    cfg = et.config
    pid = os.fork()
    if pid == 0:
        code = 0
        if not (cfg.seq_len == 8 and et.config["seq_len"] == 8 and run.config.seq_len == 8
                and dict(et.config) == {"seq_len": 8} and "seq_len" in et.config
                and et.summary["best"] == 0.5):
            code = 10
        for change in (
            lambda: et.config.update({"x": 1}),
            lambda: setattr(et.config, "x", 1),
            lambda: et.config.__setitem__("x", 1),
            lambda: run.config.update({"x": 1}),
            lambda: et.summary.update({"y": 1}),
            lambda: et.summary.__setitem__("y", 1),
            lambda: run.summary.update({"y": 1}),
        ):
            try:
                change()
                code = 11
            except et.ForkedRunError:
                pass
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    print("child exit", os.waitstatus_to_exitcode(status), flush=True)
    et.finish()
    print(json.dumps(json.load(open(run.dir / "config.json"))))
    """
    p = run_py(code, str(tmp_path / "runs"))
    assert "child exit 0" in p.stdout, p.stdout + p.stderr
    assert p.stdout.splitlines()[-1] == '{"seq_len": 8}'


def test_pickled_or_copied_config_is_a_detached_snapshot():
    # a Dataset holding wandb.config sent to a spawned worker is pickled
    run = et.init(project="p", name="r", config={"seq_len": 8, "model": {"depth": 2}})
    for copy_of in (lambda c: pickle.loads(pickle.dumps(c)), copy.deepcopy, copy.copy):
        for source in (et.config, run.config):
            snap = copy_of(source)
            assert isinstance(snap, RunConfig) and snap is not run.config
            assert snap.seq_len == 8 and dict(snap) == {"seq_len": 8, "model": {"depth": 2}}
            snap.update({"extra": 1})  # the snapshot only: bound to no file and no run
    assert "extra" not in run.config
    assert json.loads((run.dir / "config.json").read_text()) == run.config.as_dict()
    et.finish()
    with pytest.raises(et.NoActiveRunError):
        pickle.dumps(et.config)


def test_summary_attribute_access_is_a_summary_key():
    # wandb scripts write `wandb.run.summary.best_acc = 0.9` (was a Python attribute on
    # the Summary object: silently missing from summary.json) and read `wandb.summary.loss`
    run = et.init(project="p", name="r")
    et.log({"loss": 0.5})
    et.run.summary.best_acc = 0.9
    et.summary.epochs = 3
    assert et.summary.loss == 0.5 and run.summary.best_acc == 0.9
    assert run.summary["epochs"] == 3
    with pytest.raises(AttributeError, match="nope"):
        _ = et.summary.nope
    assert not hasattr(run.summary, "nope")
    et.finish()
    saved = json.loads((run.dir / "summary.json").read_text())
    assert saved["best_acc"] == 0.9 and saved["epochs"] == 3 and saved["loss"] == 0.5
