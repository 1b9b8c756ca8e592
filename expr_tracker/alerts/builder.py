"""``M``: build alert conditions in Python with editor completion (docs/alerts.md "Three front ends, one tree").

    M["train/loss"][50].zscore() > 4        # == parse_expr("zscore(train/loss[50]) > 4")
    M("loss") > "val_loss"                  # a str operand is a metric: loss > val_loss
    M.loss.isnan() | (M.loss > 10)          # | & ~ are or / and / not
    M.loss["5m"].mean()                     # duration windows as strings ...
    M.loss[2.5].mean()                      # ... or as a float: seconds (an int: points)

Every operation returns an ``Expr`` wrapping a frozen AST node (``expr.node``), so the
result compares equal to the parsed DSL; ``str(expr)`` is its DSL text. ``M.eval.acc`` is
the metric ``eval.acc`` (resolved to ``eval/acc`` when that is what was logged). Python's
``and``/``or``/``not`` cannot be overloaded: use ``&``, ``|``, ``~`` (and parenthesise
comparisons). Chained comparisons (``a < b < c``) do not work in Python here: write
``(a < b) & (b < c)``.

Operands: an ``Expr``, an AST node, a real number (``int``, ``float``, NumPy scalars) or a
``str``, taken as a metric name. Anything else (``None``, a ``bool``, a list, a tensor)
raises ``TypeError``; an empty name raises ``RuleError``.
"""

from __future__ import annotations

import datetime
import math
import numbers

from expr_tracker.alerts import ast
from expr_tracker.alerts.functions import FUNCTIONS
from expr_tracker.alerts.parse import RuleError

__all__ = ["M", "Expr", "call"]

_OPERANDS = "an M expression, a number or a metric name (str)"


def _node(value) -> ast.Node:
    """An operand as an AST node.

    Raises:
        TypeError: a value that is none of ``_OPERANDS`` (a ``bool`` included: a bare
            True/False is not a condition).
        RuleError: an empty metric name.
    """
    if isinstance(value, Expr):
        return value.node
    if isinstance(value, ast.Node):
        return value
    if isinstance(value, str):
        return _metric(value).node
    if isinstance(value, bool):
        raise TypeError(
            f"cannot use the bool {value!r} in an alert expression: a bare True/False is not "
            f"a condition; use {_OPERANDS} (compare a metric instead)"
        )
    if isinstance(value, numbers.Real):
        try:
            return ast.Number(float(value))
        except OverflowError:  # an int beyond the float range compares like an infinity
            return ast.Number(float("inf") if value > 0 else float("-inf"))
    raise TypeError(
        f"cannot use {type(value).__name__} {_short(value)} in an alert expression: an "
        f"operand is {_OPERANDS}"
    )


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _metric(name) -> Metric:
    if not isinstance(name, str):
        raise TypeError(f"a metric name is a str, got {type(name).__name__} {_short(name)}")
    if not name:
        raise RuleError("a metric name is a non-empty string, got ''")
    return Metric(ast.Name(name))


_WINDOWS = (
    "a window is a number of points (int), a duration in seconds (float, timedelta) or a "
    "duration string such as '30s'"
)


def _window(name: str, key) -> ast.Window:
    """``m[key]``: an ``int`` counts points, a ``float`` (or ``timedelta``) is a duration in
    seconds, a ``str`` is read as the DSL reads a window (``"20"``, ``"30s"``, ``"5m"``).

    Raises:
        TypeError: another type (a ``bool`` included).
        RuleError: a value no window has (not positive, not finite, a bad string).
    """
    if isinstance(key, bool):
        raise TypeError(f"{_WINDOWS}, got the bool {key!r}")
    if isinstance(key, numbers.Integral):
        return ast.Window(name, size=int(key))
    if isinstance(key, datetime.timedelta):
        key = key.total_seconds()
    if isinstance(key, numbers.Real):
        seconds = float(key)
        if not (math.isfinite(seconds) and seconds > 0):
            raise RuleError(f"{_WINDOWS}: a duration must be finite and > 0 seconds, got {key!r}")
        try:
            text = ast.format_duration(seconds)
        except ValueError:
            raise RuleError(
                f"{_WINDOWS}: {key!r} s has no DSL spelling (write it in ms, e.g. '5ms')"
            ) from None
        return ast.Window(name, seconds=seconds, text=text)
    if isinstance(key, str):
        from expr_tracker.alerts.parse import parse_expr

        node = parse_expr(f"x[{key.strip()}]")
        if isinstance(node, ast.Window):
            return ast.Window(name, size=node.size, seconds=node.seconds, text=node.text)
        raise RuleError(f"{_WINDOWS}, got {key!r}")
    raise TypeError(f"{_WINDOWS}, got {type(key).__name__} {_short(key)}")


class Expr:
    """An expression under construction; ``.node`` is the AST. Operators build nodes."""

    __slots__ = ("node",)

    def __init__(self, node: ast.Node) -> None:
        self.node = node

    def __repr__(self) -> str:
        return f"Expr({self.node.to_source()})"

    def __str__(self) -> str:
        return self.node.to_source()

    def to_source(self, canonical: bool = False) -> str:
        """The condition as DSL text (``Node.to_source``): the fewest parentheses."""
        return self.node.to_source(canonical)

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
    """``M.name`` / ``M["any/name"]`` / ``M("any/name")`` -> a metric expression.

    Raises ``TypeError`` for a name that is not a ``str``, ``RuleError`` for ``""``.
    """

    __slots__ = ()

    def __getitem__(self, name: str) -> Metric:
        return _metric(name)

    def __call__(self, name: str) -> Metric:
        return _metric(name)

    def __getattr__(self, name: str) -> Metric:
        if name.startswith("__"):
            raise AttributeError(name)
        return Metric(ast.Name(name))

    def __repr__(self) -> str:
        return "M"


M = _MetricFactory()


def call(func: str, *args) -> Expr:
    """``call("max", M.a, M.b)`` (or ``call("max", "a", "b")``) -> ``max(a, b)``; ``func``
    must be whitelisted (``RuleError``); an argument is an operand as for the operators
    (``TypeError`` otherwise)."""
    if func not in FUNCTIONS:
        raise RuleError(f"unknown function {func!r}")
    return Expr(ast.Call(func, tuple(_node(a) for a in args)))
