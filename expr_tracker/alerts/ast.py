"""Frozen AST nodes of the alert condition language.

Every front end (the DSL string through ``parse.parse_expr``, the ``M`` builder of
``builder.py``, dict/YAML entries) produces these nodes, so two spellings of one condition
compare equal. Nodes are immutable (``dataclass(frozen=True, slots=True)``) and hashable.

``node.to_source()`` (and ``str(node)``) renders the condition as people write it: with the
fewest parentheses that keep its meaning under the grammar's precedence and left
associativity (``a > 1 and b < 2``, ``(a or b) and c``, ``a - (b - c)``, ``not (a and b)``);
parsing that text gives back an equal tree, and dropping any pair of its parentheses would
not (both tested as hypothesis properties in ``tests/alerts/test_alerts_parse.py``;
docs/alerts.md "How a condition is printed").
Numbers and durations keep the text they were written with (``50``, ``1e-3``, ``5m``), so
every rendering shows them as the user wrote them; a number built in Python (``M.loss > 50``)
renders as ``50``, not ``50.0``. ``to_source(canonical=True)`` is the spelling-free form
auto-derived rule names are hashed from: every number as ``repr(float)`` and every
operation fully parenthesised, exactly as it always was, so ``loss > 50`` keeps the name it
always had (a change to it would rename rules).
Durations are held in seconds; a window holds either a point count or a duration.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from expr_tracker.units import format_duration

__all__ = [
    "And",
    "BinOp",
    "Call",
    "Compare",
    "Duration",
    "Keyword",
    "Name",
    "Neg",
    "Node",
    "Not",
    "Number",
    "Or",
    "Text",
    "Window",
    "format_duration",
    "format_number",
    "render_name",
]

#: Binding strength of each form, low to high, as grammar.lark reads them:
#: or < and < not < comparison < + - < * / % < unary minus (and a negative literal) < atoms
#: (numbers, durations, names, windows, calls, anything in parentheses).
OR, AND, NOT, COMPARE, SUM, PRODUCT, UNARY, ATOM = range(1, 9)
PRECEDENCE = {"or": OR, "and": AND, "not": NOT, "+": SUM, "-": SUM}
PRECEDENCE.update(dict.fromkeys(("<", "<=", ">", ">=", "==", "!="), COMPARE))
PRECEDENCE.update(dict.fromkeys(("*", "/", "%"), PRODUCT))


def _operand(node: Node, need: int, canonical: bool) -> str:
    """``node`` rendered where the grammar takes only forms binding at least as tightly as
    ``need``: parenthesised when it binds less tightly. In canonical mode every compound
    node wraps itself, so nothing is added here."""
    text = node._render(canonical)
    return f"({text})" if not canonical and node.precedence < need else text


_BARE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.@]*(/[A-Za-z0-9_.@]+)*\Z")
_KEYWORDS = frozenset({"or", "and", "not"})


def render_name(name: str) -> str:
    """A metric name as the DSL writes it: bare when the grammar reads it back, else quoted.

    Raises ``ValueError`` when the name holds all three quote characters (no DSL spelling).
    """
    if _BARE_NAME.match(name) and name not in _KEYWORDS:
        return name
    for q in ('"', "'", "`"):
        if q not in name:
            return f"{q}{name}{q}"
    raise ValueError(f"metric name {name!r} holds all three quote characters: no DSL spelling")


class Node:
    """Base of every node. Subclasses are frozen dataclasses."""

    __slots__ = ()

    #: how tightly the node binds as the grammar reads it (``PRECEDENCE``); an operand that
    #: binds less tightly than its place needs is parenthesised
    precedence = ATOM

    def to_source(self, canonical: bool = False) -> str:
        """The DSL text of the condition: the fewest parentheses that keep the tree, numbers
        and durations as written. ``canonical``: fully parenthesised with every number as
        ``repr(float)`` (the frozen form rule names are hashed from)."""
        return self._render(canonical)

    def _render(self, canonical: bool) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

    def children(self) -> tuple[Node, ...]:
        return ()

    def walk(self) -> Iterator[Node]:
        """This node and every descendant, depth first, parents before children."""
        stack: list[Node] = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children()))

    def metrics(self) -> tuple[str, ...]:
        """Metric names the condition reads, in first-appearance order (no duplicates)."""
        seen: dict[str, None] = {}
        for node in self.walk():
            if isinstance(node, (Name, Window)):
                seen.setdefault(node.name, None)
        return tuple(seen)

    def functions(self) -> tuple[str, ...]:
        """Function names the condition calls, in first-appearance order."""
        seen: dict[str, None] = {}
        for node in self.walk():
            if isinstance(node, Call):
                seen.setdefault(node.func, None)
        return tuple(seen)

    def __str__(self) -> str:
        return self.to_source()


def format_number(value: float) -> str:
    """DSL text of a number given without a spelling: ``50.0 -> "50"``, ``0.5 -> "0.5"``,
    ``1e-07 -> "1e-07"``, infinities as ``1e999`` (read back as inf)."""
    value = float(value)
    if value != value:
        raise ValueError("NaN has no DSL spelling: test for it with isnan()")
    if value in (math.inf, -math.inf):
        return "1e999" if value > 0 else "-1e999"
    if value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(value)


@dataclass(frozen=True, slots=True)
class Number(Node):
    """A numeric literal (held as float). Negative literals fold into the value.

    ``text``: the number as written (``"50"``, ``"1e-3"``, ``"-0.5"``), kept for display and
    not compared (``50`` and ``50.0`` are the same condition).
    """

    value: float
    text: str = field(default="", compare=False)

    @property
    def precedence(self) -> int:  # type: ignore[override]
        """A negative literal is read as a unary minus folded into the number."""
        return UNARY if (self.text or format_number(self.value)).startswith("-") else ATOM

    def _render(self, canonical: bool) -> str:
        if canonical:
            text = repr(float(self.value))
            return f"({text})" if self.value < 0 else text
        return self.text or format_number(self.value)


@dataclass(frozen=True, slots=True)
class Duration(Node):
    """A duration literal (``30s``, ``5m``, ``2h``, ``1d``, ``250ms``) in seconds."""

    seconds: float
    text: str = field(default="", compare=False)

    def _render(self, canonical: bool) -> str:
        return self.text or format_duration(self.seconds)


@dataclass(frozen=True, slots=True)
class Name(Node):
    """A metric; evaluated bare it is the latest recorded value."""

    name: str

    def _render(self, canonical: bool) -> str:
        return render_name(self.name)


@dataclass(frozen=True, slots=True)
class Window(Node):
    """``m[N]`` (the last N recorded values) or ``m[30s]`` (values of the last 30 s).

    Exactly one of ``size`` (points) and ``seconds`` is set. Valid only as a function
    argument (checked when the rule is compiled).
    """

    name: str
    size: int | None = None
    seconds: float | None = None
    text: str = field(default="", compare=False)

    def _render(self, canonical: bool) -> str:
        if self.size is not None:
            inner = str(self.size)
        else:
            inner = self.text or format_duration(float(self.seconds or 0.0))
        return f"{render_name(self.name)}[{inner}]"


@dataclass(frozen=True, slots=True)
class Text(Node):
    """A quoted text given to a keyword argument (``runs="sweep/*"``): a word, never a
    metric."""

    text: str

    def _render(self, canonical: bool) -> str:
        for q in ('"', "'", "`"):
            if q not in self.text:
                return f"{q}{self.text}{q}"
        raise ValueError(f"text {self.text!r} holds all three quote characters: no DSL spelling")


@dataclass(frozen=True, slots=True)
class Keyword(Node):
    """``name=value``, a keyword argument of a call (``q=0.5``); a quoted value is a
    :class:`Text`."""

    name: str
    value: Node

    def children(self) -> tuple[Node, ...]:
        return (self.value,)

    def _render(self, canonical: bool) -> str:
        return f"{self.name}={self.value._render(canonical)}"


@dataclass(frozen=True, slots=True)
class Call(Node):
    """A call of a whitelisted function (``functions.FUNCTIONS``)."""

    func: str
    args: tuple[Node, ...] = ()

    def children(self) -> tuple[Node, ...]:
        return self.args

    def _render(self, canonical: bool) -> str:
        # an argument is a whole condition (grammar.lark ``args``): never parenthesised
        return f"{self.func}({', '.join(a._render(canonical) for a in self.args)})"


@dataclass(frozen=True, slots=True)
class Neg(Node):
    """Unary minus of a non-literal operand."""

    operand: Node
    precedence = UNARY

    def children(self) -> tuple[Node, ...]:
        return (self.operand,)

    def _render(self, canonical: bool) -> str:
        if canonical:
            return f"(-{self.operand._render(canonical)})"
        return f"-{_operand(self.operand, UNARY, canonical)}"


class _Binary(Node):
    """Shared by the two-operand nodes: children and the rendering.

    ``_word`` is the operator as written in the DSL (``op`` for arithmetic and
    comparisons, ``and``/``or`` for the logical nodes). The grammar's binary forms are left
    associative (``a - b - c`` is ``(a - b) - c``), and a comparison takes sums on both
    sides (``a < b < c`` is a chain, read as two comparisons): so the left operand may bind
    as loosely as the operator itself, except under a comparison, and the right operand
    must bind more tightly.
    """

    __slots__ = ()

    left: Node
    right: Node

    @property
    def _word(self) -> str:
        return self.op  # type: ignore[attr-defined]

    @property
    def precedence(self) -> int:  # type: ignore[override]
        return PRECEDENCE[self._word]

    def children(self) -> tuple[Node, ...]:
        return (self.left, self.right)

    def _render(self, canonical: bool) -> str:
        mine = self.precedence
        left = _operand(self.left, mine + 1 if mine == COMPARE else mine, canonical)
        right = _operand(self.right, mine + 1, canonical)
        text = f"{left} {self._word} {right}"
        return f"({text})" if canonical else text


@dataclass(frozen=True, slots=True)
class BinOp(_Binary):
    """Arithmetic: ``op`` is one of ``+ - * / %``."""

    op: str
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Compare(_Binary):
    """One comparison; ``op`` is one of ``< <= > >= == !=``. Chains become ``And``."""

    op: str
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class And(_Binary):
    """Kleene conjunction."""

    left: Node
    right: Node
    _word = "and"


@dataclass(frozen=True, slots=True)
class Or(_Binary):
    """Kleene disjunction."""

    left: Node
    right: Node
    _word = "or"


@dataclass(frozen=True, slots=True)
class Not(Node):
    """Kleene negation."""

    operand: Node
    precedence = NOT

    def children(self) -> tuple[Node, ...]:
        return (self.operand,)

    def _render(self, canonical: bool) -> str:
        if canonical:
            return f"(not {self.operand._render(canonical)})"
        return f"not {_operand(self.operand, NOT, canonical)}"
