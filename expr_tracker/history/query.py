"""``et.history()`` / ``read_history()``: plan a read, select steps and columns, shape them.

Planning (spec design.txt B.2, B.3):

=======================  ==================================  ============================
source                   no ``step_range``                   ``step_range=(a, b)``
=======================  ==================================  ============================
live ``HistoryStore``    ``store.tail(n)``: cache, then the   ``store.step_range(a, b)``:
                         file backwards for evicted rows      cache binary search + indexed
                                                              file read for older steps
run dir / metrics file   ``JsonlReader.tail(n)`` backwards   ``JsonlReader.read_range``
                         (``n`` None: the whole file)         via the sidecar index
=======================  ==================================  ============================

``n`` counts steps (the newest ``n``; None/-1 everything) and applies after ``step_range``.
Every result is a snapshot: new objects that later logging never changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from expr_tracker.history.frame import (
    OUTPUT_TYPES,
    check_output_type,
    parse_columns,
    shape,
    to_output,
)
from expr_tracker.history.paths import resolve_run_path
from expr_tracker.history.reader import JsonlReader
from expr_tracker.history.store import HistoryStore

__all__ = ["OUTPUT_TYPES", "parse_step_range", "query_history"]


def parse_step_range(step_range: Any) -> tuple[int | None, int | None] | None:
    """``(a, b)``, ``[a, b]``, ``range(a, b)`` or ``"a:b"`` -> ``(a, b)`` (either side None).

    Raises:
        ValueError: not one of those forms, or a side that is not an integer.
    """
    if step_range is None:
        return None
    if isinstance(step_range, range):
        if step_range.step != 1:
            raise ValueError("step_range: a range() with a step other than 1 is not supported")
        return step_range.start, step_range.stop
    try:
        if isinstance(step_range, str):
            a, sep, b = step_range.partition(":")
            if not sep:
                raise ValueError
            return (int(a) if a.strip() else None, int(b) if b.strip() else None)
        a, b = step_range
        return (None if a is None else int(a), None if b is None else int(b))
    except (TypeError, ValueError):
        raise ValueError(
            f"step_range={step_range!r} is not valid: give (start, end) with end exclusive, "
            "or 'start:end' (either side may be empty/None)"
        ) from None


def query_history(
    source: HistoryStore | str | Path,
    *,
    n: int | None = 50,
    output_type: str = "dict",
    metrics: Any = None,
    step_range: Any = None,
    include_meta: bool = True,
    include_open: bool = True,
    fill_missing: bool = False,
    dropna: bool = False,
    stream: str | None = None,
) -> Any:
    """Rows of a run as ``output_type``; see :func:`expr_tracker.history` for the arguments.

    ``source`` is a live store, a run directory (the file is chosen by
    :func:`resolve_run_path` with ``stream``) or a metrics file.

    Raises:
        ValueError: an unknown ``output_type`` or a malformed ``step_range``.
        FileNotFoundError: ``source`` names no run.
        ImportError: pandas/polars missing (the message names the extra).
    """
    check_output_type(output_type)
    if n is not None and n < 0:
        n = None
    bounds = parse_step_range(step_range)
    if isinstance(source, HistoryStore):
        if bounds is None:
            rows = source.tail(n, include_open=include_open)
        else:
            rows = source.step_range(bounds[0], bounds[1], include_open=include_open)
    else:
        reader = JsonlReader(resolve_run_path(source, stream=stream))
        if bounds is None:
            rows = reader.tail(n)
        else:
            rows = reader.read_range(bounds[0], bounds[1])
    if n is not None and len(rows) > n:
        rows = rows[-n:] if n else []
    cols = parse_columns(metrics)
    rows = shape(rows, cols, include_meta=include_meta, fill_missing=fill_missing, dropna=dropna)
    return to_output(rows, output_type, cols, include_meta)
