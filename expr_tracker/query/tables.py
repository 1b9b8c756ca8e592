"""The small files of every run as Arrow tables: the ``runs``, ``alerts`` and ``artifacts``
views of :mod:`expr_tracker.query.views`.

These files are small (one ``run*.json``, ``config*.json`` and ``summary*.json`` per producer,
an ``alerts*.jsonl`` line per rule transition or delivery, an ``artifacts*.jsonl`` line per
artifact logged or used), so they are read here in Python, every time, and never cached.

Values keep their IEEE meaning: NaN and ±inf stay floats in numeric columns and are written
as ``NaN``/``Infinity``/``-Infinity`` in JSON text columns (as our files write them; DuckDB's
JSON functions read those tokens). A value of the wrong type for its column (a hand-edited
file) becomes NULL there; the whole line stays in the ``record`` column (alerts, artifacts),
and the whole config and summary in the ``config`` and ``summary`` columns (runs).

Every file is untrusted input (docs/query.md "Security"): it is opened with
:mod:`expr_tracker.history.untrusted` (a regular file only, never blocking on a FIFO, inside
the run directory's real path as discovered), JSON is depth-limited, and one that cannot be
read is recorded in a :class:`Problems` (the ``runs`` view's ``problem`` column and the one
warning of a query) instead of failing the query: the run's other files and the other runs
still answer.

pyarrow is imported inside the functions (the ``[query]`` extra).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from expr_tracker.history import untrusted
from expr_tracker.history.alertlog import read_alert_log
from expr_tracker.history.rundirs import producer_status, worst_status
from expr_tracker.history.runinfo import dead_status, is_dead
from expr_tracker.history.values import dotted, json_text
from expr_tracker.query import scan

#: the range of a DuckDB BIGINT
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

#: identity columns every view starts with (``name``: the run's name; only in runs/metrics)
IDENTITY = (("project", "VARCHAR"), ("run", "VARCHAR"), ("stream", "VARCHAR"), ("rank", "INTEGER"))

#: the ``runs`` view before its ``config.*`` and ``summary.*`` columns
RUNS_COLUMNS: tuple[tuple[str, str], ...] = (
    ("project", "VARCHAR"),
    ("run", "VARCHAR"),
    ("name", "VARCHAR"),
    ("stream", "VARCHAR"),
    ("rank", "INTEGER"),
    ("status", "VARCHAR"),
    ("run_status", "VARCHAR"),
    ("problem", "VARCHAR"),
    ("started_at", "DOUBLE"),
    ("ended_at", "DOUBLE"),
    ("started", "TIMESTAMP"),
    ("ended", "TIMESTAMP"),
    ("duration_s", "DOUBLE"),
    ("first_started_at", "DOUBLE"),
    ("first_started", "TIMESTAMP"),
    ("wall_duration_s", "DOUBLE"),
    ("active_duration_s", "DOUBLE"),
    ("steps", "BIGINT"),
    ("last_time", "DOUBLE"),
    ("host", "VARCHAR"),
    ("pid", "BIGINT"),
    ("git_commit", "VARCHAR"),
    ("git_dirty", "BOOLEAN"),
    ("tags", "VARCHAR[]"),
    ("group", "VARCHAR"),
    ("notes", "VARCHAR"),
    ("job_type", "VARCHAR"),
    ("path", "VARCHAR"),
    ("config", "VARCHAR"),
    ("summary", "VARCHAR"),
)

#: the ``alerts`` view: identity + one row per line of ``alerts*.jsonl``
ALERTS_COLUMNS: tuple[tuple[str, str], ...] = (
    *IDENTITY,
    ("kind", "VARCHAR"),
    ("rule", "VARCHAR"),
    ("event", "VARCHAR"),
    ("level", "VARCHAR"),
    ("state", "VARCHAR"),
    ("step", "BIGINT"),
    ("time", "DOUBLE"),
    ("title", "VARCHAR"),
    ("message", "VARCHAR"),
    ("channel", "VARCHAR"),
    ("type", "VARCHAR"),
    ("source", "VARCHAR"),
    ("delivered", "BOOLEAN"),
    ("error", "VARCHAR"),
    ("status", "BIGINT"),
    ("attempts", "BIGINT"),
    ("notify", "BOOLEAN"),
    ("metrics", "VARCHAR"),
    ("tags", "VARCHAR[]"),
    ("line", "BIGINT"),
    ("record", "VARCHAR"),
)

#: the ``artifacts`` view: identity + one row per line of ``artifacts*.jsonl`` (lineage)
ARTIFACTS_COLUMNS: tuple[tuple[str, str], ...] = (
    *IDENTITY,
    ("action", "VARCHAR"),
    ("name", "VARCHAR"),
    ("version", "BIGINT"),
    ("digest", "VARCHAR"),
    ("type", "VARCHAR"),
    ("aliases", "VARCHAR[]"),
    ("step", "BIGINT"),
    ("time", "DOUBLE"),
    ("path", "VARCHAR"),
    ("new", "BOOLEAN"),
    ("line", "BIGINT"),
    ("record", "VARCHAR"),
)


# --------------------------------------------------------------------------- values


def _is_int(v: Any) -> bool:
    return type(v) is int and INT64_MIN <= v <= INT64_MAX


def _is_num(v: Any) -> bool:
    return type(v) in (int, float)


def _text(v: Any) -> str | None:
    """A VARCHAR cell: a string as it is, None as NULL, anything else as JSON."""
    if v is None or type(v) is str:
        return v
    return json_text(v)


def _coerce(v: Any, sql_type: str) -> Any:
    """``v`` for a column of ``sql_type``, NULL when it does not fit (no guessing)."""
    if sql_type == "VARCHAR":
        return _text(v)
    if sql_type in ("BIGINT", "INTEGER"):
        return v if _is_int(v) else None
    if sql_type == "DOUBLE":
        return float(v) if _is_num(v) and (type(v) is float or abs(v) < 2**1023) else None
    if sql_type == "BOOLEAN":
        return v if type(v) is bool else None
    if sql_type == "VARCHAR[]":
        if isinstance(v, (list, tuple)):
            return [_text(x) for x in v]
        return None
    raise ValueError(f"unknown column type {sql_type!r}")


_ARROW_TYPES: dict[str, Any] = {}


def arrow_type(sql_type: str) -> Any:
    """The Arrow type of one of our DuckDB column types."""
    if not _ARROW_TYPES:
        import pyarrow as pa

        _ARROW_TYPES.update(
            {
                "VARCHAR": pa.string(),
                "BIGINT": pa.int64(),
                "INTEGER": pa.int32(),
                "DOUBLE": pa.float64(),
                "BOOLEAN": pa.bool_(),
                "TIMESTAMP": pa.timestamp("us"),
                "VARCHAR[]": pa.list_(pa.string()),
            }
        )
    return _ARROW_TYPES[sql_type]


def build_table(columns: Sequence[tuple[str, str]], rows: Iterable[dict[str, Any]]) -> Any:
    """A ``pyarrow.Table`` with exactly ``columns`` (name, DuckDB type); each row is a dict
    whose values already fit their column (see :func:`_coerce`); a missing key is NULL."""
    import pyarrow as pa

    rows = list(rows)
    arrays = []
    for name, sql_type in columns:
        values = [r.get(name) for r in rows]
        if sql_type == "TIMESTAMP":
            micros = [None if v is None else round(v * 1e6) for v in values]
            arrays.append(pa.array(micros, pa.int64()).cast(pa.timestamp("us")))
        else:
            arrays.append(pa.array(values, arrow_type(sql_type)))
    return pa.Table.from_arrays(arrays, names=[c[0] for c in columns])


#: the largest JSONL file of alerts or lineage read (whole, as these files are small)
MAX_LINES_BYTES = 256 << 20
#: a producer's ``status`` when its ``run*.json`` exists but cannot be read (worse than any
#: other in ``run_status``, as ``et runs`` ranks it: history/rundirs.SEVERITY)
UNREADABLE = "unreadable"


class Problems:
    """What could not be read, per producer: a file that could not be read at all (with
    why: permissions, not a regular file, outside the run directory, not JSON, nested too
    deeply) or lines of a file that were skipped. It feeds the ``runs`` view's ``problem``
    column and the one warning a query gives (:meth:`message`)."""

    def __init__(self) -> None:
        self._items: dict[tuple[str, str | None, int], list[str]] = {}

    @staticmethod
    def _key(p: Any) -> tuple[str, str | None, int]:
        return (p.run_id, p.stream, p.rank)

    def add(self, p: Any, text: str) -> None:
        """Record ``text`` (``"metrics.jsonl: permission denied"``) for producer ``p``."""
        items = self._items.setdefault(self._key(p), [])
        if text not in items:
            items.append(text)

    def extend(self, other: Problems) -> None:
        """Record every problem of ``other`` (gathered apart, by a thread) here too."""
        for key, items in other._items.items():
            mine = self._items.setdefault(key, [])
            mine.extend(t for t in items if t not in mine)

    def of(self, p: Any) -> str | None:
        """The problems of producer ``p`` joined by ``"; "``, None when it has none."""
        items = self._items.get(self._key(p))
        return "; ".join(items) if items else None

    def __bool__(self) -> bool:
        return bool(self._items)

    def message(self) -> str | None:
        """One text naming every producer with a problem and why, None when none has any."""
        if not self._items:
            return None
        lines = []
        for (run, stream, rank), items in sorted(
            self._items.items(), key=lambda kv: (kv[0][0], kv[0][1] or "", kv[0][2])
        ):
            who = run
            if stream is not None or rank:
                who += f" ({'stream ' + stream + ', ' if stream else ''}rank {rank})"
            lines.append(f"  {who}: {'; '.join(items)}")
        n = len({k[0] for k in self._items})
        head = (
            f"expr_tracker: {n} run{'s' if n != 1 else ''} could not be read whole; what "
            "could not be read is left out of the answer (the runs view's problem column "
            "says the same):"
        )
        return "\n".join([head, *lines])


def unlisted_problem(p: Any) -> str:
    """The problem of a producer standing for a folder that could not be listed."""
    return f"the folder cannot be listed: {p.unlisted}"


def read_problem(path: Path, exc: BaseException) -> str:
    """``"<file name>: <why>"`` for a file that could not be read."""
    if isinstance(exc, untrusted.UnsafeFileError):
        why = exc.reason
    elif isinstance(exc, PermissionError):
        why = "permission denied"
    elif isinstance(exc, OSError):
        why = exc.strerror or str(exc)
    else:
        why = f"not JSON ({scan.reason(exc)})"
    return f"{Path(path).name}: {why}"


def lines_problem(path: Path, count: int, first: tuple[int, str] | None) -> str:
    """``"<file name>: 3 unreadable lines skipped (line 7: nested too deeply)"``; ``first``
    holds a 0-based line number, shown 1-based as editors number lines."""
    text = f"{Path(path).name}: {count} unreadable line{'s' if count != 1 else ''} skipped"
    if first is not None:
        text += f" (line {first[0] + 1}: {first[1]})"
    return text


def read_json_file(
    path: Path | None,
    root: Path | None = None,
    problems: Problems | None = None,
    producer: Any = None,
) -> Any:
    """The JSON value in a small file (``NaN``/``Infinity`` accepted), read as
    :mod:`expr_tracker.history.untrusted` reads it (inside ``root``, default the file's
    folder). None when missing, and None, recorded in ``problems`` for ``producer``, when it
    cannot be read or decoded or nests deeper than :data:`expr_tracker.query.scan.MAX_DEPTH`
    levels (a file being rewritten is replaced atomically, so it is whole or absent)."""
    if path is None:
        return None
    path = Path(path)
    try:
        data = untrusted.read_regular(path, root=root if root is not None else path.parent)
        value = untrusted.load_json_bytes(data)
        if scan.too_deep(data, value):
            raise ValueError(f"nested deeper than {scan.MAX_DEPTH} levels")
        return value
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:
        if problems is not None and producer is not None:
            problems.add(producer, read_problem(path, exc))
        return None


def read_jsonl_records(
    path: Path | None,
    root: Path | None = None,
    problems: Problems | None = None,
    producer: Any = None,
) -> list[tuple[int, dict[str, Any], str]]:
    """(line number, record, line text) for each complete line of a JSONL file holding a
    JSON object; a torn last line (no newline yet) is left out, and lines that cannot be
    read (not JSON, not an object, nested too deeply) are left out and counted in
    ``problems`` for ``producer``, as is a file that cannot be read at all."""
    if path is None:
        return []
    path = Path(path)
    try:
        data = untrusted.read_regular(
            path, root=root if root is not None else path.parent, max_bytes=MAX_LINES_BYTES
        )
    except FileNotFoundError:
        return []
    except OSError as exc:
        if problems is not None and producer is not None:
            problems.add(producer, read_problem(path, exc))
        return []
    end = data.rfind(b"\n") + 1
    out = []
    bad = scan.BadLines()
    for i, raw in enumerate(data[:end].split(b"\n")[:-1]):
        if not raw.strip():
            continue
        rec, why = scan.load_line(raw)
        if isinstance(rec, dict):
            out.append((i, rec, raw.decode("utf-8", errors="replace")))
        else:
            bad.add(i, why or "not a JSON object")
    if bad.count and problems is not None and producer is not None:
        problems.add(producer, lines_problem(path, bad.count, bad.first))
    return out


# --------------------------------------------------------------------------- runs


def _dotted(d: dict[str, Any]) -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (:func:`~expr_tracker.history.values.dotted`)."""
    return dotted(d)


def column_type(values: Iterable[Any]) -> str:
    """The DuckDB type of a flattened ``config.*``/``summary.*`` column: BOOLEAN when every
    value is a bool, BIGINT when every one is an int a BIGINT holds, DOUBLE when every one is
    a number, else VARCHAR (strings as they are, lists and dicts as JSON). NULLs don't count."""
    present = [v for v in values if v is not None]
    if not present:
        return "VARCHAR"
    if all(type(v) is bool for v in present):
        return "BOOLEAN"
    if all(_is_int(v) for v in present):
        return "BIGINT"
    if all(_is_num(v) for v in present):
        return "DOUBLE"
    return "VARCHAR"


def _flat_columns(prefix: str, dicts: list[dict[str, Any]], taken: set[str]) -> list[tuple]:
    """``(column name, type, [value per row])`` for the flattened keys of ``dicts``, sorted
    ignoring case. Keys that differ only in case (DuckDB names are case-insensitive) are
    told apart: the lowercase one (else the first) keeps its name, the others get ``#2``,
    ``#3`` ..."""
    flats = [_dotted(d) for d in dicts]
    keys: dict[str, None] = {}
    for f in flats:
        keys.update(dict.fromkeys(f))
    cols = []
    # case-insensitive order; of keys that differ only in case, the lowercase one first
    for key in sorted(keys, key=lambda k: (k.lower(), k != k.lower(), k)):
        name = f"{prefix}.{key}"
        n = 1
        while name.lower() in taken:
            n += 1
            name = f"{prefix}.{key}#{n}"
        taken.add(name.lower())
        values = [f.get(key) for f in flats]
        sql_type = column_type(values)
        cols.append((name, sql_type, [_coerce(v, sql_type) for v in values]))
    return cols


def _meta_block(p: Any, problems: Problems | None) -> dict[str, Any]:
    """The metrics file's sidecar ``*.meta.json`` (``max_step``, ``run`` block), {} if none
    or unreadable (then recorded in ``problems``)."""
    metrics = p.metrics
    if metrics is None:
        return {}
    meta = read_json_file(
        metrics.with_name(metrics.name[: -len(".jsonl")] + ".meta.json"), p.root, problems, p
    )
    return meta if isinstance(meta, dict) else {}


def _run_infos(producers: Sequence[Any], problems: Problems | None) -> dict[Path, dict[str, Any]]:
    """Per run directory, each producer's ``run*.json`` (file name -> its content, or None
    when it exists but cannot be read); a ``running`` producer whose process is gone on
    this host reads ``crashed`` (judged as ``et runs`` judges it; nothing is rewritten)."""
    out: dict[Path, dict[str, Any]] = {}
    for p in producers:
        if p.run_file is None:
            continue
        infos = out.setdefault(p.run_dir, {})
        if p.run_file.name in infos:
            continue
        info = read_json_file(p.run_file, p.root, problems, p)
        if info is not None and not isinstance(info, dict):
            if problems is not None:
                problems.add(p, f"{p.run_file.name}: not a JSON object")
            info = None
        if info is None and not untrusted.present(p.run_file):
            continue  # deleted since it was found: as if it never was
        if isinstance(info, dict) and info.get("status") == "running" and is_dead(info):
            info = {**info, "status": dead_status(info)}
        infos[p.run_file.name] = info
    return out


def _num_or_none(v: Any) -> float | None:
    return float(v) if _is_num(v) and math.isfinite(v) else None


def runs_table(
    producers: Sequence[Any],
    stats: dict[int, tuple[Any, Any]],
    problems: Problems | None = None,
) -> Any:
    """The ``runs`` view's table: one row per producer.

    ``stats[i]``: ``(max step, max time)`` of producer ``i``'s metrics from its cache (None
    when it has none). ``status`` is judged as ``et runs`` does
    (:func:`~expr_tracker.history.rundirs.producer_status` of its ``run*.json``, a dead
    ``running`` process reading ``crashed``), ``unreadable`` when its ``run*.json`` cannot
    be read; ``run_status`` is the worst over the run. ``problem``: what could not be read
    of the producer's files (from ``problems``, where the files read here add theirs), NULL
    when everything was read.
    """
    problems = problems if problems is not None else Problems()
    infos_by_dir = _run_infos(producers, problems)
    json_cache: dict[tuple[Path, Any], Any] = {}

    def small(path: Path | None, p: Any) -> Any:
        if path is None:
            return None
        key = (path, (p.run_id, p.stream, p.rank))
        if key not in json_cache:
            value = read_json_file(path, p.root, problems, p)
            if value is not None and not isinstance(value, dict):
                problems.add(p, f"{path.name}: not a JSON object")
            json_cache[key] = value
        return json_cache[key]

    rows = []
    configs, summaries = [], []
    for i, p in enumerate(producers):
        infos = infos_by_dir.get(p.run_dir, {})
        if p.unlisted is not None:  # a folder that could not be listed: nothing to read
            problems.add(p, unlisted_problem(p))
            info, status = {}, UNREADABLE
        elif p.run_file is None or p.run_file.name not in infos:
            info: dict[str, Any] = {}
            status = "unknown"
        elif infos[p.run_file.name] is None:
            info, status = {}, UNREADABLE
        else:
            info = infos[p.run_file.name]
            status = producer_status(info)
        run_status = worst_status(
            UNREADABLE if v is None else producer_status(v) for v in infos.values()
        )
        if p.unlisted is not None:
            run_status = UNREADABLE
        meta = _meta_block(p, problems)
        max_step, max_time = stats.get(i, (None, None))
        if max_step is None and _is_int(meta.get("max_step")):
            max_step = meta["max_step"]
        steps = max_step + 1 if max_step is not None else info.get("steps")
        started = _num_or_none(info.get("started_at"))
        if started is None and isinstance(meta.get("run"), dict):
            started = _num_or_none(meta["run"].get("started_at"))
        ended = _num_or_none(info.get("ended_at"))
        last_time = _num_or_none(max_time)
        if started is not None and ended is not None:
            duration = ended - started
        elif started is not None and last_time is not None:
            duration = last_time - started  # not ended (yet): as far as its rows go
        else:
            duration = None
        from expr_tracker.history.runinfo import run_life

        life = run_life(info, last_time=last_time)  # the whole life, over every attempt
        git = info.get("git") if isinstance(info.get("git"), dict) else {}
        config = small(p.config, p)
        summary = small(p.summary, p)
        configs.append(config if isinstance(config, dict) else {})
        summaries.append(summary if isinstance(summary, dict) else {})
        row = {
            "project": p.project,
            "run": p.run_id,
            "name": p.name,
            "stream": p.stream,
            "rank": p.rank,
            "status": status,
            "run_status": run_status,
            "problem": problems.of(p),
            "started_at": started,
            "ended_at": ended,
            "started": started,
            "ended": ended,
            "duration_s": duration,
            **life,
            "first_started": life["first_started_at"],
            "steps": steps,
            "last_time": last_time,
            "host": info.get("host"),
            "pid": info.get("pid"),
            "git_commit": git.get("commit"),
            "git_dirty": git.get("dirty"),
            "tags": info.get("tags"),
            "group": info.get("group"),
            "notes": info.get("notes"),
            "job_type": info.get("job_type"),
            "path": str(Path(p.run_dir).absolute()),
            "config": json_text(config) if isinstance(config, dict) else None,
            "summary": json_text(summary) if isinstance(summary, dict) else None,
        }
        rows.append({name: _coerce_run(name, t, row.get(name)) for name, t in RUNS_COLUMNS})
    import pyarrow as pa

    table = build_table(RUNS_COLUMNS, rows)
    taken = {c.lower() for c, _ in RUNS_COLUMNS}
    # every flattened column made first, the table once: appending them one by one copies
    # the schema each time (a config of 20,000 keys took minutes)
    names, arrays = list(table.column_names), list(table.columns)
    for prefix, dicts in (("config", configs), ("summary", summaries)):
        for name, sql_type, values in _flat_columns(prefix, dicts, taken):
            names.append(name)
            arrays.append(pa.array(values, arrow_type(sql_type)))
    return pa.Table.from_arrays(arrays, names=names)


def _coerce_run(name: str, sql_type: str, v: Any) -> Any:
    if sql_type == "TIMESTAMP":
        return v if v is not None and abs(v) < 2**62 / 1e6 else None
    return _coerce(v, sql_type)


# --------------------------------------------------------------------------- alerts, artifacts


def _identity(p: Any) -> dict[str, Any]:
    return {"project": p.project, "run": p.run_id, "stream": p.stream, "rank": p.rank}


def _alert_lines(
    path: Path | None, root: Path | None, problems: Problems | None, producer: Any
) -> list[tuple[int, dict[str, Any], str]]:
    """(line number, record, line text) of an alert log, read as its every reader reads it
    (:func:`~expr_tracker.history.alertlog.read_alert_log`); what cannot be read counted in
    ``problems`` for ``producer``, as :func:`read_jsonl_records` does."""
    if path is None:
        return []
    path = Path(path)
    try:
        lines = read_alert_log(
            path, root=root if root is not None else path.parent, max_bytes=MAX_LINES_BYTES
        )
    except OSError as exc:
        if problems is not None and producer is not None:
            problems.add(producer, read_problem(path, exc))
        return []
    if lines.bad and problems is not None and producer is not None:
        problems.add(producer, lines_problem(path, lines.bad, lines.first_bad))
    return [(r.line, r.record, r.text) for r in lines.records]


def _lines_table(
    producers: Sequence[Any],
    attr: str,
    columns: Sequence[tuple[str, str]],
    problems: Problems | None,
    read: Any = None,
) -> Any:
    rows = []
    own = {name for name, _ in IDENTITY} | {"line", "record"}
    read = read or read_jsonl_records
    for p in producers:
        ident = _identity(p)
        for line, rec, text in read(getattr(p, attr), p.root, problems, p):
            row = dict(ident)
            for name, sql_type in columns:
                if name in own:
                    continue
                row[name] = _coerce(rec.get(name), sql_type)
            row["line"] = line
            row["record"] = text
            rows.append(row)
    return build_table(columns, rows)


def alerts_table(producers: Sequence[Any], problems: Problems | None = None) -> Any:
    """The ``alerts`` view's table: one row per line of every producer's ``alerts*.jsonl``
    (``kind``: ``transition`` or ``delivery``); ``metrics`` as JSON text. What cannot be
    read is recorded in ``problems``."""
    return _lines_table(producers, "alerts", ALERTS_COLUMNS, problems, _alert_lines)


def artifacts_table(producers: Sequence[Any], problems: Problems | None = None) -> Any:
    """The ``artifacts`` view's table: one row per lineage line of every producer's
    ``artifacts*.jsonl`` (``action``: ``logged`` or ``used``; ``name``: the artifact's).
    What cannot be read is recorded in ``problems``."""
    return _lines_table(producers, "artifacts", ARTIFACTS_COLUMNS, problems)
