"""The DSL grammar: names, windows, precedence, rule splitting, syntax errors, round trip."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from expr_tracker.alerts import ast
from expr_tracker.alerts.parse import (
    SYNTAX_EXAMPLES,
    AlertSyntaxError,
    parse_expr,
    parse_rule,
    split_rule,
)

N, W, C = ast.Name, ast.Window, ast.Call


def num(v):
    return ast.Number(float(v))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a/b > 1", ast.Compare(">", N("a/b"), num(1))),
        ("a / b > 1", ast.Compare(">", ast.BinOp("/", N("a"), N("b")), num(1))),
        ("a/ b", ast.BinOp("/", N("a"), N("b"))),
        ("a /b", ast.BinOp("/", N("a"), N("b"))),
        ("val/m1/acc@16", N("val/m1/acc@16")),
        ("eval.acc", N("eval.acc")),
        ("loss/2", N("loss/2")),
        ('"train loss"', N("train loss")),
        ("'a-b'", N("a-b")),
        ("`x y`", N("x y")),
        ("loss[20]", W("loss", size=20)),
        ("loss[30s]", W("loss", seconds=30.0)),
        ("loss[5m]", W("loss", seconds=300.0)),
        ("loss[2h]", W("loss", seconds=7200.0)),
        ("loss[1d]", W("loss", seconds=86400.0)),
        ("loss[250ms]", W("loss", seconds=0.25)),
        ('"a b"[3]', W("a b", size=3)),
        ("5m", ast.Duration(300.0)),
        ("-3", num(-3)),
        ("-x", ast.Neg(N("x"))),
        ("+x", N("x")),
        ("notable", N("notable")),
        ("order", N("order")),
        ("1e-5", num(1e-5)),
        ("max(a, b)", C("max", (N("a"), N("b")))),
        ("step()", C("step", ())),
    ],
)
def test_atoms_and_names(text, expected):
    assert parse_expr(text) == expected


def test_precedence_matches_the_spec():
    # or < and < not < comparison < +- < */% < unary < call/window
    got = parse_expr("not a > 1 + 2 * -b or c and d")
    a_cmp = ast.Compare(
        ">", N("a"), ast.BinOp("+", num(1), ast.BinOp("*", num(2), ast.Neg(N("b"))))
    )
    assert got == ast.Or(ast.Not(a_cmp), ast.And(N("c"), N("d")))
    # the Python trap from C.1: diff(m1)>50 | m1>5 is an or of two comparisons
    assert parse_expr("diff(m1)>50 | m1>5") == ast.Or(
        ast.Compare(">", C("diff", (N("m1"),)), num(50)), ast.Compare(">", N("m1"), num(5))
    )


def test_symbol_aliases():
    assert parse_expr("a || b && !c") == parse_expr("a or b and not c")
    assert parse_expr("a | b & !c") == parse_expr("a or (b and (not c))")


def test_chained_comparison_is_a_conjunction():
    assert parse_expr("a < b <= c") == ast.And(
        ast.Compare("<", N("a"), N("b")), ast.Compare("<=", N("b"), N("c"))
    )


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("zscore(loss[50]) > 4 => error: spike", ("zscore(loss[50]) > 4", "error", "spike")),
        ("x > 1 => warn", ("x > 1", "warn", None)),
        ("x > 1 => : just a message", ("x > 1", None, "just a message")),
        ("x > 1 => error: a: b", ("x > 1", "error", "a: b")),
        ("x > 1", ("x > 1", None, None)),
        ('"a=>b" > 1 => info: q', ('"a=>b" > 1', "info", "q")),
        ("max(a, b) > 1, warn, oh, no", ("max(a, b) > 1", "warn", "oh, no")),
        ("max(a, b) > 1", ("max(a, b) > 1", None, None)),
    ],
)
def test_split_rule(text, parts):
    assert split_rule(text) == parts


def test_parse_rule():
    r = parse_rule("isnan(loss) => critical: nan")
    assert r.condition == C("isnan", (N("loss"),))
    assert (r.level, r.message, r.source) == ("critical", "nan", "isnan(loss)")


@pytest.mark.parametrize(
    ("label", "example"), [(lab, ex) for lab, exs in SYNTAX_EXAMPLES.items() for ex in exs]
)
def test_every_syntax_example_is_labelled(label, example):
    with pytest.raises(AlertSyntaxError) as info:
        parse_expr(example)
    assert info.value.label == label
    assert label in str(info.value)


def test_syntax_error_shows_a_caret_and_what_was_expected():
    with pytest.raises(AlertSyntaxError) as info:
        parse_expr("loss > 1 and")
    err = info.value
    text = str(err)
    lines = text.splitlines()
    assert lines[1] == "  loss > 1 and"
    assert lines[2].index("^") == 2 + len("loss > 1 and")  # just past the end
    assert "expected:" in text and "a number" in text
    assert err.column == 13 and err.label == "missing operand"

    with pytest.raises(AlertSyntaxError) as info:
        parse_expr("a/mean(b[3]) > 1")
    assert info.value.column == 7  # under the "("
    assert str(info.value).splitlines()[2] == "  " + " " * 6 + "^"


def test_empty_condition():
    with pytest.raises(AlertSyntaxError, match="empty"):
        parse_expr("   ")


# -- round trip: to_source() has the fewest parentheses and parses back to the same tree -----

_names = st.one_of(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_.@]{0,6}(/[A-Za-z0-9_.@]{1,4}){0,2}", fullmatch=True),
    st.text(min_size=0, max_size=6).filter(lambda s: not all(q in s for q in "\"'`")),
)
_durations = st.sampled_from(["250ms", "30s", "5m", "2h", "1d", "1.5s"])
_numbers = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False).map(ast.Number)


def _window(name, which, size, dur):
    if which:
        return ast.Window(name, size=size)
    node = parse_expr(f"x[{dur}]")
    return ast.Window(name, seconds=node.seconds, text=node.text)


_windows = st.builds(
    _window, _names, st.booleans(), st.integers(min_value=1, max_value=4096), _durations
)
_leaves = st.one_of(
    _numbers,
    st.builds(ast.Name, _names),
    _durations.map(lambda d: parse_expr(d)),
)


def _extend(children):
    funcs = st.sampled_from(["mean", "zscore", "abs", "max", "isnan", "ema", "step"])
    # a minus before a literal folds into it when parsed: Neg(Number) is never a parsed tree
    not_number = children.filter(lambda n: not isinstance(n, ast.Number))
    return st.one_of(
        st.builds(ast.Neg, not_number),
        st.builds(ast.BinOp, st.sampled_from("+-*/%"), children, children),
        st.builds(
            ast.Compare, st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), children, children
        ),
        st.builds(ast.And, children, children),
        st.builds(ast.Or, children, children),
        st.builds(ast.Not, children),
        st.builds(ast.Call, funcs, st.lists(st.one_of(children, _windows), max_size=3).map(tuple)),
    )


_trees = st.recursive(_leaves, _extend, max_leaves=12)


def _grouping_parens(text: str) -> list[tuple[int, int]]:
    """(open, close) offsets of each pair of grouping parentheses in a rendered condition:
    not a call's (a "(" right after a name character) and not inside a quoted name."""
    pairs, stack, quote = [], [], None
    for i, ch in enumerate(text):
        if quote is not None:
            quote = None if ch == quote else quote
        elif ch in "\"'`":
            quote = ch
        elif ch == "(":
            is_call = i > 0 and (text[i - 1].isalnum() or text[i - 1] in "_.@")
            stack.append(None if is_call else i)
        elif ch == ")":
            opened = stack.pop()
            if opened is not None:
                pairs.append((opened, i))
    return pairs


def _check_rendering(node):
    text = node.to_source()
    assert str(node) == text
    assert parse_expr(text) == node
    # the fewest parentheses: dropping any pair reads another tree, or nothing
    for i, j in _grouping_parens(text):
        fewer = text[:i] + text[i + 1 : j] + text[j + 1 :]
        try:
            assert parse_expr(fewer) != node, f"{text!r}: the pair at {i} is not needed"
        except AlertSyntaxError:
            pass
    # the one-line form splits around any rendering (quoted names may hold => , :)
    rule = parse_rule(f"{text} => error: msg: {text}")
    assert (rule.condition, rule.level, rule.message) == (node, "error", f"msg: {text}")
    # the canonical form (rule-name digests) is fully parenthesised and reads back too
    assert parse_expr(node.to_source(canonical=True)) == node


@settings(max_examples=150, deadline=None)
@given(_trees)
def test_to_source_round_trips_with_the_fewest_parentheses(node):
    _check_rendering(node)


@pytest.mark.slow
@settings(max_examples=1500, deadline=None)
@given(st.recursive(_leaves, _extend, max_leaves=25))
def test_to_source_round_trips_with_the_fewest_parentheses_deep(node):
    _check_rendering(node)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("((a > 1) and (b < 2))", "a > 1 and b < 2"),
        ("(a or b) and c", "(a or b) and c"),
        ("a or (b and c)", "a or b and c"),
        ("(a or b) or c", "a or b or c"),
        ("a or (b or c)", "a or (b or c)"),
        ("a - (b - c)", "a - (b - c)"),
        ("(a - b) - c", "a - b - c"),
        ("a + (b + c)", "a + (b + c)"),  # another tree: floating point is not associative
        ("(a + b) * c", "(a + b) * c"),
        ("a + (b * c)", "a + b * c"),
        ("a / (b * c)", "a / (b * c)"),
        ("not (a and b)", "not (a and b)"),
        ("(not a) and b", "not a and b"),
        ("not (not a)", "not not a"),
        ("not (a > 1)", "not a > 1"),
        ("(a < b) == c", "(a < b) == c"),
        ("a < b < c", "a < b and b < c"),
        ("-(a * b)", "-(a * b)"),
        ("(-a) * b", "-a * b"),
        ("- -a", "--a"),
        ("a - (-3)", "a - -3"),
        ("x > (-2.50)", "x > -2.50"),
        ("mean((x[5])) > (1)", "mean(x[5]) > 1"),
        ("max((a or b), c + 1) > 0", "max(a or b, c + 1) > 0"),
        ("(diff(m1) > 50) | (m1 > 5)", "diff(m1) > 50 or m1 > 5"),
        ("!(a && b) || c", "not (a and b) or c"),
        ('"my metric" > 1 and `a:b=>c` < 2', '"my metric" > 1 and "a:b=>c" < 2'),
    ],
)
def test_to_source_prints_the_fewest_parentheses(text, shown):
    assert parse_expr(text).to_source() == shown
    assert parse_expr(shown) == parse_expr(text)


def test_canonical_form_is_frozen():
    """Rule-name digests are hashed from it: fully parenthesised, numbers as floats."""
    node = parse_expr("a > 1 and not b < -2 or -c * 2 > 1e-3")
    assert node.to_source(canonical=True) == (
        "(((a > 1.0) and (not (b < (-2.0)))) or (((-c) * 2.0) > 0.001))"
    )


_SPELLED = st.sampled_from(["50", "1e-3", "0.5", ".5", "5.", "2.50", "1E3", "0", "007", "1e+2"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_SPELLED, st.booleans()), min_size=1, max_size=4))
def test_numbers_render_as_written_and_round_trip(numbers):
    """Each number keeps its spelling (and sign) in to_source(); the text parses back to
    the same tree, and the spelling never changes what the condition means."""
    terms = [("-" if neg else "") + text for text, neg in numbers]
    text = "x > " + " + ".join(terms)
    node = parse_expr(text)
    src = node.to_source()
    assert src == text
    assert parse_expr(src) == node
    canonical = node.to_source(canonical=True)
    assert parse_expr(canonical) == node


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("loss > 50", "loss > 50"),
        ("loss > 50.0", "loss > 50.0"),
        ("mean(x[5]) < 1e-3", "mean(x[5]) < 1e-3"),
        ("y == 0.5", "y == 0.5"),
        ("z > -2.50", "z > -2.50"),
        ("z > - 3", "z > -3"),
        ("z > --3", "z > 3"),
    ],
)
def test_to_source_keeps_numbers_as_written(text, shown):
    assert parse_expr(text).to_source() == shown


def test_numbers_built_in_python_render_without_a_float_suffix():
    from expr_tracker.alerts import M

    assert (M.loss > 50).to_source() == "loss > 50"
    assert (M.loss < 0.5).to_source() == "loss < 0.5"
    assert (M.loss > -3).to_source() == "loss > -3"
    assert (M.loss > 1e-7).to_source() == "loss > 1e-07"
    assert (M.loss < 1e300).to_source() == "loss < 1e+300"
    assert parse_expr((M.loss < float("inf")).to_source()) == (M.loss < float("inf")).node


def test_spelling_does_not_change_an_auto_derived_rule_name():
    from expr_tracker.alerts import M, make_rule

    # the digest is hashed from the spelling-free form, so names stay what they were
    text = (
        "zscore(train/loss[50]) > 4 => error: train/loss spiked to {train/loss:.4f} at step {step}"
    )
    assert make_rule(text).name == "zscore(train/loss[50]) > 4 [error#ba05ff]"  # README
    assert make_rule(M.loss > 50, level="error").name == "loss > 50 [error#dd311f]"


# -- labels whatever the nesting, end of input, expected tokens in words -----------------------

# Every label of SYNTAX_EXAMPLES hit by a condition that is not one of its examples: deeper
# nesting, another context. (Lark's own matcher compares parse-stack depth, so before these
# were matched structurally "mean(loss) > (1" got no label at all.)
LABELLED_IN_CONTEXT = {
    "missing operand": ["(a > 1 and", "x > -", "(", "x > 1 or or y", "1 > (2 *"],
    "unclosed window: add ']'": ["x > mean(loss[20", "(max(a[5m) > 1)"],
    "unclosed parenthesis: add ')'": [
        "mean(loss) > (1",
        "a > 1 and (b < 2",
        "max(a, b",
        "abs(abs(loss",
        "f(a) > (g(b) or h(c)",
    ],
    "unbalanced ')'": ["(a > 1))", "x > 1 and y)"],
    "division written as a name: put spaces around '/' (a / b)": ["(x > loss/mean(y[3]))"],
    "window size must be a whole number of points or a duration (20, 30s, 5m)": [
        "mean(x[1.5]) > 1",
        "x > mean(loss[",
    ],
    "unknown duration unit: use ms, s, m, h or d": ["mean(x[4h]) > age(y) + 1hour"],
    "a window applies to a metric name, not an expression": [
        "x > mean((b)[3])",
        "mean(x[2]) > abs(y)[3]",
    ],
    "two operands without an operator between them": ["(a > 1 and b 2)", "x > (y) z"],
    "'=' is not a comparison: use '=='": ["(x = 2)"],
    "missing argument": ["max(a, , b) > 1", "x > min(,a)"],
    "'=>' inside the condition: the rule separator must be at the top level": ["f(a => b)"],
}


def test_every_label_is_covered_in_context():
    assert set(LABELLED_IN_CONTEXT) == set(SYNTAX_EXAMPLES)


@pytest.mark.parametrize(
    ("label", "text"), [(lab, t) for lab, ts in LABELLED_IN_CONTEXT.items() for t in ts]
)
def test_labels_match_whatever_the_nesting(label, text):
    assert text not in SYNTAX_EXAMPLES[label]
    with pytest.raises(AlertSyntaxError) as info:
        parse_expr(text)
    assert info.value.label == label


def test_end_of_input_without_a_label_reads_unexpected_end(monkeypatch):
    from expr_tracker.alerts import parse as parse_mod

    with pytest.raises(AlertSyntaxError) as info:
        parse_expr("x > )")
    assert info.value.label is None and "unexpected ')'" in str(info.value)
    # every end-of-input mistake has a label now: take them away to see the plain wording
    monkeypatch.setattr(parse_mod, "_structural_label", lambda *args: None)
    monkeypatch.setattr(parse_mod, "_match_label", lambda exc: None)
    with pytest.raises(AlertSyntaxError) as info:
        parse_expr("x > -")
    text = str(info.value)
    assert text.startswith("syntax error at column 6: unexpected end of the condition")
    assert "unexpected the end" not in text


def test_expected_tokens_are_words_and_complete():
    with pytest.raises(AlertSyntaxError) as info:
        parse_expr("mean(loss) > (1")
    expected = info.value.expected
    # everything that may follow "(1", not just what Lark lists after reducing to "( expr"
    assert expected == (
        "an arithmetic operator (+ - * / %)",
        "a comparison (< <= > >= == !=)",
        "'and'",
        "'or'",
        "')'",
    )
    with pytest.raises(AlertSyntaxError) as info:
        parse_expr("loss >")
    assert info.value.expected[:3] == ("a number", "a metric name", "a function call")
    for text in ("loss >", "x[3", "loss 3", "max(a, b"):
        with pytest.raises(AlertSyntaxError) as info:
            parse_expr(text)
        shown = str(info.value).splitlines()[-1]
        assert shown.startswith("expected: ")
        assert not any(raw in shown for raw in ("RPAR", "CMP_OP", "$END", "SIMPLE_NAME", "RSQB"))
