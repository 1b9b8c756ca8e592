"""The run page's Media section and the media files it shows (docs/media.md "In the
dashboard").

:func:`media_section` finds the media keys of a run's main producers in the columnar cache
(values that are media references: images, galleries, histograms, tables) with their
steps: images as references per step (the page asks each file by its name), histograms as
counts and edges per step, read from their ``.npz`` files (a heatmap of bins × steps and
the latest as bars; a file that cannot be read leaves its step out, named in ``error``),
and the latest table's content, read from its Parquet file (its first :data:`TABLE_ROWS`
rows). At most :data:`MAX_STEPS` steps per key are sent, spread evenly over the run and
always with the last one.

:func:`media_table` serves one page of a table larger than what the section sends, sorted
over the whole table by one column (the page asks it when a table has more than
:data:`TABLE_ROWS` rows).

:func:`media_file` serves one file: only a name ``media/<sha256>.<ext>`` of the run, read
through :func:`expr_tracker.media.read.read_media` (a regular file inside the run's
``media`` folder, no symbolic link out, its hash checked), with its Content-Type.
"""

from __future__ import annotations

from typing import Any

from expr_tracker.history.codec import decode_line
from expr_tracker.media.read import CONTENT_TYPES, load_histogram, load_table, read_media
from expr_tracker.ui.catalog import Catalog
from expr_tracker.ui.errors import BadRequest, NotFound, Unreadable, why
from expr_tracker.ui.parts import duckdb_cursor, metrics_sql

__all__ = ["MAX_STEPS", "TABLE_ROWS", "media_file", "media_section", "media_table"]

#: steps per media key sent to the page
MAX_STEPS = 200
#: rows of a table sent to the page
TABLE_ROWS = 1000
_SYSTEM = "system"


def _kind(value: Any) -> str | None:
    if isinstance(value, dict):
        k = value.get("_type")
        return k if k in ("image", "histogram", "table") else None
    if isinstance(value, list) and value and all(_kind(v) == "image" for v in value):
        return "image"
    return None


def _spread(items: list[Any], n: int) -> list[Any]:
    if len(items) <= n:
        return items
    step = (len(items) - 1) / (n - 1)
    return [items[round(i * step)] for i in range(n)]


def _run_dir(prods: list[Any]) -> Any:
    p = prods[0]
    return p.real_dir or p.run_dir


def media_section(catalog: Catalog, run_id: str) -> dict:
    """``{"media": [{"key", "kind", "steps", "items"} ...], "error"}``: per media key, its
    steps and, per step, the image references (a list: a gallery), the histogram
    (``values``, ``bins``) or, for tables, the reference (and ``table``: the latest one's
    ``columns`` and first rows)."""
    prods = [p for p in catalog.get(run_id) if p.stream != _SYSTEM]
    found: dict[str, dict[int, Any]] = {}
    errors: list[str] = []
    con = duckdb_cursor()
    try:
        for p in prods:
            try:
                sql = metrics_sql(con, catalog, p)
            except Unreadable as exc:
                errors.append(str(exc))
                continue
            if sql is None:
                continue
            rows = con.execute(
                f"SELECT metric, step, text FROM ({sql}) WHERE text LIKE '{{\"_type\":%' "
                'OR text LIKE \'[{"_type":"image"%\' ORDER BY metric, step'
            ).fetchall()
            for metric, step, text in rows:
                try:
                    value = decode_line(text)
                except ValueError:
                    continue
                if _kind(value) is not None:
                    found.setdefault(metric, {})[int(step)] = value
    finally:
        con.close()
    out = []
    run_dir = _run_dir(catalog.get(run_id))
    for key in sorted(found):
        by_step = found[key]
        kinds = sorted(k for k in (_kind(v) for v in by_step.values()) if k is not None)
        kind = "image" if "image" in kinds else kinds[0]
        steps = _spread(sorted(s for s, v in by_step.items() if _kind(v) == kind), MAX_STEPS)
        items: list[Any] = []
        kept: list[int] = []
        bad = 0
        for s in steps:
            v = by_step[s]
            if kind == "image":
                refs = v if isinstance(v, list) else [v]
                items.append([_image_ref(r) for r in refs])
            elif kind == "histogram":
                try:
                    counts, edges = load_histogram(run_dir, v)
                except (OSError, ValueError) as exc:
                    if not bad:
                        msg = why(exc) if isinstance(exc, OSError) else str(exc)
                        errors.append(f"histogram {key!r} at step {s}: {msg}")
                    bad += 1
                    continue
                items.append({"values": counts.tolist(), "bins": edges.tolist()})
            else:
                items.append(_image_ref(v))
            kept.append(s)
        if bad > 1:
            errors.append(f"histogram {key!r}: {bad} steps unreadable in all")
        steps = kept
        entry: dict[str, Any] = {"key": key, "kind": kind, "steps": steps, "items": items}
        if kind == "table" and steps:
            try:
                entry["table"] = _table_page(
                    run_dir, by_step[steps[-1]], 0, TABLE_ROWS, None, False
                )
            except (OSError, ValueError) as exc:
                errors.append(f"table {key!r}: {why(exc) if isinstance(exc, OSError) else exc}")
        out.append(entry)
    return {"media": out, "error": "; ".join(errors) or None}


def _image_ref(ref: Any) -> dict[str, Any]:
    """The fields of a reference the page uses (strings and numbers only)."""
    if not isinstance(ref, dict):
        return {}
    keep = ("_type", "path", "width", "height", "caption", "nrows", "ncols", "format")
    return {k: ref[k] for k in keep if isinstance(ref.get(k), (str, int, float))}


def media_file(catalog: Catalog, run_id: str, path: str) -> tuple[bytes, str]:
    """The bytes and Content-Type of the run's media file ``path`` (``media/<sha256>.<ext>``).

    Raises:
        NotFound: no such run, or no such file.
        Unreadable: a name that is not a media name, or a file that is not a regular file
            inside the run's media folder, or whose content is not its hash.
    """
    prods = catalog.get(run_id)
    try:
        return read_media(_run_dir(prods), path)
    except FileNotFoundError:
        raise NotFound(f"no media file {path[:100]!r} in run {run_id!r}") from None
    except OSError as exc:
        raise Unreadable(f"{path[:100]!r}: {why(exc)}") from None
    except ValueError as exc:
        raise Unreadable(str(exc)) from None


def _sort_key(v: Any) -> tuple[int, Any]:
    """Numbers before strings before anything else, None last (as the page sorts)."""
    if v is None:
        return (3, 0)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return (0, v) if v == v else (3, 0)  # NaN with the missing
    if isinstance(v, (str, bool)):
        return (1, str(v))
    return (2, str(v))


def media_table(
    catalog: Catalog,
    run_id: str,
    path: str,
    offset: int = 0,
    limit: int = 25,
    sort: str | None = None,
    desc: bool = False,
) -> dict[str, Any]:
    """``{"columns", "data", "nrows", "offset"}``: rows ``offset`` .. ``offset + limit`` of
    the run's table file ``path``, sorted by column ``sort`` first when given (numbers,
    then text, missing last; ``desc`` reverses all but the missing).

    Raises:
        BadRequest: a negative offset, a limit outside 1..1000, or an unknown column.
        NotFound: no such run or file. Unreadable: not a table of the run's media folder.
    """
    if offset < 0 or not 1 <= limit <= TABLE_ROWS:
        raise BadRequest(f"offset must be >= 0 and limit in 1..{TABLE_ROWS}")
    run_dir = _run_dir(catalog.get(run_id))
    try:
        page = _table_page(run_dir, path, offset, limit, sort, desc)
    except BadRequest:
        raise
    except FileNotFoundError:
        raise NotFound(f"no media file {path[:100]!r} in run {run_id!r}") from None
    except OSError as exc:
        raise Unreadable(f"{path[:100]!r}: {why(exc)}") from None
    except (ValueError, ImportError) as exc:
        raise Unreadable(str(exc)) from None
    return {**page, "offset": offset}


def _decode_cell(text: Any) -> Any:
    return None if text is None else decode_line(text)


def _sorted_rows(rows: list[list[Any]], j: int, desc: bool) -> list[list[Any]]:
    """``rows`` by column ``j`` (:func:`_sort_key`; the missing last, in their order)."""
    present = [r for r in rows if _sort_key(r[j])[0] < 3]
    missing = [r for r in rows if _sort_key(r[j])[0] == 3]
    present.sort(key=lambda r: _sort_key(r[j]), reverse=desc)
    return present + missing


def _table_page(
    run_dir: Any, path: Any, offset: int, limit: int, sort: str | None, desc: bool
) -> dict[str, Any]:
    """``{"columns", "data", "nrows"}`` of one page. A Parquet table is sorted and cut with
    Arrow, only the page becoming Python values (a page of a 1,000,000-row table: ~0.3 s,
    was ~4 s turning every row into lists); a JSON column (mixed kinds, media cells) and an
    older ``.table.json`` are sorted as Python values by :func:`_sort_key`.

    Raises: what :func:`~expr_tracker.media.read.load_table` raises; BadRequest for an
    unknown ``sort`` column."""
    data, ctype = read_media(run_dir, path)
    if ctype != CONTENT_TYPES["parquet"]:
        t = load_table(run_dir, path, output_type="dict")
        columns = [str(c) for c in t["columns"]]
        rows = t["data"]
        if sort is not None:
            if sort not in columns:
                raise BadRequest(f"sort={sort[:80]!r} is not a column of the table")
            rows = _sorted_rows(rows, columns.index(sort), desc)
        return {"columns": columns, "data": rows[offset : offset + limit], "nrows": len(t["data"])}
    import pyarrow as pa
    import pyarrow.compute as pc

    from expr_tracker.media.parquet import decode_table

    try:
        table, json_cols = decode_table(data)
    except ValueError as exc:
        raise ValueError(f"{str(path)[:100]}: {exc}") from None
    columns = [str(c) for c in table.column_names]
    n = table.num_rows
    if sort is not None and sort not in columns:
        raise BadRequest(f"sort={sort[:80]!r} is not a column of the table")
    if sort is None:
        part = table.slice(offset, limit)
    elif sort in json_cols:
        cells = table.column(sort).to_pylist()
        key = [_decode_cell(c) for c in cells]
        order = _sorted_rows([[v, i] for i, v in enumerate(key)], 0, desc)
        part = table.take(pa.array([i for _, i in order[offset : offset + limit]], pa.int64()))
    else:
        col = table.column(sort)
        missing = pc.is_null(col, nan_is_null=True)
        present = pc.indices_nonzero(pc.invert(missing))
        kept = col.take(present).combine_chunks()
        order = pc.array_sort_indices(kept, order="descending" if desc else "ascending")
        idx = pa.chunked_array([present.take(order), pc.indices_nonzero(missing)])
        part = table.take(idx.slice(offset, limit))
    out = []
    for name, c in zip(columns, part.columns, strict=True):
        cells = c.to_pylist()
        out.append([_decode_cell(v) for v in cells] if name in json_cols else cells)
    return {"columns": columns, "data": [list(r) for r in zip(*out, strict=True)], "nrows": n}
