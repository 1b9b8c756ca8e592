"""Alert rules: the condition DSL (Lark grammar), its AST, compiled evaluation, rules and
the engine that runs them per committed step. See docs/alerts.md.

Light to import: lark loads on the first parse; rich only when the console sink is used.
"""

from expr_tracker.alerts.ast import Node
from expr_tracker.alerts.builder import Expr, M
from expr_tracker.alerts.delivery.record import AlertLog, ConsoleNotifier
from expr_tracker.alerts.engine import AlertEngine, AlertEvent, render_template
from expr_tracker.alerts.evaluate import UNKNOWN, CompiledExpr, EvalContext, compile_expr
from expr_tracker.alerts.parse import (
    AlertSyntaxError,
    ParsedRule,
    RuleError,
    parse_expr,
    parse_rule,
    split_rule,
)
from expr_tracker.alerts.rules import AlertRule, make_rule, rule_level
from expr_tracker.units import level_rank, normalize_level

__all__ = [
    "UNKNOWN",
    "AlertEngine",
    "AlertEvent",
    "AlertLog",
    "AlertRule",
    "AlertSyntaxError",
    "CompiledExpr",
    "ConsoleNotifier",
    "EvalContext",
    "Expr",
    "M",
    "Node",
    "ParsedRule",
    "RuleError",
    "compile_expr",
    "level_rank",
    "make_rule",
    "normalize_level",
    "parse_expr",
    "parse_rule",
    "render_template",
    "rule_level",
    "split_rule",
]
