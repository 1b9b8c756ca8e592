"""The two layouts of ``et export``: what a producer's merged steps become.

- long: one row per (producer, step, metric): ``project, run, stream, rank, step, time,
  metric, value, text`` (:func:`long_schema`, :func:`long_rows`);
- wide: one row per (producer, step): ``project, run, stream, rank, step, time``, then one
  column per metric, sorted by name (:func:`wide_schema`, :func:`wide_rows`). A metric whose
  non-null values are all numbers is a DOUBLE column; one holding any string, list or dict
  value is a VARCHAR column, its numbers written as in our JSONL files (``1.5``, ``NaN``,
  ``Infinity``). A JSON ``null`` value is an empty (NULL) cell. A metric named like an
  identity column (``step``, ``time``, ...) gets the column ``metric:<name>``
  (:func:`column_names`).

``project`` and ``run`` are left out (``with_run`` false) in a partitioned export, whose
folders name them. The input is what :meth:`expr_tracker.query.stepreader.StepReader.merged`
yields: tables of whole steps, patch lines merged, with the metric's index ``m``; the
output, Arrow record batches of the schema.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

__all__ = [
    "IDENTITY",
    "KEY_COLUMNS",
    "LONG_COLUMNS",
    "column_names",
    "long_rows",
    "long_schema",
    "wide_rows",
    "wide_schema",
]

#: identity and step columns of every export, in order
IDENTITY = ("project", "run", "stream", "rank")
KEY_COLUMNS = (*IDENTITY, "step", "time")
LONG_COLUMNS = (*KEY_COLUMNS, "metric", "value", "text")


def column_names(metrics: list[str]) -> list[str]:
    """The wide layout's column of each metric: its name, or ``metric:<name>`` when an
    identity column (or another metric's column) has it."""
    used = set(KEY_COLUMNS)
    out = []
    for m in metrics:
        name = m
        while name in used:
            name = f"metric:{name}"
        used.add(name)
        out.append(name)
    return out


def _identity_arrays(pa: Any, p: Any, n: int, with_run: bool) -> list[Any]:
    arrays = []
    if with_run:
        arrays.append(pa.repeat(pa.scalar(p.project, pa.string()), n))
        arrays.append(pa.repeat(pa.scalar(p.run_id, pa.string()), n))
    arrays.append(pa.repeat(pa.scalar(p.stream, pa.string()), n))
    arrays.append(pa.repeat(pa.scalar(p.rank, pa.int64()), n))
    return arrays


def _key_fields(pa: Any, with_run: bool) -> list[Any]:
    f = []
    if with_run:
        f += [pa.field("project", pa.string()), pa.field("run", pa.string())]
    f += [
        pa.field("stream", pa.string()),
        pa.field("rank", pa.int64()),
        pa.field("step", pa.int64()),
        pa.field("time", pa.float64()),
    ]
    return f


def long_schema(pa: Any, with_run: bool) -> Any:
    """The long layout's schema (``project`` and ``run`` only ``with_run``)."""
    return pa.schema(
        [
            *_key_fields(pa, with_run),
            pa.field("metric", pa.string()),
            pa.field("value", pa.float64()),
            pa.field("text", pa.string()),
        ]
    )


def wide_schema(pa: Any, with_run: bool, columns: list[str], is_text: list[bool]) -> Any:
    """The wide layout's schema: the key columns, then ``columns`` (:func:`column_names`),
    VARCHAR where ``is_text``, else DOUBLE."""
    return pa.schema(
        [
            *_key_fields(pa, with_run),
            *(
                pa.field(c, pa.string() if t else pa.float64())
                for c, t in zip(columns, is_text, strict=True)
            ),
        ]
    )


def long_rows(
    tables: Iterable[Any], producer: Any, metrics: list[str], schema: Any, with_run: bool
) -> Iterator[Any]:
    """The long layout of one producer's merged step tables (``StepReader.merged``): a row
    per (step, metric), ``metric`` named from its index into ``metrics``."""
    import pyarrow as pa

    value_set = pa.array(metrics, pa.string())
    for tbl in tables:
        n = tbl.num_rows
        arrays = [
            *_identity_arrays(pa, producer, n, with_run),
            tbl.column("step"),
            tbl.column("time"),
            value_set.take(tbl.column("m")),
            tbl.column("value"),
            tbl.column("text"),
        ]
        yield from pa.Table.from_arrays(arrays, schema=schema).to_batches()


def _json_number_text(pa: Any, pc: Any, values: Any) -> Any:
    """Numbers in a VARCHAR (mixed) column: the shortest text that reads back as the same
    double (``1.5``, ``3``, ``1e+20``), and ``NaN``, ``Infinity``, ``-Infinity`` as in our
    JSONL files."""
    s = pc.cast(values, pa.string())
    s = pc.if_else(pc.equal(s, "nan"), "NaN", s)
    s = pc.if_else(pc.equal(s, "inf"), "Infinity", s)
    return pc.if_else(pc.equal(s, "-inf"), "-Infinity", s)


def wide_rows(
    tables: Iterable[Any], producer: Any, is_text: list[bool], schema: Any, with_run: bool
) -> Iterator[Any]:
    """The wide layout of one producer's merged step tables (``StepReader.merged``): a row
    per step, a column per metric (``is_text``: per metric, a VARCHAR column; else DOUBLE).
    A JSON null is an empty cell; in a VARCHAR column a number is written as our JSONL
    files write it."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    any_text = any(is_text)
    for tbl in tables:
        steps = tbl.column("step").to_numpy()
        starts = np.flatnonzero(np.concatenate(([True], steps[1:] != steps[:-1])))
        ends = np.concatenate((starts[1:], [len(steps)])) - 1
        gid = np.cumsum(np.concatenate(([0], (steps[1:] != steps[:-1]).astype(np.int64))))
        n_groups = len(starts)
        mi = tbl.column("m").to_numpy()
        value = tbl.column("value")
        text = tbl.column("text")
        if any_text:
            # a JSON null is an empty cell; else the string, or the number as text
            json_null = pc.fill_null(pc.equal(text, "null"), False)
            cell = pc.if_else(
                json_null,
                pa.scalar(None, pa.string()),
                pc.coalesce(text, _json_number_text(pa, pc, value)),
            )
        rowpos = np.arange(len(steps))
        present = np.unique(mi)
        arrays = [
            *_identity_arrays(pa, producer, n_groups, with_run),
            pa.array(steps[starts]),
            # a step's time is its last line's (later lines win, as for every key)
            tbl.column("time").take(pa.array(ends)),
        ]
        nulls_f = None
        nulls_s = None
        for j, txt in enumerate(is_text):
            if j not in present:
                if txt:
                    nulls_s = nulls_s or pa.nulls(n_groups, pa.string())
                    arrays.append(nulls_s)
                else:
                    nulls_f = nulls_f or pa.nulls(n_groups, pa.float64())
                    arrays.append(nulls_f)
                continue
            mask = mi == j
            idx = np.full(n_groups, -1, dtype=np.int64)
            idx[gid[mask]] = rowpos[mask]
            take = pa.array(idx, mask=idx < 0)
            arrays.append((cell if txt else value).take(take))
        yield pa.RecordBatch.from_arrays(
            [a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a for a in arrays],
            schema=schema,
        )
