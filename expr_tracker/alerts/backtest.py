"""Backtesting rules over whole recorded series at once (docs/alerts.md "Backtesting").

``backtest_frame(rules, frame) -> [RuleTrace]`` gives, for each rule, the steps at which the
per-step engine (``AlertEngine`` driven by ``alerts.testing.replay``) would have entered
FIRING and gone back to OK, computed over the whole series with numpy instead of row by row.

A :class:`Frame` is one run's rows in commit order: ``steps`` (int64, shape ``(R,)``),
``times`` (float64 epoch seconds, NaN where a row had no ``_time``) and ``columns``: metric
name -> ``(present, values)``, two arrays of shape ``(R,)`` (bool: the row recorded a
number for the metric; float64: that number, NaN and ±inf kept). A row that recorded a
string, None, a list or a dict for a metric does not record it, as in the engine.

How the answer stays the engine's, exactly:

- a rule is evaluated at the rows the engine evaluates it at: rows recording a metric it
  reads (exact name, or with ``.`` read as ``/``), or every row for rules using ``has``,
  ``step``, a time-based function or no metric at all;
- every value is a pair of arrays (value, known): UNKNOWN is ``known == False``, NaN stays
  a value (``isnan`` sees it), and the Kleene operators, comparisons and arithmetic apply
  the closures' rules element-wise (``alerts/closures.py``);
- window functions compute the fast path of ``alerts/functions.py`` with the same floating
  point operations in the same order (a window sum is accumulated left to right as
  CPython's ``sum`` does; from 3.12 with its compensation), and every window whose fast
  path the scalar code would leave (NaN, infinities, overflow, cancellation, tiny values,
  non-consecutive steps) is handed to that same scalar function: the slow paths are not
  re-implemented, they are called;
- ``log``/``exp`` call ``math`` per value (numpy's may differ in the last bit);
- the state machine (``for_steps`` consecutive True evaluations fire, False resolves,
  UNKNOWN changes nothing) runs over the known results as run lengths.

Rules the vector form does not cover run through the per-step engine itself ("replay"):
duration windows (``m[5m]``: the engine trims its buffers as it goes, which decides what a
long duration window holds) and ``age()``. :attr:`RuleTrace.engine` says which was used.
``no_data()`` is false at every recorded step (it fires between steps, on the watchdog),
so a backtest over recorded steps never fires it, as ``et rules test --run`` never does.

The time base is the recorded ``_time`` (as in ``replay``): a row without a finite time
keeps the previous row's.

Cost: a window of N points costs about 2N vector operations over the run per sum it needs
(``zscore(loss[50])``: ~200 passes over the series), min/max ``log2(N)``; the benchmark is
``benchmarks/bench_backtest.py``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from expr_tracker.alerts import ast
from expr_tracker.alerts.compiled import CompiledRule
from expr_tracker.alerts.evaluate import DEFAULT_WINDOW
from expr_tracker.alerts.functions import FUNCTIONS
from expr_tracker.alerts.rules import AlertRule, make_rule

__all__ = [
    "Frame",
    "RunOutcome",
    "RuleTrace",
    "VectorUnsupported",
    "backtest_frame",
    "frame_from_rows",
    "rows_of",
    "state_steps",
    "score_rules",
    "vector_support",
]

#: functions with no vector form: their rules replay through the engine
_REPLAY_FUNCS = frozenset({"age"})
_COMPENSATED_SUM = sys.version_info >= (3, 12)


class VectorUnsupported(Exception):
    """The rule uses something the vector form does not compute (the reason)."""


@dataclass
class Frame:
    """One run's rows (see the module doc for the shapes)."""

    steps: np.ndarray
    times: np.ndarray
    columns: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    #: what the rules over this frame share (the clock, evaluation rows, series)
    cache: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return int(self.steps.shape[0])


@dataclass
class RuleTrace:
    """What one rule did over one frame: the steps where it entered FIRING and where it went
    back to OK (``resolved``), and ``engine``: ``vector`` or ``replay`` (with ``reason``)."""

    rule: AlertRule
    firing: list[int]
    resolved: list[int]
    engine: str
    reason: str | None = None


def frame_from_rows(rows: Iterable[Mapping[str, Any]]) -> Frame:
    """A frame from row dicts (``_step``, ``_time``, metrics), converting values as the
    engine does (float, int, bool recorded; anything else not). For tests and small data."""
    rows = list(rows)
    n = len(rows)
    steps = np.array([r.get("_step") for r in rows], dtype=np.int64)
    times = np.array(
        [_time_of(r.get("_time")) for r in rows],
        dtype=np.float64,
    )
    cols: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for i, r in enumerate(rows):
        for k, v in r.items():
            if k in ("_step", "_time"):
                continue
            x = _as_float(v)
            if x is None:
                continue
            col = cols.get(k)
            if col is None:
                col = cols[k] = (np.zeros(n, dtype=bool), np.full(n, np.nan))
            col[0][i] = True
            col[1][i] = x
    return Frame(steps, times, cols)


def _time_of(t: Any) -> float:
    if t is None or isinstance(t, bool):
        return math.nan
    try:
        return float(t)
    except (TypeError, ValueError, OverflowError):
        return math.nan


def _as_float(v: Any) -> float | None:
    t = type(v)
    if t is float:
        return v
    if t is int or t is bool:
        try:
            return float(v)
        except OverflowError:
            return math.inf if v > 0 else -math.inf
    if v is None or t is str:
        return None
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf
    except Exception:  # noqa: BLE001 - not a number: not recorded (as the engine)
        return None


def rows_of(frame: Frame, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """The frame back as row dicts (only the metrics ``names``, all when None): what the
    replay fallback feeds the engine."""
    cols = frame.columns if names is None else {k: frame.columns[k] for k in names}
    steps = frame.steps.tolist()
    times = frame.times.tolist()
    # a row without a time leaves "_time" out (replay keeps the previous row's)
    rows: list[dict[str, Any]] = [
        {"_step": s} if t != t else {"_step": s, "_time": t}
        for s, t in zip(steps, times, strict=True)
    ]
    for name, (present, values) in cols.items():
        idx = np.flatnonzero(present)
        for i, v in zip(idx.tolist(), values[idx].tolist(), strict=True):
            rows[i][name] = v
    return rows


# -- the state machine over whole series ----------------------------------------------------


def state_steps(
    steps: np.ndarray, result: np.ndarray, for_steps: int
) -> tuple[list[int], list[int]]:
    """``(firing, resolved)`` steps of ``RuleState.advance`` fed ``result`` (int8 per
    evaluation: 1 True, 0 False, -1 UNKNOWN) at ``steps``: a run of ``for_steps``
    consecutive known Trues fires at its ``for_steps``-th; the next known False resolves."""
    known = result >= 0
    b = result[known] == 1
    st = steps[known]
    if b.size == 0:
        return [], []
    padded = np.concatenate(([False], b, [False]))
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    starts, ends = edges[0::2], edges[1::2]  # runs of True: [start, end)
    need = max(int(for_steps), 1)
    long_enough = (ends - starts) >= need
    fire_at = starts[long_enough] + need - 1
    ends = ends[long_enough]
    resolve_at = ends[ends < b.size]
    return st[fire_at].tolist(), st[resolve_at].tolist()


# -- values: (value, known) pairs at the evaluation rows -------------------------------------


class _Series:
    """One metric as the engine's ``MetricSeries`` holds it: the recorded values in order
    (``v``), their steps and times, and per evaluation row how many were recorded so far."""

    def __init__(self, v: np.ndarray, steps: np.ndarray, times: Any, cnt: np.ndarray, dense: bool):
        self.v = v
        self.steps = steps
        self.times = times
        self.cnt = cnt  # at each evaluation row
        #: every row is evaluated and records the metric: cnt[j] == j + 1
        self.dense = dense


class _Ctx:
    def __init__(self, frame: Frame, rows: np.ndarray, rows_key: Any):
        self.frame = frame
        self.rows = rows  # indices of the evaluation rows
        self.rows_key = rows_key
        self.all_rows = rows.shape[0] == len(frame)
        self.m = int(rows.shape[0])

    @property
    def clock(self) -> np.ndarray:
        """The time base at every row."""
        return self._clock()[0]

    @property
    def start(self) -> float:
        """The time base when the engine started."""
        return self._clock()[1]

    def _clock(self) -> tuple[np.ndarray, float]:
        cache = self.frame.cache
        if "clock" not in cache:
            cache["clock"] = _clock(self.frame.times)
        return cache["clock"]


class _Lazy:
    """A series' times, computed when a function reads them (``rate``)."""

    def __init__(self, ctx: _Ctx, idx: np.ndarray | None = None):
        self.ctx = ctx
        self.idx = idx

    def __getitem__(self, key: Any) -> np.ndarray:
        clock = self.ctx.clock
        times = clock if self.idx is None else clock[self.idx]
        return times[key]


def _clock(times: np.ndarray) -> tuple[np.ndarray, float]:
    """``(clock per row, start)``: the replay's time base, the row's ``_time``, else the
    previous row's, from ``start``: the first row's time (0 when it has none)."""
    if times.size == 0:
        return times, 0.0
    t0 = float(times[0]) if times[0] == times[0] else 0.0
    finite = np.isfinite(times)
    idx = np.where(finite, np.arange(times.size), -1)
    np.maximum.accumulate(idx, out=idx)
    return np.where(idx >= 0, times[np.maximum(idx, 0)], t0), t0


def _lr_sum(x: np.ndarray, n: int) -> np.ndarray:
    """Sums of every window of ``n`` consecutive values of ``x`` (shape ``(len(x)-n+1,)``),
    each accumulated from 0 left to right exactly as CPython's ``sum`` of floats does."""
    m = x.shape[0] - n + 1
    if _COMPENSATED_SUM:
        return _neumaier_sum(x, n)
    acc = np.add(0.0, x[0:m])
    for k in range(1, n):
        acc += x[k : k + m]
    return acc


def _neumaier_sum(x: np.ndarray, n: int) -> np.ndarray:
    """CPython 3.12+'s ``sum`` of floats: Neumaier's compensated summation, the
    compensation added at the end only when it is non-zero and finite."""
    m = x.shape[0] - n + 1
    s = np.add(0.0, x[0:m])
    c = np.zeros(m)
    with np.errstate(invalid="ignore", over="ignore"):
        for k in range(1, n):
            xk = x[k : k + m]
            t = s + xk
            big = np.abs(s) >= np.abs(xk)
            c += np.where(big, (s - t) + xk, (xk - t) + s)
            s = t
        add = (c != 0) & np.isfinite(c)
        return np.where(add, s + c, s)


def _sliding_extreme(x: np.ndarray, n: int, fn: Callable) -> np.ndarray:
    """min or max (``fn``: np.minimum / np.maximum, NaN propagating) of every window of
    ``n``, by doubling: O(len(x) log n)."""
    cur = x
    width = 1
    while width * 2 <= n:
        cur = fn(cur[:-width], cur[width:])
        width *= 2
    # cur[i] covers x[i : i + width]; a window of n is two overlapping blocks
    m = x.shape[0] - n + 1
    return fn(cur[0:m], cur[n - width : n - width + m])


def _rolling_count(flags: np.ndarray, n: int) -> np.ndarray:
    """How many of each window of ``n`` consecutive ``flags`` are set (exact: integers)."""
    c = np.concatenate(([0], np.cumsum(flags, dtype=np.int64)))
    return c[n:] - c[: c.shape[0] - n]


class _Vector:
    """AST -> arrays at the evaluation rows. Each ``v_*`` returns ``(kind, payload)``:
    ``("scalar", (value float64, known bool))`` or ``("bool", int8 result)``."""

    def __init__(self, ctx: _Ctx):
        self.ctx = ctx

    def series(self, name: str) -> _Series | None:
        ctx = self.ctx
        key = ("series", name, ctx.rows_key)
        cache = ctx.frame.cache
        if key in cache:
            return cache[key]
        frame, rows = ctx.frame, ctx.rows
        col = _resolve(frame, name)
        s = None
        if col is not None:
            present, values = col
            if ctx.all_rows and bool(present.all()):
                n = len(frame)
                s = _Series(values, frame.steps, _Lazy(ctx), np.arange(1, n + 1), True)
            else:
                idx = np.flatnonzero(present)
                cnt = np.cumsum(present, dtype=np.int64)[rows] if rows.size else rows
                s = _Series(values[idx], frame.steps[idx], _Lazy(ctx, idx), cnt, False)
        cache[key] = s
        return s

    # -- dispatch ---------------------------------------------------------------------------
    def scalar(self, node: ast.Node) -> tuple[np.ndarray, np.ndarray]:
        kind, payload = self.eval(node)
        if kind != "scalar":  # pragma: no cover - compile_expr checked the kinds
            raise VectorUnsupported(f"{node.to_source()} is not a number")
        return payload

    def logical(self, node: ast.Node) -> np.ndarray:
        kind, payload = self.eval(node)
        if kind == "bool":
            return payload
        val, known = payload
        with np.errstate(invalid="ignore"):
            ok = known & (val == val)
            return np.where(ok, (val != 0).astype(np.int8), np.int8(-1)).astype(np.int8)

    def eval(self, node: ast.Node) -> tuple[str, Any]:
        method = getattr(self, "v_" + type(node).__name__.lower())
        return method(node)

    def const(self, value: float) -> tuple[str, Any]:
        m = self.ctx.m
        return "scalar", (np.full(m, float(value)), np.ones(m, dtype=bool))

    def v_number(self, node: ast.Number):
        return self.const(node.value)

    def v_duration(self, node: ast.Duration):
        return self.const(node.seconds)

    def v_name(self, node: ast.Name):
        s = self.series(node.name)
        m = self.ctx.m
        if s is None:
            return "scalar", (np.full(m, np.nan), np.zeros(m, dtype=bool))
        if s.dense:
            return "scalar", (s.v, np.ones(m, dtype=bool))
        known = s.cnt > 0
        val = np.full(m, np.nan)
        val[known] = s.v[s.cnt[known] - 1]
        return "scalar", (val, known)

    def v_neg(self, node: ast.Neg):
        val, known = self.scalar(node.operand)
        return "scalar", (-val, known)

    def v_binop(self, node: ast.BinOp):
        a, ka = self.scalar(node.left)
        b, kb = self.scalar(node.right)
        known = ka & kb
        with np.errstate(all="ignore"):
            if node.op == "+":
                r = a + b
            elif node.op == "-":
                r = a - b
            elif node.op == "*":
                r = a * b
            elif node.op == "/":
                known = known & (b != 0)
                r = a / np.where(b == 0, 1.0, b)
            else:
                return self._mod(a, b, known)
            undefined = (r != r) & (a == a) & (b == b)
        return "scalar", (r, known & ~undefined)

    @staticmethod
    def _mod(a: np.ndarray, b: np.ndarray, known: np.ndarray):
        known = known & (b != 0)
        with np.errstate(all="ignore"):
            bb = np.where(b == 0, 1.0, b)
            mod = np.fmod(a, bb)
            # CPython's float %: the sign of the divisor, zero signed as the divisor
            fix = (mod != 0) & ((bb < 0) != (mod < 0))
            mod = np.where(fix, mod + bb, mod)
            mod = np.where(mod == 0, np.copysign(0.0, bb), mod)
            nan_in = (a != a) | (b != b)
            inf_a = ~nan_in & (a - a != 0)
            bad = ~nan_in & ~inf_a & (mod - mod != 0)
            r = np.where(nan_in, np.nan, mod)
        return "scalar", (r, known & ~inf_a & ~bad)

    def v_compare(self, node: ast.Compare):
        a, ka = self.scalar(node.left)
        b, kb = self.scalar(node.right)
        op = {
            "<": np.less,
            "<=": np.less_equal,
            ">": np.greater,
            ">=": np.greater_equal,
            "==": np.equal,
            "!=": np.not_equal,
        }[node.op]
        with np.errstate(invalid="ignore"):
            ok = ka & kb & (a == a) & (b == b)
            res = op(a, b).astype(np.int8)
        return "bool", np.where(ok, res, np.int8(-1)).astype(np.int8)

    def v_and(self, node: ast.And):
        a, b = self.logical(node.left), self.logical(node.right)
        out = np.full(a.shape, -1, dtype=np.int8)
        out[(a == 1) & (b == 1)] = 1
        out[(a == 0) | (b == 0)] = 0
        return "bool", out

    def v_or(self, node: ast.Or):
        a, b = self.logical(node.left), self.logical(node.right)
        out = np.full(a.shape, -1, dtype=np.int8)
        out[(a == 0) & (b == 0)] = 0
        out[(a == 1) | (b == 1)] = 1
        return "bool", out

    def v_not(self, node: ast.Not):
        a = self.logical(node.operand)
        return "bool", np.where(a < 0, a, 1 - a).astype(np.int8)

    def v_window(self, node: ast.Window):  # pragma: no cover - compile_expr rejects it
        raise VectorUnsupported(f"the window {node.to_source()} outside a function")

    # -- calls ------------------------------------------------------------------------------
    def v_call(self, node: ast.Call):
        f = node.func
        args = node.args
        first = args[0] if args else None
        if isinstance(first, ast.Window) or (f == "diff" and isinstance(first, ast.Name)):
            win = first if isinstance(first, ast.Window) else ast.Window(first.name, size=2)
            return self._window_call(node, win)
        m = self.ctx.m
        if f == "has":
            s = self.series(_name_arg(node))
            if s is None:
                return "bool", np.zeros(m, dtype=np.int8)
            return "bool", (s.cnt > 0).astype(np.int8)
        if f == "step":
            steps = self.ctx.frame.steps[self.ctx.rows].astype(np.float64)
            return "scalar", (steps, np.ones(m, dtype=bool))
        if f == "elapsed":
            with np.errstate(invalid="ignore"):
                since = self.ctx.clock[self.ctx.rows] - self.ctx.start
            return "scalar", (since, np.ones(m, dtype=bool))
        if f == "no_data":  # false at every commit (ctx.mono == last_commit_mono)
            return "bool", np.zeros(m, dtype=np.int8)
        if f in _REPLAY_FUNCS:  # pragma: no cover - vector_support sends these to replay
            raise VectorUnsupported(f"{f}()")
        pairs = [self.scalar(a) for a in args]
        known = np.ones(m, dtype=bool)
        for _, k in pairs:
            known &= k
        vals = [v for v, _ in pairs]
        with np.errstate(all="ignore"):
            if f in ("min", "max"):
                r = vals[0]
                fn = np.minimum if f == "min" else np.maximum
                for v in vals[1:]:
                    r = fn(r, v)
                return "scalar", (r, known)
            (x,) = vals
            if f == "isnan":
                return "bool", np.where(known, (x != x).astype(np.int8), np.int8(-1)).astype(
                    np.int8
                )
            if f == "isinf":
                return "bool", np.where(known, np.isinf(x).astype(np.int8), np.int8(-1)).astype(
                    np.int8
                )
            if f == "abs":
                return "scalar", (np.abs(x), known)
            if f == "sqrt":
                ok = (x != x) | (x >= 0)
                return "scalar", (
                    np.where(x >= 0, np.sqrt(np.where(x >= 0, x, 0.0)), x),
                    known & ok,
                )
            if f == "log":
                ok = (x != x) | (x > 0)
                r = x.copy()
                pos = known & (x > 0)
                r[pos] = [math.log(t) for t in x[pos].tolist()]
                return "scalar", (r, known & ok)
            if f == "exp":
                r = x.copy()
                r[known] = [_exp(t) for t in x[known].tolist()]
                return "scalar", (r, known)
        raise VectorUnsupported(f"{f}()")  # pragma: no cover - every function is listed

    def _window_call(self, node: ast.Call, win: ast.Window):
        f = node.func
        if win.size is None:  # pragma: no cover - vector_support sends these to replay
            raise VectorUnsupported("a duration window")
        n = int(win.size)
        m = self.ctx.m
        extras = [self.scalar(a) for a in node.args[1:]]
        s = self.series(win.name)
        returns = next(sig.returns for sig in FUNCTIONS[f] if sig.window_param)
        unknown_out = (
            ("bool", np.full(m, -1, dtype=np.int8))
            if returns == "bool"
            else ("scalar", (np.full(m, np.nan), np.zeros(m, dtype=bool)))
        )
        if s is None or s.v.shape[0] < n:
            return unknown_out
        if s.dense:  # row j ends the window at value j: no gathering
            full: Any = slice(n - 1, None)
            pos = np.arange(n - 1, m)
        else:
            full = s.cnt >= n  # evaluation rows whose window is complete
            pos = s.cnt[full] - 1  # the index of the window's last value
        if extras:
            evals = [(v[full], k[full]) for v, k in extras]
            const = all(
                bool(k.all()) and (v.size == 0 or bool(np.all(v == v[0]))) for v, k in evals
            )
            if not const:  # a per-row parameter: the scalar function per row
                val, known = _per_row(f, s, n, pos, evals)
            else:
                params = [float(v[0]) if v.size else math.nan for v, _ in evals]
                val, known = _window_values(f, s, n, params)
                if not s.dense:
                    val, known = val[pos - (n - 1)], known[pos - (n - 1)]
        else:
            val, known = _window_values(f, s, n, [])
            if not s.dense:
                val, known = val[pos - (n - 1)], known[pos - (n - 1)]
        if returns == "bool":
            out = np.full(m, -1, dtype=np.int8)
            out[full] = np.where(known, val.astype(np.int8), np.int8(-1))
            return "bool", out
        v_out = np.full(m, np.nan)
        k_out = np.zeros(m, dtype=bool)
        v_out[full] = val
        k_out[full] = known
        return "scalar", (v_out, k_out)


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _name_arg(node: ast.Call) -> str:
    arg = node.args[0]
    assert isinstance(arg, ast.Name)
    return arg.name


def _resolve(frame: Frame, name: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The column a rule's name reads, as ``series_getter`` settles it: the exact name,
    else ``.`` read as ``/``, whichever the engine finds at the first row recording
    either (the exact one when both appear on that row)."""
    exact = frame.columns.get(name)
    alt_name = name.replace(".", "/") if "." in name else None
    alt = frame.columns.get(alt_name) if alt_name else None
    if exact is None or alt is None:
        return exact if exact is not None else alt
    fe = int(np.argmax(exact[0])) if exact[0].any() else None
    fa = int(np.argmax(alt[0])) if alt[0].any() else None
    if fe is None:
        return alt
    if fa is None or fe <= fa:
        return exact
    return alt


def _impl(f: str) -> Callable[..., Any]:
    return next(sig.impl for sig in FUNCTIONS[f] if sig.window_param)  # type: ignore[return-value]


def _per_row(f: str, s: _Series, n: int, pos: np.ndarray, evals: list) -> tuple:
    """The scalar function called per evaluation row (a parameter that varies by row)."""
    impl = _impl(f)
    needs = next(sig.needs for sig in FUNCTIONS[f] if sig.window_param)
    v = s.v.tolist()
    extra_v = [ev.tolist() for ev, _ in evals]
    extra_k = [ek.tolist() for _, ek in evals]
    out_v = np.full(pos.shape[0], np.nan)
    out_k = np.zeros(pos.shape[0], dtype=bool)
    for j, e in enumerate(pos.tolist()):
        if not all(k[j] for k in extra_k):
            continue
        args: list[Any] = [v[e - n + 1 : e + 1]]
        if needs == "times":
            args.append(s.times[e - n + 1 : e + 1].tolist())
        elif needs == "steps":
            args.append(s.steps[e - n + 1 : e + 1].tolist())
        args.extend(x[j] for x in extra_v)
        r = impl(*args)
        if r is not None:
            out_v[j] = float(r)
            out_k[j] = True
    return out_v, out_k


def _window_values(f: str, s: _Series, n: int, params: list[float]) -> tuple:
    """``f`` of every window of ``n`` values of the series: (value, known), shape
    ``(len - n + 1,)``, index i the window ending at value ``i + n - 1``."""
    x = s.v
    k = x.shape[0] - n + 1
    first, last = x[0:k], x[n - 1 :]
    val = np.full(k, np.nan)
    slow = np.zeros(k, dtype=bool)
    known = np.ones(k, dtype=bool)
    with np.errstate(all="ignore"):
        if f == "first":
            val = first.copy()
        elif f == "last":
            val = last.copy()
        elif f == "count":
            val = np.full(k, float(n))
        elif f in ("min", "max"):
            val = _sliding_extreme(x, n, np.minimum if f == "min" else np.maximum)
        elif f == "sum":
            val = _lr_sum(x, n)
            slow = val != val
        elif f == "mean":
            total = _lr_sum(x, n)
            slow = total - total != 0
            val = total / n
        elif f in ("var", "std", "zscore"):
            mean = _lr_sum(x, n) / n
            ss = _lr_sum(x * x, n) / n
            var = ss - mean * mean
            slow = (var - var != 0) | (ss < 1e-250) | (var <= 1e-9 * mean * mean)
            if f == "var":
                val = var
            elif f == "std":
                slow |= (var > 0) & (var < 1e-250)
                val = np.sqrt(np.where(slow, 1.0, var))
            else:
                val = (last - mean) / np.sqrt(np.where(slow, 1.0, var))
        elif f == "median":
            val, slow = _median(x, n)
        elif f == "diff":
            d = last - first
            val = d
            known = ~((d != d) & (first == first) & (last == last))
        elif f == "pct_change":
            zero = first == 0
            r = (last - first) / np.abs(np.where(zero, 1.0, first))
            fast = (r - r == 0) | ((r != r) & ((first != first) | (last != last)))
            known = ~zero
            slow = ~zero & ~fast
            val = r
        elif f == "rate":
            t = s.times
            dt = t[n - 1 :] - t[0:k]
            d = last - first
            d_unknown = (d != d) & (first == first) & (last == last)
            r = d / np.where(dt > 0, dt, 1.0)
            known = (dt > 0) & ~d_unknown & ~((r != r) & (d == d))
            val = r
        elif f == "slope":
            mx = (n - 1) / 2.0
            sxx = n * (n * n - 1) / 12.0
            w = [(i - mx) / sxx for i in range(n)]
            val = _weighted(x, w)
            consecutive = (s.steps[n - 1 :] - s.steps[0:k]) == n - 1
            slow = ~consecutive | (val - val != 0)
        elif f == "ema":
            alpha = params[0]
            if alpha != alpha or not (0.0 < alpha <= 1.0):
                known = np.zeros(k, dtype=bool)
            else:
                keep = 1.0 - alpha
                w = [keep ** (n - 1)] + [alpha * keep ** (n - 1 - j) for j in range(1, n)]
                val = _weighted(x, w)
                slow = (val - val != 0) | ((val > -1e-290) & (val < 1e-290))
        elif f in ("increasing", "decreasing"):
            nan_n = _rolling_count(x != x, n)
            pairs = (x[:-1] < x[1:]) if f == "increasing" else (x[:-1] > x[1:])
            good = _rolling_count(pairs, n - 1)
            known = nan_n == 0
            val = (good == n - 1).astype(np.float64)
        elif f == "stalled":
            eps = params[0]
            if eps != eps:
                known = np.zeros(k, dtype=bool)
            else:
                nan_n = _rolling_count(x != x, n)
                hi = _sliding_extreme(x, n, np.maximum)
                lo = _sliding_extreme(x, n, np.minimum)
                stuck_inf = (hi == lo) & (hi - hi != 0)
                known = (nan_n == 0) & ~stuck_inf
                val = (hi - lo <= eps).astype(np.float64)
        else:  # pragma: no cover - every window function is listed
            raise VectorUnsupported(f"{f}()")
        if f in _SPECIAL_FORMS and slow.any():
            slow, val, known = _specials(f, x, n, slow, val, known)
    if slow.any():
        impl = _impl(f)
        needs = next(sig.needs for sig in FUNCTIONS[f] if sig.window_param)
        xs = x.tolist()
        for i in np.flatnonzero(slow).tolist():
            args: list[Any] = [xs[i : i + n]]
            if needs == "steps":
                args.append(s.steps[i : i + n].tolist())
            elif needs == "times":
                args.append(s.times[i : i + n].tolist())
            args.extend(params)
            r = impl(*args)
            if r is None:
                known[i] = False
            else:
                known[i] = True
                val[i] = float(r)
    return val, known


#: window functions whose answer for a window holding NaN or infinities is known in closed
#: form (alerts/functions.py: a NaN propagates; one infinity, or several of one sign, is
#: where the value diverges; +inf beside -inf is undefined)
_SPECIAL_FORMS = frozenset({"mean", "sum", "var", "std", "zscore", "slope", "ema"})


def _specials(f: str, x: np.ndarray, n: int, slow, val, known):
    """The slow windows of ``f`` that hold NaN or infinities, answered as the scalar
    function answers them, so a diverging run (NaN or inf from some step on) does not call
    it per window; the rest stay slow (overflow of finite values, cancellation)."""
    nan_n = _rolling_count(x != x, n)
    has_nan = slow & (nan_n > 0)
    val = np.where(has_nan, np.nan, val)  # every one of these propagates a NaN
    known = known | has_nan
    slow = slow & ~has_nan
    if f in ("mean", "var", "std", "zscore") and slow.any():
        pos = _rolling_count(x == np.inf, n)
        neg = _rolling_count(x == -np.inf, n)
        inf_n = pos + neg
        some = slow & (inf_n > 0)
        if f == "mean":
            both = some & (pos > 0) & (neg > 0)
            val = np.where(some & ~both, np.where(pos > 0, np.inf, -np.inf), val)
            known = np.where(both, False, known | some)
        elif f in ("var", "std"):
            same = some & (inf_n == n) & ((pos == n) | (neg == n))  # one infinity throughout
            val = np.where(some & ~same, np.inf, val)
            known = np.where(same, False, known | some)
        else:  # zscore: several infinities have no limit; one is left to the function
            several = some & (inf_n > 1)
            known = np.where(several, False, known)
            some = several
        slow = slow & ~some
    return slow, val, known


def _weighted(x: np.ndarray, w: Sequence[float]) -> np.ndarray:
    """``sum(map(mul, w, window))`` of every window of ``len(w)`` values, summed as
    CPython's ``sum`` does (left to right; compensated from 3.12)."""
    n = len(w)
    k = x.shape[0] - n + 1
    if _COMPENSATED_SUM:
        prods = np.stack([w[j] * x[j : j + k] for j in range(n)], axis=1).ravel()
        # each window's products in a row: sum them as one series of n per window
        return _neumaier_rows(prods.reshape(k, n))
    acc = np.add(0.0, w[0] * x[0:k])
    for j in range(1, n):
        acc += w[j] * x[j : j + k]
    return acc


def _neumaier_rows(p: np.ndarray) -> np.ndarray:
    s = np.add(0.0, p[:, 0])
    c = np.zeros(p.shape[0])
    with np.errstate(invalid="ignore", over="ignore"):
        for j in range(1, p.shape[1]):
            xk = p[:, j]
            t = s + xk
            c += np.where(np.abs(s) >= np.abs(xk), (s - t) + xk, (xk - t) + s)
            s = t
        return np.where((c != 0) & np.isfinite(c), s + c, s)


def _median(x: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    k = x.shape[0] - n + 1
    val = np.empty(k)
    slow = np.zeros(k, dtype=bool)
    h = n // 2
    view = np.lib.stride_tricks.sliding_window_view(x, n)
    chunk = max(1, (1 << 22) // n)
    with np.errstate(all="ignore"):
        for start in range(0, k, chunk):
            block = np.sort(view[start : start + chunk], axis=1)  # NaN sorts last
            has_nan = block[:, -1] != block[:, -1]
            if n % 2:
                mid = block[:, h]
            else:
                mid = (block[:, h - 1] + block[:, h]) / 2.0
                slow[start : start + chunk] = (mid - mid != 0) & ~has_nan
            val[start : start + chunk] = np.where(has_nan, np.nan, mid)
    return val, slow


# -- rules -----------------------------------------------------------------------------------


def _node(rule: AlertRule) -> ast.Node:
    """The rule's condition (a node once the rule is made)."""
    node = rule.condition
    assert isinstance(node, ast.Node)
    return node


def vector_support(rule: AlertRule) -> str | None:
    """None when ``rule`` has a vector form, else why it replays (``duration window
    loss[5m]``, ``age()``)."""
    for node in _node(rule).walk():
        if isinstance(node, ast.Window) and node.size is None:
            return f"duration window {node.to_source()}"
        if isinstance(node, ast.Call) and node.func in _REPLAY_FUNCS:
            return f"{node.func}()"
    return None


def _both_spellings(frame: Frame, compiled: CompiledRule) -> str | None:
    """Why a rule replays on this frame: it reads ``a.b`` and the run logged both ``a.b``
    and ``a/b``. The engine settles which one the name means at the first evaluation that
    reads it, which the rule's other operands decide (a short window returns before its
    parameters are read): the replay answers that exactly."""
    for name in compiled.expr.needs:
        if "." not in name:
            continue
        alt = name.replace(".", "/")
        if name in frame.columns and alt in frame.columns:
            return f"both {name} and {alt} logged"
    return None


def _evaluation_rows(frame: Frame, compiled: CompiledRule) -> np.ndarray:
    """Indices of the rows at which the engine evaluates the rule."""
    n = len(frame)
    if compiled.every_step or compiled.timed:
        return np.arange(n)
    touched = np.zeros(n, dtype=bool)
    for key in compiled.keys:
        col = frame.columns.get(key)
        if col is not None:
            touched |= col[0]
    return np.flatnonzero(touched)


def backtest_frame(
    rules: Iterable[Any],
    frame: Frame,
    *,
    window: int = DEFAULT_WINDOW,
    replay_only: bool = False,
) -> list[RuleTrace]:
    """Each rule (anything ``make_rule`` takes) over ``frame``: a :class:`RuleTrace` per
    rule, in order, disabled rules (``enabled: false``) with no steps.

    ``window``: ``alert_window``, the widest point window allowed. ``replay_only``: run
    every rule through the per-step engine (the reference the vector form is tested
    against). Raises ``RuleError`` for a rule the engine would reject.
    """
    out = []
    for r in rules:
        rule = make_rule(r)
        compiled = CompiledRule(rule, window)  # the engine's checks and its evaluation rows
        if not rule.enabled:
            out.append(RuleTrace(rule, [], [], "vector", "disabled"))
            continue
        why = "asked" if replay_only else (vector_support(rule) or _both_spellings(frame, compiled))
        if why is not None:
            out.append(_replay(rule, compiled, frame, window, why))
            continue
        rows_key = "all" if (compiled.every_step or compiled.timed) else compiled.keys
        rows = frame.cache.get(("rows", rows_key))
        if rows is None:
            rows = frame.cache[("rows", rows_key)] = _evaluation_rows(frame, compiled)
        ctx = _Ctx(frame, rows, rows_key)
        result = _Vector(ctx).logical(_node(rule))
        firing, resolved = state_steps(frame.steps[rows], result, rule.for_steps)
        out.append(RuleTrace(rule, firing, resolved, "vector"))
    return out


def _replay(
    rule: AlertRule, compiled: CompiledRule, frame: Frame, window: int, why: str
) -> RuleTrace:
    from expr_tracker.alerts.testing import replay

    names = [k for k in compiled.keys if k in frame.columns]
    cap = replay([rule], rows_of(frame, names), window=window)
    firing = [int(e.step or 0) for e in cap.events if e.kind == "firing"]
    resolved = [int(e.step or 0) for e in cap.events if e.kind == "resolved"]
    return RuleTrace(rule, firing, resolved, "replay", why)


# -- the report ------------------------------------------------------------------------------


@dataclass
class RunOutcome:
    """One run's part of a backtest: ``label`` True (it went bad: failed, crashed,
    diverged, or the label column said so), False (finished fine), None (unlabelled);
    ``last_step`` its last recorded step; ``traces`` one per rule, in rule order."""

    run: str
    label: bool | None
    last_step: int | None
    traces: list[RuleTrace]


def _middle(values: list[int]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    h = len(s) // 2
    return float(s[h]) if len(s) % 2 else (s[h - 1] + s[h]) / 2.0


def _engine(traces: Iterable[RuleTrace]) -> str:
    """``vector``, ``replay``, or ``vector+replay`` when the runs differed (a run that
    logged both spellings of a name replays)."""
    engines = {t.engine for t in traces}
    return engines.pop() if len(engines) == 1 else "vector+replay"


def score_rules(outcomes: Sequence[RunOutcome]) -> list[dict[str, Any]]:
    """Per rule (in rule order), over the runs: ``runs`` evaluated, ``fired`` (runs where it
    entered FIRING at least once), ``bad_runs``/``caught``/``missed`` (bad runs it fired on
    or not), ``fine_runs``/``false_positives`` (runs that finished fine and it fired on),
    ``first_step_median`` (of the first firing step over the runs it fired on),
    ``lead_median``/``lead_min``/``lead_max`` (steps between the first firing and the
    last step of each bad run it caught), ``engine`` (``vector``/``replay``, ``reason``)
    and ``per_run``: ``{run, label, last_step, firing, resolved, lead}``."""
    if not outcomes:
        return []
    out = []
    for i, first in enumerate(outcomes[0].traces):
        per_run = []
        firsts, leads = [], []
        fired = bad = caught = fine = fp = 0
        for o in outcomes:
            t = o.traces[i]
            lead = None
            if t.firing:
                fired += 1
                firsts.append(t.firing[0])
            if o.label is True:
                bad += 1
                if t.firing:
                    caught += 1
                    if o.last_step is not None:
                        lead = o.last_step - t.firing[0]
                        leads.append(lead)
            elif o.label is False:
                fine += 1
                if t.firing:
                    fp += 1
            per_run.append(
                {
                    "run": o.run,
                    "label": {True: "bad", False: "fine", None: None}[o.label],
                    "last_step": o.last_step,
                    "firing": t.firing,
                    "resolved": t.resolved,
                    "lead": lead,
                }
            )
        rule = first.rule
        out.append(
            {
                "rule": rule.name,
                "condition": _node(rule).to_source(),
                "level": rule.level,
                "for_steps": rule.for_steps,
                "engine": _engine(o.traces[i] for o in outcomes),
                "reason": "; ".join(sorted({o.traces[i].reason or "" for o in outcomes} - {""}))
                or None,
                "runs": len(outcomes),
                "fired": fired,
                "bad_runs": bad,
                "caught": caught,
                "missed": bad - caught,
                "fine_runs": fine,
                "false_positives": fp,
                "first_step_median": _middle(firsts),
                "lead_median": _middle(leads),
                "lead_min": min(leads) if leads else None,
                "lead_max": max(leads) if leads else None,
                "per_run": per_run,
            }
        )
    return out
