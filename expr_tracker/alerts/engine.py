"""AlertEngine: evaluates compiled rules on each committed step (docs/alerts.md "Rule options").

    engine = AlertEngine(rules, window=4096, notify=console, record=alert_log,
                         run_info={"project": "p", "run": "r"})
    engine.on_step({"_step": 3, "_time": 1.7e9, "loss": 0.42})   # a HistoryStore sink
    engine.start_watchdog(30.0)    # only starts when a time-based rule exists
    engine.stats(); engine.finish_warnings(); engine.close()

``on_step(row)`` appends the row's values to the metric series the rules read, then
evaluates the rules whose metrics the row touched (dependency index), the time-based ones
(``no_data``/``age``/``elapsed``) and those using ``has``/``step`` or no metric at all.
Costs a few microseconds for a couple of rules (docs/alerts.md "Cost": one function per row,
plans per row shape, running sums for ``zscore``).

Time base (docs/alerts.md "Time base"; a clock that can move is for display only): each value
appended at ``on_step`` is stamped with ``clock()`` (monotonic, injectable), and ``age()``,
duration windows, ``rate``, ``elapsed()`` and ``no_data()`` measure against that same clock,
so a wall-clock jump (NTP) neither fires nor silences a time-based rule. The row's
``_time`` (or ``wall_clock()`` on the watchdog) is only displayed: ``{time}`` in messages
and ``AlertEvent.time``. A replay of recorded history has no monotonic stamps: it drives
``clock`` from the recorded ``_time`` (``alerts.testing.replay``), which makes the row time
the time base there.

Threads: ``on_step`` (the training thread) and ``check_time`` (the watchdog) each append
and evaluate under one engine lock, so a rule function never sees a series half-appended and
transitions, counters and the order events are produced in are serialised. The events go to
a queue under that lock; ``record`` and ``notify`` are called afterwards, outside every lock,
by one drainer at a time in queue order (a caller that finds another thread draining leaves
its events to it), so ``alerts.jsonl`` and the channels see transitions in the order they
happened.

``on_action(event)`` receives each ``firing`` event of a rule with an action (``stop``,
``prune``: docs/alerts.md "Actions"), after it was recorded and before it is notified, on
every rank (``deliver=False`` included: each rank stops its own loop); the run sets its
stop request there.

``notify(event)`` receives the events to deliver (``firing``, level-mode ``repeat``,
``resolved`` with notify_recovery, ``disabled``); ``record(event)`` receives every
transition (the ``alerts.jsonl`` sink). ``deliver=False`` (a rank that does not alert):
rules stay registered, listed and evaluated and ``record`` is still called, but ``notify``
never is. A failing ``notify``/``record`` is counted and warned about once; it does not
undo the transition (delivery retries belong to the dispatcher).

An exception raised while evaluating a rule is a bug, not UNKNOWN: it is counted per rule,
passed to ``on_error(rule, exc)``, and after ``max_errors`` (10) in a row the rule is
disabled with one ``disabled`` event (docs/alerts.md "Three-valued logic").

Parts kept apart: ``compiled.py`` (a rule compiled for the engine, with its counters),
``events.py`` (``AlertEvent``), ``watchdog.py`` (the ``check_time`` thread), ``finish.py``
(finish warnings). What stays here is one algorithm: the row queue, evaluation under the
lock with its roll-back, and the in-order drain, which share the interrupt-safety state.
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from expr_tracker._warn import Warner
from expr_tracker.alerts.ast import Node
from expr_tracker.alerts.compiled import CompiledRule
from expr_tracker.alerts.evaluate import DEFAULT_WINDOW, EvalContext, render_observed
from expr_tracker.alerts.events import AlertEvent
from expr_tracker.alerts.finish import finish_warnings, unresolved_metrics
from expr_tracker.alerts.parse import RuleError
from expr_tracker.alerts.rules import FIRING, OK, AlertRule, make_rule
from expr_tracker.alerts.template import render_template
from expr_tracker.alerts.watchdog import Watchdog
from expr_tracker.history.series import MetricSeries
from expr_tracker.history.values import format_value

__all__ = ["AlertEngine", "AlertEvent", "render_template"]

log = logging.getLogger("expr_tracker.alerts")

#: placeholders every template may use besides the metrics of the latest row
RESERVED_FIELDS = ("step", "time", "run", "project", "expr", "name", "level")
DEFAULT_MESSAGE = "{expr}"


def _as_float(value: Any, t: type) -> float | None:
    """A row value as the float a series records (int/bool and number-likes converted, an
    int beyond the float range as an infinity); None when it is not recorded (None, str,
    not a number)."""
    if t is int or t is bool:
        try:
            return float(value)
        except OverflowError:  # an int beyond the float range
            return math.inf if value > 0 else -math.inf
    if value is None or t is str:
        return None
    try:
        return float(value)
    except OverflowError:
        try:
            return math.inf if value > 0 else -math.inf
        except Exception:  # noqa: BLE001 - an object that will not compare
            return None
    except Exception:  # noqa: BLE001 - not a number: not recorded
        return None


class AlertEngine:
    """Evaluates alert rules on committed rows. Thread-safe for one ``on_step`` caller
    plus the watchdog: both evaluate under ``_lock``; events are delivered outside it, in
    the order they were produced.

    Args:
        rules: anything ``make_rule`` accepts (strings, ``M`` expressions, dicts, RuleSpec,
            AlertRule). Duplicate names raise ``RuleError``.
        window: ``alert_window``, the widest point window a rule may use (4096); duration
            windows keep up to this many values per metric.
        notify: called with each ``AlertEvent`` to deliver (outside locks).
        record: called with every transition event (e.g. ``AlertLog``).
        on_error: ``on_error(rule, exc)`` for each evaluation error (default: log once);
            called with the engine lock held, so it must not call back into the engine.
        clock: monotonic seconds, the time base of everything measuring elapsed time
            (value stamps, ``age``, duration windows, ``rate``, ``elapsed``, ``no_data``,
            cooldowns); injectable. A replay drives it from the recorded ``_time``.
        wall_clock: epoch seconds, display only: ``{time}``/``AlertEvent.time`` when a row
            has no ``_time`` and on the watchdog.
        run_info: ``{"project": ..., "run": ...}`` for templates and events.
        deliver: False on ranks that do not alert (``notify`` is never called).
        max_errors: consecutive evaluation errors before a rule is disabled.
        peers: what ``skew(m)`` reads: the other ranks' values on rank 0 of a multi-rank
            run (``expr_tracker.history.peers.RankSkew``); None: ``skew`` is UNKNOWN.
            Assignable later (``engine.peers = ...``), before the first row.
        on_action: called with each ``firing`` event of a rule with an ``action`` (outside
            locks, in order with record and notify).
        baselines: where ``baseline()`` calls find the other runs (an
            ``alerts.baseline.Baselines``); None: every ``baseline()`` is UNKNOWN.
    """

    def __init__(
        self,
        rules: Iterable = (),
        *,
        window: int = DEFAULT_WINDOW,
        notify: Callable[[AlertEvent], None] | None = None,
        record: Callable[[AlertEvent], None] | None = None,
        on_error: Callable[[AlertRule | None, BaseException], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        run_info: Mapping | None = None,
        deliver: bool = True,
        max_errors: int = 10,
        peers: object = None,
        on_action: Callable[[AlertEvent], None] | None = None,
        baselines: Any = None,
    ) -> None:
        if int(window) < 1:
            raise RuleError(f"alert window must be >= 1, got {window!r}")
        self.window = int(window)
        self.notify = notify
        self.record = record
        self.on_error = on_error
        self.clock = clock
        self.wall_clock = wall_clock
        self.run_info = dict(run_info or {})
        self.deliver = bool(deliver)
        self.max_errors = int(max_errors)
        self.on_action = on_action
        self.baselines = baselines
        # guards the rule table, the series and evaluation (on_step vs the watchdog); never
        # held while calling record/notify
        self._lock = threading.Lock()
        # Interrupt safety (Ctrl-C lands anywhere): a row taken by on_step waits in _rows
        # until it is processed completely (an interrupted one is rolled back and stays at
        # the front, processed by the next on_step, check_time or close); an event stays
        # at the front of _pending until it was recorded and notified (_recorded: the
        # front one was recorded already).
        self._rows: deque[Mapping] = deque()  # taken, not yet processed (under _lock)
        self._pending: deque[AlertEvent] = deque()  # produced under _lock, delivered in order
        self._recorded: AlertEvent | None = None  # the last event recorded
        self._drain_lock = threading.Lock()  # one thread delivers _pending at a time
        # replaced, never mutated (copy on write, under _lock): readers without the lock
        # (rules, stats, firing, another thread's list_alert_rules) see a consistent list
        self._rules: list[CompiledRule] = []
        self._by_name: dict[str, CompiledRule] = {}
        self._index: dict[str, tuple[CompiledRule, ...]] = {}
        self._always: tuple[CompiledRule, ...] = ()
        self._timed: tuple[CompiledRule, ...] = ()
        self._capacity: dict[str, int] = {}
        #: row shape (its keys in order) -> ((key, series) of the metrics rules read, the
        #: rules to evaluate): what _append_row found for the last row of that shape
        self._plans: dict[tuple, tuple] = {}
        self._series: dict[str, MetricSeries] = {}
        self._seen: set[str] = set()
        start = clock()
        self._ctx = EvalContext(self._series, now=wall_clock(), mono=start, peers=peers)
        self._token = 0
        self._last_row: Mapping = {}
        self._delivery_errors = 0
        self._warner = Warner(log)  # once per (what, rule) when there is no on_error
        self._watchdog = Watchdog()
        self._watchdog_interval: float | None = None
        self._closed = False
        for rule in rules:
            self.add_rule(rule)

    @property
    def peers(self) -> object:
        """What ``skew(m)`` reads (None: nothing, ``skew`` is UNKNOWN)."""
        return self._ctx.peers

    @peers.setter
    def peers(self, value: object) -> None:
        self._ctx.peers = value

    # -- rules ---------------------------------------------------------------------------
    @property
    def rules(self) -> list[AlertRule]:
        """The registered rules, in registration order."""
        return [c.rule for c in self._rules]

    def add_rule(self, rule, **overrides) -> AlertRule:
        """Register a rule (any ``make_rule`` input). Raises ``RuleError`` on a bad rule,
        a window wider than ``window``, or a name already used by a different rule (an
        identical rule is a no-op). Starts the watchdog if one was requested and this is
        the first time-based rule."""
        rule = make_rule(rule, **overrides)
        compiled = CompiledRule(rule, self.window, self.baselines)
        with self._lock:
            existing = self._by_name.get(rule.name)
            if existing is not None:
                if existing.rule == rule:
                    return existing.rule
                raise RuleError(f"duplicate alert rule name {rule.name!r}")
            self._rules = [*self._rules, compiled]
            self._by_name[rule.name] = compiled
            self._reindex()
        if compiled.timed and self._watchdog_interval is not None:
            self.start_watchdog(self._watchdog_interval)
        return rule

    def remove_rule(self, name: str) -> AlertRule | None:
        """Unregister a rule by name; returns the removed ``AlertRule``, None when there is
        none.

        Takes the engine lock, so an evaluation in progress (``on_step`` on the committing
        thread, ``check_time`` on the watchdog) completes first and no later one sees the
        rule. Its state (pending streak, firing episode) is dropped with it; events it
        produced before are still delivered. A ``removed`` transition is recorded
        (``alerts.jsonl``) but never notified: the condition did not recover, so no
        ``resolved`` notice goes out."""
        with self._lock:
            compiled = self._by_name.pop(name, None)
            if compiled is None:
                return None
            self._rules = [c for c in self._rules if c is not compiled]
            compiled.disabled = True
            self._reindex()
            ctx = self._ctx
            rule = compiled.rule
            st = compiled.state
            if self._closed:
                return rule
            self._pending.append(
                AlertEvent(
                    rule=rule,
                    kind="removed",
                    state="removed",
                    level="info",
                    step=ctx.step,
                    time=self.wall_clock(),
                    title=f"alert rule removed: {rule.name}",
                    message=f"{rule.name} was removed while {st.state}; it is no longer "
                    f"evaluated. Condition: {rule.source}",
                    notify=False,
                    run_info=self.run_info,
                    episode=st.episode,
                    fires=st.fires,
                )
            )
        self._drain()
        return rule

    def _reindex(self) -> None:
        index: dict[str, list[CompiledRule]] = {}
        capacity: dict[str, int] = {}
        for c in self._rules:
            for key in c.keys:
                index.setdefault(key, []).append(c)
            for name, n in c.expr.needs.items():
                for key in {name, name.replace(".", "/")}:
                    capacity[key] = max(capacity.get(key, 0), n)
        for key, n in capacity.items():
            s = self._series.get(key)
            if s is not None:
                s.ensure_capacity(n)
        self._capacity = capacity
        self._index = {k: tuple(v) for k, v in index.items()}
        self._plans.clear()  # the rules of a row shape changed
        self._always = tuple(c for c in self._rules if c.every_step or c.timed)
        self._timed = tuple(c for c in self._rules if c.timed)

    # -- evaluation ----------------------------------------------------------------------
    def on_step(self, row: Mapping) -> None:
        """Evaluate the rules a committed row concerns. ``row`` holds ``_step``, ``_time``
        (epoch seconds, displayed only) and metric values (float/int/bool are recorded;
        None, strings and other objects are not), each stamped with ``clock()`` read now,
        the commit time. Never raises for bad values; call it once per commit.

        Interrupted (``KeyboardInterrupt``), the row is not lost: it is processed by the
        next call, ``check_time`` or ``close``, and events already queued are delivered."""
        if self._closed:
            return
        with self._lock:  # series and evaluation: on_step vs the watchdog
            self._rows.append(row)
            self._process_rows()
        if self._pending:
            self._drain()

    def _process_rows(self) -> None:
        """With ``_lock`` held: process the taken rows in order. Each is all or nothing:
        an interrupted one is rolled back (series values, rule states, queued events) and
        stays at the front.

        One function for the whole row (docs/alerts.md "Cost"): the values appended, the
        rules the row concerns evaluated in place; a rule whose result leaves its state as
        it was (False while OK, UNKNOWN) costs its call and two counters."""
        rows = self._rows
        ctx = self._ctx
        pending = self._pending
        plans = self._plans
        todo: Sequence[CompiledRule]  # a plan's tuple, or the list _append_row makes
        while rows:
            row = rows[0]
            undo: list = []
            mark = len(pending)
            try:
                step = row.get("_step")
                now = row.get("_time")
                if now is None:
                    now = self.wall_clock()
                mono = self.clock()
                ctx.now = now
                ctx.step = step
                ctx.mono = mono
                ctx.last_commit_mono = mono
                self._last_row = row
                plan = plans.get(tuple(row))
                if plan is not None:  # a row of a shape seen before: its series, its rules
                    for key, s in plan[0]:
                        value = row[key]
                        if type(value) is not float:
                            value = _as_float(value, type(value))
                            if value is None:  # not recorded: this row takes the general path
                                self._undo(undo, mark)
                                undo = []
                                todo = self._append_row(row, mono, step, undo, False)
                                break
                        undo.append((s, s.count, len(s.values)))
                        # MetricSeries.append inlined (same statements, same order)
                        vals = s.values
                        vals.append(value)
                        s.times.append(mono)  # the monotonic commit time
                        s.steps.append(step)
                        s.count += 1
                        if len(vals) > s.limit:
                            s.trim()
                    else:
                        todo = plan[1]
                else:
                    todo = self._append_row(row, mono, step, undo, True)
                for c in todo:  # _evaluate, inlined for the results that change nothing
                    if c.disabled:
                        continue
                    c.evaluations += 1
                    try:
                        result = c.fn(ctx)
                    except Exception as exc:  # a bug in a function: counted, never UNKNOWN
                        ev = self._rule_error(c, exc, ctx)
                        if ev is not None:
                            pending.append(ev)
                        continue
                    if c.consecutive_errors:
                        c.consecutive_errors = 0
                    if result is None:
                        continue
                    st = c.state
                    if result is False and st.state is OK:
                        st.streak = 0
                        continue
                    ev = self._advance(c, st, result is True, ctx, mono, undo)
                    if ev is not None:
                        pending.append(ev)
                rows.popleft()  # the commit point
            except BaseException:
                if rows and rows[0] is row:  # not committed: as if never started
                    self._undo(undo, mark)
                raise

    def _append_row(
        self, row: Mapping, mono: float, step: Any, undo: list, learn: bool
    ) -> list[CompiledRule]:
        """With ``_lock`` held: append the values of ``row`` the rules read to their series
        (each on ``undo``) and return the rules to evaluate, in order: those of the row's
        metrics in row order (registration order within one), then the ones evaluated on
        every step. ``learn``: remember the row's shape when every metric a rule reads was
        recorded, so the next row of that shape skips this lookup."""
        self._token = tok = self._token + 1
        index = self._index
        series = self._series
        seen = self._seen
        todo: list[CompiledRule] = []
        entries = []
        complete = True
        for key, value in row.items():
            rules = index.get(key)
            if rules is None:
                if key not in seen:
                    seen.add(key)
                continue
            t = type(value)
            if t is not float:
                value = _as_float(value, t)
                if value is None:
                    complete = False
                    continue
            s = series.get(key)
            if s is None:
                seen.add(key)
                s = series[key] = MetricSeries(key, self._capacity.get(key, 1))
            undo.append((s, s.count, len(s.values)))
            s.append(value, mono, step)  # the monotonic commit time
            entries.append((key, s))
            for c in rules:
                if c.mark != tok:
                    c.mark = tok
                    todo.append(c)
        for c in self._always:
            if c.mark != tok:
                c.mark = tok
                todo.append(c)
        if learn and complete:
            plans = self._plans
            if len(plans) >= 256:  # rows of ever new shapes: forget, stay bounded
                plans.clear()
            plans[tuple(row)] = (tuple(entries), tuple(todo))
        return todo

    def _undo(self, undo: list[tuple[Any, ...]], mark: int) -> None:
        pending = self._pending
        while len(pending) > mark:
            pending.pop()
        i = len(undo)
        while i:  # newest first (an index loop: mypyc cannot compile reversed() here)
            i -= 1
            entry = undo[i]
            if len(entry) == 2:  # a rule state's snapshot
                entry[0].restore(entry[1])
                continue
            # a series: (series, count, len(values)) before this row appended to it
            s, before, length = entry
            values, times, steps = s.values, s.times, s.steps
            if s.count == before:  # the append was cut short: drop what it added
                del values[length:]
                del times[length:]
                del steps[length:]
                continue
            n = s.count - before  # appended (and maybe trimmed since): drop the last n
            del values[-n:]
            del times[-n:]
            del steps[-n:]
            s.count = before
            m = min(len(values), len(times), len(steps))
            if not len(values) == len(times) == len(steps):  # a trim cut short: finish it
                for lst in (values, times, steps):
                    del lst[: len(lst) - m]

    def check_time(self) -> None:
        """Evaluate the time-based rules now (what the watchdog does every interval)."""
        if not self._timed or self._closed:
            return
        with self._lock:
            timed = self._timed
            main = self._ctx
            ctx = EvalContext(self._series, now=self.wall_clock(), mono=self.clock())
            ctx.step = main.step
            ctx.last_commit_mono = main.last_commit_mono
            ctx.start_mono = main.start_mono
            ctx.truncated = main.truncated
            ctx.peers = main.peers
            self._process_rows()  # a row an interrupt left behind
            self._pending.extend(self._evaluate(timed, ctx, ctx.mono))
        if self._pending:
            self._drain()

    def _drain(self) -> None:
        """Deliver the queued events in order, outside ``_lock``, until the queue is empty
        (events another thread queues meanwhile included; a thread finding another one
        delivering leaves its events to it). An event leaves the queue only once recorded and notified: an interrupted
        delivery resumes at the next drain (an event interrupted right after it was
        recorded is recorded again: at least once, never lost)."""
        pending = self._pending
        lock = self._drain_lock
        while pending:
            # another thread (or this one, re-entered from notify) delivers: it looks at the
            # queue again after releasing the lock, so what was queued before is not left
            if lock.locked():
                return
            with lock:  # a C lock in a with block: an interrupt never leaves it held
                while pending:
                    ev = pending[0]
                    if self._recorded is not ev:
                        self._emit_record(ev)
                        self._recorded = ev
                        if ev.action is not None:
                            self._emit_action(ev)
                    self._emit_notify(ev)
                    with self._lock:
                        pending.popleft()

    def _evaluate(
        self, todo, ctx: EvalContext, mono: float, undo: list | None = None
    ) -> list[AlertEvent]:
        events: list[AlertEvent] = []
        for c in todo:
            if c.disabled:
                continue
            c.evaluations += 1
            try:
                result = c.fn(ctx)
            except Exception as exc:  # a bug in a function: counted, never UNKNOWN
                ev = self._rule_error(c, exc, ctx)
                if ev is not None:
                    events.append(ev)
                continue
            c.consecutive_errors = 0
            if result is None:
                continue
            st = c.state
            if result is False and st.state is OK:
                st.streak = 0
                continue
            ev = self._advance(c, st, result is True, ctx, mono, undo)
            if ev is not None:
                events.append(ev)
        return events

    def _advance(
        self, c: CompiledRule, st: Any, result: bool, ctx: EvalContext, mono: float, undo
    ) -> AlertEvent | None:
        """Move a rule's state on a True/False result; the event of a transition (None
        when there is none). The snapshot goes on ``undo`` (a row's roll-back)."""
        with st.lock:
            snap = st.snapshot()
            if undo is not None:
                undo.append((st, snap))
            change = st.advance(result, mono)
            if change is None:
                return None
            try:
                return self._event(c, change[0], change[1], ctx)
            except Exception as exc:  # a failed render does not advance the state
                st.restore(snap)
                self._report(c.rule, exc, "rendering")
                return None

    def _rule_error(self, c: CompiledRule, exc: BaseException, ctx) -> AlertEvent | None:
        c.errors += 1
        c.consecutive_errors += 1
        c.last_error = f"{type(exc).__name__}: {exc}"
        self._report(c.rule, exc, "evaluating")
        if c.consecutive_errors < self.max_errors or c.disabled:
            return None
        c.disabled = True
        rule = c.rule
        return AlertEvent(
            rule=rule,
            kind="disabled",
            state="disabled",
            level="error",
            step=ctx.step,
            time=ctx.now,
            title=f"alert rule disabled: {rule.name}",
            message=(
                f"{c.consecutive_errors} evaluation errors in a row; last: {c.last_error}. "
                f"Condition: {rule.source}"
            ),
            notify=True,
            run_info=self.run_info,
            episode=c.state.episode,
            fires=c.state.fires,
        )

    def _report(self, rule: AlertRule | None, exc: BaseException, what: str) -> None:
        if self.on_error is not None:
            try:
                self.on_error(rule, exc)
            except Exception:  # the hook must not break measuring
                pass
            return
        self._warner.warn(
            f"{what}:{rule.name if rule else ''}",
            "alert rule %r: error while %s: %r (counted in stats)",
            rule.name if rule else None,
            what,
            exc,
        )

    def _values(self, c: CompiledRule, ctx: EvalContext) -> dict:
        out = {}
        for name in c.expr.needs:
            s = self._series.get(name) or self._series.get(name.replace(".", "/"))
            out[name] = s.values[-1] if s is not None and s.values else None
        return out

    def _event(self, c: CompiledRule, kind: str, notify: bool, ctx: EvalContext) -> AlertEvent:
        rule = c.rule
        observed = render_observed(
            cast(Node, rule.condition),  # a node once the rule is made (AlertRule)
            ctx,
            window=self.window,
            baselines=self.baselines,
        )
        values: dict = {}
        for key, value in self._last_row.items():
            if value is None or isinstance(value, (bool, int, float, str)):
                values[key] = value
        metrics = self._values(c, ctx)
        for key, value in metrics.items():
            values.setdefault(key, value)
        if c.skewed and ctx.peers is not None:  # {rank}: the slowest rank of the last step judged
            last = ctx.peers.last(c.skewed[0])
            if last is not None:
                values["rank"] = last[2]
        t = ctx.now
        try:
            stamp = _dt.datetime.fromtimestamp(t).isoformat(timespec="seconds")
        except (OverflowError, OSError, ValueError, TypeError):
            stamp = format_value(t, "rule")
        values.update(
            step=ctx.step,
            time=stamp,
            run=self.run_info.get("run", self.run_info.get("name")),
            project=self.run_info.get("project"),
            expr=observed,
            name=rule.name,
            level=rule.level,
        )
        if kind == "resolved":  # the firing templates describe the problem, not its end
            title = f"resolved: {rule.name}"
            message = (
                f"{rule.name} resolved at step {ctx.step}: {rule.source} is no longer true "
                f"({observed})"
            )
        else:
            message = render_template(rule.message or DEFAULT_MESSAGE, values)
            title = render_template(rule.title, values) if rule.title else str(rule.name)
        st = c.state
        return AlertEvent(
            rule=rule,
            kind=kind,
            state=st.state,
            level=rule.level if kind != "resolved" else "info",
            step=ctx.step,
            time=t,
            title=title,
            message=message,
            metrics=metrics,
            observed=observed,
            notify=notify and self.deliver,  # a rank that does not alert records, never notifies
            run_info=self.run_info,
            episode=st.episode,
            fires=st.fires,
            action=rule.action if kind == "firing" else None,
        )

    def _emit_record(self, ev: AlertEvent) -> None:
        record = self.record
        if record is not None:
            try:
                record(ev)
            except Exception as exc:
                self._delivery_errors += 1
                self._report(ev.rule, exc, "recording")

    def _emit_action(self, ev: AlertEvent) -> None:
        on_action = self.on_action
        if on_action is not None:
            try:
                on_action(ev)
            except Exception as exc:
                self._report(ev.rule, exc, "taking the action of")

    def _emit_notify(self, ev: AlertEvent) -> None:
        notify = self.notify
        if self.deliver and ev.notify and notify is not None:
            try:
                notify(ev)
            except Exception as exc:
                self._delivery_errors += 1
                self._report(ev.rule, exc, "notifying")

    # -- watchdog ------------------------------------------------------------------------
    def start_watchdog(
        self,
        interval: float = 30.0,
        *,
        thread_factory: Callable[..., threading.Thread] = threading.Thread,
    ) -> bool:
        """Start the daemon thread calling ``check_time()`` every ``interval`` seconds —
        only when a time-based rule exists (returns whether a watchdog runs). The request
        is remembered: adding a time-based rule later starts it. ``thread_factory`` is
        injectable for tests (same signature as ``threading.Thread``)."""
        if not interval > 0:
            raise ValueError(f"watchdog interval must be > 0 seconds, got {interval!r}")
        self._watchdog_interval = float(interval)
        if self._closed or not self._timed:
            return False
        if self._watchdog.running:
            return True
        self._watchdog.start(float(interval), self.check_time, self._report, thread_factory)
        return True

    def close(self, timeout: float = 1.0) -> None:
        """Process what an interrupt left (a taken row, undelivered events), then stop the
        watchdog (joined up to ``timeout`` s); later ``on_step`` calls do nothing."""
        if not self._closed:
            with self._lock:
                self._process_rows()
            if self._pending:
                self._drain()
        self._closed = True
        self._watchdog.stop(timeout)

    @property
    def watchdog_running(self) -> bool:
        return self._watchdog.running

    # -- reporting -----------------------------------------------------------------------
    def unresolved_metrics(self) -> list[str]:
        """Metric names rules read that no committed row has held (exact or ``.`` -> ``/``)."""
        return unresolved_metrics(self._rules, self._seen)

    def stats(self) -> dict:
        """``{"rules": {name: {evaluations, fires, errors, state, disabled, level,
        last_error, unresolved_metrics}}, "unresolved_metrics": [...], "truncated_windows":
        [...], "delivery_errors": n, "watchdog": bool}`` (and ``"baselines"``: per
        ``baseline()`` call, the peer runs and steps read). ``state`` is ok/pending/firing;
        a rule's ``unresolved_metrics`` are the names it reads that no committed row held
        (the top-level list: every rule's)."""
        rules = {}
        for c in list(self._rules):
            rules[c.rule.name] = {
                "unresolved_metrics": unresolved_metrics((c,), self._seen),
                "evaluations": c.evaluations,
                "fires": c.state.fires,
                "errors": c.errors,
                "state": c.state.state,
                "disabled": c.disabled,
                "level": c.rule.level,
                "last_error": c.last_error,
            }
        out = {
            "rules": rules,
            "unresolved_metrics": self.unresolved_metrics(),
            "truncated_windows": sorted(self._ctx.truncated),
            "delivery_errors": self._delivery_errors,
            "watchdog": self.watchdog_running,
        }
        tables = self.baselines.stats() if self.baselines is not None else None
        if tables:  # baseline() calls: the peer runs and steps each table holds
            out["baselines"] = tables
        return out

    def finish_warnings(self) -> list[str]:
        """Messages to warn about once at finish: unresolved metrics (with close matches
        among the names seen), disabled rules, truncated duration windows. Not emitted here:
        the caller decides how (``warnings.warn``/logging)."""
        return finish_warnings(self._rules, self._seen, self._ctx.truncated, self.window)

    def firing(self) -> list[str]:
        """Names of the rules now FIRING."""
        return [c.rule.name for c in self._rules if c.state.state == FIRING]  # type: ignore[misc]
