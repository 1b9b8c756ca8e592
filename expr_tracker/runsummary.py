"""The run's summary: the last value of every metric plus what the user assigns.

:class:`Summary` is a row sink of the run (``run.summary``, ``et.summary``): it keeps the
last values under its own lock, holds the run's ``define_metric`` definitions and their
aggregation state (:class:`~expr_tracker.history.metricdefs.MetricDefs`), and saves
``summary[.S][.rankN].json`` and ``metric_defs.json`` on the background flusher
(docs/logging.md "Summary"). ``expr_tracker.runs`` re-exports it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

from expr_tracker._current import FORK_MESSAGE, fork_generation
from expr_tracker.history.codec import dumps_pretty, normalize_value
from expr_tracker.history.flusher import get_flusher
from expr_tracker.history.metricdefs import MetricDef, MetricDefs
from expr_tracker.history.paths import atomic_write

__all__ = ["SUMMARY_SAVE_INTERVAL_S", "Summary"]

log = logging.getLogger("expr_tracker")


_MISSING = object()

#: row keys the store adds (the step and its time): kept for ``summary.json`` (a resume
#: catches up from the step it had seen), never part of the summary's keys
_META = ("_step", "_time")


#: seconds between background saves of summary.json while rows arrive
SUMMARY_SAVE_INTERVAL_S = 2.0


class Summary(MutableMapping):
    """The last value of every metric plus what the user assigns (``summary["best"] = 0.9``,
    or as an attribute: ``summary.best = 0.9``, as wandb allows).

    Its keys are the keys logged and assigned, as given (``"eval.acc"`` stays
    ``"eval.acc"``); the row's ``_step``/``_time`` are not among them (``summary.json``
    keeps them, as the step the summary had seen).

    Persisted to ``summary[.S][.rankN].json`` on the background flusher at most every
    :data:`SUMMARY_SAVE_INTERVAL_S` seconds while rows arrive, on ``flush()`` and at finish,
    so a crash leaves it at most that far behind (and a resume catches up from the metrics
    file). Assigned keys are kept even when a later row carries the same metric.
    """

    def __init__(
        self,
        path: Path | None,
        initial: dict[str, Any] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        defs_path: Path | None = None,
        defs: MetricDefs | None = None,
        lock: threading.Lock | None = None,
    ) -> None:
        self.path = path
        self._last: dict[str, Any] = dict(initial or {})
        self._assigned: dict[str, Any] = {}
        # its own lock, or the history store's (the run's summary: its rows then arrive
        # through on_row_locked, under that lock, without a second one)
        self._lock = lock if lock is not None else threading.Lock()
        self._clock = clock
        self._save_scheduled = False
        self._failed = False
        #: the run's define_metric definitions and the state of their aggregations
        self.defs = defs if defs is not None else MetricDefs()
        self._defs_path = defs_path
        self._aggregating = self.defs.aggregating  # the row path calls defs.update() then
        #: called with ``{key: value}`` after user assignments (the run's "summary" event)
        self.on_assign: Callable[[dict[str, Any]], Any] | None = None
        self._fork_gen = fork_generation()  # a forked child reads, never assigns
        # the history store whose on_commit hook this is (attach): between two saves the
        # hook is the dict's own update (see on_row_locked)
        self._store: Any = None

    def attach(self, store: Any) -> None:
        """Take ``store``'s committed rows through its ``on_commit`` hook, under its lock
        (the summary must share that lock: ``Summary(lock=store.lock)``).

        While no aggregation is defined and a save is already scheduled, the hook is
        ``dict.update`` of the last values itself: what :meth:`on_row_locked` would do
        then, without a call into Python (docs/logging.md "What one log() costs"); a due
        save and :meth:`define` put :meth:`on_row_locked` back.
        """
        self._store = store
        store.on_commit = self.on_row_locked

    def on_row(self, row: dict[str, Any]) -> None:
        """Take one committed row (a row sink)."""
        with self._lock:
            self.on_row_locked(row)

    def on_row_locked(self, row: dict[str, Any]) -> None:
        """``on_row`` with the summary's lock already held: the history store's
        ``on_commit`` when the summary shares the store's lock (``Summary(lock=store.lock)``,
        as a run's does)."""
        self._last.update(row)
        if self._aggregating:
            self.defs.update(row)
        if not self._save_scheduled and self.path is not None:
            self._save_scheduled = True
            get_flusher().schedule(
                ("summary", id(self)), self._clock() + SUMMARY_SAVE_INTERVAL_S, self._save_due
            )
        store = self._store
        if store is not None and not self._aggregating and self._save_scheduled:
            # until the save is due: only the update above happens for a row
            store.on_commit = self._last.update

    def define(self, name: str, **options: Any) -> MetricDef:
        """Record one ``define_metric`` and save it (see
        :meth:`expr_tracker.runs.Run.define_metric`)."""
        with self._lock:
            d = self.defs.define(name, **options)
            self._aggregating = self.defs.aggregating
            self._full_hook_locked()
        self.save()
        return d

    def _full_hook_locked(self) -> None:
        """The store's hook back to :meth:`on_row_locked` (under the lock: no row is being
        committed meanwhile)."""
        store = self._store
        if store is not None:
            store.on_commit = self.on_row_locked

    def _save_due(self) -> None:
        with self._lock:  # a row committed from here on schedules the next save
            self._save_scheduled = False
            self._full_hook_locked()
        self.save()

    def close(self) -> None:
        """Save now and stop the background saves."""
        get_flusher().cancel(("summary", id(self)))
        self.save()

    #: attributes of the object itself; any other attribute is a summary key (wandb's
    #: ``run.summary.best_acc = 0.9``, ``run.summary.loss``)
    _OWN_ATTRS = frozenset({"path", "defs", "on_assign"})

    def __getattr__(self, key: str) -> Any:  # only reached when no attribute is found
        if key.startswith("_") or key in self._OWN_ATTRS:
            raise AttributeError(key)
        try:
            return self[key]
        except KeyError:
            raise AttributeError(f"the summary has no key {key!r}") from None

    def __setattr__(self, key: str, value: Any) -> None:
        if key.startswith("_") or key in self._OWN_ATTRS or hasattr(type(self), key):
            object.__setattr__(self, key, value)
        else:
            self.update({key: value})

    def __getitem__(self, key: str) -> Any:
        if key in self._assigned:
            return self._assigned[key]
        if key in _META:
            raise KeyError(key)
        if self.defs.aggregating or self.defs.definitions():
            return self.to_dict()[key]  # as saved: aggregations, `none` metrics left out
        return self._last[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.update({key: value})

    def update(self, other: Any = (), /, **kwargs: Any) -> None:
        """Assign several keys (they win over logged values); one ``"summary"`` event.

        Raises:
            ForkedRunError: in a forked child that inherited the run (reads work there).
        """
        self._check_not_forked()
        changes = {str(k): normalize_value(v) for k, v in dict(other, **kwargs).items()}
        if not changes:
            return
        with self._lock:
            self._assigned.update(changes)
        hook = self.on_assign
        if hook is not None:
            hook(changes)

    def __delitem__(self, key: str) -> None:
        self._check_not_forked()
        with self._lock:
            found = self._assigned.pop(key, _MISSING) is not _MISSING
            found = self._last.pop(key, _MISSING) is not _MISSING or found
        if not found:
            raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())

    def _check_not_forked(self) -> None:
        if self._fork_gen != fork_generation():
            from expr_tracker.errors import ForkedRunError

            raise ForkedRunError(FORK_MESSAGE)

    def to_dict(self) -> dict[str, Any]:
        """The summary: last values of the logged keys (defined metrics as their
        aggregations, ``none`` metrics left out), then the user's assignments, which win.
        No ``_step``/``_time`` (see :meth:`saved`)."""
        out = self.saved()
        for key in _META:
            if key not in self._assigned:
                out.pop(key, None)
        return out

    def saved(self) -> dict[str, Any]:
        """What ``summary.json`` holds: :meth:`to_dict` plus the ``_step`` and ``_time`` of
        the last row seen (a resume catches up from there)."""
        with self._lock:
            return {**self.defs.apply(self._last), **self._assigned}

    def __repr__(self) -> str:
        return f"Summary({self.to_dict()!r})"

    def save(self) -> None:
        if self.path is None:
            return
        try:
            atomic_write(self.path, dumps_pretty(self.saved()))
            if self._defs_path is not None and (self.defs.definitions() or self.defs.state):
                with self._lock:
                    defs = dumps_pretty(self.defs.to_json())
                atomic_write(self._defs_path, defs)
            self._failed = False
        except OSError as exc:
            if not self._failed:  # once per outage, not every 2 s
                self._failed = True
                log.warning(
                    "expr_tracker: cannot write %s (%s); retried in the background",
                    self.path,
                    exc,
                )
