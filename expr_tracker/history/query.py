"""``et.history()`` / ``read_history()``: plan a read, select steps and columns, shape them.

Planning (docs/history.md "Arguments", "Where the answer comes from"):

=======================  ==================================  ============================
source                   no ``step_range``                   ``step_range=(a, b)``
=======================  ==================================  ============================
live ``HistoryStore``    ``store.tail(n)``: cache, then the   ``store.step_range(a, b)``:
                         file backwards for evicted rows      cache binary search + indexed
                                                              file read for older steps
run dir / metrics file   ``JsonlReader.tail(n)`` backwards   ``JsonlReader.read_range``
                         (``n`` None: the whole file)         via the sidecar index
=======================  ==================================  ============================

``n`` counts steps (the newest ``n``; None or negative: everything) and applies after ``step_range``.
The default ``n`` is :data:`DEFAULT_N` (50, recognised by identity): with a ``step_range``
and no explicit ``n`` every step of the range is returned; an ``n`` passed explicitly (even
``50``) still picks the newest ``n`` steps of the range.
Every result is a snapshot: new objects that later logging never changes.
"""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Any

from expr_tracker import _current
from expr_tracker._warn import Warner
from expr_tracker.history.frame import (
    OUTPUT_TYPES,
    check_output_type,
    parse_columns,
    shape,
    to_output,
    unknown_columns,
    unknown_message,
)
from expr_tracker.history.metricdefs import index_column, index_frame, read_step_metrics
from expr_tracker.history.paths import resolve_run_path
from expr_tracker.history.reader import JsonlReader
from expr_tracker.history.store import HistoryStore

__all__ = [
    "DEFAULT_N",
    "OUTPUT_TYPES",
    "check_n",
    "parse_step_range",
    "query_history",
    "warn_unknown_metrics",
]

#: once-only memory for warnings of offline reads (a live store has its own ``warner``)
_OFFLINE_WARNER = Warner()


class _DefaultN(int):
    """The type of :data:`DEFAULT_N`: an ``int`` equal to 50 that is told apart by identity."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "50"


#: the default ``n`` of ``et.history`` (docs/history.md "Arguments": ``n=50``). It equals 50 and is
#: used as 50 without ``step_range``; with ``step_range`` (and no explicit ``n``) it means
#: every step of the range. ``query_history`` recognises it by identity (``n is DEFAULT_N``),
#: so an explicit ``n=50`` still cuts the range to its newest 50 steps.
DEFAULT_N: int = _DefaultN(50)


_RANGE_FORMS = (
    "give (start, end) with end exclusive, or 'start:end' (either side may be None/empty), "
    "with integer steps"
)


def refuse_stream(stream: Any) -> None:
    """Raise the ``SpecError`` ``et.init`` gives for a ``stream`` name it refuses (too long
    for a file name, a ``/``, a rank suffix): the spec's own check, registered by api in
    ``_current.check_stream``. None passes."""
    if stream is not None and _current.check_stream is not None:
        _current.check_stream(stream)


def check_n(n: Any) -> int | None:
    """``n`` as the number of steps to return: an int ``>= 0``, or None for every step.

    None and any negative ``n`` (``-1``, ``-5``) mean every step (docs/history.md
    "Arguments"). Integer-like objects (``numpy.int64``) are accepted; bools, floats and
    strings are not.

    Raises:
        TypeError: ``n`` is not an integer (or None).
    """
    if n is None:
        return None
    if isinstance(n, bool):
        v = None
    else:
        try:
            v = operator.index(n)
        except TypeError:
            v = None
    if v is None:
        raise TypeError(
            f"n={n!r} is not valid: n must be an integer >= 0 (the newest n steps), or "
            f"negative/None (every step), got {type(n).__name__}"
        )
    return None if v < 0 else v


def _range_side(side: Any, step_range: Any) -> int | None:
    if side is None:
        return None
    if not isinstance(side, bool):
        try:
            return operator.index(side)
        except TypeError:
            pass
    raise TypeError(
        f"step_range={step_range!r} is not valid: {side!r} is not an integer step; " + _RANGE_FORMS
    )


def parse_step_range(step_range: Any) -> tuple[int | None, int | None] | None:
    """``(a, b)``, ``[a, b]``, ``range(a, b)`` or ``"a:b"`` -> ``(a, b)`` (either side None).

    ``end`` is exclusive. A reversed or empty range (``end <= start``) is valid and selects
    no steps: the query returns an empty result.

    Raises:
        ValueError: a string that is not ``"a:b"`` with integer sides, a sequence that is
            not a pair, or a ``range`` with a step other than 1.
        TypeError: ``step_range`` is of another type, or a side of a pair is not an
            integer (a float, a bool, a string).
    """
    if step_range is None:
        return None
    if isinstance(step_range, range):
        if step_range.step != 1:
            raise ValueError(
                f"step_range={step_range!r} is not valid: a range() with a step other than 1 "
                "is not supported"
            )
        return step_range.start, step_range.stop
    if isinstance(step_range, str):
        a, sep, b = step_range.partition(":")
        try:
            if not sep or ":" in b:
                raise ValueError
            return (int(a) if a.strip() else None, int(b) if b.strip() else None)
        except ValueError:
            raise ValueError(f"step_range={step_range!r} is not valid: " + _RANGE_FORMS) from None
    if isinstance(step_range, (tuple, list)):
        if len(step_range) != 2:
            raise ValueError(
                f"step_range={step_range!r} is not valid: it has {len(step_range)} items, "
                "not 2; " + _RANGE_FORMS
            )
        return _range_side(step_range[0], step_range), _range_side(step_range[1], step_range)
    raise TypeError(
        f"step_range={step_range!r} is not valid ({type(step_range).__name__}): " + _RANGE_FORMS
    )


def warn_unknown_metrics(
    rows: list[dict[str, Any]], columns: list[str] | None, warner: Warner, scope: Any
) -> list[str]:
    """Warn once per requested metric that appears in none of ``rows`` (with suggestions).

    Rows are still returned for such a metric: in a live run it may appear later. Nothing
    is judged when no row was read. ``scope`` keys the once-only memory (a store's own
    ``warner`` needs none; an offline read passes its path). Returns the unknown names.
    """
    unknown = unknown_columns(rows, columns)
    for name, close in unknown:
        warner.warn(
            ("unknown_metric", scope, name),
            "expr_tracker: %s; the rows are returned without it (warned once per name)",
            unknown_message(name, close, len(rows)),
        )
    return [name for name, _ in unknown]


def query_history(
    source: HistoryStore | str | Path,
    *,
    n: int | None = DEFAULT_N,
    output_type: str = "dict",
    metrics: Any = None,
    step_range: Any = None,
    include_meta: bool = True,
    include_open: bool = True,
    fill_missing: bool = False,
    dropna: bool = False,
    stream: str | None = None,
    index: Any = None,
    step_metrics: Any = None,
) -> Any:
    """Rows of a run as ``output_type``; see :func:`expr_tracker.history` for the arguments.

    ``index``: a metric name to index a pandas frame by (a polars frame gets it as its
    first column), or True for the ``step_metric`` that ``define_metric`` recorded for
    the selected ``metrics``: looked up with ``step_metrics(name)`` (a live run's), else
    in ``metric_defs*.json`` beside the file read. The index column is read even when
    ``metrics`` does not list it.

    ``source`` is a live store, a run directory (the file is chosen by
    :func:`resolve_run_path` with ``stream``) or a metrics file.

    ``n`` left at :data:`DEFAULT_N` means 50 steps without ``step_range`` and every step of
    the range with it; any ``n`` given explicitly picks the newest ``n`` steps of the range.

    Every argument is checked before anything is read (:func:`check_n`,
    :func:`parse_step_range`, :func:`~expr_tracker.history.frame.parse_columns`). A
    ``metrics`` name found in no row read is kept (a live run may log it later) and logged
    as a warning once per name, with close matches.

    Raises:
        ValueError: an unknown ``output_type`` (matched exactly), a malformed
            ``step_range`` string or pair, an empty metric name; a ``stream`` name
            ``et.init`` refuses (its ``SpecError``).
        TypeError: ``n`` not an integer, ``step_range`` or ``metrics`` of the wrong type.
        FileNotFoundError: ``source`` names no run.
        ImportError: pandas/polars missing (the message names the extra).
    """
    check_output_type(output_type)
    refuse_stream(stream)
    bounds = parse_step_range(step_range)
    # the default n (not an explicit one) does not cut a step range: every step of it
    n = None if bounds is not None and n is DEFAULT_N else check_n(n)
    cols = parse_columns(metrics)
    index_name = asked = None
    if index is not None and index is not False:
        if step_metrics is None and index is True and not isinstance(source, HistoryStore):
            step_metrics = read_step_metrics(resolve_run_path(source, stream=stream))
        index_name = index_column(index, cols, step_metrics or (lambda name: None))
        if cols is not None and index_name is not None and index_name not in cols:
            asked, cols = cols, [*cols, index_name]
    if isinstance(source, HistoryStore):
        if bounds is None:
            rows = source.tail(n, include_open=include_open)
        else:
            rows = source.step_range(bounds[0], bounds[1], include_open=include_open)
        warner, scope = source.warner, None
    else:
        path = resolve_run_path(source, stream=stream)
        reader = JsonlReader(path)
        if bounds is None:
            rows = reader.tail(n)
        else:
            rows = reader.read_range(bounds[0], bounds[1])
        warner, scope = _OFFLINE_WARNER, str(path)
    if n is not None and len(rows) > n:
        rows = rows[-n:] if n else []
    if cols:
        warn_unknown_metrics(rows, cols, warner, scope)
    if dropna and asked:  # the index column added here does not keep a row
        rows = [r for r in rows if any(r.get(c) is not None for c in asked)]
    rows = shape(rows, cols, include_meta=include_meta, fill_missing=fill_missing, dropna=dropna)
    result = to_output(rows, output_type, cols, include_meta)
    return result if index_name is None else index_frame(result, index_name)
