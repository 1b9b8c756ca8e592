"""merge(): the one function that folds spec sources, later wins."""

from __future__ import annotations

from expr_tracker.spec.merge import Layer, merge, merge_layers


def test_mappings_merge_deeply():
    a = {"history": {"buffer": {"size": 10, "interval": 2}, "rank_aware": False}}
    b = {"history": {"buffer": {"size": 20}}}
    assert merge(a, b) == {"history": {"buffer": {"size": 20, "interval": 2}, "rank_aware": False}}


def test_other_lists_are_replaced():
    assert merge({"tags": ["a", "b"]}, {"tags": ["c"]}) == {"tags": ["c"]}
    assert merge(
        {"spans": {"plugins": [{"type": "cpu"}]}}, {"spans": {"plugins": [{"type": "gpu"}]}}
    ) == {"spans": {"plugins": [{"type": "gpu"}]}}


def test_scalar_replaces_mapping_and_back():
    assert merge({"config": {"a": 1}}, {"config": None}) == {"config": None}
    assert merge({"config": None}, {"config": {"a": 1}}) == {"config": {"a": 1}}


def test_inputs_are_not_mutated():
    a = {
        "history": {"buffer": {"size": 10}},
        "alerts": {"rules": [{"name": "r", "condition": "x"}]},
    }
    b = {
        "history": {"buffer": {"size": 20}},
        "alerts": {"rules": [{"name": "r", "level": "error"}]},
    }
    merge(a, b)
    assert a["history"]["buffer"]["size"] == 10
    assert a["alerts"]["rules"] == [{"name": "r", "condition": "x"}]


def test_rules_merge_by_name_later_wins():
    a = {
        "alerts": {
            "rules": [
                {"name": "nan", "condition": "isnan(loss)", "level": "error"},
                {"name": "spike", "condition": "zscore(loss[50]) > 4"},
                "loss > 10 => warn: high",
            ]
        }
    }
    b = {
        "alerts": {
            "rules": [
                {"name": "spike", "level": "critical"},
                "loss > 10 => warn: high",
                {"name": "new", "condition": "acc < 0.1"},
            ]
        }
    }
    rules = merge(a, b)["alerts"]["rules"]
    assert rules == [
        {"name": "nan", "condition": "isnan(loss)", "level": "error"},
        {"name": "spike", "condition": "zscore(loss[50]) > 4", "level": "critical"},
        "loss > 10 => warn: high",
        {"name": "new", "condition": "acc < 0.1"},
    ]


def test_channels_merge_by_name_defaulting_to_type():
    env = {"alerts": {"channels": [{"type": "slack", "url": "https://env"}]}}
    yaml_file = {
        "alerts": {
            "channels": [
                {"type": "slack", "min_level": "error"},
                {"type": "slack", "name": "ops", "url": "https://ops"},
            ]
        }
    }
    channels = merge(env, yaml_file)["alerts"]["channels"]
    assert channels == [
        {"type": "slack", "url": "https://env", "min_level": "error"},
        {"type": "slack", "name": "ops", "url": "https://ops"},
    ]


def test_mapping_form_merges_with_list_form_and_removes_with_null():
    a = {
        "alerts": {"rules": {"nan_guard": {"condition": "isnan(loss)"}, "old": {"condition": "x"}}}
    }
    b = {"alerts": {"rules": {"nan_guard": {"level": "critical"}, "old": None}}}
    c = {"alerts": {"rules": [{"name": "extra", "condition": "y > 1"}]}}
    assert merge(a, b, c)["alerts"]["rules"] == [
        {"name": "nan_guard", "condition": "isnan(loss)", "level": "critical"},
        {"name": "extra", "condition": "y > 1"},
    ]


def test_two_hydra_style_rule_sets_both_kept():
    nan_guard = {"alerts": {"rules": {"nan_guard": {"condition": "isnan(loss)"}}}}
    divergence = {"alerts": {"rules": {"divergence": {"condition": "loss > 1e3"}}}}
    names = [r["name"] for r in merge(nan_guard, divergence)["alerts"]["rules"]]
    assert names == ["nan_guard", "divergence"]


def test_entries_of_one_layer_do_not_merge_with_each_other():
    a = {"alerts": {"channels": [{"type": "slack", "url": "1"}, {"type": "slack", "url": "2"}]}}
    assert len(merge(a)["alerts"]["channels"]) == 2  # left for validation to report


def test_unnamed_rules_are_appended():
    a = {"alerts": {"rules": [{"condition": "x > 1"}]}}
    b = {"alerts": {"rules": [{"condition": "x > 1"}]}}
    assert len(merge(a, b)["alerts"]["rules"]) == 2


def test_objects_are_not_copied():
    class Plugin:
        def end(self, span):
            return {}

    plugin = Plugin()
    out = merge({"spans": {"plugins": [plugin], "print": print}})
    assert out["spans"]["plugins"][0] is plugin and out["spans"]["print"] is print


def test_merge_layers_tracks_sources_per_leaf():
    layers = [
        Layer(
            "env:ET_SLACK_WEBHOOK_URL", {"alerts": {"channels": [{"type": "slack", "url": "u"}]}}
        ),
        Layer("file:a.yaml", {"history": {"buffer": {"size": 3, "interval": 1}}, "tags": ["a"]}),
        Layer(
            "init",
            {
                "history": {"buffer": {"size": 4}},
                "alerts": {"channels": [{"type": "slack", "min_level": "error"}]},
            },
        ),
        Layer("spec", {"tags": ["b"]}),
    ]
    data, sources, _ = merge_layers(layers)
    assert data["history"]["buffer"] == {"size": 4, "interval": 1}
    assert sources["history.buffer.size"] == "init"
    assert sources["history.buffer.interval"] == "file:a.yaml"
    assert sources["tags"] == "spec"
    assert sources["alerts.channels.slack.url"] == "env:ET_SLACK_WEBHOOK_URL"
    assert sources["alerts.channels.slack.min_level"] == "init"


def test_replacing_a_subtree_forgets_its_old_sources():
    layers = [
        Layer("a", {"config": {"x": 1, "y": 2}}),
        Layer("b", {"config": None}),
    ]
    _, sources, _ = merge_layers(layers)
    assert sources == {"config": "b"}


def test_merge_at_a_section_path():
    a = {"rules": {"nan": {"condition": "isnan(loss)"}}, "on_rank": 0}
    b = {"rules": [{"name": "nan", "level": "error"}], "on_rank": 1}
    assert merge(None, a, b, at="alerts") == {
        "rules": [{"name": "nan", "condition": "isnan(loss)", "level": "error"}],
        "on_rank": 1,
    }
    assert merge(at="alerts") == {}
