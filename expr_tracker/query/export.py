"""Export runs' metrics to Parquet, CSV or JSONL, streaming with bounded memory (``et export``).

``export_runs(source, path, format=, layout=)`` reads every producer (stream, rank) of the
run(s) under ``source`` through the per-producer columnar cache (:func:`query.cache.refresh`:
Parquet parts covering every complete line of ``metrics[.S][.rankN].jsonl``) and writes:

- ``layout="long"``: one row per (producer, step, metric): ``project, run, stream, rank, step,
  time, metric, value, text``;
- ``layout="wide"``: one row per (producer, step): ``project, run, stream, rank, step, time``,
  then one column per metric, sorted by name (DOUBLE, or VARCHAR for a metric holding any
  string, list or dict value; ``metric:<name>`` for a metric named like an identity column).

The layouts are ``query/layouts.py``'s. Patch lines of one step (written after
``max_open_seconds``) are merged as every reader merges them: per (step, metric) the value of
the later line wins; the step's ``time`` is its last line's. Rows come per producer in step
order (file order within a step), read by ``query/stepreader.py``: memory stays bounded
whatever the run's size (record batches, each written out before the next is read; a file
whose lines are not in step order sorted by DuckDB under a memory limit).

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
from pathlib import Path
from typing import Any

from expr_tracker.query import layouts
from expr_tracker.query.placement import OutputAppeared, Placement
from expr_tracker.query.stepreader import StepReader, need_duckdb

FORMATS = ("parquet", "csv", "jsonl")
LAYOUTS = ("wide", "long")
#: Hive's name for a NULL partition value
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
# Hive's FileUtils.escapePathName set: control characters and these, as %XX (upper-case hex)
_HIVE_SPECIAL = set("\"#%'*/:=?\\\x7f{[]^")
_EXTENSIONS = {"parquet": "parquet", "csv": "csv", "jsonl": "jsonl"}
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


def _need_pyarrow() -> Any:
    from expr_tracker.query.views import INSTALL_HINT

    try:
        import pyarrow
    except ImportError as exc:  # pragma: no cover - the extra is installed in dev
        raise ImportError(f"et export needs pyarrow: {INSTALL_HINT}") from exc
    return pyarrow


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


# -- sinks ------------------------------------------------------------------------------------


def _named_failures(src: StepReader, batches: Iterator[Any], pa: Any) -> Iterator[Any]:
    """``batches``, with a failure of DuckDB or pyarrow while making them (a value of
    300 MB past the sort's memory limit, a part that cannot be decoded) turned into an
    :class:`ExportError` naming the run, instead of a traceback."""
    duckdb = need_duckdb()
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
    from expr_tracker.query.exportmedia import MEDIA_FOLDER, is_media_name

    for level, pattern in enumerate(("project=", "run=")):
        dirs = [path] if level == 0 else [d for d in path.iterdir() if d.name != MEDIA_FOLDER]
        for d in dirs:
            for entry in d.iterdir():
                if level == 0 and entry.name == MEDIA_FOLDER and not entry.is_symlink():
                    if entry.is_dir():  # the export's copied media (docs/media.md)
                        for f in entry.iterdir():
                            if f.is_symlink() or not f.is_file() or not is_media_name(f.name):
                                return f
                        continue
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
    media: bool = True,
    media_dir: str | os.PathLike[str] | None = None,
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
        media: copy the media files the rows reference (images, tables; docs/media.md
            "Exporting") into ``media/`` next to the output file, or ``PATH/_media/`` in a
            partitioned export; false leaves the references pointing into the runs.
        media_dir: the folder to copy them to instead; the references are rewritten to
            its path relative to the output's folder (partitioned: to ``PATH``).

    A producer whose metrics cannot be read (permissions, not a regular file, outside its
    run directory) is left out, named in one logged warning and in ``skipped``; lines that
    cannot be read are left out and counted there too. A temporary ``.PATH.*.partial`` of
    an earlier export on this host that was killed is removed.

    Returns:
        ``{"path", "format", "layout", "partitioned", "runs", "producers", "rows", "files",
        "bytes", "columns", "seconds", "skipped"}``: rows written (all files), output
        bytes, the column names (wide: with the metric columns), wall seconds,
        ``skipped``: ``{"run", "stream", "rank", "problem"}`` per producer not read whole,
        and ``media``: ``{"dir", "files", "bytes", "refused"}`` (None with ``media=False``).

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
    for name, flag in (("partition", partition), ("overwrite", overwrite), ("media", media)):
        if flag is not None and not isinstance(flag, bool):
            raise ExportError(f"{name}={flag!r} is not valid: use True or False")
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
        raise ExportError(f"cache_dir={cache_dir!r} is not valid: give a folder's path")
    if media_dir is not None and not isinstance(media_dir, (str, os.PathLike)):
        raise ExportError(f"media_dir={media_dir!r} is not valid: give a folder's path")
    if media_dir is not None and not media:
        raise ExportError("media_dir= (--media-dir) and media=False (--no-media) contradict")
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

    sources: list[StepReader] = []
    problems = Problems()
    for p in unlisted:  # a colleague's 0700 run: named in the warning, not left out silently
        problems.add(p, unlisted_problem(p))
    cdir = Path(cache_dir) if cache_dir else None
    for p in producers:
        cached, _ = cache_of(p, "metrics", cdir, problems)
        if cached is not None:
            sources.append(StepReader(producer=p, cached=cached, cache_dir=cdir))
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
        s.scan()
    stats: dict[str, list[bool]] = {}
    for s in sources:
        for m, (ht,) in s.stats.items():
            cur = stats.setdefault(m, [False])
            cur[0] = cur[0] or ht
    chosen = _select_metrics(stats, patterns, metrics)
    with_run = not partition
    if layout == "wide":
        columns = layouts.column_names(chosen)
        is_text = [stats[m][0] for m in chosen]
        schema = layouts.wide_schema(pa, with_run, columns, is_text)
    else:
        schema = layouts.long_schema(pa, with_run)
    place = Placement(out, overwrite=overwrite, replaceable=_check_replaceable)
    tmp = place.tmp
    copier = _media_copier(out, tmp, media, media_dir, partition, run_dirs) if media else None
    media_inside = copier is not None and copier.dest.parent == tmp  # renamed with the output
    rows = 0
    files = 0
    tmpdir = tempfile.mkdtemp(prefix="et-export-")
    try:

        def rows_of(s: StepReader) -> Iterator[Any]:
            tables = s.merged(chosen, tmpdir)
            if layout == "wide":
                rows = layouts.wide_rows(tables, s.producer, is_text, schema, with_run)
            else:
                rows = layouts.long_rows(tables, s.producer, chosen, schema, with_run)
            if copier is not None:
                rows = copier.batches(s.producer.run_dir, rows)
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
        if copier is not None:
            copier.copy()
        # the metrics' bytes: media copied inside a partitioned output are counted in "media"
        size = _tree_size(tmp) - (copier.bytes if media_inside and copier is not None else 0)
        try:
            place.commit()
        except OutputAppeared:
            raise ExportError(
                f"{out} appeared during the export; pass --overwrite to replace it"
            ) from None
    except OSError as exc:  # a full disk, a read-only folder: say where
        place.abort()
        if copier is not None:
            copier.abort()
        why = exc.strerror or str(exc)
        msg = f"export to {out} failed: {why}" + (
            f" ({exc.filename})" if exc.filename and exc.strerror else ""
        )
        raise (OSError(exc.errno, msg) if exc.errno else OSError(msg)) from exc
    except BaseException:
        place.abort()
        if copier is not None:
            copier.abort()
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
        "media": _media_summary(copier, out, media_inside) if copier is not None else None,
    }


def _media_summary(copier: Any, out: Path, inside: bool) -> dict[str, Any]:
    """The copier's summary, its folder named where it is once the output is in place
    (inside a partitioned output it was filled under the temporary name)."""
    summary = dict(copier.summary())
    if inside:
        summary["dir"] = str(out / copier.dest.name)
    return summary


def _media_copier(
    out: Path,
    tmp: Path,
    media: bool,
    media_dir: str | os.PathLike[str] | None,
    partition: bool,
    run_dirs: set[Path],
) -> Any:
    """The :class:`~expr_tracker.query.exportmedia.MediaCopier` of an export: where its
    files go and the path its references get (docs/media.md "Exporting")."""
    from expr_tracker.query.exportmedia import MEDIA_FOLDER, MediaCopier, prefix_for

    identity = {"project", "run", "stream", "rank", "step", "time", "metric"}
    base = out if partition else out.parent
    if media_dir is None:
        if partition:  # inside the folder renamed into place: atomic with it
            return MediaCopier(tmp / MEDIA_FOLDER, MEDIA_FOLDER + "/", identity)
        return MediaCopier(out.parent / "media", "media/", identity)
    dest = Path(media_dir)
    target = dest.resolve()
    for d in run_dirs:
        if target == d or d in target.parents:
            raise ExportError(
                f"--media-dir {dest}: it is inside the run directory {d} being exported; "
                "choose a folder outside it"
            )
    if partition and (target == out.resolve() or out.resolve() in target.parents):
        raise ExportError(
            f"--media-dir {dest}: it is inside the partitioned output {out}, which is replaced "
            f"when the export completes; leave --media-dir out ({MEDIA_FOLDER}/ goes there)"
        )
    return MediaCopier(dest, prefix_for(dest, base), identity)


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
