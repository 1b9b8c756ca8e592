"""``et.history(...)``: the query over the current run (answered from memory), another
stream of it, or a run directory read offline.

The current run is read from :mod:`expr_tracker._current` (set by ``et.init``), so the
history package needs nothing above it; ``expr_tracker.api`` re-exports :func:`history`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from expr_tracker import _current
from expr_tracker._current import FORK_MESSAGE
from expr_tracker.errors import ForkedRunError, NoActiveRunError
from expr_tracker.history.paths import parse_metrics_name, resolve_run_path
from expr_tracker.history.query import DEFAULT_N, query_history, refuse_stream
from expr_tracker.history.store import HistoryStore


def no_run_error() -> NoActiveRunError:
    """The error raised when a verb needs the current run and none is active."""
    return NoActiveRunError(
        "no active run: call et.init(project=..., name=...) first (or pass run=DIR to read a "
        "finished run)"
    )


def current_run() -> Any:
    """The current run (a ``Run``).

    Raises:
        NoActiveRunError: no run is active.
        ForkedRunError: this is a forked child that inherited the run.
    """
    run = _current.run
    if run is None:
        raise no_run_error()
    if run.forked:
        raise ForkedRunError(FORK_MESSAGE)
    return run


def history(
    n: int | None = DEFAULT_N,
    *,
    output_type: str = "dict",
    metrics: Any = None,
    step_range: Any = None,
    include_meta: bool = True,
    include_open: bool = True,
    fill_missing: bool = False,
    dropna: bool = False,
    run: Any = None,
    stream: str | None = None,
    index: Any = None,
) -> Any:
    """Query a run's history (docs/history.md "Arguments").

    Args:
        n: the newest ``n`` steps (an int >= 0); None or any negative int (``-1``) for
            everything. The default
            (50) does not apply to ``step_range``: without an explicit ``n`` every step of
            the range is returned; an explicit ``n`` picks the newest ``n`` of the range.
        output_type: ``"dict"``/``"dicts"``/``"records"``/``"list"`` (a list of row
            dicts, one per step), ``"pandas"``/``"pd"`` (a ``pandas.DataFrame``),
            ``"polars"``/``"pl"`` (a ``polars.DataFrame``), matched exactly (``""`` is
            ``"dict"``; ``"Pandas"`` or ``"dict "`` is an error).
        metrics: column names (a list or a comma-separated string) to keep. A name found
            in none of the rows read is logged as a warning once, with close matches.
        step_range: ``(start, end)`` or ``"start:end"`` of integer steps, end exclusive,
            exact by step; either side may be None/empty. A reversed range (``end <=
            start``) selects nothing: the result is empty.
        include_meta: keep ``_step``/``_time``.
        include_open: include the uncommitted current step (live runs).
        fill_missing: absent keys become None.
        dropna: drop rows where every selected metric is missing.
        run: read a run directory or metrics file offline (no ``et.init`` needed).
        stream: which stream to read. Without ``run`` (or with a ``Run``): None is the
            run's own stream, answered from memory; another name reads that stream's
            file in the run's directory (with this process's rank suffix), as written so
            far by the process that logs it. With a ``run`` path: None is the main stream.
        index: index a pandas frame by this metric (a polars frame gets it as its first
            column); ``True``: by the ``step_metric`` that ``define_metric`` recorded for
            the selected ``metrics`` (``history(metrics=["val/loss"], index=True,
            output_type="pandas")`` is indexed by ``iter`` after
            ``define_metric("val/loss", step_metric="iter")``). The column is read even
            when ``metrics`` does not list it.

    Returns:
        Rows oldest first, as ``output_type``; a snapshot that later logging does not change.

    Raises:
        NoActiveRunError: no ``run`` given and no run active.
        FileNotFoundError: ``run`` names no run, or ``stream`` has no metrics file (yet).
        TypeError: ``n`` is not an integer, ``step_range``/``metrics`` of the wrong type.
        ValueError: ``index`` with a list output or naming no column read, ``index=True``
            without one shared step metric;
            a malformed ``step_range``, an ``output_type`` that is none of the names (the
            message lists them).
        SpecError: a ``stream`` name ``et.init`` refuses (the same error).
        ImportError: ``pandas``/``polars`` is missing (naming the extra to install).
    """
    refuse_stream(stream)  # the SpecError et.init gives for a name it refuses
    step_metrics = None
    if run is None or isinstance(getattr(run, "history", None), HistoryStore):  # a Run
        live = current_run() if run is None else run
        if stream is None or stream == live.stream:
            source: Any = live.history
            step_metrics = live.summary.defs.step_metric_of
        else:  # another stream of this run: its file (written by another process)
            source = _stream_file(live, stream)
    else:
        source = Path(run)
    return query_history(
        source,
        n=n,
        output_type=output_type,
        metrics=metrics,
        step_range=step_range,
        include_meta=include_meta,
        include_open=include_open,
        fill_missing=fill_missing,
        dropna=dropna,
        stream=stream,
        index=index,
        step_metrics=step_metrics,
    )


def _stream_file(run: Any, stream: str) -> Path:
    """The metrics file of ``stream`` beside a live run's own: same directory, same rank
    suffix as the run's file (``metrics.<stream>[.rankN].jsonl``).

    Raises ``ValueError`` for an invalid stream name and ``FileNotFoundError`` (listing the
    files that exist) when that stream has written nothing yet.
    """
    writer = run.history.writer
    parsed = parse_metrics_name(writer.path.name) if writer is not None else None
    rank = parsed[1] if parsed is not None else 0
    return resolve_run_path(run.dir, stream=stream, rank=rank)
