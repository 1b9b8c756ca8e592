"""Export runs' metrics to Parquet, CSV or JSONL, streaming with bounded memory (``et export``).

``export_runs(source, path, format=, layout=)`` reads every producer (stream, rank) of the
run(s) under ``source`` through the per-producer columnar cache (:func:`query.cache.refresh`:
Parquet parts covering every complete line of ``metrics[.S][.rankN].jsonl``) and writes:

- ``layout="long"``: one row per (producer, step, metric): ``project, run, stream, rank, step,
  time, metric, value, text``;
- ``layout="wide"``: one row per (producer, step): ``project, run, stream, rank, step, time``,
  then one column per metric, sorted by name. A metric whose non-null values are all numbers
  is a DOUBLE column; one holding any string, list or dict value is a VARCHAR column, its
  numbers written as in our JSONL files (``1.5``, ``NaN``, ``Infinity``). A JSON ``null``
  value is an empty (NULL) cell. A metric named like an identity column (``step``, ``time``,
  ...) gets the column ``metric:<name>``.

Patch lines of one step (written after ``max_open_seconds``) are merged as every reader
merges them: per (step, metric) the value of the later line wins; the step's ``time`` is its
last line's. Rows come per producer in step order (file order within a step).

Memory stays bounded whatever the run's size: the parts are read in record batches, the
rows of the last step of a batch wait for the next one, and each batch is written out before
the next is read. A file whose lines are not in step order (``step_policy="allow"``) is
sorted by DuckDB under a memory limit, spilling to a temporary directory.

A single run (``source`` is a run directory) goes to one file at ``path``; a folder of runs
(or ``partition=True``) goes to a Hive-style directory ``path/project=P/run=R/<producer>.<ext>``
whose partition values are percent-encoded as Hive does, and whose files hold every column
but ``project`` and ``run`` (they come from the path). Everything is written under a
temporary name beside ``path`` and renamed into place at the end (``query/placement.py``, as
``et query -o`` writes), so an interrupted export never leaves a complete-looking file.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import shutil
import tempfile
import time as _time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from expr_tracker.query.placement import OutputAppeared, Placement

FORMATS = ("parquet", "csv", "jsonl")
LAYOUTS = ("wide", "long")
#: identity and step columns of every export, in order
IDENTITY = ("project", "run", "stream", "rank")
KEY_COLUMNS = (*IDENTITY, "step", "time")
LONG_COLUMNS = (*KEY_COLUMNS, "metric", "value", "text")
#: rows of the source parts read at a time (bounds memory; each batch is written before the next)
BATCH_ROWS = 262_144
#: DuckDB's limits when it sorts an out-of-order file or writes CSV/JSONL
DUCKDB_MEMORY_LIMIT = "256MB"
DUCKDB_THREADS = 1
#: Hive's name for a NULL partition value
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
# Hive's FileUtils.escapePathName set: control characters and these, as %XX (upper-case hex)
_HIVE_SPECIAL = set("\"#%'*/:=?\\\x7f{[]^")
_EXTENSIONS = {"parquet": "parquet", "csv": "csv", "jsonl": "jsonl"}
_INSTALL = "pip install 'expr-tracker[query]'"
log = logging.getLogger("expr_tracker")


#: output suffix -> format, when no format is given
SUFFIX_FORMATS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
}


def format_for(path: str | os.PathLike[str]) -> str:
    """The format of ``path``'s suffix (:data:`SUFFIX_FORMATS`), else ``"parquet"``."""
    lower = os.fspath(path).lower()
    for suffix, name in SUFFIX_FORMATS.items():
        if lower.endswith(suffix):
            return name
    return "parquet"


class ExportError(ValueError):
    """Bad export arguments or a source that cannot be exported (message names the argument,
    the bad value and what would be valid)."""


# -- Hive partition names ---------------------------------------------------------------------


def hive_escape(value: str | None) -> str:
    """A partition value as Hive writes it in a path: ``%XX`` for control characters and
    ``"#%'*/:=?\\{[]^`` and DEL (upper-case hex of each UTF-8 byte); other characters,
    spaces and non-ASCII included, as they are. ``None`` is ``__HIVE_DEFAULT_PARTITION__``."""
    if value is None:
        return HIVE_NULL
    if value == "":
        raise ExportError("a partition value cannot be empty (project or run name '')")
    out = []
    for ch in value:
        if ch in _HIVE_SPECIAL or ord(ch) < 0x20:
            out.append("".join(f"%{b:02X}" for b in ch.encode("utf-8")))
        else:
            out.append(ch)
    text = "".join(out)
    if text in (".", ".."):  # not a usable folder name
        text = text.replace(".", "%2E")
    return text


def hive_unescape(text: str) -> str | None:
    """The inverse of :func:`hive_escape`."""
    if text == HIVE_NULL:
        return None
    from urllib.parse import unquote

    return unquote(text, encoding="utf-8", errors="strict")


# -- the plan ---------------------------------------------------------------------------------


@dataclass
class _Source:
    producer: Any  # query.catalog.Producer
    cached: Any  # query.cache.CachedSource
    cache_dir: Path | None = None
    in_order: bool = True  # lines and steps non-decreasing over the parts, in order
    stats: dict[str, list[bool]] = field(default_factory=dict)  # metric -> [has text]
    limit: int = -1  # the lines of the first refresh: a later one's rows past it are left out
    checked: Any = None  # the refresh whose parts were checked against their SHA-256

    def __post_init__(self) -> None:
        if self.limit < 0:
            self.limit = self.cached.lines


def _parts(src: _Source) -> Iterator[Any]:
    """The cache parts of one refresh, all opened before the first is read (a cache folder
    deleted after that cannot take them away), one producer at a time (a folder of many runs
    must not hold a file descriptor per part). A part that a later refresh replaces stays on
    disk for 10 minutes (query.cache), so the snapshot stays readable while we export it; a
    part deleted before it was opened (a cleaner deleting ``.et-cache``) is made again by a
    new refresh, whose rows past the first refresh's lines are left out (:func:`_limited`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from expr_tracker.query.cache import damaged
    from expr_tracker.query.tables import Problems
    from expr_tracker.query.views import cache_of

    files: list[Any] = []
    for _attempt in range(4):
        if src.cached.memory:
            files = [
                pq.ParquetFile(pa.BufferReader(b), read_dictionary=["metric"])
                for b in src.cached.memory
            ]
            break
        # an export reads every byte of the parts anyway: check them against the SHA-256
        # written with them first (a damaged middle keeps the size and the magic that a
        # refresh checks), and rebuild a cache that holds a damaged one
        bad = damaged(src.cached.parts) if src.checked is not src.cached else []
        src.checked = src.cached
        if bad:
            for part, why in bad:
                log.warning(
                    "expr_tracker: the query cache part %s could not be read (%s): rebuilt "
                    "from the JSONL",
                    part,
                    why,
                )
            cached, _ = cache_of(src.producer, "metrics", src.cache_dir, Problems())
            if cached is None:
                raise FileNotFoundError(f"{src.producer.metrics} vanished")
            src.cached = cached
            continue
        try:
            for path in src.cached.parts:
                files.append(pq.ParquetFile(str(path), read_dictionary=["metric"]))
            break
        except FileNotFoundError:
            for f in files:
                f.close()
            files = []
            cached, _ = cache_of(src.producer, "metrics", src.cache_dir, Problems())
            if cached is None:
                raise
            src.cached = cached
    else:
        raise OSError(f"the query cache of {src.producer.metrics} kept vanishing")
    try:
        yield from files
    finally:
        for f in files:
            f.close()


def _limited(src: _Source, batch: Any, pc: Any) -> Any:
    """``batch`` without rows of lines the first refresh did not cover."""
    if src.cached.lines <= src.limit:
        return batch
    return batch.filter(pc.less(batch.column("line"), src.limit))


def _need_pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError as exc:  # pragma: no cover - the extra is installed in dev
        raise ImportError(f"et export needs pyarrow: {_INSTALL}") from exc
    return pyarrow


def _need_duckdb() -> Any:
    try:
        import duckdb
    except ImportError as exc:  # pragma: no cover
        raise ImportError(f"et export needs duckdb: {_INSTALL}") from exc
    return duckdb


def _as_list(value: Any, name: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",")]
    else:
        ok = isinstance(value, (list, tuple, set, frozenset))
        ok = ok and all(isinstance(v, str) or (name == "rank" and _is_int(v)) for v in value)
        if not ok:
            what = "numbers" if name == "rank" else "names"
            raise ExportError(
                f"{name}={value!r} is not valid: give a string 'a,b' or a list of {what}"
            )
        items = [str(v) for v in value]
    items = [v for v in items if v]
    if not items:
        raise ExportError(f"{name}={value!r} selects nothing: give names separated by ','")
    return items


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _rank_filter(rank: Any) -> set[int] | None:
    if rank is None:
        return None
    if _is_int(rank):
        if rank < 0:
            raise ExportError(f"rank={rank!r}: ranks are 0 or more")
        return {rank}
    out = set()
    for item in _as_list(rank, "rank") or []:
        try:
            r = int(item)
        except (TypeError, ValueError):
            raise ExportError(
                f"rank={rank!r}: {item!r} is not a rank number; give N or N,M (e.g. 0,1)"
            ) from None
        if r < 0:
            raise ExportError(f"rank={rank!r}: ranks are 0 or more")
        out.add(r)
    return out


def _select_producers(producers: list[Any], stream: Any, rank: Any) -> list[Any]:
    streams = _as_list(stream, "stream")
    if streams is not None and "*" in streams:
        streams = None
    ranks = _rank_filter(rank)
    seen_streams = sorted({p.stream or "main" for p in producers})
    seen_ranks = sorted({p.rank for p in producers})
    if streams is not None:
        missing = [s for s in streams if s not in seen_streams]
        if missing:
            raise ExportError(
                f"stream={stream!r}: no stream {', '.join(map(repr, missing))} in the source; "
                f"streams there: {', '.join(seen_streams) or 'none'} ('main' is the default)"
            )
    if ranks is not None:
        missing_r = sorted(ranks - set(seen_ranks))
        if missing_r:
            raise ExportError(
                f"rank={rank!r}: no rank {', '.join(map(str, missing_r))} in the source; "
                f"ranks there: {', '.join(map(str, seen_ranks)) or 'none'}"
            )
    return [
        p
        for p in producers
        if (streams is None or (p.stream or "main") in streams)
        and (ranks is None or p.rank in ranks)
    ]


def _scan(src: _Source, pa: Any, pq: Any, pc: Any) -> None:
    """One pass over the cheap columns: is the file in (step, line) order, which metrics
    does it hold, and which of them hold text. The ``text`` column is read only in row
    groups whose statistics say it holds a value (most runs log numbers only)."""
    import numpy as np

    last_step = None
    last_line = None
    stats = src.stats
    for pf in _parts(src):
        md = pf.metadata
        text_i = pf.schema_arrow.get_field_index("text")
        for rg in range(md.num_row_groups):
            meta = md.row_group(rg)
            st = meta.column(text_i).statistics
            need_text = st is None or not st.has_null_count or st.null_count < meta.num_rows
            cols = ["step", "line", "metric", *(["text"] if need_text else [])]
            for b in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[rg], columns=cols):
                b = _limited(src, b, pc)
                if b.column("step").null_count:  # lines without an int _step: not rows
                    b = b.filter(pc.is_valid(b.column("step")))
                if b.num_rows == 0:
                    continue
                steps = b.column("step").to_numpy(zero_copy_only=False)
                lines = b.column("line").to_numpy(zero_copy_only=False)
                if src.in_order:
                    if last_step is not None and (steps[0] < last_step or lines[0] < last_line):
                        src.in_order = False
                    elif len(steps) > 1 and (
                        bool(np.any(np.diff(steps) < 0)) or bool(np.any(np.diff(lines) < 0))
                    ):
                        src.in_order = False
                    last_step, last_line = steps[-1], lines[-1]
                # per metric, through the dictionary (no string hashing): any text at all
                metric = b.column("metric")
                if not pa.types.is_dictionary(metric.type):
                    metric = pc.dictionary_encode(metric)
                idx = metric.indices.to_numpy(zero_copy_only=False)
                names = metric.dictionary.to_pylist()
                if need_text:
                    is_text = pc.fill_null(pc.not_equal(b.column("text"), "null"), False)
                    has_text = np.bincount(idx, weights=_bools(is_text), minlength=len(names)) > 0
                else:
                    has_text = np.zeros(len(names), dtype=bool)
                for j in np.unique(idx):
                    cur = stats.setdefault(names[j], [False])
                    cur[0] = cur[0] or bool(has_text[j])


def _bools(arr: Any) -> Any:
    """A null-free boolean Arrow array as a numpy float array (0.0/1.0)."""
    return arr.to_numpy(zero_copy_only=False).astype("float64")


def _select_metrics(
    all_metrics: Iterable[str], patterns: list[str] | None, given: Any
) -> list[str]:
    names = sorted(set(all_metrics))
    if patterns is None:
        return names
    chosen: set[str] = set()
    for pat in patterns:
        hits = [n for n in names if n == pat or fnmatch.fnmatchcase(n, pat)]
        if not hits:
            import difflib

            close = difflib.get_close_matches(pat, names, n=5)
            hint = f"; close: {', '.join(close)}" if close else ""
            raise ExportError(
                f"metrics={given!r}: {pat!r} matches no metric in the source{hint} "
                f"({len(names)} metrics there; patterns use * and ? as in train/*)"
            )
        chosen.update(hits)
    return sorted(chosen)


def _column_names(metrics: list[str]) -> list[str]:
    used = set(KEY_COLUMNS)
    out = []
    for m in metrics:
        name = m
        while name in used:
            name = f"metric:{name}"
        used.add(name)
        out.append(name)
    return out


# -- the row stream ---------------------------------------------------------------------------


def _part_batches(pf: Any, cols: list[str], src: _Source) -> Iterator[Any]:
    """The batches of one cache part, a row group at a time: one ``iter_batches`` over a
    whole file keeps allocating (pyarrow 26: +32 MB per ~20M rows read, freed only when the
    reader ends), which put a 10M-step export past its 500 MB budget."""
    import pyarrow.compute as pc

    for rg in range(pf.metadata.num_row_groups):
        for b in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[rg], columns=cols):
            yield _limited(src, b, pc)


def _ordered_batches(src: _Source, pa: Any, tmpdir: str) -> Iterator[Any]:
    """Record batches ``step, time, metric, value, text, line`` in (step, line) order."""
    cols = ["step", "time", "metric", "value", "text", "line"]
    if src.in_order:
        for pf in _parts(src):
            yield from _part_batches(pf, cols, src)
        return
    duckdb = _need_duckdb()
    con = duckdb.connect(
        config={
            "memory_limit": DUCKDB_MEMORY_LIMIT,
            "threads": DUCKDB_THREADS,
            "temp_directory": tmpdir,
            "preserve_insertion_order": True,
        }
    )
    try:
        # the parts reach DuckDB as an Arrow stream, not as paths: a run directory named
        # with [, * or ? would be a glob pattern to read_parquet
        opened = _parts(src)
        first = next(opened, None)
        if first is None:
            return
        schema = first.schema_arrow
        opened.close()

        def parts() -> Iterator[Any]:
            for pf in _parts(src):
                yield from _part_batches(pf, cols, src)

        con.register(
            "parts",
            pa.RecordBatchReader.from_batches(pa.schema([schema.field(c) for c in cols]), parts()),
        )
        rel = con.sql(
            f"SELECT {', '.join(cols)} FROM parts WHERE step IS NOT NULL ORDER BY step, line"
        )
        yield from rel.to_arrow_reader(BATCH_ROWS)
    finally:
        con.close()


def _merged_batches(
    src: _Source, pa: Any, pc: Any, metrics: list[str], tmpdir: str
) -> Iterator[Any]:
    """Batches of whole steps, patch lines merged (per (step, metric) the later line wins),
    unselected metrics dropped; each batch gets a ``m`` column (index into ``metrics``)."""
    import numpy as np

    value_set = pa.array(metrics, pa.string())
    need_merge = not src.cached.merged
    carry = None
    for b in _ordered_batches(src, pa, tmpdir):
        if b.column("step").null_count:  # a line without an int _step is no row (as et.history)
            b = b.filter(pc.is_valid(b.column("step")))
        if b.num_rows == 0:
            continue
        # the metric name -> its index in ``metrics`` (NULL: not selected), batch by batch
        # (each part's dictionary is its own)
        metric = b.column("metric")
        if pa.types.is_dictionary(metric.type):
            m = pc.index_in(metric.dictionary, value_set=value_set).take(metric.indices)
        else:
            m = pc.index_in(metric, value_set=value_set)
        i = b.schema.get_field_index("metric")
        t = pa.Table.from_batches([b]).remove_column(i).append_column("m", m)
        tbl = t if carry is None else pa.concat_tables([carry, t])
        # steps are sorted: the rows of the last step may continue in the next batch
        steps = tbl.column("step").to_numpy()
        cut = int(np.searchsorted(steps, steps[-1], side="left"))
        carry = tbl.slice(cut)
        done = tbl.slice(0, cut)
        if done.num_rows:
            out = _finish(done, pa, pc, value_set, need_merge)
            if out is not None:
                yield out
    if carry is not None and carry.num_rows:
        out = _finish(carry, pa, pc, value_set, need_merge)
        if out is not None:
            yield out


def _finish(tbl: Any, pa: Any, pc: Any, value_set: Any, need_merge: bool) -> Any:
    import numpy as np

    tbl = tbl.combine_chunks()
    if need_merge and tbl.num_rows:
        # one time per step: its last line's (later lines win, as for every key)
        steps = tbl.column("step").to_numpy()
        new = np.concatenate(([True], steps[1:] != steps[:-1]))
        gid = np.cumsum(new) - 1
        last = np.concatenate((np.flatnonzero(new)[1:] - 1, [len(steps) - 1]))
        i = tbl.schema.get_field_index("time")
        tbl = tbl.set_column(i, "time", tbl.column("time").take(pa.array(last[gid])))
    keep = pc.is_valid(tbl.column("m"))
    if not pc.all(keep).as_py():
        tbl = tbl.filter(keep)
    if tbl.num_rows == 0:
        return None
    if need_merge:
        steps = tbl.column("step").to_numpy()
        mi = tbl.column("m").to_numpy().astype(np.int64)
        n = len(value_set)
        # group index of each row's step (steps are sorted), then the last row per (step, m)
        gid = np.concatenate(([0], np.cumsum(steps[1:] != steps[:-1])))
        key = gid * n + mi
        _, first_rev = np.unique(key[::-1], return_index=True)
        winners = np.sort(len(key) - 1 - first_rev)
        if len(winners) != tbl.num_rows:
            tbl = tbl.take(pa.array(winners))
    return tbl


# -- layouts ----------------------------------------------------------------------------------


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


def _long_schema(pa: Any, with_run: bool) -> Any:
    return pa.schema(
        [
            *_key_fields(pa, with_run),
            pa.field("metric", pa.string()),
            pa.field("value", pa.float64()),
            pa.field("text", pa.string()),
        ]
    )


def _wide_schema(pa: Any, with_run: bool, columns: list[str], is_text: list[bool]) -> Any:
    return pa.schema(
        [
            *_key_fields(pa, with_run),
            *(
                pa.field(c, pa.string() if t else pa.float64())
                for c, t in zip(columns, is_text, strict=True)
            ),
        ]
    )


def _long_rows(
    src: _Source, pa: Any, pc: Any, metrics: list[str], schema: Any, with_run: bool, tmpdir: str
) -> Iterator[Any]:
    value_set = pa.array(metrics, pa.string())
    for tbl in _merged_batches(src, pa, pc, metrics, tmpdir):
        n = tbl.num_rows
        arrays = [
            *_identity_arrays(pa, src.producer, n, with_run),
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


def _wide_rows(
    src: _Source,
    pa: Any,
    pc: Any,
    metrics: list[str],
    is_text: list[bool],
    schema: Any,
    with_run: bool,
    tmpdir: str,
) -> Iterator[Any]:
    import numpy as np

    any_text = any(is_text)
    for tbl in _merged_batches(src, pa, pc, metrics, tmpdir):
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
            *_identity_arrays(pa, src.producer, n_groups, with_run),
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


# -- sinks ------------------------------------------------------------------------------------


def _named_failures(src: _Source, batches: Iterator[Any], pa: Any) -> Iterator[Any]:
    """``batches``, with a failure of DuckDB or pyarrow while making them (a value of
    300 MB past the sort's memory limit, a part that cannot be decoded) turned into an
    :class:`ExportError` naming the run, instead of a traceback."""
    duckdb = _need_duckdb()
    try:
        yield from batches
    except (duckdb.Error, pa.ArrowException, MemoryError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ExportError(
            f"{src.producer.run_id}: its rows could not be exported ({first}); export the "
            "other runs on their own (et export RUN_DIR)"
        ) from None


def _write(path: Path, fmt: str, schema: Any, batches: Iterator[Any]) -> int:
    """Write ``batches`` (all of ``schema``) to ``path``; returns the rows written."""
    rows = 0

    def counted() -> Iterator[Any]:
        nonlocal rows
        for b in batches:
            rows += b.num_rows
            yield b

    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        # no min/max statistics on the metric values: Parquet's leave NaN out, and DuckDB
        # (by default) takes them to mean a row group holds no NaN, so `WHERE isnan(v)` or
        # `WHERE v > 1e9` on the export would skip the row groups that hold NaN
        stats = [f.name for f in schema if f.name == "time" or not pa.types.is_floating(f.type)]
        with pq.ParquetWriter(str(path), schema, compression="zstd", write_statistics=stats) as w:
            for b in counted():
                if b.num_rows:
                    w.write_batch(b)
        return rows
    from expr_tracker.query.textrows import RowRenderer

    renderer = RowRenderer(schema, fmt)
    with open(path, "wb") as f:
        f.write(renderer.header())
        for b in counted():
            f.write(renderer.render(b))
    return rows


# -- files and renames ------------------------------------------------------------------------


def _foreign_entry(path: Path) -> Path | None:
    """The first entry of the directory ``path`` that is not part of an export's layout
    (``project=P/run=R/part*.<parquet|csv|jsonl>``), else None."""
    exts = tuple("." + e for e in _EXTENSIONS.values())
    for level, pattern in enumerate(("project=", "run=")):
        dirs = [path] if level == 0 else [d for d in path.iterdir()]
        for d in dirs:
            for entry in d.iterdir():
                if entry.is_symlink() or not entry.is_dir() or not entry.name.startswith(pattern):
                    return entry
                if level == 1:
                    for f in entry.iterdir():
                        name = f.name
                        if (
                            f.is_symlink()
                            or not f.is_file()
                            or not name.startswith("part")
                            or not name.endswith(exts)
                        ):
                            return f
    return None


def _check_replaceable(path: Path) -> None:
    """With --overwrite, an existing directory is replaced only when it holds an earlier
    export and nothing else: a folder of the user's own files is never deleted."""
    if path.is_symlink() or not path.is_dir():
        return  # a file (or a link: the link is replaced, never what it points to)
    try:
        foreign = _foreign_entry(path)
    except OSError as exc:
        raise ExportError(f"-o {path}: cannot check what the directory holds ({exc})") from None
    if foreign is not None:
        raise ExportError(
            f"-o {path} --overwrite: the directory holds {foreign}, which is not part of an "
            "earlier export (project=P/run=R/part*.parquet|csv|jsonl); --overwrite replaces only "
            "an earlier export: choose another -o, or move those files away"
        )


def producer_file_name(p: Any, fmt: str) -> str:
    """The file of one producer inside a run's partition: ``part[.S][.rankN].<ext>`` (never
    ``metrics*.jsonl``: an export kept under a runs folder must not look like a run)."""
    parts = ["part"]
    if p.stream:
        parts.append(p.stream)
    if p.rank:
        parts.append(f"rank{p.rank}")
    return ".".join(parts) + "." + _EXTENSIONS[fmt]


def partition_dir(p: Any) -> str:
    """``project=P/run=R`` for a producer (Hive-escaped values)."""
    return f"project={hive_escape(p.project)}/run={hive_escape(p.run_id)}"


# -- the public function ----------------------------------------------------------------------


def export_runs(
    source: str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    format: str | None = None,  # noqa: A002 - the CLI's name
    layout: str = "wide",
    metrics: str | Sequence[str] | None = None,
    stream: str | Sequence[str] | None = None,
    rank: int | str | Sequence[int] | None = None,
    partition: bool | None = None,
    overwrite: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Export the metrics of the run(s) under ``source`` to ``path``.

    Args:
        source: a run directory, or a folder of runs (searched as ``et runs`` does).
        path: the output file (one run, ``partition`` false) or directory (partitioned).
        format: default: from ``path``'s suffix (:data:`SUFFIX_FORMATS`), else parquet.
            ``"parquet"`` (zstd), ``"csv"`` (header; NaN as ``NaN``, ±inf as
            ``inf``/``-inf``; NULL as an empty field) or ``"jsonl"`` (one object per row;
            ``NaN``, ``Infinity``, ``-Infinity`` as in our own files).
        layout: ``"wide"`` (one row per step, one column per metric) or ``"long"`` (one row per
            step and metric).
        metrics: names or glob patterns (``"train/*"``), a list or ``"a,b"``; default all.
        stream: streams to export (``"main"`` is the default stream; ``"*"`` all); default all.
        rank: ranks to export (``0``, ``"0,1"``); default all.
        partition: write ``path/project=P/run=R/...``; default: true when ``source`` is a
            folder of runs, false when it is one run directory.
        overwrite: replace an existing ``path``.
        cache_dir: where the columnar cache lives (default: the cache's own default).

    A producer whose metrics cannot be read (permissions, not a regular file, outside its
    run directory) is left out, named in one logged warning and in ``skipped``; lines that
    cannot be read are left out and counted there too. A temporary ``.PATH.*.partial`` of
    an earlier export on this host that was killed is removed.

    Returns:
        ``{"path", "format", "layout", "partitioned", "runs", "producers", "rows", "files",
        "bytes", "columns", "seconds", "skipped"}``: rows written (all files), output
        bytes, the column names (wide: with the metric columns), wall seconds, and
        ``skipped``: ``{"run", "stream", "rank", "problem"}`` per producer not read whole.

    Raises:
        ExportError: a bad argument, a missing source, no metrics files (or none that can
            be read), a metric pattern that matches nothing, or ``path`` existing without
            ``overwrite``.
        ImportError: duckdb or pyarrow missing (``pip install 'expr-tracker[query]'``).
        OSError: reading the runs or writing ``path`` failed.
    """
    t0 = _time.perf_counter()
    if format is None:
        format = format_for(path)  # noqa: A001
    if format not in FORMATS:
        raise ExportError(f"format={format!r} is not valid: use one of {', '.join(FORMATS)}")
    if layout not in LAYOUTS:
        raise ExportError(f"layout={layout!r} is not valid: use one of {', '.join(LAYOUTS)}")
    for name, flag in (("partition", partition), ("overwrite", overwrite)):
        if flag is not None and not isinstance(flag, bool):
            raise ExportError(f"{name}={flag!r} is not valid: use True or False")
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
        raise ExportError(f"cache_dir={cache_dir!r} is not valid: give a folder's path")
    patterns = _as_list(metrics, "metrics")
    src_path = Path(source)
    if not src_path.exists():
        raise ExportError(
            f"source {str(src_path)!r} does not exist (give a run directory or a folder of runs)"
        )
    out = Path(path)
    if out.name in ("", ".."):
        raise ExportError(
            f"-o {os.fspath(path)!r} names no file or folder of its own (it is '.', '..' or '/'); "
            "give a new name, e.g. -o ./export"
        )
    if os.path.lexists(out) and not overwrite:
        raise ExportError(
            f"{out} exists; pass --overwrite (overwrite=True) to replace it, or choose another -o"
        )
    pa = _need_pyarrow()
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from expr_tracker.query.catalog import discover
    from expr_tracker.query.tables import Problems, unlisted_problem
    from expr_tracker.query.views import cache_of

    found = discover(src_path, include_unlisted=True)
    unlisted = [p for p in found if p.unlisted is not None]
    producers = [p for p in found if p.metrics is not None]
    if not producers:
        raise ExportError(f"no metrics files under {str(src_path)!r} (metrics[.S][.rankN].jsonl)")
    producers = _select_producers(producers, stream, rank)
    run_dirs = {p.run_dir.resolve() for p in producers}
    _check_output(out, run_dirs)
    if overwrite:
        _check_replaceable(out)
    one_run = src_path.resolve() in run_dirs and len(run_dirs) == 1
    if partition is None:
        partition = not one_run
    if not partition and len(run_dirs) > 1:
        raise ExportError(
            f"{str(src_path)!r} holds {len(run_dirs)} runs: they go to a partitioned directory "
            "(leave --partition on, or export one run directory)"
        )

    sources: list[_Source] = []
    problems = Problems()
    for p in unlisted:  # a colleague's 0700 run: named in the warning, not left out silently
        problems.add(p, unlisted_problem(p))
    cdir = Path(cache_dir) if cache_dir else None
    for p in producers:
        cached, _ = cache_of(p, "metrics", cdir, problems)
        if cached is not None:
            sources.append(_Source(producer=p, cached=cached, cache_dir=cdir))
    message = problems.message()
    if message:
        log.warning("%s", message.replace("left out of the answer", "left out of the export"))
    skipped = [
        {"run": p.run_id, "stream": p.stream, "rank": p.rank, "problem": problems.of(p)}
        for p in [*producers, *unlisted]
        if problems.of(p) is not None
    ]
    if not sources:
        raise ExportError(
            f"no metrics file under {str(src_path)!r} could be read: "
            + "; ".join(f"{s['run']}: {s['problem']}" for s in skipped)
        )
    for s in sources:
        _scan(s, pa, pq, pc)
    stats: dict[str, list[bool]] = {}
    for s in sources:
        for m, (ht,) in s.stats.items():
            cur = stats.setdefault(m, [False])
            cur[0] = cur[0] or ht
    chosen = _select_metrics(stats, patterns, metrics)
    with_run = not partition
    if layout == "wide":
        columns = _column_names(chosen)
        is_text = [stats[m][0] for m in chosen]
        schema = _wide_schema(pa, with_run, columns, is_text)
    else:
        schema = _long_schema(pa, with_run)
    place = Placement(out, overwrite=overwrite, replaceable=_check_replaceable)
    tmp = place.tmp
    rows = 0
    files = 0
    tmpdir = tempfile.mkdtemp(prefix="et-export-")
    try:

        def rows_of(s: _Source) -> Iterator[Any]:
            if layout == "wide":
                rows = _wide_rows(s, pa, pc, chosen, is_text, schema, with_run, tmpdir)
            else:
                rows = _long_rows(s, pa, pc, chosen, schema, with_run, tmpdir)
            return _named_failures(s, rows, pa)

        if partition:
            tmp.mkdir(parents=True)
            for s in sources:
                d = tmp / partition_dir(s.producer)
                d.mkdir(parents=True, exist_ok=True)
                rows += _write(
                    d / producer_file_name(s.producer, format), format, schema, rows_of(s)
                )
                files += 1
        else:
            out.parent.mkdir(parents=True, exist_ok=True)

            def chained() -> Iterator[Any]:
                for s in sources:
                    yield from rows_of(s)

            rows = _write(tmp, format, schema, chained())
            files = 1
        size = _tree_size(tmp)
        try:
            place.commit()
        except OutputAppeared:
            raise ExportError(
                f"{out} appeared during the export; pass --overwrite to replace it"
            ) from None
    except OSError as exc:  # a full disk, a read-only folder: say where
        place.abort()
        why = exc.strerror or str(exc)
        msg = f"export to {out} failed: {why}" + (
            f" ({exc.filename})" if exc.filename and exc.strerror else ""
        )
        raise (OSError(exc.errno, msg) if exc.errno else OSError(msg)) from exc
    except BaseException:
        place.abort()
        raise
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return {
        "path": str(out),
        "format": format,
        "layout": layout,
        "partitioned": bool(partition),
        "runs": len(run_dirs),
        "producers": len(sources),
        "rows": rows,
        "files": files,
        "bytes": size,
        "columns": schema.names,
        "seconds": _time.perf_counter() - t0,
        "skipped": skipped,
    }


def _check_output(out: Path, run_dirs: set[Path]) -> None:
    """Refuse an output that would replace or sit among the files it is made from: a run
    directory being exported, a folder holding one, or a file directly inside one (with
    --overwrite, ``-o RUN/metrics.jsonl`` would replace the run's own history)."""
    target = out.resolve()
    for d in run_dirs:
        if target == d or target in d.parents or target.parent == d:
            raise ExportError(
                f"-o {out}: the output would be written over or inside the run directory {d} "
                "being exported; choose a path outside it"
            )
    from expr_tracker.query.catalog import producers_of

    if target.parent.is_dir() and producers_of(target.parent):
        # another run's folder: --overwrite would replace its metrics.jsonl or config.json
        raise ExportError(
            f"-o {out}: the output would be written inside the run directory {target.parent}; "
            "choose a path outside it"
        )


def _tree_size(p: Path) -> int:
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
