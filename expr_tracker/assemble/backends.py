"""The mirrors of a run: wandb, trackio and backend objects, hooked into the ``Run``.

``build_backends(run, spec, stream, rank, warner, objects)`` turns the spec's ``backends``
(names and ``{type: ...}`` mappings; ``jsonl`` is the local files, always written) and the
objects handed to ``et.init(backends=[...])`` into one :class:`~expr_tracker.backends.mirror.Mirror`
each, on the ranks ``backend_on_rank`` names:

- the row sink ``mirror.put`` is appended to ``run.history.sinks`` (the fan-out point of the
  summary and the alerts, so span and plugin metrics arrive too; only committed rows);
- ``mirror.on_event`` subscribes to the run events (config, summary, define_metric, artifact);
- one late closer (after the data is on disk and ``run.json`` written) queues the final
  summary and ``finish(exit_code)`` on every mirror and waits for them within
  ``backend_finish_timeout``;
- ``et.info()["backends"]``: each mirror's counters.

Identity: a stream or a rank is a backend run of its own (no service merges two step axes),
named ``<run>``, ``<run>.<stream>``, ``<run>.rank<N>`` or ``<run>.<stream>.rank<N>`` and
grouped under the run name; its ``id`` is derived from project, run name, stream and rank,
so a resumed run continues the same backend run.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from expr_tracker._warn import Warner
from expr_tracker.runs import Run

if TYPE_CHECKING:
    from expr_tracker.backends.mirror import Mirror

__all__ = ["backend_identity", "build_backends", "mirrors_on_rank"]

#: built-in backend name -> (module, class); the class imports its library only in
#: ``init``, and the module itself is imported only by a run that mirrors (cold start)
_BUILTIN: dict[str, tuple[str, str]] = {
    "wandb": ("expr_tracker.backends.wandb_backend", "WandbBackend"),
    "trackio": ("expr_tracker.backends.trackio_backend", "TrackioBackend"),
}


def _builtin(kind: str) -> Any:
    """The class of built-in backend ``kind`` (a key of ``_BUILTIN``)."""
    module, name = _BUILTIN[kind]
    return getattr(importlib.import_module(module), name)


def mirrors_on_rank(on_rank: Any, rank: int) -> bool:
    """Whether ``rank`` mirrors under ``backend_on_rank`` (a rank, a list, or ``"all"``)."""
    if on_rank == "all":
        return True
    if isinstance(on_rank, list):
        return rank in on_rank
    return bool(rank == on_rank)


def backend_identity(run: Run, rank: int) -> dict[str, Any]:
    """The keywords a backend's ``init`` is handed (see backends/protocol.py)."""
    name = run.name
    backend_name = name
    if run.stream:
        backend_name += f".{run.stream}"
    if rank:
        backend_name += f".rank{rank}"
    key = "\0".join([run.project, name, run.stream or "", str(rank)])
    info = run.info_record or {}
    return {
        "project": run.project,
        "name": backend_name,
        "group": name,
        "config": dict(run.config or {}),
        "tags": list(run.spec.tags or []),
        "notes": run.spec.notes,
        "entity": run.spec.entity,
        "job_type": run.spec.job_type,
        "run_name": name,
        "stream": run.stream,
        "rank": rank,
        "run_dir": str(run.dir),
        "resumed": bool(info.get("resumed_at_step")),
        "id": _digest(key),
    }


def _digest(key: str) -> str:
    import hashlib  # here: a run without mirrors never loads OpenSSL

    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _available(module: str) -> bool:
    if module in sys.modules:
        return sys.modules[module] is not None
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def build_backends(
    run: Run,
    spec: Any,
    rank: int,
    warner: Warner,
    objects: Iterable[Any] = (),
) -> list[Mirror]:
    """Start a mirror per backend on this rank and hook them into ``run`` (see the module
    docstring). Returns the mirrors (none on a rank ``backend_on_rank`` leaves out).

    Raises:
        TypeError: an object in ``objects`` lacks ``init``/``log``/``finish``.
    """
    # one mirror per object: the same object listed twice (backends=[b, b]) would be
    # initialised twice and get every row twice
    objects = list({id(obj): obj for obj in objects}.values())
    entries: list[tuple[str, Any]] = []
    for entry in spec.backends:
        kind = entry if isinstance(entry, str) else entry["type"]
        if kind == "jsonl":
            continue  # the local files: always written
        kwargs = dict(spec.backend_kwargs.get(kind) or {})
        if isinstance(entry, dict):
            kwargs.update({k: v for k, v in entry.items() if k != "type"})
        if kind == "wandb" and spec.mode == "offline" and "mode" in spec.model_fields_set:
            # et.init(mode="offline") as a wandb user writes it: no network for the mirror
            kwargs.setdefault("mode", "offline")
        entries.append((kind, kwargs))
    if not (entries or objects):
        return []
    # imported only by a run that mirrors (cold start: docs/architecture.md)
    from expr_tracker.backends.mirror import Mirror, close_mirrors
    from expr_tracker.backends.protocol import adapt

    adapted = [adapt(obj) for obj in objects]  # TypeError before anything starts
    if not mirrors_on_rank(spec.backend_on_rank, rank):
        # the same code runs on every rank: et.info()["backends"] is there, with no mirror
        run.add_stats("backends", dict)
        return []
    info = backend_identity(run, rank)
    mirrors: list[Mirror] = []
    labels: set[str] = set()

    def label_for(base: str) -> str:
        label, n = base, 1
        while label in labels:
            n += 1
            label = f"{base}#{n}"
        labels.add(label)
        return label

    def make(backend: Any, label: str) -> Mirror:
        return Mirror(
            backend, dict(info), label=label, queue_size=spec.backend_queue_size, warner=warner
        )

    seen: dict[str, int] = {}
    for kind, kwargs in entries:
        label = label_for(kind)
        nth = seen[kind] = seen.get(kind, -1) + 1
        if not _available(kind):  # the library has the backend's name
            mirror = make(None, label)
            mirror.disable(f"{kind} is not installed; pip install 'expr-tracker[{kind}]'")
            mirrors.append(mirror)
            continue
        mirror = make(adapt(_builtin(kind)(kwargs)), label)
        if nth:  # a second wandb entry (another entity, say) is a backend run of its own
            key = f"{mirror.info['id']}\0{nth}"
            mirror.info["id"] = _digest(key)
        mirrors.append(mirror)
    for backend in adapted:
        mirrors.append(make(backend, label_for(backend.label)))

    live = [m for m in mirrors if m.alive is not False]
    if live:
        # imported here, not by a backend's init on the mirror thread: it registers a
        # threading exit hook when imported, which fails once the interpreter shuts down, and
        # a short script can end while a mirror is still importing its library (wandb imports
        # ThreadPoolExecutor); the run is then finished at exit and the mirror must start
        import concurrent.futures.thread  # noqa: F401
    run.mirrors = list(mirrors)  # run.backends
    for mirror in live:
        mirror.start()
        run.history.sinks.append(mirror.put)
        run.subscribe(mirror.on_event)
    timeout = float(spec.backend_finish_timeout)

    def close() -> None:
        code = run.exit_code or 0
        if code == 0 and (run.info_record or {}).get("status") == "failed":
            code = 1  # e.g. the history writer could not be closed
        summary = {k: v for k, v in run.summary.to_dict().items() if not k.startswith("_")}
        close_mirrors(live, code, timeout, summary)  # Ctrl-C/SIGTERM end the wait

    run.add_closer("backends", close, late=True)
    run.add_stats("backends", lambda: {m.label: m.stats() for m in mirrors})
    return mirrors
