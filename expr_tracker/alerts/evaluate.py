"""AST -> one compiled closure, evaluated with three-valued (Kleene) logic.

``compile_expr(node, window=4096, known_metrics=None) -> CompiledExpr`` checks the whole
condition once (functions, arity, argument kinds, window sizes; ``RuleError`` on any
problem) and builds nested closures, so evaluating is a chain of plain calls: no tree
walking, no isinstance ladders (docs/architecture.md "The hot path").

``CompiledExpr.fn(ctx) -> True | False | None``. ``None`` is UNKNOWN (``UNKNOWN`` below):
missing metric, short window, NaN in a comparison, zero division, domain errors
(docs/alerts.md "Three-valued logic"). ``A and B`` is False when either is False, ``A or B`` True when
either is True, anything else with an UNKNOWN is UNKNOWN. Only an exact True fires.

Scalars flow as floats (NaN propagates through arithmetic and is UNKNOWN at a comparison;
``isnan`` sees it). A bare metric in a logical position is true when non-zero.

Metric names resolve when evaluated: the exact name, then with ``.`` replaced by ``/``
(``eval.acc`` finds ``eval/acc``); a series found once is cached in the closure.
``EvalContext`` carries what the closures read: ``series`` (name -> MetricSeries), ``now``
(epoch seconds: the row time, or the wall clock on the watchdog — display only, for
``{time}``), ``mono`` (the engine's time base, now), ``step``, ``last_commit_mono``,
``start_mono``.

Time base: everything that measures elapsed time — ``age()``, duration windows, ``rate``,
``elapsed()``, ``no_data()`` — reads ``mono`` and the series' ``times``, which the engine
stamps with the same clock: live, a monotonic clock read at commit, so a wall-clock jump
(an NTP correction) moves none of them; in a replay, a clock driven by the recorded
``_time`` (``alerts.testing.replay``). ``now`` is never used to measure anything.
"""

from __future__ import annotations

import difflib
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from expr_tracker.alerts import ast
from expr_tracker.alerts.closures import (
    ARITH,
    as_truthy,
    duration_call,
    fused_compare,
    fused_isnan,
    fused_latest_call,
    points_call,
    scalar_call,
    series_cell,
    series_getter,
)
from expr_tracker.alerts.functions import FUNCTIONS, TIME_BASED, Signature
from expr_tracker.alerts.parse import RuleError
from expr_tracker.alerts.running import zscore_call
from expr_tracker.history.values import format_value

__all__ = [
    "UNKNOWN",
    "CompiledExpr",
    "EvalContext",
    "compile_expr",
    "render_observed",
]

#: the third truth value: "cannot tell" (missing data, short window, NaN, zero division)
UNKNOWN = None

DEFAULT_WINDOW = 4096

_CMP = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}

_KIND_TEXT = {
    "scalar": "a number",
    "bool": "a condition (true/false)",
    "window": "a window such as loss[20]",
    "name": "a metric name",
    "duration": "a duration such as 5m",
}


class EvalContext:
    """What compiled closures read. One per engine, updated in place per evaluation."""

    __slots__ = (
        "series",
        "now",
        "mono",
        "step",
        "last_commit_mono",
        "start_mono",
        "truncated",
        "peers",
    )

    def __init__(
        self,
        series: dict | None = None,
        *,
        now: float = 0.0,
        mono: float = 0.0,
        peers: object = None,
    ):
        self.series: dict = {} if series is None else series
        self.now = now
        self.mono = mono
        self.step: int | None = None
        self.last_commit_mono: float | None = None
        self.start_mono = mono
        self.truncated: set[str] = set()
        self.peers: Any = peers  # RankSkew on rank 0 of a multi-rank run, else None


@dataclass(frozen=True, slots=True)
class CompiledExpr:
    """A checked, compiled condition.

    ``fn(ctx)``: True/False/None. ``needs``: metric name -> number of recent values the
    condition reads (sizes the ring buffers). ``time_based``: uses ``no_data``/``age``/
    ``elapsed`` (evaluated by the watchdog too). ``kind``: ``bool`` or ``scalar`` (a bare
    number used as a condition: true when non-zero).
    """

    node: ast.Node
    fn: Callable[[EvalContext], bool | None]
    needs: dict[str, int] = field(default_factory=dict)
    time_based: bool = False
    kind: str = "bool"

    @property
    def metrics(self) -> tuple[str, ...]:
        return self.node.metrics()


class _Compiler:
    def __init__(
        self, window: int | None, known: set[str] | None, text: str, baselines: Any = None
    ):
        self.window = window
        self.known = known
        self.text = text
        self.baselines = baselines
        self.needs: dict[str, int] = {}
        self.time_based = False

    # -- helpers -----------------------------------------------------------------------
    def error(self, message: str, node: ast.Node | None = None) -> RuleError:
        column = None
        if node is not None and self.text:
            src = node.to_source()
            at = self.text.find(src)
            if at < 0 and isinstance(node, (ast.Call, ast.Name, ast.Window)):
                key = node.func if isinstance(node, ast.Call) else node.name
                at = self.text.find(key)
            column = at + 1 if at >= 0 else None
        return RuleError(message, text=self.text, column=column)

    def need(self, name: str, n: int) -> None:
        if not name:  # "" > 1, M[""]: log() drops an empty key, so no value ever comes
            spots = [at for q in ('""', "''", "``") if (at := self.text.find(q)) >= 0]
            raise RuleError(
                "a metric name cannot be empty: log() records no metric under '', so the "
                "rule could never fire",
                text=self.text,
                column=min(spots) + 1 if spots else None,
            )
        if self.known is not None:
            alt = name.replace(".", "/")
            if name not in self.known and alt not in self.known:
                close = difflib.get_close_matches(name, sorted(self.known), n=3)
                hint = f" (did you mean {', '.join(close)}?)" if close else ""
                raise self.error(f"unknown metric {name!r}{hint}", ast.Name(name))
        if n > self.needs.get(name, 0):
            self.needs[name] = n

    def compile(self, node: ast.Node) -> tuple[Callable, str]:
        method = getattr(self, "c_" + type(node).__name__.lower(), None)
        if method is None:
            raise self.error(f"not an expression node: {type(node).__name__}")
        return method(node)

    def scalar(self, node: ast.Node, what: str) -> Callable:
        fn, kind = self.compile(node)
        if kind != "scalar":
            raise self.error(f"{what} needs a number, got {_KIND_TEXT[kind]}", node)
        return fn

    def logical(self, node: ast.Node) -> Callable:
        fn, kind = self.compile(node)
        if kind == "bool":
            return fn
        if kind == "scalar":
            return as_truthy(fn)
        raise self.error(f"expected a condition, got {_KIND_TEXT[kind]}", node)

    # -- leaves ------------------------------------------------------------------------
    def c_number(self, node: ast.Number):
        value = float(node.value)
        return (lambda ctx: value), "scalar"

    def c_duration(self, node: ast.Duration):
        value = float(node.seconds)
        return (lambda ctx: value), "scalar"

    def c_name(self, node: ast.Name):
        self.need(node.name, 1)
        get = series_getter(node.name)

        def latest(ctx):
            s = get(ctx)
            if s is None:
                return None
            v = s.values
            return v[-1] if v else None

        return latest, "scalar"

    def c_window(self, node: ast.Window):
        raise self.error(
            f"the window {node.to_source()} must be the argument of a function such as "
            f"mean({node.to_source()}) or last({node.to_source()})",
            node,
        )

    # -- operators ---------------------------------------------------------------------
    def c_neg(self, node: ast.Neg):
        f = self.scalar(node.operand, "unary minus")

        def neg(ctx):
            a = f(ctx)
            return None if a is None else -a

        return neg, "scalar"

    def c_binop(self, node: ast.BinOp):
        lf = self.scalar(node.left, f"'{node.op}'")
        rf = self.scalar(node.right, f"'{node.op}'")
        return ARITH[node.op](lf, rf), "scalar"

    def c_compare(self, node: ast.Compare):
        lf = self.scalar(node.left, f"'{node.op}'")
        op = _CMP[node.op]
        if isinstance(node.left, ast.Name) and isinstance(node.right, (ast.Number, ast.Duration)):
            self.scalar(node.right, f"'{node.op}'")
            self.need(node.left.name, 1)
            return fused_compare(node.left.name, op, node.right), "bool"
        if isinstance(node.right, (ast.Number, ast.Duration)):
            c = float(
                node.right.value if isinstance(node.right, ast.Number) else node.right.seconds
            )
            self.scalar(node.right, f"'{node.op}'")
            fuse = getattr(lf, "with_compare", None)
            if fuse is not None:  # zscore(m[N]) <op> c in one closure (running.py)
                return fuse(op, c), "bool"

            def cmp_const(ctx):
                a = lf(ctx)
                if a is None or a != a:
                    return None
                return op(a, c)

            return cmp_const, "bool"
        rf = self.scalar(node.right, f"'{node.op}'")

        def cmp(ctx):
            a = lf(ctx)
            if a is None or a != a:
                return None
            b = rf(ctx)
            if b is None or b != b:
                return None
            return op(a, b)

        return cmp, "bool"

    def c_and(self, node: ast.And):
        lf, rf = self.logical(node.left), self.logical(node.right)

        def and_(ctx):
            a = lf(ctx)
            if a is False:
                return False
            b = rf(ctx)
            if b is False:
                return False
            return True if (a is True and b is True) else None

        return and_, "bool"

    def c_or(self, node: ast.Or):
        lf, rf = self.logical(node.left), self.logical(node.right)

        def or_(ctx):
            a = lf(ctx)
            if a is True:
                return True
            b = rf(ctx)
            if b is True:
                return True
            return False if (a is False and b is False) else None

        return or_, "bool"

    def c_not(self, node: ast.Not):
        f = self.logical(node.operand)

        def not_(ctx):
            a = f(ctx)
            return None if a is None else not a

        return not_, "bool"

    def c_keyword(self, node: ast.Keyword):
        raise self.error(f"a keyword argument ({node.to_source()}) belongs in a call", node)

    def c_text(self, node: ast.Text):
        raise self.error(
            f"a quoted text ({node.to_source()}) is only a keyword argument's value, such as "
            'runs="sweep/*"',
            node,
        )

    # -- calls -------------------------------------------------------------------------
    def c_call(self, node: ast.Call):
        sigs = FUNCTIONS.get(node.func)
        if sigs is None:
            close = difflib.get_close_matches(node.func, list(FUNCTIONS), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise self.error(f"unknown function {node.func!r}{hint}", node)
        if node.func == "baseline":
            return self.f_baseline(node), "scalar"
        for arg in node.args:
            if isinstance(arg, ast.Keyword):
                raise self.error(
                    f"{node.func}() takes no keyword arguments, got {arg.to_source()}", node
                )
        if node.func in TIME_BASED:
            self.time_based = True
        sig = self._pick(node, sigs)
        if sig.window_param:
            return self._window_call(node, sig)
        special = getattr(self, "f_" + node.func, None)
        if special is not None:
            return special(node), sig.returns
        fns = [self.scalar(a, f"{node.func}()") for a in node.args]
        if len(node.args) == 1 and isinstance(node.args[0], ast.Name):
            if node.func == "isnan":
                return fused_isnan(node.args[0].name), sig.returns
            return fused_latest_call(node.args[0].name, sig.impl), sig.returns
        return scalar_call(sig.impl, fns), sig.returns

    def _pick(self, node: ast.Call, sigs: tuple[Signature, ...]) -> Signature:
        for sig in sigs:
            n = len(node.args)
            if sig.variadic:
                if n >= sig.min_args and not any(isinstance(a, ast.Window) for a in node.args):
                    return sig
                continue
            if n != len(sig.params):
                continue
            first = node.args[0] if node.args else None
            if sig.window_param and not (
                isinstance(first, ast.Window)
                or (node.func == "diff" and isinstance(first, ast.Name))
            ):
                continue
            return sig
        raise self.error(f"{node.func}() {self._usage(node.func, sigs)}", node)

    @staticmethod
    def _usage(name: str, sigs: tuple[Signature, ...]) -> str:
        shapes = []
        for sig in sigs:
            if sig.variadic:
                shapes.append(f"{name}(a, b, ...) with two or more numbers")
            elif sig.window_param:
                extra = "".join(", " + p for p in sig.params[1:])
                shapes.append(f"{name}(metric[N or duration]{extra}) with an explicit window")
            else:
                shapes.append(f"{name}({', '.join(sig.params)})")
        return "takes " + " or ".join(shapes)

    def _window_call(self, node: ast.Call, sig: Signature):
        win = node.args[0]
        if isinstance(win, ast.Name):  # diff(m) is diff(m[2])
            win = ast.Window(win.name, size=2)
        extras = [self.scalar(a, f"{node.func}()") for a in node.args[1:]]
        impl = sig.impl
        get, cell = series_cell(win.name)
        if win.size is not None:
            n = win.size
            if n < max(sig.min_points, 1):
                raise self.error(
                    f"{node.func}() needs a window of at least {max(sig.min_points, 1)} points, "
                    f"got {win.to_source()}",
                    node,
                )
            if self.window is not None and n > self.window:
                raise self.error(
                    f"window {win.to_source()} is wider than alert_window={self.window}; "
                    "raise history.alert_window (et.init(alert_window=N)) or use a "
                    "smaller window",
                    node,
                )
            self.need(win.name, n)
            if node.func == "zscore" and not extras and n >= 2:  # O(1) a step (running.py)
                return zscore_call(get, n, impl, cell), sig.returns
            return points_call(get, n, impl, sig.needs, extras), sig.returns
        secs = float(win.seconds or 0.0)
        if not secs > 0:
            raise self.error(f"window {win.to_source()} must be longer than zero", node)
        self.need(win.name, self.window or 0)
        return duration_call(get, win.name, secs, impl, sig.needs, extras), sig.returns

    # functions that read the context rather than values
    def f_has(self, node: ast.Call):
        name = self._name_arg(node)
        self.need(name, 1)
        get = series_getter(name)

        def has(ctx):
            s = get(ctx)
            return s is not None and s.count > 0

        return has

    def f_age(self, node: ast.Call):
        name = self._name_arg(node)
        self.need(name, 1)
        get = series_getter(name)

        def age(ctx):
            s = get(ctx)
            if s is None or not s.times:
                return None
            return ctx.mono - s.times[-1]

        return age

    def f_no_data(self, node: ast.Call):
        arg = node.args[0]
        if isinstance(arg, ast.Duration):
            secs = float(arg.seconds)
        elif isinstance(arg, ast.Number):
            secs = float(arg.value)
        else:
            raise self.error("no_data() takes a duration literal such as no_data(5m)", node)
        if not secs > 0:
            raise self.error("no_data() needs a duration longer than zero", node)

        def no_data(ctx):
            last = ctx.last_commit_mono
            return ctx.mono - (ctx.start_mono if last is None else last) > secs

        return no_data

    def f_step(self, node: ast.Call):
        def step(ctx):
            s = ctx.step
            return None if s is None else float(s)

        return step

    def f_skew(self, node: ast.Call):
        """max / median across ranks of the metric's value at one step, judged on rank 0
        once every rank has written that step (``expr_tracker.history.peers.RankSkew``);
        UNKNOWN elsewhere, for a missing rank, or when no new step is complete
        (docs/streams.md "Straggler ranks")."""
        name = self._name_arg(node)
        self.need(name, 1)
        get = series_getter(name)

        def skew(ctx):
            peers = ctx.peers
            if peers is None:
                return None
            s = get(ctx)
            if s is None or not s.values:
                return None
            res = peers.skew(s.name, ctx.step, s.steps[-1], s.values[-1])
            return None if res is None else res[0]

        return skew

    def f_baseline(self, node: ast.Call):
        """``baseline(metric, runs="project/glob", q=0.5, min_runs=1)``: the q-quantile of
        ``metric`` at this step across finished peer runs (alerts/baseline.py)."""
        usage = 'baseline(metric, runs="project/*", q=0.5, min_runs=1)'
        positional = [a for a in node.args if not isinstance(a, ast.Keyword)]
        keywords: dict[str, ast.Node] = {}
        for a in node.args:
            if isinstance(a, ast.Keyword):
                if a.name in keywords:
                    raise self.error(f"baseline(): {a.name}= given twice", node)
                if a.name not in ("runs", "q", "min_runs"):
                    raise self.error(
                        f"baseline() has no argument {a.name!r}: {usage} (runs, q and "
                        "min_runs are keywords)",
                        node,
                    )
                keywords[a.name] = a.value
            elif keywords:
                raise self.error(
                    f"baseline(): a positional argument after a keyword: {usage}", node
                )
        if len(positional) != 1 or not isinstance(positional[0], ast.Name):
            raise self.error(f"baseline() takes one bare metric name first: {usage}", node)
        metric = positional[0].name
        runs = keywords.get("runs")
        if runs is not None and not isinstance(runs, ast.Text):
            raise self.error(
                f'baseline(): runs must be a quoted glob of project/name such as "sweep/*", '
                f"got {runs.to_source()}",
                node,
            )
        pattern = runs.text if isinstance(runs, ast.Text) else None
        if pattern is not None and (
            not pattern or pattern.startswith("/") or ".." in pattern.split("/")
        ):
            raise self.error(
                f"baseline(): runs={pattern!r} must name runs inside the runs root as "
                '"project/name" with globs ("sweep/*"), not a path',
                node,
            )
        q = self._number_kw(keywords, "q", 0.5, node)
        if not 0.0 <= q <= 1.0:
            raise self.error(f"baseline(): q must be a quantile in [0, 1], got {q:g}", node)
        min_runs = self._number_kw(keywords, "min_runs", 1.0, node)
        if min_runs < 1 or not float(min_runs).is_integer():
            raise self.error(
                f"baseline(): min_runs must be a whole number >= 1, got {min_runs:g}", node
            )
        provider = self.baselines
        if provider is None:  # checked only (no engine): UNKNOWN
            return lambda ctx: None
        table = provider.table(metric, pattern, q, int(min_runs))
        at = table.at

        def baseline(ctx):
            return at(ctx.step)

        return baseline

    def _number_kw(self, keywords: dict, key: str, default: float, node: ast.Call) -> float:
        value = keywords.get(key)
        if value is None:
            return default
        if isinstance(value, ast.Neg) or not isinstance(value, ast.Number):
            raise self.error(f"baseline(): {key} must be a number, got {value.to_source()}", node)
        return float(value.value)

    def f_elapsed(self, node: ast.Call):
        return lambda ctx: ctx.mono - ctx.start_mono

    def _name_arg(self, node: ast.Call) -> str:
        arg = node.args[0]
        if not isinstance(arg, ast.Name):
            raise self.error(
                f"{node.func}() takes a bare metric name, e.g. {node.func}(loss)", node
            )
        return arg.name


def compile_expr(
    node: ast.Node,
    *,
    window: int | None = DEFAULT_WINDOW,
    known_metrics: Iterable[str] | None = None,
    text: str = "",
    baselines: Any = None,
) -> CompiledExpr:
    """Check ``node`` and compile it. ``window`` caps point windows (``alert_window``);
    None checks everything but the cap (a rule made without an engine: the engine checks
    it against the configured ``alert_window``, and says so). ``known_metrics``, when given,
    turns a name absent from it (exact or ``.`` -> ``/``) into an error. ``text`` (the
    source) lets errors point at a column.

    Raises ``RuleError`` for unknown functions, wrong arity or argument kinds, a window
    outside a function, a window narrower than the function needs or wider than
    ``window``, and (with ``known_metrics``) unknown metric names. ``baselines`` (an
    ``alerts.baseline.Baselines``) gives ``baseline()`` calls their tables; None: they are
    checked and UNKNOWN.
    """
    if not isinstance(node, ast.Node):
        raise RuleError(f"a condition must be an expression node, got {type(node).__name__}")
    known = set(known_metrics) if known_metrics is not None else None
    comp = _Compiler(None if window is None else int(window), known, text, baselines)
    fn, kind = comp.compile(node)
    if kind == "scalar":
        fn = as_truthy(fn)
    elif kind != "bool":  # pragma: no cover - windows are rejected by c_window
        raise comp.error(f"a condition must be true/false, got {_KIND_TEXT[kind]}", node)
    return CompiledExpr(node, fn, comp.needs, comp.time_based, kind)


def render_observed(
    node: ast.Node, ctx: EvalContext, *, window: int = DEFAULT_WINDOW, baselines: Any = None
) -> str:
    """The condition with the values observed now: ``zscore(loss[50])=4.2 > 3.0``.

    Used for the ``{expr}`` template placeholder; runs only when a message is rendered.
    Never raises: a part that cannot be evaluated shows as ``UNKNOWN``.
    """

    def value_of(n: ast.Node) -> str:
        try:
            fn, kind = _Compiler(window, None, "", baselines).compile(n)
            return format_value(fn(ctx), "rule")
        except Exception:
            return "UNKNOWN"

    def walk(n: ast.Node) -> str:
        if isinstance(n, (ast.Number, ast.Duration)):
            return n.to_source()
        if isinstance(n, (ast.Name, ast.Call)):
            return f"{n.to_source()}={value_of(n)}"
        if isinstance(n, ast.Compare):
            return f"{walk(n.left)} {n.op} {walk(n.right)}"
        if isinstance(n, ast.BinOp):
            return f"({walk(n.left)} {n.op} {walk(n.right)})"
        if isinstance(n, ast.And):
            return f"({walk(n.left)} and {walk(n.right)})"
        if isinstance(n, ast.Or):
            return f"({walk(n.left)} or {walk(n.right)})"
        if isinstance(n, ast.Not):
            return f"not {walk(n.operand)}"
        if isinstance(n, ast.Neg):
            return f"-{walk(n.operand)}"
        return n.to_source()

    text = walk(node)
    if text.startswith("(") and text.endswith(")") and isinstance(node, (ast.And, ast.Or)):
        text = text[1:-1]
    return text
