"""Span objects and the nesting stack.

A :class:`Span` times a region with ``time.perf_counter_ns``. Nesting lives in a
``ContextVar`` holding a tuple of open spans: a new thread starts empty and every asyncio
task works on its own copy, so concurrent work never nests inside unrelated spans. A span
that ends removes *itself* from the current stack by filtering (never a token reset), so
spans may end out of order (``start_span`` / ``end``).

The active :class:`~expr_tracker.spans.recorder.SpanRecorder` is a module global set by the
run (:func:`set_active_recorder`) and read on the fast path: no locks and no validation on
enter. Without one, spans still time and print but write nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from time import perf_counter_ns
from time import time as _wall
from typing import Any

from expr_tracker import _current
from expr_tracker._warn import Warner
from expr_tracker.errors import ForkedRunError
from expr_tracker.spans.printing import enter_line, exit_line

log = logging.getLogger("expr_tracker.spans")

#: the open spans of the current thread / asyncio task, outermost first
_stack: ContextVar[tuple[Span, ...]] = ContextVar("expr_tracker_span_stack", default=())
_stack_get = _stack.get
_stack_set = _stack.set

#: the active recorder (a SpanRecorder or None), set by the run
_active: Any = None
#: this process's pid, refreshed in a forked child before any user code runs
_PID = os.getpid()
#: span ids, unique within a process (the span file carries the pid beside them): drawn from
#: the one process-wide sequence the history store also marks each accepted ``log()`` with,
#: so the store can tell whether a ``log()`` came while a span ran
_ids = _current.sequence

_warner = Warner(log)

#: plugin keys that belong to the span itself and are dropped from plugin results
RESERVED_KEYS = ("time_ms", "count")

#: how each measurement (the metric name before its first "/") combines within one history
#: row (docs/spans.md "Aggregation"); ``build`` hands it to the
#: ``HistoryStore``. A name not listed sums.
AGGREGATION = {
    "time_ms": "sum",
    "cpu_time_ms": "sum",
    "gpu_mem_delta_mb": "sum",
    "count": "sum",
    "gpu_mem_peak_mb": "max",
    "gpu_mem_used_mb": "max",
    "cpu_percent": "mean",
    "gpu_percent": "mean",
}


def _after_fork_in_child() -> None:
    global _PID
    _PID = os.getpid()


if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


def set_active_recorder(recorder: Any) -> Any:
    """Make ``recorder`` (a ``SpanRecorder`` or None) receive every span that ends.

    Called by the run on ``init`` (the new recorder) and ``finish`` (None). Returns the
    previously active recorder. A span reports to the recorder that was active when it
    started: one left open across ``finish()``/``init()`` is not recorded (its run's recorder
    is closed) and is never the parent of the new run's spans.
    """
    global _active
    prev = _active
    _active = recorder
    return prev


def get_active_recorder() -> Any:
    """The recorder spans currently report to, or None."""
    return _active


def current_span() -> Span | None:
    """The innermost open span of this thread / asyncio task, or None."""
    for s in reversed(_stack_get()):
        if not s._end_ns:
            return s
    return None


def _normalize_name(name: str) -> str:
    """A span name with a ``/`` as the path it makes: no leading, trailing or doubled ``/``
    (``"/forward/"`` -> ``"forward"``, ``"a//b"`` -> ``"a/b"``; docs/spans.md "Naming").

    Raises:
        ValueError: a name of nothing but ``/``.
    """
    parts = [p for p in name.split("/") if p]
    if not parts:
        raise ValueError(f"span name must name something besides '/', got {name!r}")
    return "/".join(parts)


def _warn_once(key: Any, message: str, *args: Any) -> None:
    _warner.warn(key, message, *args)


class Span:
    """One timed region: ``span(name, *, print_fn=None, plugins=None, step=None, **attrs)``.

    Use it as a context manager, an ``async with`` target, or a decorator (sync or async;
    each call runs in a fresh span). :func:`start_span` starts one for manual ``.end()``.

    - ``print_fn``: a callable taking one line (``print``, ``logger.info``). None inherits
      the enclosing span's (or the run's ``span_print_fn``); ``False`` silences this subtree.
    - ``plugins``: measurement plugins (objects with ``start(span)``/``end(span) -> dict`` or
      plain ``fn(span) -> dict``). None inherits; ``[]`` turns them off for this subtree.
    - ``step``: only added to the record's ``args.step``; the history step is the one open
      when the span ends, or the row the next ``log()`` writes when no ``log()`` came while
      the span ran (docs/spans.md "Which row a span joins").
    - ``**attrs``: attributes for the span file (not metrics).

    Raises ``ValueError`` for an empty name (or one of only ``/``); on entry ``RuntimeError`` when the span was
    already started (a span from :func:`start_span` may be entered once: the block ends it),
    and ``ForkedRunError`` in a forked child whose active recorder belongs
    to the parent process. Exceptions from the code inside are recorded and re-raised.

    Attributes (read-only unless noted):

    - ``name`` (str): the name given, with no leading, trailing or doubled ``/``
      (``"/forward/"`` is ``"forward"``); ``path`` (str): names of the enclosing spans and
      this one joined by ``/`` (set when the span starts); ``depth`` (int, 0 = outermost).
    - ``attrs`` (dict): attributes as given, original values (update with :meth:`set`).
    - ``step``: the ``step=`` argument (only added to the record's ``args``), or None.
    - ``error`` (str | None): the exception type name that ended the span.
    - ``id`` (int): unique within the process; ``parent`` (Span | None).
    - :attr:`duration_ms`, :attr:`metrics`.
    """

    __slots__ = (
        "name",
        "path",
        "depth",
        "parent",
        "id",
        "attrs",
        "step",
        "error",
        "_print_arg",
        "_plugins_arg",
        "_print",
        "_pdepth",
        "_plugins",
        "_start_ns",
        "_end_ns",
        "_pm",
        "_rec",
        "_manual",
        "__weakref__",
    )

    def __init__(
        self,
        name: str,
        *,
        print_fn: Callable[[str], Any] | bool | None = None,
        plugins: Iterable[Any] | None = None,
        step: int | None = None,
        **attrs: Any,
    ) -> None:
        if type(name) is not str or not name:
            raise ValueError(f"span name must be a non-empty string, got {name!r}")
        if "/" in name:  # one C-level scan; only names with a "/" pay for the rest
            name = _normalize_name(name)
        self.name = name
        self.path = name
        self.depth = 0
        self.parent: Span | None = None
        self.id = 0
        self.attrs = attrs or None
        self.step = step
        self.error: str | None = None
        self._print_arg = print_fn
        self._plugins_arg = plugins if plugins is None else tuple(plugins)
        self._print: Callable[[str], Any] | None = None
        self._pdepth = 0
        self._plugins: tuple[Any, ...] | list[Any] = ()
        self._start_ns = 0
        self._end_ns = 0
        self._pm: dict[str, Any] | None = None
        self._rec: Any = None  # the recorder (run) active when the span started
        self._manual = False  # started by start_span(), not yet entered by `with`

    # ------------------------------------------------------------------ lifecycle

    def _start(self) -> Span:
        if self._start_ns:
            if self._manual and not self._end_ns:  # `with et.start_span("x"):` ends it at exit
                self._manual = False
                return self
            raise RuntimeError(
                f"span {self.name!r} was already started (or entered twice); create a new one"
            )
        rec = _active
        if rec is not None and rec._pid != _PID:
            raise ForkedRunError(
                "this process was forked from the one that started the run; spans cannot "
                "report to the parent's run. Call et.init() (a new run or stream) in the child."
            )
        stack = _stack_get()
        if stack:
            parent = stack[-1]
            if parent._end_ns:  # ended from another context: drop the stale entries
                stack = tuple(s for s in stack if not s._end_ns)
                parent = stack[-1] if stack else None
            if parent is not None and parent._rec is not rec:
                parent = None  # left open by an earlier run: not this run's parent
        else:
            parent = None
        self._rec = rec
        p = self._print_arg
        plugins = self._plugins_arg
        if parent is None:
            if p is None:
                p = rec._print_fn if rec is not None else None
            if plugins is None:
                plugins = rec._plugins if rec is not None else ()
        else:
            self.path = parent.path + "/" + self.name
            self.depth = parent.depth + 1
            self.parent = parent
            if p is None:
                p = parent._print
                self._pdepth = parent._pdepth + 1
            if plugins is None:
                plugins = parent._plugins_arg
        self._plugins_arg = plugins  # the effective set, inherited by children
        self.id = next(_ids)
        try:  # all or nothing: interrupted (Ctrl-C), the stack is left as it was
            _stack_set(stack + (self,))
            if p:  # self._print stays None (from __init__) for a falsy print_fn
                self._print = p
                self._emit(enter_line(self, _wall()))
            if plugins:
                self._plugins = _start_plugins(self, plugins)
            self._start_ns = perf_counter_ns()
        except BaseException:
            self._unstart(stack)
            raise
        return self

    def _unstart(self, stack: tuple[Span, ...]) -> None:
        """Undo an interrupted ``_start``: the span is new again, ``stack`` current."""
        _stack_set(stack)
        self._start_ns = 0
        self._print = None
        if self._plugins:  # close what the plugins opened; the result is dropped
            _end_plugins(self)
            self._plugins = ()

    def __exit__(self, exc_type: Any, exc: Any = None, tb: Any = None) -> bool:
        end = perf_counter_ns()
        if self._end_ns or not self._start_ns:
            return False
        self._end_ns = end
        if exc_type is not None:
            self.error = exc_type.__name__
        stack = _stack_get()
        if stack and stack[-1] is self:
            _stack_set(stack[:-1])
        elif self in stack:
            _stack_set(tuple(s for s in stack if s is not self))
        pm = _end_plugins(self) if self._plugins else None
        # the run the span started in, never a later one (a span left open across
        # et.finish()/et.init() is not recorded: its run's recorder is closed)
        rec = self._rec
        if rec is not None:
            if rec._pid == _PID:
                try:
                    rec.record(self, pm)
                except Exception as exc:  # noqa: BLE001 - measuring must not break the code
                    _warn_once(
                        ("record", type(exc).__name__),
                        "expr_tracker: recording span %r failed (%s: %s); ignored",
                        self.path,
                        type(exc).__name__,
                        exc,
                    )
            else:
                _warn_once("forked", "expr_tracker: span ended in a forked child; not recorded")
                self._pm = pm
        else:
            self._pm = pm
        if self._print is not None:
            self._emit(exit_line(self, _wall()))
        return False

    _finish = __exit__
    __enter__ = _start

    def _emit(self, line: str) -> None:
        try:
            self._print(line)  # type: ignore[misc]
        except Exception as exc:  # noqa: BLE001 - a broken print_fn must not break the code
            _warn_once(
                ("print_fn", id(self._print)),
                "expr_tracker: span print_fn raised %s: %s; ignored (warned once)",
                type(exc).__name__,
                exc,
            )

    def end(self) -> float:
        """End a span opened with :func:`start_span`; returns its duration in milliseconds
        (:attr:`duration_ms`). A second call ends nothing and returns the same duration."""
        self._finish(None)
        return self.duration_ms

    def _discard(self) -> None:
        """Take a started span off the stack without recording it (a failed use of it)."""
        if not self._end_ns:
            self._end_ns = self._start_ns
            if self._plugins:
                _end_plugins(self)  # close what the plugins opened; the result is dropped
            stack = _stack_get()
            if self in stack:
                _stack_set(tuple(s for s in stack if s is not self))

    # ------------------------------------------------------------------ protocols

    async def __aenter__(self) -> Span:
        return self._start()

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        self._finish(exc_type)
        return False

    def _clone(self) -> Span:
        return Span(
            self.name,
            print_fn=self._print_arg,
            plugins=self._plugins_arg,
            step=self.step,
            **(self.attrs or {}),
        )

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Use the span as a decorator: each call of ``fn`` runs in a fresh span.

        Works on plain and ``async def`` functions. Raises ``TypeError`` for a span that
        was already started.
        """
        if self._start_ns:
            if self._manual:  # @et.start_span(...): never leave it open for others to nest in
                self._discard()
            raise TypeError(
                f"a started span cannot decorate a function: use @et.span({self.name!r}) "
                "(et.start_span starts the span at once)"
            )
        import functools
        import inspect

        template = self
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                async with template._clone():
                    return await fn(*args, **kwargs)

            return async_wrapper

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with template._clone():
                return fn(*args, **kwargs)

        return wrapper

    # ------------------------------------------------------------------ data

    def set(self, **attrs: Any) -> Span:
        """Add or replace attributes (kept as given; the span file gets an encoded copy)."""
        if self.attrs is None:
            self.attrs = attrs or None
        else:
            self.attrs.update(attrs)
        return self

    @property
    def duration_ms(self) -> float:
        """Milliseconds: final after the span ended, elapsed so far while it runs, 0.0 before."""
        if self._end_ns:
            return (self._end_ns - self._start_ns) / 1e6
        if self._start_ns:
            return (perf_counter_ns() - self._start_ns) / 1e6
        return 0.0

    @property
    def metrics(self) -> dict[str, Any]:
        """This span's own measurements, unprefixed: ``{"time_ms": 3.1, "cpu_percent": ...}``.

        Empty until the span ends. Plugin values are as the run encoded them (NumPy values
        normalised) when a run was active, as the plugin returned them otherwise.
        """
        if not self._end_ns:
            return {}
        out: dict[str, Any] = {"time_ms": (self._end_ns - self._start_ns) / 1e6}
        if self._pm:
            out.update(self._pm)
        return out

    @property
    def running(self) -> bool:
        """True between start and end."""
        return bool(self._start_ns) and not self._end_ns

    def __repr__(self) -> str:
        state = "ended" if self._end_ns else ("running" if self._start_ns else "new")
        return f"<Span {self.path!r} {state} {self.duration_ms:.3f}ms>"


# ---------------------------------------------------------------------- plugins


def _start_plugins(span: Span, plugins: Iterable[Any]) -> list[Any]:
    started = []
    for p in plugins:
        start = getattr(p, "start", None)
        if start is not None:
            try:
                start(span)
            except Exception as exc:  # noqa: BLE001
                _plugin_failed(p, "start", exc)
                continue
        started.append(p)
    return started


def _end_plugins(span: Span) -> dict[str, Any] | None:
    out: dict[str, Any] | None = None
    # the reverse of start order, so the innermost-started measurement closes first
    for p in reversed(span._plugins):
        end = getattr(p, "end", None)
        try:
            res = end(span) if end is not None else p(span)
        except Exception as exc:  # noqa: BLE001
            _plugin_failed(p, "end", exc)
            continue
        if not res:
            continue
        if not hasattr(res, "items"):
            _warn_once(
                ("plugin-result", id(p)),
                "expr_tracker: span plugin %s returned %s, not a dict; ignored (warned once)",
                _plugin_name(p),
                type(res).__name__,
            )
            continue
        for k, v in res.items():
            if k in RESERVED_KEYS or type(k) is not str or not k:
                _warn_once(
                    ("plugin-key", id(p), k),
                    "expr_tracker: span plugin %s returned key %r, which belongs to the "
                    "span (time_ms and count are reserved) or is not a name; dropped",
                    _plugin_name(p),
                    k,
                )
                continue
            if out is None:
                out = {}
            out[k] = v
    return out


def _plugin_name(p: Any) -> str:
    return getattr(p, "__qualname__", None) or type(p).__qualname__


def _plugin_failed(p: Any, hook: str, exc: BaseException) -> None:
    _warn_once(
        ("plugin", id(p), hook),
        "expr_tracker: span plugin %s raised in %s(): %s: %s; skipped (logged once per plugin)",
        _plugin_name(p),
        hook,
        type(exc).__name__,
        exc,
    )


# ---------------------------------------------------------------------- public forms


#: ``span(name, *, print_fn=None, plugins=None, step=None, **attrs) -> Span`` (the class
#: itself, so opening a span costs one call): see :class:`Span`.
span = Span


def start_span(
    name: str,
    *,
    print_fn: Callable[[str], Any] | bool | None = None,
    plugins: Iterable[Any] | None = None,
    step: int | None = None,
    **attrs: Any,
) -> Span:
    """Start a span now and return it; call ``.end()`` on it later, from any scope.

    Takes the arguments of :func:`span`. Spans opened afterwards in the same thread/task nest
    under it until it ends; ending out of order is allowed. ``with et.start_span("x"):``
    (and ``async with``) also works: the block ends it. A bad argument raises before the
    span is started (``ValueError`` for an empty name); using the returned span as a
    decorator raises ``TypeError`` and discards it, so no later span nests under it.
    """
    s = Span(name, print_fn=print_fn, plugins=plugins, step=step, **attrs)._start()
    s._manual = True
    return s
