"""The run keeps the query cache of the files it writes (``history.query_cache``;
docs/query.md "Kept by the run").

A :class:`~expr_tracker.query.warmer.CacheWarmer` per file (the stream's metrics file and,
when spans are written, its spans file) is told each batch's size by the file's writer;
the late closer ``query cache`` extends each cache over the rest at finish, after
everything else (``run.json``, alert delivery, the last sync pass), waiting for the helper
only when the run ended ``finished`` (or ``pruned``), and the stats section
``query_cache`` says how far each got.
"""

from __future__ import annotations

from typing import Any

from expr_tracker import process_exit
from expr_tracker.runs import Run

__all__ = ["build_query_cache"]


def build_query_cache(run: Run, spec: Any) -> None:
    """Hook a cache warmer onto each JSONL writer of ``run`` when ``spec.history.query_cache``
    is on (the default)."""
    if not spec.history.query_cache:
        return
    from expr_tracker.query.warmer import CacheWarmer

    warmers: list[CacheWarmer] = []
    metrics = run.history.writer
    if metrics is not None:
        warmers.append(CacheWarmer(metrics.path, "metrics"))
        metrics.warming = warmers[-1]
    spans = getattr(run.spans, "writer", None)
    if spans is not None:
        warmers.append(CacheWarmer(spans.path, "spans"))
        spans.warming = warmers[-1]
    if not warmers:
        return

    def finish() -> None:
        # a run that ended failed or preempted (an exception, a Ctrl-C, a non-zero exit, a
        # SIGTERM) waits for no extension: the process ends as the error has it, and the
        # helper finishes what it was sent after this process is gone (it reads its input
        # to the end before it sees it close)
        wait = None if run.info_record.get("status") in ("finished", "pruned") else 0.0
        for w in warmers:
            w.finish(wait=wait, cut=process_exit.finish_wait_cut)

    run.add_closer("query cache", finish, late=True)
    run.add_stats("query_cache", lambda: {w.kind: w.stats() for w in warmers})
