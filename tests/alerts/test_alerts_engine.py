"""Rules, the state machine, the engine (dependency index, watchdog, errors, templates,
stats) and the sinks."""

from __future__ import annotations

import json
import threading

import pytest
from rich.console import Console

import expr_tracker as et
from expr_tracker.alerts import (
    AlertEngine,
    AlertLog,
    AlertRule,
    ConsoleNotifier,
    M,
    RuleError,
    level_rank,
    make_rule,
    parse_expr,
    render_template,
)
from expr_tracker.alerts.testing import AlertCapture, replay, rows_from_series
from expr_tracker.testing import FakeClock


def run(rules, series, **kw):
    return replay(rules, rows_from_series(series), **kw)


# -- rules ------------------------------------------------------------------------------------


def test_front_ends_give_the_same_rule():
    a = make_rule("zscore(train/loss[50]) > 4 => error: spike")
    b = make_rule(M["train/loss"][50].zscore() > 4, level="error", message="spike")
    c = make_rule({"condition": "zscore(train/loss[50]) > 4", "level": "err", "message": "spike"})
    d = make_rule({"expr": "zscore(train/loss[50]) > 4", "level": "error", "message": "spike"})
    assert a.condition == b.condition == c.condition == d.condition
    assert a == c == d and a.name == c.name
    assert b.condition == parse_expr("zscore(train/loss[50]) > 4")


def test_builder_operators():
    assert (M.loss.isnan() | (M.loss > 10)).node == parse_expr("isnan(loss) or loss > 10")
    assert (~(M.a < 1) & (M.b["5m"].mean() >= -2)).node == parse_expr(
        "not a < 1 and mean(b[5m]) >= -2"
    )
    assert (M.eval.acc < 0.5).node == parse_expr("eval.acc < 0.5")
    assert ((M.a + 1) * 2 / M.b - M.c % 3 > 0).node == parse_expr("(a + 1) * 2 / b - c % 3 > 0")
    with pytest.raises(TypeError):
        bool(M.a > 1)


def test_rule_from_rulespec_like_object():
    class Spec:
        def model_dump(self):
            return {
                "name": "nan",
                "condition": "isnan(loss)",
                "level": "critical",
                "channels": None,
                "tags": ["x"],
                "max_fires": None,
                "cooldown": 60.0,
            }

    rule = make_rule(Spec())
    assert (rule.name, rule.level, rule.tags, rule.cooldown) == ("nan", "critical", ("x",), 60.0)


def test_auto_names_distinguish_rules():
    base = make_rule("loss > 1 => warn")
    others = [
        make_rule("loss > 1 => error"),
        make_rule("loss > 1 => warn: other"),
        make_rule("loss > 1 => warn", channels=["slack"]),
        make_rule("loss > 1 => warn", for_steps=3),
        make_rule("loss > 1 => warn", mode="level"),
        make_rule("loss > 1 => warn", tags=["t"]),
        make_rule("loss > 1 => warn", title="T"),
    ]
    assert len({base.name, *(r.name for r in others)}) == 8
    assert base.name.startswith("loss > 1 [warning#")


@pytest.mark.parametrize(
    ("obj", "kw", "match"),
    [
        ("loss > 1 => loud", {}, "not an alert level"),
        ("loss > 1", {"mode": "sometimes"}, "mode"),
        ("loss > 1", {"for_steps": 0}, "for_steps"),
        ("loss > 1", {"cooldown": "soon"}, "not a duration"),
        ("loss > 1", {"max_fires": 0}, "max_fires"),
        ({"condition": "loss > 1", "levle": "error"}, {}, "did you mean 'level'"),
        ({"level": "error"}, {}, "needs a 'condition'"),
        ({"condition": "loss > 1 => error"}, {}, "holds '=>'"),
        ("mean(loss) > 1", {}, "explicit window"),
        (42, {}, "a rule is"),
    ],
)
def test_bad_rules_raise(obj, kw, match):
    with pytest.raises(RuleError, match=match):
        make_rule(obj, **kw)


def test_levels_compare_by_severity():
    assert level_rank("crit") > level_rank("error") > level_rank("WARN") > level_rank("info")
    assert make_rule("x > 1 => fatal").level == "critical"


# -- state machine ----------------------------------------------------------------------------


def kinds(cap, name=None):
    return [(e.kind, e.step) for e in cap.events if name is None or e.rule.name == name]


def test_edge_mode_fires_once_then_rearms():
    cap = run(["x > 1 => error: hi"], {"x": [0, 2, 2, 0, 2]})
    assert kinds(cap) == [("firing", 1), ("resolved", 3), ("firing", 4)]
    assert [e.notify for e in cap.events] == [True, False, True]


def test_for_steps_counts_consecutive_trues_and_unknown_changes_nothing():
    rule = {"name": "r", "condition": "x > 1", "for_steps": 3}
    # None = x absent (rule not evaluated), nan = UNKNOWN: neither resets nor advances
    cap = run([rule], {"x": [2, float("nan"), 2, None, 0, 2, 2, 2], "y": [0] * 8})
    assert kinds(cap) == [("pending", 0), ("cancelled", 4), ("pending", 5), ("firing", 7)]


def test_level_mode_renotifies_after_cooldown():
    rule = {"name": "r", "condition": "x > 1", "mode": "level", "cooldown": 2}
    cap = run([rule], {"x": [2, 2, 2, 2, 2, 2]})
    assert kinds(cap) == [("firing", 0), ("repeat", 2), ("repeat", 4)]


def test_max_fires_caps_notifications():
    rule = {"name": "r", "condition": "x > 1", "mode": "level", "cooldown": 0, "max_fires": 2}
    cap = run([rule], {"x": [2, 2, 2, 0, 2]})
    fired = [(e.kind, e.step, e.notify) for e in cap.events]
    assert fired == [
        ("firing", 0, True),
        ("repeat", 1, True),
        ("resolved", 3, False),
        ("firing", 4, False),
    ]


def test_notify_recovery():
    cap = run([{"name": "r", "condition": "x > 1", "notify_recovery": True}], {"x": [2, 0]})
    assert [(e.kind, e.notify, e.level) for e in cap.events] == [
        ("firing", True, "warning"),
        ("resolved", True, "info"),
    ]


def test_no_recovery_notice_for_an_episode_whose_firing_was_suppressed():
    """max_fires=1 with notify_recovery: episode 1 notifies firing and recovery; episode 2's
    firing is suppressed by the cap, so its recovery must not go out either."""
    rule = {"name": "r", "condition": "x > 1", "max_fires": 1, "notify_recovery": True}
    cap = run([rule], {"x": [2, 0, 2, 0, 2, 0]})
    assert [(e.kind, e.step, e.notify) for e in cap.events] == [
        ("firing", 0, True),
        ("resolved", 1, True),
        ("firing", 2, False),
        ("resolved", 3, False),
        ("firing", 4, False),
        ("resolved", 5, False),
    ]


def test_recovery_after_a_level_mode_repeat_within_max_fires_is_notified():
    # the firing notified: its recovery does, however many repeats the cap then suppressed
    rule = {
        "name": "r",
        "condition": "x > 1",
        "mode": "level",
        "cooldown": 0,
        "max_fires": 2,
        "notify_recovery": True,
    }
    cap = run([rule], {"x": [2, 2, 2, 0, 2, 0]})
    assert [(e.kind, e.notify) for e in cap.events] == [
        ("firing", True),
        ("repeat", True),
        ("resolved", True),
        ("firing", False),
        ("resolved", False),
    ]


def test_suppressed_episode_sends_nothing_through_a_run(tmp_path):
    import expr_tracker as et

    run_ = et.init(
        project="p",
        name="capped",
        dir=str(tmp_path),
        alert={"channels": [{"type": "memory", "name": "mem"}], "policy": {"dedup_window": 0}},
        alert_rules=[{"name": "r", "condition": "x > 1", "max_fires": 1, "notify_recovery": True}],
    )
    for x in (2, 0, 2, 0):
        et.log({"x": x})
    mem = run_.dispatcher.lanes["mem"].channel
    et.finish()
    assert [m.title for m in mem.messages] == ["r", "resolved: r"]


def test_disabled_rule_is_listed_but_not_evaluated():
    eng = AlertEngine([{"name": "r", "condition": "x > 1", "enabled": False}])
    eng.on_step({"_step": 0, "_time": 0.0, "x": 5})
    assert eng.stats()["rules"]["r"]["evaluations"] == 0 and eng.rules[0].name == "r"


# -- engine -----------------------------------------------------------------------------------


def test_dependency_index_skips_rules_whose_metrics_are_absent():
    eng = AlertEngine(["a > 1", "b > 1", "step() > 100"])
    eng.on_step({"_step": 0, "_time": 0.0, "a": 0})
    ev = {name: s["evaluations"] for name, s in eng.stats()["rules"].items()}
    assert sorted(ev.values()) == [0, 1, 1]  # b skipped; step() runs every commit


def test_notify_outside_locks_and_deliver_false():
    seen = []
    eng = AlertEngine(["x > 1 => error"], notify=seen.append, deliver=False, record=seen.append)
    eng.on_step({"_step": 0, "_time": 0.0, "x": 5})
    assert [e.kind for e in seen] == ["firing"]  # only the record sink on a silent rank
    got = []

    def notify(event):  # would deadlock if called under the rule lock
        compiled = eng._by_name[event.rule.name]
        assert compiled.state.lock.acquire(timeout=1)
        compiled.state.lock.release()
        got.append(event)

    eng2 = AlertEngine(["x > 1 => error"], notify=notify)

    def record(event):  # would deadlock if called under the engine lock
        assert eng2._lock.acquire(timeout=1)
        eng2._lock.release()

    eng2.record = record
    eng2.on_step({"_step": 0, "_time": 0.0, "x": 5})
    eng = eng2
    assert len(got) == 1


def _watchdog_race_engine(**kw):
    """x > 1 (on_step) and no_data(60s) (the watchdog), on a fake monotonic clock."""
    clock = FakeClock(0.0)
    eng = AlertEngine(
        ["x > 1 => error: x", "no_data(60s) => critical: hung"],
        clock=clock,
        wall_clock=FakeClock(1000.0),
        **kw,
    )
    return eng, clock


def test_watchdog_waits_for_an_on_step_evaluation():
    # the watchdog must not evaluate while on_step is half way through its rules (series
    # half appended, counters and transitions racing)
    seen = []
    eng, clock = _watchdog_race_engine(record=seen.append)
    compiled = eng._by_name[eng.rules[0].name]
    entered, release = threading.Event(), threading.Event()
    real = compiled.fn

    def slow(ctx):
        entered.set()
        assert release.wait(5)
        return real(ctx)

    compiled.fn = slow
    step = threading.Thread(target=eng.on_step, args=({"_step": 1, "_time": 1000.0, "x": 5},))
    step.start()
    assert entered.wait(5)
    clock.now = 61.0  # no_data(60s) is now true for the watchdog
    watchdog = threading.Thread(target=eng.check_time)
    watchdog.start()
    watchdog.join(0.2)
    assert watchdog.is_alive()  # blocked on the engine lock, not evaluating
    release.set()
    step.join(5)
    watchdog.join(5)
    assert [(e.rule.name, e.kind) for e in seen] == [
        (eng.rules[0].name, "firing"),
        (eng.rules[1].name, "firing"),
    ]
    assert eng.stats()["rules"][eng.rules[1].name]["evaluations"] == 2


def test_events_reach_the_sinks_in_the_order_they_happened():
    # on_step's event is being recorded (outside the lock) when the watchdog produces the
    # next one: the watchdog queues it behind, it is not recorded first
    seen = []
    entered, release = threading.Event(), threading.Event()

    def record(event):
        if event.kind == "firing" and event.level == "error":
            entered.set()
            assert release.wait(5)
        seen.append((event.level, event.kind))

    notified = []
    eng, clock = _watchdog_race_engine(record=record, notify=lambda e: notified.append(e.level))
    step = threading.Thread(target=eng.on_step, args=({"_step": 1, "_time": 1000.0, "x": 5},))
    step.start()
    assert entered.wait(5)
    clock.now = 61.0
    eng.check_time()  # returns at once: the on_step thread delivers its event, in order
    assert seen == []
    release.set()
    step.join(5)
    assert seen == [("error", "firing"), ("critical", "firing")]
    assert notified == ["error", "critical"]
    assert not eng._drain_lock.locked() and not eng._pending


def test_evaluation_errors_are_counted_and_disable_after_ten():
    errors = []
    cap = AlertCapture()
    eng = AlertEngine(["x > 1 => error"], notify=cap, on_error=lambda r, e: errors.append(e))
    compiled = eng._rules[0]

    def boom(ctx):
        raise ZeroDivisionError("bug")

    compiled.fn = boom
    for i in range(12):
        eng.on_step({"_step": i, "_time": float(i), "x": 5})
    s = eng.stats()["rules"][eng.rules[0].name]
    assert (s["errors"], s["disabled"], s["evaluations"]) == (10, True, 10)
    assert len(errors) == 10
    assert [e.kind for e in cap.events] == ["disabled"]
    assert "ZeroDivisionError" in cap.events[0].message
    assert any("disabled" in w for w in eng.finish_warnings())


def test_unresolved_metrics_and_finish_warnings():
    eng = AlertEngine(["val/accuracy < 0.1", "eval.acc > 2"])
    eng.on_step({"_step": 0, "_time": 0.0, "val/acc": 0.5, "eval/acc": 3})
    assert eng.stats()["unresolved_metrics"] == ["val/accuracy"]
    (warning,) = eng.finish_warnings()
    assert "'val/accuracy'" in warning and "did you mean 'val/acc'" in warning


def test_finish_warning_suggests_the_logged_name_with_the_same_last_part():
    # a shipped rule set reads `loss`; the app logs `train/loss` (difflib alone misses it)
    eng = AlertEngine([{"name": "et_nan_guard", "condition": "isnan(loss)"}])
    eng.on_step({"_step": 0, "_time": 0.0, "train/loss": 0.5, "lr": 0.1})
    (warning,) = eng.finish_warnings()
    assert warning.startswith("alert rule 'et_nan_guard' reads metric 'loss', which was never")
    assert warning.endswith("did you mean 'train/loss'?")


def test_add_rule_at_runtime_and_duplicates():
    eng = AlertEngine(window=100)
    eng.add_rule("x > 1 => warn")
    eng.add_rule("x > 1 => warn")  # identical: no-op
    assert len(eng.rules) == 1
    eng.add_rule({"name": "n", "condition": "x > 1"})
    with pytest.raises(RuleError, match="duplicate"):
        eng.add_rule({"name": "n", "condition": "x > 2"})
    with pytest.raises(RuleError, match="alert_window=100"):
        eng.add_rule("mean(x[101]) > 1")
    with pytest.raises(RuleError):
        eng.add_rule("x >")


def test_series_sized_to_widest_window():
    eng = AlertEngine(["mean(x[300]) > 1"])
    for i in range(1000):
        eng.on_step({"_step": i, "_time": float(i), "x": 1.0})
    s = eng._series["x"]
    assert s.capacity == 300 and 300 <= len(s) <= 2 * 300 + 16
    eng.add_rule("mean(x[700]) > 1")
    assert s.capacity == 700


def test_watchdog_catches_a_hung_run():
    clock, wall = FakeClock(0.0), FakeClock(1000.0)
    cap = AlertCapture()
    eng = AlertEngine(
        ["no_data(60s) => critical: hung at {step}"], notify=cap, clock=clock, wall_clock=wall
    )
    eng.on_step({"_step": 7, "_time": 1000.0, "x": 1})
    clock.now = 30.0
    eng.check_time()
    assert cap.events == []
    clock.now = 61.0
    eng.check_time()
    assert [(e.kind, e.message) for e in cap.events] == [("firing", "hung at 7")]


def test_watchdog_thread_only_with_time_based_rules():
    assert AlertEngine(["x > 1"]).start_watchdog(0.01) is False
    started = []

    def factory(**kw):
        t = threading.Thread(**kw)
        started.append(t)
        return t

    eng = AlertEngine(["age(x) > 5"])
    assert eng.start_watchdog(0.01, thread_factory=factory) is True
    assert started and started[0].daemon and eng.watchdog_running
    eng.close()
    assert not started[0].is_alive()


def test_age_uses_row_time():
    cap = run(["age(x) > 2"], {"x": [1, None, None, None], "y": [0, 0, 0, 0]})
    assert kinds(cap) == [("firing", 3)]


# -- templates --------------------------------------------------------------------------------


def test_template_fields_and_safety():
    values = {"loss": 0.123456, "train/loss": 2.0, "step": 3, "run": "r"}
    out = render_template(
        "{loss:.2f} {train/loss:.1f} {step} {run} {nope} {loss.__class__} {loss[0]} "
        "{loss!r} {{x}} {loss:%Q} {}",
        values,
    )
    assert out == "0.12 2.0 3 r {nope} {loss.__class__} {loss[0]} 0.123456 {x} {loss:%Q} {}"
    assert render_template("{unclosed", values) == "{unclosed"


def test_message_renders_expr_step_run_project():
    cap = run(
        ["loss > 1 => error: {project}/{run} step {step}: {expr} loss={loss:.1f} lr={lr}"],
        {"loss": [0.5, 3.0], "lr": [0.1, 0.1]},
        run_info={"project": "p", "run": "r"},
    )
    (ev,) = cap.events
    assert ev.message == "p/r step 1: loss=3 > 1 loss=3.0 lr=0.1"  # 1 as written
    assert ev.metrics == {"loss": 3.0}


# -- sinks ------------------------------------------------------------------------------------


def test_alert_log_appends_one_record_per_transition(tmp_path):
    path = tmp_path / "run" / "alerts.rank1.jsonl"
    sink = AlertLog(path)
    eng = AlertEngine(["x > 1 => error: big"], record=sink)
    for i, x in enumerate([0, 2, 0]):
        eng.on_step({"_step": i, "_time": 100.0 + i, "x": x})
    sink.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["kind"], r["event"], r["state"], r["step"]) for r in records] == [
        ("transition", "firing", "firing", 1),
        ("transition", "resolved", "ok", 2),
    ]
    assert records[0]["level"] == "error" and records[0]["message"] == "big"


def test_console_notifier_renders_with_rich():
    console = Console(width=60, record=True, color_system=None)
    eng = AlertEngine(["x > 1 => error: too big"], notify=ConsoleNotifier(console))
    eng.on_step({"_step": 4, "_time": 0.0, "x": 2})
    text = console.export_text()
    assert "ERROR" in text and "too big" in text and "step 4" in text


def test_rule_to_dict_round_trips():
    rule = make_rule("x > 1 => error: m", channels=["slack"], tags=["a"])
    assert AlertRule.from_dict(rule.to_dict()) == rule


def test_recovery_notice_has_its_own_text():
    rule = {
        "name": "spike",
        "condition": "loss > 1",
        "title": "loss spiked",
        "message": "{loss} spiked to {loss:.4f} at step {step}",
        "notify_recovery": True,
    }
    cap = run([rule], {"loss": [2.5, 0.2003]})
    firing, resolved = cap.events
    assert (firing.title, firing.message) == ("loss spiked", "2.5 spiked to 2.5000 at step 0")
    assert resolved.kind == "resolved" and resolved.title == "resolved: spike"
    assert (
        resolved.message == "spike resolved at step 1: loss > 1 is no longer true (loss=0.2003 > 1)"
    )
    assert "spiked" not in resolved.message


def test_window_error_names_the_real_setting():
    with pytest.raises(RuleError) as info:
        AlertEngine(window=100).add_rule("mean(x[101]) > 1")
    assert "history.alert_window" in str(info.value) and "alerts.window" not in str(info.value)


@pytest.mark.parametrize("size", [101, 1 << 62, 10**22])
def test_a_window_past_any_cap_names_the_configured_alert_window(size):
    """A window wider than the internal bound of a rule made without an engine (base
    code: "wider than alert_window=4611686018427387904") names the configured one."""
    with pytest.raises(RuleError, match=r"wider than alert_window=100;") as info:
        AlertEngine(window=100).add_rule(f"mean(x[{size}]) > 1")
    assert "alert_window=4611686018427387904" not in str(info.value)
    with pytest.raises(RuleError, match=r"wider than alert_window=100;"):
        AlertEngine(window=100).add_rule({"name": "r", "condition": f"max(x[{size}]) > 1"})


def test_the_configured_alert_window_in_et_init(tmp_path):
    from expr_tracker.spec import SpecError

    with pytest.raises(SpecError, match=r"wider than alert_window=100;"):
        et.init(
            project="p",
            name="w",
            dir=str(tmp_path),
            alert_window=100,
            alert_rules=["mean(loss[5000000000000000000000]) > 1 => warning: x"],
        )


@pytest.mark.parametrize(
    "rule, column",
    [
        ('"" > 1', 1),
        ("`` > 1 => error: never", 1),
        ("x > 1 and '' < 2", 11),
        ("mean(''[5]) > 1", 6),
        ("has('')", 5),
        ({"name": "empty", "condition": '"" > 1'}, 1),
        (getattr(M, "") > 1, 1),  # the rule builder
    ],
)
def test_a_rule_on_the_empty_metric_name_is_refused(rule, column):
    """log() never records a metric named '' (it drops the key), so such a rule could
    never fire (base code: accepted, silently inert)."""
    eng = AlertEngine(window=100)
    with pytest.raises(RuleError, match="metric name cannot be empty") as info:
        eng.add_rule(rule)
    assert info.value.column == column
    assert eng.rules == []


def test_the_empty_metric_name_in_et_init_and_add_alert_rule(tmp_path):
    from expr_tracker.spec import SpecError

    with pytest.raises(SpecError, match="metric name cannot be empty"):
        et.init(project="p", name="e", dir=str(tmp_path), alert_rules=['"" > 1 => error: x'])
    et.init(project="p", name="e", dir=str(tmp_path))
    with pytest.raises(RuleError, match="metric name cannot be empty"):
        et.add_alert_rule("mean(``[3]) > 1 => warning: x")
    assert et.list_alert_rules() == []
    et.finish()
