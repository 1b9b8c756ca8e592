"""Shaping query results: column selection, then ``dict``/``dicts``/``pandas``/``polars``.

``output_type="dict"``, ``"dicts"``, ``"records"`` and ``"list"`` are the same thing — a
list of row dicts, oldest first — because a "dict of columns" would silently lose the row
structure that patch lines and sparse metrics rely on; ask for ``"pandas"`` (``"pd"``) or
``"polars"`` (``"pl"``) when columns are wanted. Names match exactly (``""`` is ``"dict"``).
pandas and polars are imported only when asked for; a missing one raises ``ImportError``
naming the extra to install.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from expr_tracker._warn import Warner

#: accepted ``output_type`` names -> the shape: "dicts", "pandas" or "polars"
OUTPUT_TYPE_NAMES: dict[str, str] = {
    "dict": "dicts",
    "dicts": "dicts",
    "records": "dicts",
    "list": "dicts",
    "pandas": "pandas",
    "pd": "pandas",
    "polars": "polars",
    "pl": "polars",
}
OUTPUT_TYPES = tuple(OUTPUT_TYPE_NAMES)

#: once-only memory for "this polars column became strings" (per metric name)
_FRAME_WARNER = Warner()
META = ("_step", "_time")


def check_output_type(
    output_type: str, names: dict[str, str] = OUTPUT_TYPE_NAMES, *, exact: bool = True
) -> str:
    """The shape ``output_type`` names in ``names`` (accepted name -> shape; default
    :data:`OUTPUT_TYPE_NAMES`, ``et.history``'s: ``"dicts"``, ``"pandas"`` or ``"polars"``).

    ``exact`` (``et.history``'s rule, docs/history.md "Arguments"): the name as written,
    no case folding, no blanks trimmed (``"DICT "`` is an error); ``""`` is the default,
    ``"dict"``. ``exact=False`` (``et.query``'s names): any case, blanks trimmed.

    Raises:
        ValueError: naming the value and every valid name.
    """
    shape = names.get(output_type) if isinstance(output_type, str) else None
    if shape is None and isinstance(output_type, str):
        if exact:
            if output_type == "":
                shape = names.get("dict")
        else:
            shape = names.get(output_type.strip().lower())
    if shape is None:
        valid = ", ".join(repr(n) for n in names)
        how = "exactly as written ('' is 'dict')" if exact else "any case"
        raise ValueError(f"output_type={output_type!r} is not valid: one of {valid} ({how})")
    return shape


def parse_columns(metrics: Any) -> list[str] | None:
    """``"a,b"`` or ``["a", "b"]`` -> ``["a", "b"]``; None stays None (every column).

    A string is split on commas (blank parts are ignored); any other iterable (a list, a
    tuple) must hold non-empty strings.

    Raises:
        TypeError: ``metrics`` is not a string or an iterable of strings (a number, a dict,
            bytes, a list holding a non-string).
        ValueError: a list holding an empty name.
    """
    if metrics is None:
        return None
    if isinstance(metrics, str):
        return [m.strip() for m in metrics.split(",") if m.strip()]
    valid = "a list of metric names (['loss', 'acc']) or a comma-separated string ('loss,acc')"
    if isinstance(metrics, (bytes, bytearray, Mapping)) or not isinstance(metrics, Iterable):
        raise TypeError(f"metrics={metrics!r} is not valid ({type(metrics).__name__}): {valid}")
    cols = list(metrics)
    for m in cols:
        if not isinstance(m, str):
            raise TypeError(
                f"metrics={metrics!r} is not valid: {m!r} ({type(m).__name__}) is not a "
                f"metric name; {valid}"
            )
        if not m:
            raise ValueError(f"metrics={metrics!r} is not valid: an empty name; {valid}")
    return cols


def unknown_columns(
    rows: list[dict[str, Any]], columns: list[str] | None
) -> list[tuple[str, list[str]]]:
    """The names in ``columns`` that appear in none of ``rows``, each with up to three
    close matches among the rows' metrics (:func:`difflib.get_close_matches`).

    Nothing is judged when there are no rows or no columns (returns ``[]``). Cheap when
    every name is present: the scan stops at the first row holding it.
    """
    if not rows or not columns:
        return []
    missing = [c for c in columns if not any(c in r for r in rows)]
    if not missing:
        return []
    known = columns_of(rows)
    import difflib  # only once a metric asked for is missing

    return [(c, difflib.get_close_matches(c, known, n=3, cutoff=0.6)) for c in missing]


def unknown_message(name: str, close: list[str], nrows: int) -> str:
    """The warning for a requested metric that is in none of the ``nrows`` rows read."""
    hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
    return f"metric {name!r} is in none of the {nrows} step(s) read{hint}"


def columns_of(rows: Iterable[dict[str, Any]]) -> list[str]:
    """Metric names (no ``_step``/``_time``) in order of first appearance."""
    seen: dict[str, None] = {}
    for r in rows:
        for k in r:
            if k not in seen and k not in META:
                seen[k] = None
    return list(seen)


def shape(
    rows: list[dict[str, Any]],
    columns: list[str] | None = None,
    *,
    include_meta: bool = True,
    fill_missing: bool = False,
    dropna: bool = False,
) -> list[dict[str, Any]]:
    """Select columns of row dicts (the list and the dicts may be modified and reused).

    A selected row holds the metrics in the order asked for, then ``_step``/``_time`` — last,
    like the rows as written and as returned without a selection.

    Args:
        columns: metric names to keep (None: all of them).
        include_meta: keep ``_step``/``_time``.
        fill_missing: a selected metric absent from a row becomes None.
        dropna: drop rows in which every selected metric is absent or None (NaN is a value).
    """
    if columns is None and include_meta and not fill_missing and not dropna:
        return rows
    wanted = columns_of(rows) if columns is None else columns
    out = []
    for r in rows:
        picked: dict[str, Any] = {}
        present = False
        for k in wanted:
            if k in r:
                v = r[k]
                picked[k] = v
                if v is not None:
                    present = True
            elif fill_missing:
                picked[k] = None
        if dropna and not present:
            continue
        if include_meta:  # last, as in the rows written (and in a plain history())
            for k in META:
                if k in r:
                    picked[k] = r[k]
        out.append(picked)
    return out


def _frame_columns(
    rows: list[dict[str, Any]], columns: list[str] | None, include_meta: bool
) -> list[str]:
    cols = [k for k in META if include_meta and any(k in r for r in rows)]
    return cols + (columns if columns is not None else columns_of(rows))


def to_output(
    rows: list[dict[str, Any]],
    output_type: str = "dict",
    columns: list[str] | None = None,
    include_meta: bool = True,
) -> Any:
    """Rows (already shaped) as ``output_type``.

    ``dict``/``dicts``/``records``/``list``: the list itself. ``pandas``/``pd``: a
    ``pandas.DataFrame`` with
    ``_step``/``_time`` first, then the metrics in order of first appearance (or
    ``columns``); absent values are NaN/None. ``polars``/``pl``: a ``polars.DataFrame`` with the
    same columns (mixed int/float columns become float; other mixtures fall back to
    strings rather than failing, and a metric turned into strings that way is logged as a
    warning once per metric name, suggesting pandas).

    Raises:
        ValueError: unknown ``output_type``.
        ImportError: pandas/polars is not installed (the message names the extra).
    """
    output_type = check_output_type(output_type)
    if output_type == "dicts":
        return rows
    cols = _frame_columns(rows, columns, include_meta)
    if output_type == "pandas":
        try:
            import pandas as pd
        except ImportError:
            raise ImportError(
                "output_type='pandas' needs pandas, which is not installed: "
                "pip install 'expr-tracker[pandas]'"
            ) from None
        return pd.DataFrame.from_records(rows, columns=cols)
    try:
        import polars as pl
    except ImportError:
        raise ImportError(
            "output_type='polars' needs polars, which is not installed: "
            "pip install 'expr-tracker[polars]'"
        ) from None
    series = []
    for c in cols:
        vals = [r.get(c) for r in rows]
        try:
            col = pl.Series(c, vals, strict=False)
            if col.dtype == pl.Object:  # lists beside numbers: opaque to polars, so text
                raise TypeError
        except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
            col = pl.Series(c, [None if v is None else str(v) for v in vals], dtype=pl.String)
        series.append(col)
        if col.dtype == pl.String and any(v is not None and not isinstance(v, str) for v in vals):
            _FRAME_WARNER.warn(
                ("polars_strings", c),
                "expr_tracker: metric %r mixes value types polars cannot hold in one typed "
                "column (strings or lists beside numbers), so in this polars frame it is a "
                "String column and its numbers are text. Use output_type='pandas', which keeps each value "
                "as logged (an object column), or select the metric with metrics=[...] and "
                "convert it yourself (warned once per metric)",
                c,
            )
    return pl.DataFrame(series)
