"""``et.AlertLevel`` (expr_tracker/units.py): the enum over the one level table, ordered by
severity, parsing aliases in any case, accepted wherever a level string is."""

from __future__ import annotations

import json

import pytest

import expr_tracker as et
from expr_tracker import _current
from expr_tracker.units import LEVEL_ALIASES, LEVELS, AlertLevel

L = et.AlertLevel


def test_members_are_the_level_table_in_severity_order():
    assert et.AlertLevel is AlertLevel
    assert [m.value for m in L] == list(LEVELS)
    assert [m.rank for m in L] == [0, 1, 2, 3, 4]
    assert L.DEBUG < L.INFO < L.WARNING < L.ERROR < L.CRITICAL
    assert sorted([L.CRITICAL, L.DEBUG, L.ERROR, L.INFO, L.WARNING]) == list(L)
    assert max(L) is L.CRITICAL and min(L) is L.DEBUG
    # the aliases of the table are the same members
    for alias, canonical in LEVEL_ALIASES.items():
        assert getattr(L, alias.upper()) is L(canonical)
    assert L.WARN is L.WARNING and L.ERR is L.ERROR and L.FATAL is L.CRIT is L.CRITICAL


@pytest.mark.parametrize(
    ("given", "member"),
    [
        ("warning", L.WARNING),
        ("WARN", L.WARNING),
        (" Warn ", L.WARNING),
        ("err", L.ERROR),
        ("Fatal", L.CRITICAL),
        ("crit", L.CRITICAL),
        ("DEBUG", L.DEBUG),
        (L.INFO, L.INFO),
    ],
)
def test_constructor_and_parse_accept_names_and_aliases_in_any_case(given, member):
    assert L(given) is member
    assert L.parse(given) is member


@pytest.mark.parametrize("bad", ["warnings", "", "trace", 3, None, 2.0])
def test_a_value_that_is_no_level_names_the_valid_ones(bad):
    for make in (L, L.parse):
        with pytest.raises(ValueError) as info:
            make(bad)
        text = str(info.value)
        assert repr(bad) in text and "debug, info, warning, error, critical" in text
        assert "warn" in text and "crit" in text


def test_comparisons_against_level_strings_are_by_severity_not_string_order():
    assert L.CRITICAL > "error"  # "critical" < "error" as strings
    assert L.ERROR >= "warn"
    assert "error" >= L.WARNING  # the reflected comparison is ours too
    assert not ("debug" >= L.WARNING)
    assert "info" < L.WARNING
    assert L.WARNING <= "WARNING"
    with pytest.raises(ValueError, match="not an alert level"):
        L.ERROR < "zzz"  # noqa: B015 - never silently compared as strings
    with pytest.raises(TypeError):
        L.ERROR < 3  # noqa: B015


def test_a_member_is_its_canonical_string():
    assert L.ERROR == "error" and isinstance(L.ERROR, str)
    assert {"error": 1}[L.ERROR] == 1
    assert str(L.ERROR) == "error" and f"{L.ERROR}" == "error" and f"{L.ERROR:>7}" == "  error"
    assert json.dumps({"level": L.WARN}) == '{"level": "warning"}'
    assert L.WARNING != "warn"  # equality is the canonical name; parse to match aliases


def test_usable_wherever_a_level_string_is(tmp_path, monkeypatch):
    from expr_tracker.alerts.delivery import AlertMessage
    from expr_tracker.testing import InMemoryChannel

    monkeypatch.setattr(_current, "configured_alert", {})
    assert AlertMessage("t", level=L.FATAL).level == "critical"
    rule = et.AlertRule(condition="loss > 1", level=L.ERR)
    assert rule.level == "error" and type(rule.level) is str  # stored canonical, plain
    assert rule.level >= L.WARNING
    run = et.init(
        project="p",
        dir=str(tmp_path),
        alert={
            "channels": {
                "mem": {"type": "memory", "min_level": L.ERROR, "policy": {"async_send": False}}
            }
        },
        alert_rules=[{"name": "spike", "condition": "loss > 5", "level": L.CRITICAL}],
    )
    assert run.spec.alerts.channels[0].min_level == "error"
    et.add_alert_rule("loss < 0", name="neg", level=L.WARN)  # below the channel's min_level
    assert et.alert("direct", level=L.ERROR) is True
    assert et.alert("too low", level=L.INFO) is False  # routed by severity
    et.log({"loss": 9.0})
    et.log({"loss": -1.0})
    mem = InMemoryChannel.get("mem")
    assert mem.titles == ["direct", "spike"]
    assert [m.level for m in mem.messages] == ["error", "critical"]
    et.finish()
    text = (run.dir / "spec.json").read_text()
    assert '"level": "critical"' in text
