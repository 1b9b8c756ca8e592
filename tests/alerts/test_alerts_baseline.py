"""``baseline(metric, runs=..., q=...)`` (docs/alerts.md "Comparing with other runs"): the
arithmetic, the step lookup, the checks of a call, the peers read from a runs root at
``et.init``, and the shipped ``prune_median`` rule set pruning a bad trial."""

from __future__ import annotations

import json

import numpy as np
import pytest

import expr_tracker as et
from expr_tracker.alerts import AlertRule, RuleError
from expr_tracker.alerts.baseline import Baselines, BaselineTable, find_peers, quantile_table
from expr_tracker.alerts.testing import replay, rows_from_series
from expr_tracker.alerts.unittests import run_unit_tests


def test_quantile_table_golden_values():
    peers = [
        ([0, 1, 2, 3], [1.0, 2.0, 3.0, 4.0]),
        ([0, 2], [3.0, 5.0]),  # logs every other step: its step-0 value votes at step 1
        ([0, 1], [5.0, float("nan")]),  # ended at step 1; a NaN vote is left out
    ]
    steps, values = quantile_table(peers, 0.5)
    assert steps.tolist() == [0, 1, 2, 3]
    # step 0: 1 3 5; step 1: 2 3 (NaN out); step 2: 3 5 (the third ended at 1); step 3: 4
    # alone (the second ended at 2)
    assert values.tolist() == [3.0, 2.5, 4.0, 4.0]
    _, q90 = quantile_table(peers, 0.9)
    assert q90[0] == pytest.approx(np.quantile([1, 3, 5], 0.9))
    _, two = quantile_table(peers, 0.5, min_runs=3)
    assert two[0] == 3.0 and np.isnan(two[1:]).all()
    assert quantile_table([], 0.5)[0].tolist() == []


def test_quantile_table_blocks_match_one_pass(monkeypatch):
    rng = np.random.default_rng(0)
    peers = [(np.sort(rng.choice(50, 30, replace=False)), rng.normal(size=30)) for _ in range(7)]
    whole = quantile_table(peers, 0.3)[1]
    monkeypatch.setattr("expr_tracker.alerts.baseline._BLOCK", 4)
    np.testing.assert_array_equal(quantile_table(peers, 0.3)[1], whole)


def test_quantiles_match_numpy_with_gaps_and_nan():
    rng = np.random.default_rng(1)
    peers = []
    for _ in range(6):
        steps = np.sort(rng.choice(40, 25, replace=False))
        values = rng.normal(size=25)
        values[rng.random(25) < 0.2] = np.nan
        peers.append((steps, values))
    for q in (0.0, 0.25, 0.5, 0.9, 1.0):
        steps, got = quantile_table(peers, q)
        for k, step in enumerate(steps):
            votes = []
            for s, v in peers:
                at = np.searchsorted(s, step, side="right") - 1
                if at >= 0 and step <= s[-1] and not np.isnan(v[at]):
                    votes.append(v[at])
            want = np.quantile(votes, q) if votes else np.nan
            np.testing.assert_allclose(got[k], want, rtol=1e-12, equal_nan=True)


def test_table_lookup_is_the_last_known_step():
    table = BaselineTable(("m", None, 0.5, 1))
    assert table.at(3) is None  # empty
    table.fill([10, 20, 30, 40], [1.0, 2.0, float("nan"), 4.0], [])
    got = [table.at(s) for s in (5, 10, 15, 20, 29, 30, 35, 40, 10_000, 12, None)]
    assert got == [None, 1.0, 1.0, 2.0, 2.0, None, None, 4.0, 4.0, 1.0, None]
    many = BaselineTable(("m", None, 0.5, 1))
    many.fill(list(range(0, 1000, 2)), [float(i) for i in range(500)], [])
    assert many.at(1) == 0.0 and many.at(999) == 499.0 and many.at(501) == 250.0


@pytest.mark.parametrize(
    "cond, message",
    [
        ("x > baseline(x[3])", "one bare metric name"),
        ("x > baseline(x, 0.5)", "one bare metric name"),
        ("x > baseline(x, runs=sweep)", None),  # a bare word is text too: accepted
        ("x > baseline(x, runs=3)", "quoted glob"),
        ("x > baseline(x, runs='../other/*')", "not a path"),
        ("x > baseline(x, q=1.5)", r"q must be a quantile in \[0, 1\]"),
        ("x > baseline(x, q=-0.5)", "q must be a quantile"),
        ("x > baseline(x, q=y)", "q must be a number"),
        ("x > baseline(x, min_runs=0)", "min_runs must be a whole number"),
        ("x > baseline(x, min_runs=2.5)", "min_runs must be a whole number"),
        ("x > baseline(x, qq=0.5)", "has no argument 'qq'"),
        ("x > baseline(x, q=0.5, q=0.4)", "given twice"),
        ("x > max(x, y=2)", "takes no keyword arguments"),
        ("x > 'text'", None),  # a quoted name outside a keyword stays a metric name
    ],
)
def test_baseline_calls_are_checked_at_registration(cond, message):
    if message is None:
        AlertRule(condition=cond)
        return
    with pytest.raises(RuleError, match=message):
        AlertRule(condition=cond)


def test_baseline_renders_and_reparses():
    rule = AlertRule.parse("val/loss > baseline(val/loss, runs='sw/*', q=0.25) => prune")
    assert str(rule) == 'val/loss > baseline(val/loss, runs="sw/*", q=0.25) => prune'
    again = AlertRule.parse(str(rule))
    assert (again.condition, again.action) == (rule.condition, rule.action)
    assert again.name.split("#")[1] == rule.name.split("#")[1]  # the same hashed identity
    assert rule.metrics == ("val/loss",)  # the glob is no metric


def test_replay_with_in_memory_peers():
    peers = {
        "sw/a": {"loss": ([0, 1, 2, 3], [4.0, 3.0, 2.0, 1.0])},
        "sw/b": {"loss": ([0, 1, 2, 3], [4.0, 3.5, 3.0, 2.5])},
        "other/c": {"loss": ([0, 1, 2, 3], [0.0, 0.0, 0.0, 0.0])},
    }
    rule = "loss > baseline(loss, runs='sw/*', q=1) for 2 => prune: worse than every peer"
    cap = replay(
        [rule], rows_from_series({"loss": [4, 3.6, 3.1, 3.0]}), baselines=Baselines(peers=peers)
    )
    assert [(e.step, e.action) for e in cap.fired()] == [(2, "prune")]
    assert 'baseline(loss, runs="sw/*", q=1)=3' in cap.fired()[0].observed


def _finished_run(root, project, name, losses, status="finished"):
    with et.init(project=project, name=name, dir=root) as run:
        for v in losses:
            et.log({"val/loss": v})
    if status != "finished":
        path = run.dir / "run.json"
        info = json.loads(path.read_text())
        info["status"] = status
        path.write_text(json.dumps(info))


def test_peers_are_the_finished_runs_matching_the_glob(tmp_path):
    _finished_run(tmp_path, "sw", "a", [3, 2, 1])
    _finished_run(tmp_path, "sw", "b", [5, 4, 3])
    _finished_run(tmp_path, "sw", "pruned", [9, 9, 9], status="pruned")
    _finished_run(tmp_path, "sw", "crashed", [9, 9, 9], status="failed")
    _finished_run(tmp_path, "other", "c", [0, 0, 0])
    names = lambda paths: [p.name for p in paths]  # noqa: E731
    assert names(find_peers(tmp_path, "sw/*")) == ["a", "b"]
    assert names(find_peers(tmp_path, "sw")) == ["a", "b"]
    assert names(find_peers(tmp_path, "*/[ac]")) == ["c", "a"]  # by project, then name
    assert names(find_peers(tmp_path, "sw/*", exclude=tmp_path / "sw" / "a")) == ["b"]
    assert find_peers(tmp_path / "missing", "sw/*") == []

    rules = ["val/loss > baseline(val/loss) => stop: worse than the median"]
    with et.init(project="sw", name="new", dir=tmp_path, alert_rules=rules) as run:
        for v in [3.5, 3.1, 2.5]:
            et.log({"val/loss": v})
        stats = et.info()["alerts"]["baselines"]
        assert stats == {"baseline(val/loss, runs=sw/*, q=0.5)": {"runs": 2, "steps": 3}}
        # medians 4, 3, 2: 3.5 is not above 4; 3.1 is above 3 -> stop at step 1
        assert run.stop_request.step == 1
    # a rule added later reads its peers at once
    with et.init(project="sw", name="late", dir=tmp_path) as run:
        et.add_alert_rule("val/loss > baseline(val/loss, runs='other/*') => stop")
        et.log({"val/loss": 0.5})
        assert run.should_stop()


def test_shipped_rule_set_prunes_a_diverging_trial(tmp_path):
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="expr_tracker.conf", version_base="1.3"):
        cfg = compose(
            overrides=[
                "+tracker=default",
                "+tracker/alerts=prune_median",
                "tracker.alerts.guard_metric=val/loss",
            ]
        )
    GlobalHydra.instance().clear()
    from omegaconf import OmegaConf

    tracker = OmegaConf.to_container(cfg.tracker, resolve=True)
    (rule,) = tracker["alerts"]["rules"].values()
    assert rule["condition"] == "`val/loss` > baseline(`val/loss`, q=0.5, min_runs=3)"
    # three "learning rates" that converge, one that diverges; 60 logged steps each
    for i, rate in enumerate([0.05, 0.06, 0.07]):
        _finished_run(tmp_path, "sweep", f"ok{i}", [float(np.exp(-rate * s)) for s in range(60)])
    stopped = None
    with et.init(project="sweep", name="diverging", dir=tmp_path, spec=tracker) as run:
        for s in range(60):
            et.log({"val/loss": 1.0 + 0.01 * s})
            if et.should_stop():
                stopped = s
                break
    # above the median from step 1 on; 20 steps in a row -> pruned at step 20
    assert stopped == 20 and run.stop_request.action == "prune"
    assert json.loads((run.dir / "run.json").read_text())["status"] == "pruned"
    # a peer of the same quality is never pruned
    with et.init(project="sweep", name="fine", dir=tmp_path, spec=tracker) as run:
        for s in range(60):
            et.log({"val/loss": float(np.exp(-0.06 * s))})
        assert not et.should_stop()


def test_unit_files_give_peer_runs(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(
        "rules:\n"
        "  - name: worse\n"
        "    condition: loss > baseline(loss, runs='sw/*', min_runs=2)\n"
        "    action: prune\n"
        "    for_steps: 2\n"
        "tests:\n"
        "  - input_series: {loss: '5 4 3 3 3'}\n"
        "    peer_runs:\n"
        "      sw/a: {loss: '5-1x4'}\n"
        "      sw/b: {loss: '5 4 _ 2 2'}  # step 2 votes its step-1 value\n"
        "    expected_alerts:\n"
        "      - {rule: worse, action: prune, steps: [4]}\n"
    )
    failures, _, n = run_unit_tests(path)
    assert (failures, n) == ([], 1)
