"""The span side of a run: the recorder, its span-file writer, plugins and print target.

:func:`build_recorder` takes plain values and hands back the recorder (its ``close`` and
``stats`` are the run's closer and stats section); :func:`build_spans` hooks it into the
run and makes it the active recorder.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from expr_tracker._warn import Warner
from expr_tracker.runs import Run


def build_recorder(
    *,
    store: Any,
    spec: Any,
    run_dir: Any,
    stream: str | None,
    file_rank: int,
    rank: int,
    host: str | None = None,
    warner: Any = None,
) -> Any:
    """A ``SpanRecorder`` from the ``spans`` spec section, feeding ``store``.

    Creates the span-file writer (``spans[.S][.rankN].jsonl`` on the shared background
    flusher) unless ``spec.enabled`` is False; the recorder owns it (``close`` drains it).
    Raises ``ValueError`` for an unknown plugin type or print target.
    """
    from expr_tracker.history.paths import file_name
    from expr_tracker.history.writer import JsonlWriter
    from expr_tracker.spans.recorder import SpanRecorder, resolve_plugins, resolve_print

    plugins = resolve_plugins(spec.plugins)
    print_fn = resolve_print(spec.print)
    writer = None
    if spec.enabled:
        b = spec.buffer
        writer = JsonlWriter(
            Path(run_dir) / file_name("spans", stream, file_rank),
            buffer_size=b.size,
            interval=b.interval,
            max_seconds=b.max_seconds,
            max_pending_records=b.max_pending_records,
            max_pending_bytes=int(spec.max_pending_bytes),
            async_write=spec.async_write,
            lock=False,  # the metrics writer's lock already guards this producer
            warner=warner,
        )
    return SpanRecorder(
        store,
        writer,
        metrics=spec.metrics,
        count=spec.count,
        print_fn=print_fn,
        plugins=plugins,
        max_record_bytes=int(spec.max_record_bytes),
        max_pending_bytes=int(spec.max_pending_bytes),
        identity={"pid": os.getpid(), "host": host, "stream": stream, "rank": rank},
        owns_writer=writer is not None,
        warner=warner,
    )


def build_spans(
    run: Run,
    spec: Any,
    run_dir: Path,
    stream: str | None,
    file_rank: int,
    rank: int,
    warner: Warner,
    *,
    activate: bool = True,
) -> None:
    """The span recorder and its writer (spans.jsonl), hooked into the run (closer
    ``spans``, stats section ``spans``, a history flush hook) and made the active recorder
    (not with ``activate=False``: an independent ``et.Run``, whose spans are not recorded)."""
    from expr_tracker.spans import core

    info = run.info_record
    rec = build_recorder(
        store=run.history,
        spec=spec.spans,
        run_dir=run_dir,
        stream=stream,
        file_rank=file_rank,
        rank=rank,
        host=info.get("host") if isinstance(info, dict) else None,
        warner=warner,
    )
    run.add_closer("spans", rec.close)
    run.add_stats("spans", rec.stats)
    if activate:
        core.set_active_recorder(rec)
    run.spans = rec
    run.history.flush_hooks.append(rec.flush)
