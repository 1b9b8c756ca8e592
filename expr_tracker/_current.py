"""The current run and the fork state: a leaf module (it imports nothing of the project).

``api`` sets :data:`run` when a run starts and clears it when the run finishes (under
``api._lock``); ``api``, the history package's live query (``et.history``) and ``et.alert``
(``alerts.delivery.direct``) read it, so none needs another to find the current run. The
functions api registers here (``new_run``, ``end_run``, ``check_stream``,
``standalone_dispatcher``) let a module below api call up without importing it; nothing
else is registered here (the process exit hooks are ``expr_tracker.process_exit``'s, which
``runs`` and the mirrors call directly).

:data:`fork_gen` is incremented in a child after each ``fork``: every run object remembers
the generation it was made in and raises ``ForkedRunError(FORK_MESSAGE)`` before touching a
lock in a child that inherited it.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

#: the current ``Run``, or None; read without a lock (one attribute load on the log() path)
run: Any = None

#: the alerts section given by ``et.configure_alert`` (merged over calls; replaced, never
#: mutated, by ``api.configure_alert``): read by ``et.init`` and by the run-less
#: ``et.alert`` dispatcher (``alerts.delivery.direct``), so neither needs ``api``
configured_alert: dict[str, Any] = {}

#: ``new_run(project, name, kwargs) -> Run``: builds an independent run (``et.Run(...)``);
#: set by api (spec resolved, then assemble/), so runs.py needs neither
new_run: Any = None

#: ``standalone_dispatcher() -> Dispatcher``: the process-wide dispatcher of a run-less
#: ``et.alert`` (spec resolved, then composed by ``assemble.delivery``); set by api, so
#: ``alerts.delivery.direct`` never resolves a spec nor imports the composition root
standalone_dispatcher: Any = None

#: ``end_run(run, exception)``: finish ``run`` and stop it being the current one (the end of
#: a ``with et.init(...)`` block); set by api
end_run: Any = None

#: ``check_stream(stream)``: raises the ``SpecError`` ``et.init`` gives for a stream name
#: it refuses (the spec's own check), so ``et.history(stream=...)`` says the same; set by
#: api (history needs no spec)
check_stream: Any = None

#: one process-wide order of span starts and accepted ``log()`` calls: a span takes its id
#: from it when it starts and the history store a mark at each ``log()`` it accepts, so
#: ``span.id < store mark`` says a ``log()`` reached the store while the span ran (which row
#: a span joins: docs/spans.md "Which row a span joins"). Never replaced (both hold its
#: ``__next__``).
sequence = itertools.count(1)

#: fork generation of this process: 0 in the process that imported the package
fork_gen = 0


def _after_fork_in_child() -> None:
    global fork_gen
    fork_gen += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def fork_generation() -> int:
    """Incremented in a child after each ``fork``: objects remember the one they were made in."""
    return fork_gen


FORK_MESSAGE = (
    "this process was forked from the one that started the run (a DataLoader worker or "
    "multiprocessing child?); an inherited run cannot be used here — it would write into the "
    "parent's files. Start the child's own run with et.init(..., stream='worker') (or log "
    "from the parent only)."
)
