"""Span objects and the nesting stack.

A :class:`Span` times a region with ``time.perf_counter_ns``. Nesting lives in a
``ContextVar`` holding the innermost span started in the current thread / asyncio task;
each span keeps the one below it (``_up``), so the chain is the stack of open spans. A new
thread starts empty and every asyncio task works on its own copy, so concurrent work never
nests inside unrelated spans. A span that ends only marks itself ended (``_end_ns``); the
chain is read skipping ended spans, and the next span started in that context replaces the
top, so a span costs one ``ContextVar.set`` and spans may end out of order
(``start_span`` / ``end``), from any context.

The active :class:`~expr_tracker.spans.recorder.SpanRecorder` is a module global set by the
run (:func:`set_active_recorder`) and read on the fast path: no locks and no validation on
enter. Without one, spans still time and print but write nothing. A plain span (no
print_fn, plugin, attribute, ``step=`` or error) ends with one append to the recorder's
raw-span queue (``SpanRecorder.raw_queue``), done here without calling the recorder.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from time import perf_counter_ns
from time import time as _wall
from typing import Any

from expr_tracker import _current
from expr_tracker._warn import Warner
from expr_tracker.errors import ForkedRunError
from expr_tracker.history.spanfiles import track_name
from expr_tracker.spans.printing import enter_line, exit_line

log = logging.getLogger("expr_tracker.spans")

#: the innermost span started in the current thread / asyncio task (ended or not), or None
_top: ContextVar[Span | None] = ContextVar("expr_tracker_span_top", default=None)
_top_get = _top.get
_top_set = _top.set

#: the active recorder (a SpanRecorder or None), set by the run
_active: Any = None
#: this process's pid, refreshed in a forked child before any user code runs
_PID = os.getpid()
#: span ids, unique within a process (the span file carries the pid beside them): drawn from
#: the one process-wide sequence the history store also marks each accepted ``log()`` with,
#: so the store can tell whether a ``log()`` came while a span ran
_ids = _current.sequence
_modules = sys.modules

#: plain spans waiting in a recorder's raw queue at most: the one that reaches it places
#: them (``SpanRecorder``; the store's own bounds on held records then apply)
RAW_MAX = 1024

#: per thread: ``identity``, the ``(native thread id, name at the thread's first span,
#: track)`` a span record names (set by ``SpanRecorder``'s ``thread_identity``)
thread_cache = threading.local()
_tc = thread_cache


def thread_identity() -> tuple[int, str, str]:
    """``(native thread id, name, track)`` of the calling thread, as its span records name
    it: cached per thread at its first span (``thread_cache.identity``; a later rename of
    the thread is not seen)."""
    tid, name = threading.get_native_id(), threading.current_thread().name
    v = _tc.identity = (tid, name, track_name(name, tid))
    return v


#: ``asyncio._get_running_loop``, kept once found (one global read per span after that)
_get_running_loop: Any = None


def task_name(aio: Any) -> str | None:
    """The current asyncio task's name (``aio``: the ``asyncio`` module, imported by
    someone; None once it was found here); None outside a running event loop (no loop
    running, or no task)."""
    global _get_running_loop
    running = _get_running_loop
    if running is None:
        if aio is None:
            return None
        # getattr: another thread may be importing asyncio right now (a mirror importing
        # its library), leaving a partially initialised module in sys.modules
        running = getattr(aio, "_get_running_loop", None)
        if running is None:
            return None
        _get_running_loop = running
    loop = running()
    if loop is None:
        return None
    if aio is None:
        aio = _modules.get("asyncio")
    current = getattr(aio, "current_task", None)
    task = current(loop) if current is not None else None
    return task.get_name() if task is not None else None


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


class _Forked:
    """The active recorder as a forked child of the process that made it sees it: no span
    may start under it (``Span._start`` takes its slow path, which raises
    ``ForkedRunError``); :func:`get_active_recorder` still returns the recorder."""

    __slots__ = ("recorder", "_pid")
    _plain_spans = False  # every span started under it takes the slow path

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder
        self._pid = recorder._pid


def _after_fork_in_child() -> None:
    global _PID, _active
    _PID = os.getpid()
    rec = _active
    if rec is not None and type(rec) is not _Forked and rec._pid != _PID:
        _active = _Forked(rec)  # the start of a span checks no pid of its own


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
    prev = get_active_recorder()
    _active = recorder
    top = _top_get()
    if top is not None and top._end_ns:  # let go of ended spans (and their run) here
        _top_set(_open(top))
    return prev


def get_active_recorder() -> Any:
    """The recorder spans currently report to, or None."""
    rec = _active
    return rec.recorder if type(rec) is _Forked else rec


def current_span() -> Span | None:
    """The innermost open span of this thread / asyncio task, or None."""
    return _open(_top_get())


def _open(s: Span | None) -> Span | None:
    """``s`` or the first span below it that has not ended (None: no open span)."""
    while s is not None and s._end_ns:
        s = s._up
    return s


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

    # Set by __init__: the public attributes, _opt, _start_ns, _end_ns. Set when it starts:
    # _rec, _up, _slow and, for a slow span (_slow: a print_fn, plugins, attributes or
    # step= of its own or inherited), _print, _pdepth, _plugins_arg, _plugins. _pm is set
    # when a slow span ends, _manual by start_span: the fast path stores only what it reads.
    __slots__ = (
        "name",
        "path",
        "depth",
        "parent",
        "id",
        "attrs",
        "step",
        "error",
        "_opt",
        "_start_ns",
        "_end_ns",
        "_rec",
        "_up",
        "_slow",
        "_print",
        "_pdepth",
        "_plugins_arg",
        "_plugins",
        "_pm",
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
        self.step = step
        self.error: str | None = None
        self._start_ns = 0
        self._end_ns = 0
        if attrs:
            self.attrs: dict[str, Any] | None = attrs
            self._opt: tuple[Any, Any] | None = (
                print_fn,
                plugins if plugins is None else tuple(plugins),
            )
        else:
            self.attrs = None
            # what the span sets itself (print_fn, plugins), or None: nothing of its own
            # (no step= or attributes either), the fast path when it inherits nothing
            self._opt = (
                None
                if print_fn is None and plugins is None and step is None
                else (print_fn, plugins if plugins is None else tuple(plugins))
            )

    # ------------------------------------------------------------------ lifecycle

    def _start(self) -> Span:
        if self._start_ns:
            if getattr(self, "_manual", False) and not self._end_ns:
                self._manual = False  # `with et.start_span("x"):` ends it at exit
                return self
            raise RuntimeError(
                f"span {self.name!r} was already started (or entered twice); create a new one"
            )
        rec = _active  # (in a forked child, a _Forked: the slow path raises)
        up = top = _top_get()
        while up is not None and up._end_ns:  # ended: not on the stack any more
            up = up._up
        self._rec = rec
        self._up = up
        if up is not None and up._rec is rec:  # (else left open by an earlier run)
            self.path = up.path + "/" + self.name
            self.depth = up.depth + 1
            self.parent = up
            if up._slow or self._opt is not None:
                return self._start_slow(top, up)
        elif self._opt is not None or (rec is not None and not rec._plain_spans):
            return self._start_slow(top, None)
        self._slow = False
        self.id = next(_ids)
        try:  # all or nothing: interrupted (Ctrl-C), the stack is left as it was
            _top_set(self)
            self._start_ns = perf_counter_ns()
        except BaseException:
            _top_set(top)
            raise
        return self

    def _start_slow(self, top: Span | None, parent: Span | None) -> Span:
        """``_start`` of a span that prints, measures, or has attributes or ``step=``
        (its own or inherited); ``top``: the stack's top before it, ``parent``: its
        parent, already set."""
        rec = self._rec
        if rec is not None and rec._pid != _PID:
            self._rec = None  # new again
            self.path, self.depth, self.parent = self.name, 0, None
            raise ForkedRunError(
                "this process was forked from the one that started the run; spans cannot "
                "report to the parent's run. Call et.init() (a new run or stream) in the child."
            )
        opt = self._opt
        p, plugins = opt if opt is not None else (None, None)
        pdepth = 0
        if parent is None:
            if p is None:
                p = rec._print_fn if rec is not None else None
            if plugins is None:
                plugins = rec._plugins if rec is not None else ()
        else:
            slow = parent._slow
            if p is None and slow:
                p = parent._print
                pdepth = parent._pdepth + 1
            if plugins is None:
                plugins = parent._plugins_arg if slow else ()
        self._print = None  # stays None for a falsy print_fn
        self._pdepth = pdepth
        self._plugins_arg = plugins  # the effective set, inherited by children
        self._plugins: tuple[Any, ...] | list[Any] = ()
        self._slow = True
        self.id = next(_ids)
        try:  # all or nothing: interrupted (Ctrl-C), the stack is left as it was
            _top_set(self)
            if p:
                self._print = p
                self._emit(enter_line(self, _wall()))
            if plugins:
                self._plugins = _start_plugins(self, plugins)
            self._start_ns = perf_counter_ns()
        except BaseException:
            self._unstart(top)
            raise
        return self

    def _unstart(self, top: Span | None) -> None:
        """Undo an interrupted ``_start``: the span is new again, ``top`` the stack's top."""
        _top_set(top)
        self._start_ns = 0
        self._print = None
        if self._plugins:  # close what the plugins opened; the result is dropped
            _end_plugins(self)
            self._plugins = ()

    def __exit__(self, exc_type: Any, exc: Any = None, tb: Any = None) -> bool:
        end = perf_counter_ns()
        if self._end_ns or not self._start_ns:
            return False
        # ended: off the stack (the chain skips it; the next span started here replaces it)
        self._end_ns = end
        if exc_type is None and not self._slow:
            rec = self._rec
            if rec is None:
                return False
            # None: no batched path, the recorder closed, or a forked child (SpanRecorder)
            raw = rec.raw_queue
            if raw is not None:
                # a plain span: one append to the store's raw queue (SpanRecorder.record's
                # first branch, inline), placed and encoded in a batch later
                try:
                    ident = _tc.identity
                except AttributeError:
                    ident = thread_identity()
                running = _get_running_loop  # asyncio's, once it is imported
                if running is not None:
                    entry = (self, ident, None if running() is None else task_name(None))
                elif "asyncio" in _modules:  # none imported: no task, and no call
                    entry = (self, ident, task_name(_modules["asyncio"]))
                else:
                    entry = (self, ident, None)
                if not raw:
                    rec._raw_waiting()
                raw.append(entry)
                # an ended span may stay its thread's top for long (an idle worker): it
                # must not keep its run (the recorder, the store) alive
                self._rec = None
                if len(raw) >= RAW_MAX:
                    rec._raw_pull()
                return False
        return self._end_slow(exc_type)

    def _end_slow(self, exc_type: Any) -> bool:
        """``__exit__`` of a span that is not plain, failed, or has no batched path."""
        if exc_type is not None:
            self.error = exc_type.__name__
        slow = self._slow
        pm = _end_plugins(self) if slow and self._plugins else None
        self._pm = pm
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
            self._rec = None  # ended: its run is not kept alive through it (see __exit__)
        if slow and self._print is not None:
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
            self._end_ns = self._start_ns  # ended: the stack skips it
            if self._slow and self._plugins:
                _end_plugins(self)  # close what the plugins opened; the result is dropped

    # ------------------------------------------------------------------ protocols

    async def __aenter__(self) -> Span:
        return self._start()

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        self._finish(exc_type)
        return False

    def _clone(self) -> Span:
        p, plugins = self._opt if self._opt is not None else (None, None)
        return Span(
            self.name,
            print_fn=p,
            plugins=plugins,
            step=self.step,
            **(self.attrs or {}),
        )

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Use the span as a decorator: each call of ``fn`` runs in a fresh span.

        Works on plain and ``async def`` functions. Raises ``TypeError`` for a span that
        was already started.
        """
        if self._start_ns:
            if getattr(self, "_manual", False):  # @et.start_span(...): never leave it open
                self._discard()  # for others to nest in
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
        if attrs:  # a span with attributes is recorded by the slow path
            if not self._start_ns:
                if self._opt is None:
                    self._opt = (None, None)
            elif not self._slow:  # started plain: what _start_slow sets for it
                self._print = None
                self._pdepth = 0
                self._plugins_arg = ()
                self._plugins = ()
                self._slow = True
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
        pm = getattr(self, "_pm", None)  # set when a slow span ends
        if pm:
            out.update(pm)
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
