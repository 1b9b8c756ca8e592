"""DSL text -> AST: the Lark LALR parser of ``grammar.lark`` and the rule-string split.

- ``parse_expr(text) -> Node`` parses a condition. Raises ``AlertSyntaxError`` (a
  ``RuleError``/``ValueError``) whose message shows the text with a caret under the bad
  column, a label for the common mistakes (``SYNTAX_EXAMPLES``, matched with Lark's
  ``UnexpectedInput.match_examples``) and what was expected there.
- ``split_rule(text) -> (condition, level, message)`` splits ``"cond => level: message"`` on
  the first top-level ``=>``; without one, on top-level commas (``"cond, level, message"``).
  Brackets and quoted names are skipped (docs/alerts.md "The one-line form").
- ``parse_rule(text) -> ParsedRule`` does both.

The grammar is loaded once per process (``get_parser``) with Lark's LALR cache.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from expr_tracker.alerts import ast
from expr_tracker.errors import ExprTrackerError
from expr_tracker.ruletext import split_rule
from expr_tracker.units import parse_duration

__all__ = [
    "SYNTAX_EXAMPLES",
    "AlertSyntaxError",
    "ParsedRule",
    "RuleError",
    "get_parser",
    "parse_expr",
    "parse_rule",
    "split_rule",
]


class RuleError(ExprTrackerError, ValueError):
    """An alert rule is invalid (syntax, unknown function, arity, type or window errors).

    Raised at registration time (``AlertRule``/``AlertEngine.add_rule``/``et rules check``),
    never during evaluation. ``column`` (1-based, or ``None``) points into ``text``;
    ``field`` names the rule field at fault (``"level"``, ``"condition"``, an unknown key)
    when known, so ``et rules check`` can point at it.
    """

    def __init__(
        self,
        message: str,
        *,
        text: str = "",
        column: int | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.text = text
        self.column = column
        self.field = field

    def __str__(self) -> str:
        if self.text and self.column is not None:
            return f"{self.message}\n{_caret(self.text, self.column)}"
        if self.text:
            return f"{self.message}\n  in: {self.text}"
        return self.message


class AlertSyntaxError(RuleError):
    """The condition does not parse. ``label`` names the mistake when it is a known one,
    ``expected`` lists what the grammar would have accepted at ``line``/``column``."""

    def __init__(
        self,
        message: str,
        *,
        text: str,
        line: int,
        column: int,
        label: str | None,
        expected: tuple[str, ...],
    ) -> None:
        super().__init__(message, text=text, column=column)
        self.line = line
        self.label = label
        self.expected = expected

    def __str__(self) -> str:
        lines = self.text.split("\n")
        shown = lines[self.line - 1] if 0 < self.line <= len(lines) else self.text
        out = [self.message, _caret(shown, self.column)]
        if self.expected:
            out.append("expected: " + ", ".join(self.expected))
        return "\n".join(out)


_BAD_UNIT = re.compile(r"(\d+(\.\d*)?|\.\d+)[A-Za-z]")


def _caret(text: str, column: int) -> str:
    return f"  {text}\n  {' ' * max(column - 1, 0)}^"


# Typical broken conditions -> the label shown to the user. Every entry is tested
# (tests/alerts/test_alerts_parse.py::test_every_syntax_example_is_labelled).
SYNTAX_EXAMPLES: dict[str, list[str]] = {
    "missing operand": [
        "loss >",
        "loss > 1 and",
        "loss +",
        "loss > 1 or",
        "not",
        "loss * > 2",
        "loss > and x",
        "a > 1 and > 2",
    ],
    "unclosed window: add ']'": ["loss[20", "mean(loss[20) > 1", "mean(loss[5m) > 1"],
    "unclosed parenthesis: add ')'": ["mean(loss[20] > 1", "(loss > 1", "abs(loss"],
    "unbalanced ')'": ["loss > 1)", "abs(loss))"],
    "division written as a name: put spaces around '/' (a / b)": [
        "a/mean(b[2]) > 1",
        "loss/abs(x) > 1",
    ],
    "window size must be a whole number of points or a duration (20, 30s, 5m)": [
        "loss[2.5]",
        "loss[x]",
        "loss[]",
        "loss[-3]",
    ],
    "unknown duration unit: use ms, s, m, h or d": [
        "loss[5min]",
        "no_data(5sec)",
        "mean(loss[5min]) > 1",
        "age(x) > 3days",
    ],
    "a window applies to a metric name, not an expression": ["(loss)[5]", "abs(loss)[5]"],
    "two operands without an operator between them": ["loss 3", "loss loss", "mean(x[3]) y"],
    "'=' is not a comparison: use '=='": ["loss = 3", "a=1"],
    "missing argument": ["max(a,)", "max(,a)", "max(a,,b)"],
    "'=>' inside the condition: the rule separator must be at the top level": ["(a => b)"],
}

# What the grammar would accept, in words, in the order shown. Several terminals may share a
# phrase (every kind of name is "a metric name"); ``_expected_words`` merges them.
_WORDS: tuple[tuple[frozenset[str], str], ...] = (
    (frozenset({"NUMBER"}), "a number"),
    (frozenset({"SIMPLE_NAME", "PATH_NAME", "QUOTED_NAME"}), "a metric name"),
    (frozenset({"SIMPLE_NAME"}), "a function call"),
    (frozenset({"DURATION"}), "a duration (30s, 5m)"),
    (frozenset({"INT"}), "a whole number of points"),
    (frozenset({"LPAR"}), "'('"),
    (frozenset({"MINUS", "PLUS"}), "a sign (- or +)"),
    (frozenset({"NOT"}), "'not'"),
    (frozenset({"ADD_OP", "MUL_OP"}), "an arithmetic operator (+ - * / %)"),
    (frozenset({"CMP_OP"}), "a comparison (< <= > >= == !=)"),
    (frozenset({"AND"}), "'and'"),
    (frozenset({"OR"}), "'or'"),
    (frozenset({"LSQB"}), "a window ('[')"),
    (frozenset({"COMMA"}), "',' and another argument"),
    (frozenset({"RSQB"}), "']' to close the window"),
    (frozenset({"RPAR"}), "')'"),
    (frozenset({"$END"}), "the end of the condition"),
)
_ANY_NAME = frozenset({"SIMPLE_NAME", "PATH_NAME", "QUOTED_NAME"})

_UNCLOSED = {
    "(": ("RPAR", "unclosed parenthesis: add ')'"),
    "[": ("RSQB", "unclosed window: add ']'"),
}


def _expected_words(names) -> tuple[str, ...]:
    """Terminal names -> phrases in reading order (``_WORDS``); unknown ones as written."""
    names = {n for n in names if not n.startswith("__")}
    out = [words for terms, words in _WORDS if names & terms]
    known = frozenset().union(*(terms for terms, _ in _WORDS))
    out += sorted(repr(n) for n in names - known)
    return tuple(out)


def _open_brackets(text: str) -> list[str]:
    """The brackets still open at the end of ``text`` (innermost last); quoted names skipped."""
    stack: list[str] = []
    quote = None
    for ch in text:
        if quote is not None:
            if ch == quote:
                quote = None
        elif ch in "\"'`":
            quote = ch
        elif ch in "([":
            stack.append(ch)
        elif ch in ")]" and stack:
            stack.pop()
    return stack


def _accepts_at_error(text: str) -> set[str] | None:
    """Every terminal the parser would take where ``text`` goes wrong, computed on the state
    *before* the offending token. Lark's own ``expected`` is taken after the reductions that
    token triggered, so at the end of ``(1`` it lists only ')' and 'or'."""
    from lark.exceptions import UnexpectedInput

    ip = get_parser().parse_interactive(text)
    tokens = ip.lexer_thread.lex(ip.parser_state)
    before = ip
    while True:
        try:
            token = next(tokens)
        except StopIteration:  # every token went in: the error is at the end
            break
        except UnexpectedInput:  # the lexer refused the next token
            break
        before = ip.copy()
        try:
            ip.feed_token(token)
        except UnexpectedInput:
            break
        before = ip
    try:
        return set(before.accepts())
    except Exception:  # pragma: no cover - fall back to Lark's list
        return None


@functools.cache
def get_parser():
    """The process-wide Lark LALR parser (grammar loaded and analysed once, cached on disk)."""
    from lark import Lark

    grammar = (Path(__file__).with_name("grammar.lark")).read_text(encoding="utf-8")
    try:
        return Lark(grammar, parser="lalr", transformer=_ToAst(), cache=True)
    except Exception:  # an unwritable cache directory must not stop the parser
        return Lark(grammar, parser="lalr", transformer=_ToAst())


def _make_transformer_base():
    from lark import Transformer

    return Transformer


class _ToAstMethods:
    """One method per word of the language (the ``-> alias`` names of grammar.lark)."""

    def number(self, children):
        text = str(children[0])
        return ast.Number(float(text), text)

    def duration(self, children):
        text = str(children[0])
        return ast.Duration(parse_duration(text), text)

    def name(self, children):
        return ast.Name(str(children[0]))

    def quoted_name(self, children):
        return ast.Name(str(children[0])[1:-1])

    def points_window(self, children):
        target, size = children
        return ast.Window(target.name, size=int(size))

    def duration_window(self, children):
        target, tok = children
        text = str(tok)
        return ast.Window(target.name, seconds=parse_duration(text), text=text)

    def call(self, children):
        func, args = children
        return ast.Call(str(func), tuple(args) if args is not None else ())

    def args(self, children):
        return list(children)

    def keyword(self, children):
        key, value = children
        if type(value) is ast.Name:  # a keyword's name value is a word: runs="sweep/*"
            value = ast.Text(value.name)
        return ast.Keyword(str(key), value)

    def neg(self, children):
        (operand,) = children
        if type(operand) is ast.Number:
            text = operand.text
            if text:
                text = text[1:] if text.startswith("-") else "-" + text
            return ast.Number(-operand.value, text)
        return ast.Neg(operand)

    def pos(self, children):
        return children[0]

    def binop(self, children):
        left, op, right = children
        return ast.BinOp(str(op), left, right)

    def compare(self, children):
        # a < b < c  ->  (a < b) and (b < c)
        result = None
        for i in range(0, len(children) - 2, 2):
            cmp = ast.Compare(str(children[i + 1]), children[i], children[i + 2])
            result = cmp if result is None else ast.And(result, cmp)
        return result

    def and_(self, children):
        return ast.And(children[0], children[2])

    def or_(self, children):
        return ast.Or(children[0], children[2])

    def not_(self, children):
        return ast.Not(children[1])


def _ToAst():  # noqa: N802 - builds the Transformer lazily so lark loads on first parse
    base = _make_transformer_base()
    cls = type("ToAst", (_ToAstMethods, base), {})
    return cls()


def parse_expr(text: str) -> ast.Node:
    """Parse one condition into an AST. Raises ``AlertSyntaxError`` with a caret message."""
    from lark.exceptions import UnexpectedInput

    if not isinstance(text, str):
        raise RuleError(f"a condition must be a string, got {type(text).__name__}")
    if not text.strip():
        raise AlertSyntaxError(
            "syntax error: empty condition",
            text=text,
            line=1,
            column=1,
            label="empty condition",
            expected=("a condition such as 'loss > 10'",),
        )
    parser = get_parser()
    try:
        return parser.parse(text)
    except UnexpectedInput as exc:
        raise _syntax_error(text, exc) from None


def _state_of(exc):
    state = getattr(exc, "state", None)
    return getattr(state, "position", state)


@functools.cache
def _example_errors() -> tuple[tuple[str, object], ...]:
    """``(label, exception)`` of every entry of ``SYNTAX_EXAMPLES``, parsed once."""
    from lark.exceptions import UnexpectedInput

    out = []
    for label, examples in SYNTAX_EXAMPLES.items():
        for example in examples:
            try:
                get_parser().parse(example)
            except UnexpectedInput as exc:
                out.append((label, exc))
    return tuple(out)


def _match_label(exc) -> str | None:
    """The label of the example failing the same way: same parser state and the same
    accepted tokens; the same offending token, then the same token type, preferred. Unlike Lark's
    ``match_examples`` the depth of the parse stack is ignored, so ``(1`` nested inside
    ``mean(loss) > (1`` matches an example written at the top level."""
    state = _state_of(exc)
    if state is None:
        return None
    token = getattr(exc, "token", None)
    accepts = getattr(exc, "accepts", None)
    best: tuple[int, str] | None = None
    for label, other in _example_errors():
        if type(other) is not type(exc) or _state_of(other) != state:
            continue
        if accepts is not None and getattr(other, "accepts", None) not in (None, accepts):
            continue
        theirs = getattr(other, "token", None)
        if token is not None and theirs is not None and str(token) == str(theirs):
            rank = 0  # the same token: the same mistake
        elif getattr(token, "type", None) == getattr(theirs, "type", None):
            rank = 1
        else:
            continue  # the same state but another token: a different mistake
        if best is None or rank < best[0]:
            best = (rank, label)
    return best[1] if best else None


_OPERAND_START = frozenset(
    {
        "NUMBER",
        "DURATION",
        "SIMPLE_NAME",
        "PATH_NAME",
        "QUOTED_NAME",
        "LPAR",
        "MINUS",
        "PLUS",
        "NOT",
    }
)
_OPERAND_TOKEN = frozenset({"NUMBER", "DURATION", "INT", "SIMPLE_NAME", "PATH_NAME", "QUOTED_NAME"})
_KEYWORD_BEFORE = re.compile(r"(^|[^A-Za-z0-9_.@/])(and|or|not)$")
_PATH_BEFORE = re.compile(r"[A-Za-z_][A-Za-z0-9_.@]*(/[A-Za-z0-9_.@]+)+\s*$")


def _structural_label(text: str, exc, token, at_end: bool, accepts: set[str]) -> str | None:
    """Labels decided by what is around the error, whatever the nesting depth: brackets
    left open or an operand missing at the end, a window on an expression, a path name
    called like a function, two operands in a row."""
    if at_end:
        # the innermost bracket left open, when closing it is one of the ways to go on
        # (at the end of "(a and" the operand is what is missing, not the ')')
        opened = _open_brackets(text)
        if opened and _UNCLOSED[opened[-1]][0] in accepts:
            return _UNCLOSED[opened[-1]][1]
        if accepts and accepts <= _OPERAND_START:
            return "missing operand"
        if accepts and accepts <= {"INT", "DURATION"}:
            return "window size must be a whole number of points or a duration (20, 30s, 5m)"
        return None
    kind = getattr(token, "type", None)
    pos = getattr(exc, "pos_in_stream", None)
    before = text[:pos].rstrip() if isinstance(pos, int) else ""
    if kind == "LSQB" and before.endswith(")"):
        return "a window applies to a metric name, not an expression"
    if kind == "LPAR" and _PATH_BEFORE.search(before):
        return "division written as a name: put spaces around '/' (a / b)"
    if kind in _OPERAND_TOKEN and accepts and not accepts & _OPERAND_START - {"LPAR"}:
        # "a > and x": where an operand was due, the keyword was read as a metric name
        if _KEYWORD_BEFORE.search(before):
            return "missing operand"
        return "two operands without an operator between them"
    return None


def _syntax_error(text: str, exc) -> AlertSyntaxError:
    from lark.exceptions import UnexpectedEOF

    label = None
    pos = getattr(exc, "pos_in_stream", None)
    bad = getattr(exc, "char", None)
    if bad is None and getattr(getattr(exc, "token", None), "type", None) == "EQUAL":
        bad = "="  # '=' is a token now (keyword arguments): refused where one is not due
    if pos is not None and bad == "=":
        if text.startswith("=>", pos):
            label = "'=>' inside the condition: the rule separator must be at the top level"
        else:
            label = "'=' is not a comparison: use '=='"
    elif pos is not None and (
        _BAD_UNIT.match(text, pos)
        or (0 < pos < len(text) and text[pos].isalpha() and text[pos - 1].isdigit())
    ):
        label = "unknown duration unit: use ms, s, m, h or d"
    token = getattr(exc, "token", None)
    at_end = isinstance(exc, UnexpectedEOF) or (
        token is not None and getattr(token, "type", "") == "$END"
    )
    accepts = _accepts_at_error(text)
    if accepts is None:
        accepts = set(getattr(exc, "accepts", None) or getattr(exc, "expected", None) or ())
        accepts |= set(getattr(exc, "allowed", None) or ())
    if label is None:
        label = _structural_label(text, exc, token, at_end, accepts)
    label = label or _match_label(exc)
    if label is None and "=>" in text:
        label = "'=>' inside the condition: the rule separator must be at the top level"
    line = getattr(exc, "line", -1)
    column = getattr(exc, "column", -1)
    if at_end or line is None or line < 1 or column < 1:
        lines = text.split("\n")
        line, column = len(lines), len(lines[-1].rstrip()) + 1
    expected = _expected_words(accepts)
    if at_end:
        found = "end of the condition"
    elif token is not None:
        found = repr(str(token))
    else:
        char = getattr(exc, "char", None)
        found = repr(char) if char else "end of the condition"
    head = f"syntax error at column {column}: "
    head += label if label else f"unexpected {found}"
    return AlertSyntaxError(
        head, text=text, line=line, column=column, label=label, expected=expected
    )


@dataclass(frozen=True, slots=True)
class ParsedRule:
    """A rule string split and parsed: ``condition`` node, optional ``level`` and ``message``
    (as written, not validated here) and ``source``, the condition text."""

    condition: ast.Node
    level: str | None
    message: str | None
    source: str


def parse_rule(text: str) -> ParsedRule:
    """Split a one-line rule and parse its condition (``AlertSyntaxError`` on bad syntax)."""
    cond, level, message = split_rule(text)
    return ParsedRule(parse_expr(cond), level, message, cond)
