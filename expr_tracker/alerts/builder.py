"""``M``: build alert conditions in Python with editor completion (docs/alerts.md "Three front ends, one tree").

    M["train/loss"][50].zscore() > 4        # == parse_expr("zscore(train/loss[50]) > 4")
    M.loss.isnan() | (M.loss > 10)          # | & ~ are or / and / not
    M.loss["5m"].mean()                     # duration windows as strings
    mean(M.loss[20]) > 1                    # functions also as module-level helpers

Every operation returns an ``Expr`` wrapping a frozen AST node (``expr.node``), so the
result compares equal to the parsed DSL. ``M.eval.acc`` is the metric ``eval.acc``
(resolved to ``eval/acc`` when that is what was logged). Python's ``and``/``or``/``not``
cannot be overloaded: use ``&``, ``|``, ``~`` (and parenthesise comparisons).
Chained comparisons (``a < b < c``) do not work in Python here: write ``(a < b) & (b < c)``.
"""

from __future__ import annotations

from expr_tracker.alerts import ast
from expr_tracker.alerts.functions import FUNCTIONS
from expr_tracker.alerts.parse import RuleError

__all__ = ["M", "Expr", "call"]


def _node(value) -> ast.Node:
    if isinstance(value, Expr):
        return value.node
    if isinstance(value, ast.Node):
        return value
    if isinstance(value, bool):
        raise RuleError("a bare True/False is not a condition; compare a metric instead")
    if isinstance(value, (int, float)):
        try:
            return ast.Number(float(value))
        except OverflowError:  # an int beyond the float range compares like an infinity
            return ast.Number(float("inf") if value > 0 else float("-inf"))
    raise RuleError(f"cannot use {type(value).__name__} in an alert expression")


def _window(name: str, key) -> ast.Window:
    if isinstance(key, bool):
        raise RuleError("a window is a number of points or a duration such as '30s'")
    if isinstance(key, int):
        return ast.Window(name, size=key)
    if isinstance(key, str):
        from expr_tracker.alerts.parse import parse_expr

        node = parse_expr(f"x[{key.strip()}]")
        if isinstance(node, ast.Window):
            return ast.Window(name, size=node.size, seconds=node.seconds, text=node.text)
    raise RuleError(f"a window is a number of points or a duration such as '30s', got {key!r}")


class Expr:
    """An expression under construction; ``.node`` is the AST. Operators build nodes."""

    __slots__ = ("node",)

    def __init__(self, node: ast.Node) -> None:
        self.node = node

    def __repr__(self) -> str:
        return f"Expr({self.node.to_source()})"

    def to_source(self) -> str:
        return self.node.to_source()

    # comparisons
    def __lt__(self, other):
        return Expr(ast.Compare("<", self.node, _node(other)))

    def __le__(self, other):
        return Expr(ast.Compare("<=", self.node, _node(other)))

    def __gt__(self, other):
        return Expr(ast.Compare(">", self.node, _node(other)))

    def __ge__(self, other):
        return Expr(ast.Compare(">=", self.node, _node(other)))

    def __eq__(self, other):  # type: ignore[override]
        return Expr(ast.Compare("==", self.node, _node(other)))

    def __ne__(self, other):  # type: ignore[override]
        return Expr(ast.Compare("!=", self.node, _node(other)))

    __hash__ = None  # type: ignore[assignment]

    # arithmetic
    def _bin(self, op, other, reverse=False):
        a, b = self.node, _node(other)
        return Expr(ast.BinOp(op, b, a) if reverse else ast.BinOp(op, a, b))

    def __add__(self, o):
        return self._bin("+", o)

    def __radd__(self, o):
        return self._bin("+", o, True)

    def __sub__(self, o):
        return self._bin("-", o)

    def __rsub__(self, o):
        return self._bin("-", o, True)

    def __mul__(self, o):
        return self._bin("*", o)

    def __rmul__(self, o):
        return self._bin("*", o, True)

    def __truediv__(self, o):
        return self._bin("/", o)

    def __rtruediv__(self, o):
        return self._bin("/", o, True)

    def __mod__(self, o):
        return self._bin("%", o)

    def __rmod__(self, o):
        return self._bin("%", o, True)

    def __neg__(self):
        if isinstance(self.node, ast.Number):
            return Expr(ast.Number(-self.node.value))
        return Expr(ast.Neg(self.node))

    def __pos__(self):
        return self

    # logic
    def __and__(self, o):
        return Expr(ast.And(self.node, _node(o)))

    def __rand__(self, o):
        return Expr(ast.And(_node(o), self.node))

    def __or__(self, o):
        return Expr(ast.Or(self.node, _node(o)))

    def __ror__(self, o):
        return Expr(ast.Or(_node(o), self.node))

    def __invert__(self):
        return Expr(ast.Not(self.node))

    def __bool__(self):
        raise TypeError(
            "an alert expression has no truth value in Python: use & | ~ instead of "
            "and/or/not, and (a < b) & (b < c) instead of a < b < c"
        )

    # functions as methods: M.loss[20].mean(), M.loss.isnan(), M.loss[50].ema(0.1)
    def __getattr__(self, name: str):
        if name.startswith("_") or name not in FUNCTIONS:
            raise AttributeError(name)
        return lambda *args: call(name, self, *args)


class Metric(Expr):
    """A metric name: ``M.loss``, ``M["train/loss"]``; index it for a window."""

    __slots__ = ()

    def __getitem__(self, key) -> Expr:
        return Expr(_window(self.node.name, key))

    def __getattr__(self, name: str):
        if name in FUNCTIONS and not name.startswith("_"):
            return lambda *args: call(name, self, *args)
        if name.startswith("__"):
            raise AttributeError(name)
        return Metric(ast.Name(f"{self.node.name}.{name}"))


class _MetricFactory:
    """``M.name`` / ``M["any/name"]`` -> a metric expression."""

    __slots__ = ()

    def __getitem__(self, name: str) -> Metric:
        if not isinstance(name, str) or not name:
            raise RuleError(f"a metric name is a non-empty string, got {name!r}")
        return Metric(ast.Name(name))

    def __getattr__(self, name: str) -> Metric:
        if name.startswith("__"):
            raise AttributeError(name)
        return Metric(ast.Name(name))

    def __repr__(self) -> str:
        return "M"


M = _MetricFactory()


def call(func: str, *args) -> Expr:
    """``call("max", M.a, M.b)`` -> ``max(a, b)``; ``func`` must be whitelisted."""
    if func not in FUNCTIONS:
        raise RuleError(f"unknown function {func!r}")
    return Expr(ast.Call(func, tuple(_node(a) for a in args)))
