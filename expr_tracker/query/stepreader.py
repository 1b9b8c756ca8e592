"""One producer's metric rows read from its columnar cache as record batches of whole steps,
patch lines merged (the reader of ``et export``).

A :class:`StepReader` holds one refresh of a producer's cache (:func:`query.cache.refresh`:
Parquet parts covering every complete line of ``metrics[.S][.rankN].jsonl``) and reads it
with bounded memory:

- :meth:`StepReader.scan` makes one pass over the cheap columns: are the lines in step
  order, which metrics are there, and which of them hold text (a string, list or dict);
- :meth:`StepReader.merged` yields batches of whole steps in step order (file order within
  a step), patch lines merged as every reader merges them: per (step, metric) the value of
  the later line wins, the step's ``time`` is its last line's. The rows of the last step of
  a batch wait for the next one, so a step split across two record batches is merged
  whole. A file whose lines are not in step order (``step_policy="allow"``) is sorted by
  DuckDB under a memory limit, spilling to a temporary directory.

The parts are checked against the SHA-256 written with them before they are read (a
damaged part is rebuilt from the JSONL, with a warning), and a part deleted under the
reader is made again by a new refresh, whose rows past the first refresh's lines are left
out: what is read is one snapshot of the file.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "BATCH_ROWS",
    "DUCKDB_MEMORY_LIMIT",
    "DUCKDB_THREADS",
    "StepReader",
    "need_duckdb",
]

#: rows of the source parts read at a time (bounds memory; each batch is written before the next)
BATCH_ROWS = 262_144
#: DuckDB's limits when it sorts an out-of-order file
DUCKDB_MEMORY_LIMIT = "256MB"
DUCKDB_THREADS = 1
log = logging.getLogger("expr_tracker")


def need_duckdb() -> Any:
    """``duckdb``, or ImportError naming the extra to install."""
    from expr_tracker.query.views import INSTALL_HINT

    try:
        import duckdb
    except ImportError as exc:  # pragma: no cover
        raise ImportError(f"et export needs duckdb: {INSTALL_HINT}") from exc
    return duckdb


@dataclass
class StepReader:
    """One producer's cache, read as whole steps (see the module doc)."""

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

    def parts(self) -> Generator[Any, None, None]:
        """The cache parts of one refresh (``pyarrow.parquet.ParquetFile``), all opened
        before the first is read (a cache folder deleted after that cannot take them away),
        one producer at a time (a folder of many runs must not hold a file descriptor per
        part). A part that a later refresh replaces stays on disk for 10 minutes
        (query.cache), so the snapshot stays readable while it is read; a part deleted
        before it was opened (a cleaner deleting ``.et-cache``) is made again by a new
        refresh, whose rows past the first refresh's lines are left out."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from expr_tracker.query.cache import damaged
        from expr_tracker.query.tables import Problems
        from expr_tracker.query.views import cache_of

        files: list[Any] = []
        for _attempt in range(4):
            if self.cached.memory:
                files = [
                    pq.ParquetFile(pa.BufferReader(b), read_dictionary=["metric"])
                    for b in self.cached.memory
                ]
                break
            # every byte of the parts is read anyway: check them against the SHA-256
            # written with them first (a damaged middle keeps the size and the magic that
            # a refresh checks), and rebuild a cache that holds a damaged one
            bad = damaged(self.cached.parts) if self.checked is not self.cached else []
            self.checked = self.cached
            if bad:
                for part, why in bad:
                    log.warning(
                        "expr_tracker: the query cache part %s could not be read (%s): "
                        "rebuilt from the JSONL",
                        part,
                        why,
                    )
                cached, _ = cache_of(self.producer, "metrics", self.cache_dir, Problems())
                if cached is None:
                    raise FileNotFoundError(f"{self.producer.metrics} vanished")
                self.cached = cached
                continue
            try:
                for path in self.cached.parts:
                    files.append(pq.ParquetFile(str(path), read_dictionary=["metric"]))
                break
            except FileNotFoundError:
                for f in files:
                    f.close()
                files = []
                cached, _ = cache_of(self.producer, "metrics", self.cache_dir, Problems())
                if cached is None:
                    raise
                self.cached = cached
        else:
            raise OSError(f"the query cache of {self.producer.metrics} kept vanishing")
        try:
            yield from files
        finally:
            for f in files:
                f.close()

    def _limited(self, batch: Any, pc: Any) -> Any:
        """``batch`` without rows of lines the first refresh did not cover."""
        if self.cached.lines <= self.limit:
            return batch
        return batch.filter(pc.less(batch.column("line"), self.limit))

    def scan(self) -> None:
        """One pass over the cheap columns: is the file in (step, line) order
        (:attr:`in_order`), which metrics does it hold, and which of them hold text
        (:attr:`stats`). The ``text`` column is read only in row groups whose statistics
        say it holds a value (most runs log numbers only)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        last_step = None
        last_line = None
        stats = self.stats
        for pf in self.parts():
            md = pf.metadata
            text_i = pf.schema_arrow.get_field_index("text")
            for rg in range(md.num_row_groups):
                meta = md.row_group(rg)
                st = meta.column(text_i).statistics
                need_text = st is None or not st.has_null_count or st.null_count < meta.num_rows
                cols = ["step", "line", "metric", *(["text"] if need_text else [])]
                for b in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[rg], columns=cols):
                    b = self._limited(b, pc)
                    if b.column("step").null_count:  # lines without an int _step: not rows
                        b = b.filter(pc.is_valid(b.column("step")))
                    if b.num_rows == 0:
                        continue
                    steps = b.column("step").to_numpy(zero_copy_only=False)
                    lines = b.column("line").to_numpy(zero_copy_only=False)
                    if self.in_order:
                        if last_step is not None and (steps[0] < last_step or lines[0] < last_line):
                            self.in_order = False
                        elif len(steps) > 1 and (
                            bool(np.any(np.diff(steps) < 0)) or bool(np.any(np.diff(lines) < 0))
                        ):
                            self.in_order = False
                        last_step, last_line = steps[-1], lines[-1]
                    # per metric, through the dictionary (no string hashing): any text at all
                    metric = b.column("metric")
                    if not pa.types.is_dictionary(metric.type):
                        metric = pc.dictionary_encode(metric)
                    idx = metric.indices.to_numpy(zero_copy_only=False)
                    names = metric.dictionary.to_pylist()
                    if need_text:
                        is_text = pc.fill_null(pc.not_equal(b.column("text"), "null"), False)
                        has_text = (
                            np.bincount(idx, weights=_bools(is_text), minlength=len(names)) > 0
                        )
                    else:
                        has_text = np.zeros(len(names), dtype=bool)
                    for j in np.unique(idx):
                        cur = stats.setdefault(names[j], [False])
                        cur[0] = cur[0] or bool(has_text[j])

    def _part_batches(self, pf: Any, cols: list[str]) -> Iterator[Any]:
        """The batches of one cache part, a row group at a time: one ``iter_batches`` over
        a whole file keeps allocating (pyarrow 26: +32 MB per ~20M rows read, freed only
        when the reader ends), which put a 10M-step export past its 500 MB budget."""
        import pyarrow.compute as pc

        for rg in range(pf.metadata.num_row_groups):
            for b in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[rg], columns=cols):
                yield self._limited(b, pc)

    def _ordered(self, tmpdir: str) -> Iterator[Any]:
        """Record batches ``step, time, metric, value, text, line`` in (step, line) order."""
        import pyarrow as pa

        cols = ["step", "time", "metric", "value", "text", "line"]
        if self.in_order:
            for pf in self.parts():
                yield from self._part_batches(pf, cols)
            return
        duckdb = need_duckdb()
        from expr_tracker.query import views

        con = duckdb.connect(
            config={
                "memory_limit": DUCKDB_MEMORY_LIMIT,
                "threads": DUCKDB_THREADS,
                "temp_directory": tmpdir,
                "preserve_insertion_order": True,
            }
        )
        views.quiet(con)
        try:
            # the parts reach DuckDB as an Arrow stream, not as paths: a run directory
            # named with [, * or ? would be a glob pattern to read_parquet
            opened = self.parts()
            first = next(opened, None)
            if first is None:
                return
            schema = first.schema_arrow
            opened.close()

            def parts() -> Iterator[Any]:
                for pf in self.parts():
                    yield from self._part_batches(pf, cols)

            con.register(
                "parts",
                pa.RecordBatchReader.from_batches(
                    pa.schema([schema.field(c) for c in cols]), parts()
                ),
            )
            rel = con.sql(
                f"SELECT {', '.join(cols)} FROM parts WHERE step IS NOT NULL ORDER BY step, line"
            )
            yield from rel.to_arrow_reader(BATCH_ROWS)
        finally:
            con.close()

    def merged(self, metrics: list[str], tmpdir: str) -> Iterator[Any]:
        """Tables of whole steps, patch lines merged (per (step, metric) the later line
        wins; a step's ``time`` is its last line's), the metrics not in ``metrics`` left
        out; each gets a ``m`` column (the metric's index into ``metrics``) in place of
        ``metric``: ``step, time, value, text, line, m``. ``tmpdir``: where DuckDB spills
        when it sorts an out-of-order file."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        value_set = pa.array(metrics, pa.string())
        need_merge = not self.cached.merged
        carry = None
        for b in self._ordered(tmpdir):
            if b.column("step").null_count:  # a line without an int _step is no row
                b = b.filter(pc.is_valid(b.column("step")))
            if b.num_rows == 0:
                continue
            # the metric name -> its index in ``metrics`` (NULL: not selected), batch by
            # batch (each part's dictionary is its own)
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


def _bools(arr: Any) -> Any:
    """A null-free boolean Arrow array as a numpy float array (0.0/1.0)."""
    return arr.to_numpy(zero_copy_only=False).astype("float64")


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
