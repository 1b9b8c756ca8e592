"""CompiledRule: a rule compiled for one engine (its evaluator, the metric names it is
indexed under) with its runtime state and counters."""

from __future__ import annotations

from typing import Any

from expr_tracker.alerts import ast
from expr_tracker.alerts.evaluate import compile_expr
from expr_tracker.alerts.rules import AlertRule, RuleState

__all__ = ["CompiledRule"]

#: functions whose value can change on every step (not only when a metric they read does)
_EVERY_STEP_FUNCS = frozenset({"has", "step"})


class CompiledRule:
    """A rule compiled for one engine, with its runtime state and counters."""

    __slots__ = (
        "rule",
        "fn",
        "expr",
        "state",
        "mark",
        "evaluations",
        "errors",
        "consecutive_errors",
        "disabled",
        "last_error",
        "timed",
        "every_step",
        "keys",
        "skewed",
    )

    def __init__(self, rule: AlertRule, window: int, baselines: Any = None) -> None:
        self.rule = rule
        self.expr = compile_expr(
            rule.condition, window=window, text=rule.source, baselines=baselines
        )
        self.fn = self.expr.fn
        self.state = RuleState(rule)
        self.mark = 0
        self.evaluations = 0
        self.errors = 0
        self.consecutive_errors = 0
        self.disabled = not rule.enabled
        self.last_error: str | None = None
        self.timed = self.expr.time_based
        funcs = set(rule.condition.functions())
        self.every_step = bool(funcs & _EVERY_STEP_FUNCS) or not self.expr.needs
        keys = []
        for name in self.expr.needs:
            keys.append(name)
            alt = name.replace(".", "/")
            if alt != name:
                keys.append(alt)
        self.keys = tuple(keys)
        #: the metrics of the rule's skew() calls ({rank} in its messages names the slowest)
        self.skewed = tuple(
            n.args[0].name
            for n in rule.condition.walk()
            if isinstance(n, ast.Call)
            and n.func == "skew"
            and n.args
            and isinstance(n.args[0], ast.Name)
        )
