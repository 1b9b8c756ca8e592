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

pyarrow is imported inside the functions (the ``[query]`` extra).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from expr_tracker.history.codec import decode_line
from expr_tracker.history.rundirs import producer_infos, producer_status, worst_status

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


def json_text(value: Any) -> str:
    """Compact JSON, NaN/±inf as ``NaN``/``Infinity``/``-Infinity`` (as our files write
    them); a value JSON cannot hold as its ``str()``."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


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


def arrow_type(sql_type: str) -> Any:
    """The Arrow type of one of our DuckDB column types."""
    import pyarrow as pa

    return {
        "VARCHAR": pa.string(),
        "BIGINT": pa.int64(),
        "INTEGER": pa.int32(),
        "DOUBLE": pa.float64(),
        "BOOLEAN": pa.bool_(),
        "TIMESTAMP": pa.timestamp("us"),
        "VARCHAR[]": pa.list_(pa.string()),
    }[sql_type]


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


def read_json_file(path: Path | None) -> Any:
    """The JSON value in a small file (``NaN``/``Infinity`` accepted), None when missing or
    unreadable (a file being rewritten is replaced atomically, so it is whole or absent)."""
    if path is None:
        return None
    try:
        return decode_line(Path(path).read_bytes())
    except (OSError, ValueError):
        return None


def read_jsonl_records(path: Path | None) -> list[tuple[int, dict[str, Any], str]]:
    """(line number, record, line text) for each complete line of a JSONL file holding a
    JSON object; a torn last line (no newline yet) and undecodable lines are left out."""
    if path is None:
        return []
    try:
        data = Path(path).read_bytes()
    except OSError:
        return []
    end = data.rfind(b"\n") + 1
    out = []
    for i, raw in enumerate(data[:end].split(b"\n")[:-1]):
        if not raw.strip():
            continue
        try:
            rec = decode_line(raw)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append((i, rec, raw.decode("utf-8", errors="replace")))
    return out


# --------------------------------------------------------------------------- runs


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists, empty dicts and scalars are leaves."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            for kk, vv in flatten(v, key + ".").items():
                out.setdefault(kk, vv)
        else:
            out.setdefault(key, v)
    return out


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
    flats = [flatten(d) for d in dicts]
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


def _meta_block(metrics: Path | None) -> dict[str, Any]:
    """The metrics file's sidecar ``*.meta.json`` (``max_step``, ``run`` block), {} if none."""
    if metrics is None:
        return {}
    meta = read_json_file(metrics.with_name(metrics.name[: -len(".jsonl")] + ".meta.json"))
    return meta if isinstance(meta, dict) else {}


def _num_or_none(v: Any) -> float | None:
    return float(v) if _is_num(v) and math.isfinite(v) else None


def runs_table(producers: Sequence[Any], stats: dict[int, tuple[Any, Any]]) -> Any:
    """The ``runs`` view's table: one row per producer.

    ``stats[i]``: ``(max step, max time)`` of producer ``i``'s metrics from its cache (None
    when it has none). ``status`` is judged as ``et runs`` does
    (:func:`~expr_tracker.history.rundirs.producer_status` of its ``run*.json``, a dead
    ``running`` process reading ``crashed``); ``run_status`` is the worst over the run.
    """
    infos_by_dir: dict[Path, dict[str, dict[str, Any]]] = {}
    json_cache: dict[Path, Any] = {}

    def small(path: Path | None) -> Any:
        if path is None:
            return None
        if path not in json_cache:
            json_cache[path] = read_json_file(path)
        return json_cache[path]

    rows = []
    configs, summaries = [], []
    for i, p in enumerate(producers):
        infos = infos_by_dir.get(p.run_dir)
        if infos is None:
            infos = infos_by_dir[p.run_dir] = producer_infos(p.run_dir)
        info = infos.get(p.run_file.name, {}) if p.run_file is not None else {}
        status = producer_status(info) if p.run_file is not None else "unknown"
        meta = _meta_block(p.metrics)
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
        config = small(p.config)
        summary = small(p.summary)
        configs.append(config if isinstance(config, dict) else {})
        summaries.append(summary if isinstance(summary, dict) else {})
        row = {
            "project": p.project,
            "run": p.run_id,
            "name": p.name,
            "stream": p.stream,
            "rank": p.rank,
            "status": status,
            "run_status": worst_status(producer_status(v) for v in infos.values()),
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
            "config": None if config is None else json_text(config),
            "summary": None if summary is None else json_text(summary),
        }
        rows.append({name: _coerce_run(name, t, row.get(name)) for name, t in RUNS_COLUMNS})
    table = build_table(RUNS_COLUMNS, rows)
    taken = {c.lower() for c, _ in RUNS_COLUMNS}
    for prefix, dicts in (("config", configs), ("summary", summaries)):
        for name, sql_type, values in _flat_columns(prefix, dicts, taken):
            import pyarrow as pa

            table = table.append_column(name, pa.array(values, arrow_type(sql_type)))
    return table


def _coerce_run(name: str, sql_type: str, v: Any) -> Any:
    if sql_type == "TIMESTAMP":
        return v if v is not None and abs(v) < 2**62 / 1e6 else None
    return _coerce(v, sql_type)


# --------------------------------------------------------------------------- alerts, artifacts


def _identity(p: Any) -> dict[str, Any]:
    return {"project": p.project, "run": p.run_id, "stream": p.stream, "rank": p.rank}


def _lines_table(producers: Sequence[Any], attr: str, columns: Sequence[tuple[str, str]]) -> Any:
    rows = []
    own = {name for name, _ in IDENTITY} | {"line", "record"}
    for p in producers:
        ident = _identity(p)
        for line, rec, text in read_jsonl_records(getattr(p, attr)):
            row = dict(ident)
            for name, sql_type in columns:
                if name in own:
                    continue
                row[name] = _coerce(rec.get(name), sql_type)
            row["line"] = line
            row["record"] = text
            rows.append(row)
    return build_table(columns, rows)


def alerts_table(producers: Sequence[Any]) -> Any:
    """The ``alerts`` view's table: one row per line of every producer's ``alerts*.jsonl``
    (``kind``: ``transition`` or ``delivery``); ``metrics`` as JSON text."""
    return _lines_table(producers, "alerts", ALERTS_COLUMNS)


def artifacts_table(producers: Sequence[Any]) -> Any:
    """The ``artifacts`` view's table: one row per lineage line of every producer's
    ``artifacts*.jsonl`` (``action``: ``logged`` or ``used``; ``name``: the artifact's)."""
    return _lines_table(producers, "artifacts", ARTIFACTS_COLUMNS)
