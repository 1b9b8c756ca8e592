"""et export's library side (expr_tracker.query.export): every format and layout read back in
pandas, polars and DuckDB against a model built from the JSONL files themselves."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
duckdb = pytest.importorskip("duckdb")
pd = pytest.importorskip("pandas")
pl = pytest.importorskip("polars")

import expr_tracker as et  # noqa: E402
from expr_tracker.query.catalog import discover  # noqa: E402
from expr_tracker.query.export import (  # noqa: E402
    ExportError,
    export_runs,
    hive_escape,
    hive_unescape,
)

NAN = float("nan")
INF = float("inf")
HOSTILE_PROJECT = 'pr\'oj "x"; ü=1%'
HOSTILE_NAME = "r=1 ?*:#[a]^{b} 'q\" ü%2F, ;"
NANTOK = "<NaN>"
NULLISH = "<null-or-NaN>"


def _run(root: Path, project: str, name: str, stream: str | None = None, rank: int = 0):
    old = os.environ.get("RANK")
    os.environ["RANK"] = str(rank)
    try:
        kw = {"stream": stream} if stream else {}
        return et.Run(project=project, name=name, dir=str(root), **kw)
    finally:
        if old is None:
            os.environ.pop("RANK", None)
        else:
            os.environ["RANK"] = old


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """Two runs: a hostile-named one with NaN/±inf, ints, bools, strings, lists, None, a
    patch line, a metric named like a column, a second stream and a rank-1 shard; and a plain
    one named like a number."""
    root = tmp_path_factory.mktemp("sweep") / "runs"
    r = _run(root, HOSTILE_PROJECT, HOSTILE_NAME)
    r.log({"loss": 1.0, "acc": 1, "flag": True, "tag": "x", "bad": NAN, "train/a": 0.5})
    # step 1: written open (idle), then completed: the second line is a patch line
    r.log({"loss": NAN, "acc": 2, "tag": "a,b", "bad": INF}, commit=False)
    assert r.history.write_open_row()
    r.log({"loss": 0.25, "tag": 'q"', "extra": -INF})
    r.log(
        {
            "loss": -INF,
            "lst": [1, 2],
            "none": None,
            'we"ird,name ü': 3.5,
            "step": 99,
            "train/b": 2,
            "mixed": "s",
            "big": 5,
        }
    )
    r.log({"mixed": 4.0, "tag": "", "loss": 0.125, "train/a": 1e20, "big": 2**70 + 1})
    r.finish()
    ev = _run(root, HOSTILE_PROJECT, HOSTILE_NAME, stream="eval")
    for i in range(3):
        ev.log({"eval/acc": i / 4, "loss": float(i)})
    ev.finish()
    r1 = _run(root, HOSTILE_PROJECT, HOSTILE_NAME, rank=1)
    for i in range(3):
        r1.log({"loss": 10.0 + i, "tag": f"r1-{i}"})
    r1.finish()
    r2 = _run(root, "p2", "2024")
    for i in range(3):
        r2.log({"loss": 1.0 / (i + 1), "acc": i})
    r2.finish()
    return root


# -- the model: merged steps straight from the JSONL files -----------------------------------


def model(root: Path) -> list[dict]:
    """Per producer, its merged steps: {identity..., step, time, values: {metric: raw}} plus
    the set of metrics holding text anywhere (strings, lists, dicts; JSON null excluded)."""
    out = []
    for p in discover(root):
        if p.metrics is None:
            continue
        steps: dict[int, dict] = {}
        for raw in p.metrics.read_text("utf-8").splitlines():
            d = json.loads(raw)
            s = steps.setdefault(d["_step"], {"time": None, "values": {}})
            s["time"] = d.get("_time")
            s["values"].update({k: v for k, v in d.items() if not k.startswith("_")})
        for step in sorted(steps):
            out.append(
                {
                    "project": p.project,
                    "run": p.run_id,
                    "stream": p.stream,
                    "rank": p.rank,
                    "step": step,
                    **steps[step],
                }
            )
    return out


def text_metrics(root: Path) -> set[str]:
    found = set()
    for p in discover(root):
        if p.metrics is None:
            continue
        for raw in p.metrics.read_text("utf-8").splitlines():
            for k, v in json.loads(raw).items():
                if k.startswith("_") or v is None or isinstance(v, (bool, float)):
                    continue
                if not isinstance(v, int) or float(v) != v:  # an int beyond a double: digits
                    found.add(k)
    return found


def as_value_text(v):
    """(value DOUBLE, text VARCHAR) of a raw JSON value, as the cache stores it."""
    if isinstance(v, bool):
        return float(v), None
    if isinstance(v, int) and float(v) != v:  # too large for a double: exact digits too
        return float(v), str(v)
    if isinstance(v, (int, float)):
        return float(v), None
    if isinstance(v, str):
        return None, v
    return None, json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def number_text(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    r = repr(v)
    return r[:-2] if r.endswith(".0") else r


def expected_long(root: Path, partitioned: bool, metrics=None) -> list[dict]:
    rows = []
    for s in model(root):
        for m, raw in s["values"].items():
            if metrics is not None and m not in metrics:
                continue
            value, text = as_value_text(raw)
            row = {k: s[k] for k in ("project", "run", "stream", "rank", "step")}
            row.update(time=s["time"], metric=m, value=value, text=text)
            rows.append(row)
    return rows


def expected_wide(root: Path, metrics=None) -> tuple[list[str], list[dict]]:
    states = model(root)
    names = sorted({m for s in states for m in s["values"]})
    if metrics is not None:
        names = [m for m in names if m in metrics]
    textual = text_metrics(root)
    cols = []
    used = {"project", "run", "stream", "rank", "step", "time"}
    for m in names:
        c = m
        while c in used:
            c = f"metric:{c}"
        used.add(c)
        cols.append(c)
    rows = []
    for s in states:
        if not any(m in s["values"] for m in names):
            continue
        row = {k: s[k] for k in ("project", "run", "stream", "rank", "step", "time")}
        for m, c in zip(names, cols, strict=True):
            raw = s["values"].get(m)
            if raw is None:
                row[c] = None
            elif m in textual:
                value, text = as_value_text(raw)
                row[c] = text if text is not None else number_text(value)
            else:
                row[c] = as_value_text(raw)[0]
        rows.append(row)
    return cols, rows


def norm(records, *, lenient=False, drop=()) -> list[dict]:
    """Comparable rows: numpy scalars -> Python, NaN -> a token, sorted by identity. With
    ``lenient`` (pandas' numpy dtypes have no NULL), NULL, NaN and '' are one token."""
    out = []
    for r in records:
        d = {}
        for k, v in r.items():
            if k in drop:
                continue
            if hasattr(v, "item"):
                v = v.item()
            if v is pd.NA or v is pd.NaT:
                v = None
            if isinstance(v, float) and math.isnan(v):
                v = NANTOK
            if lenient and (v is None or v == NANTOK or v == ""):
                v = NULLISH
            if isinstance(v, int) and not isinstance(v, bool) and k not in ("rank", "step"):
                v = float(v)
            d[k] = v
        out.append(d)

    def key(d):
        return tuple(str(d.get(k)) for k in ("run", "stream", "rank", "step", "metric"))

    return sorted(out, key=key)


def lenient(rows):
    return norm(rows, lenient=True)


# -- readers ----------------------------------------------------------------------------------


def hive_glob(path: Path, ext: str) -> str:
    return str(path / "**" / f"*.{ext}")


def read_duckdb(path: Path, fmt: str, partitioned: bool, text_cols=()) -> list[dict]:
    target = hive_glob(path, fmt) if partitioned else str(path)
    hive = (
        ", hive_partitioning=true, hive_types={'project': 'VARCHAR', 'run': 'VARCHAR'}"
        if partitioned
        else ""
    )
    # a VARCHAR column of digits ("5", a huge int) reads as numbers unless declared
    types = (
        ", types={" + ", ".join(f"'{c}': 'VARCHAR'" for c in sorted(text_cols)) + "}"
        if text_cols
        else ""
    )
    fn = {
        "parquet": f"read_parquet(?{hive})",
        # a column of only -inf would sniff as DATE ('-infinity'): name the candidate types
        "csv": "read_csv(?, header=true, sample_size=-1, allow_quoted_nulls=false, "
        f"auto_type_candidates=['BIGINT', 'DOUBLE', 'VARCHAR']{types}{hive})",
        "jsonl": f"read_json(?, format='newline_delimited', sample_size=-1{hive})",
    }[fmt]
    con = duckdb.connect()
    cur = con.execute(f"SELECT * FROM {fn}", [target])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def read_polars(path: Path, fmt: str, partitioned: bool, text_cols=()) -> list[dict]:
    if fmt == "parquet":
        if partitioned:
            df = pl.scan_parquet(
                hive_glob(path, "parquet"),
                hive_partitioning=True,
                hive_schema={"project": pl.String, "run": pl.String},
            ).collect()
        else:
            df = pl.read_parquet(path)
    elif fmt == "csv":
        assert not partitioned
        df = pl.read_csv(
            path, infer_schema_length=None, schema_overrides=dict.fromkeys(text_cols, pl.String)
        )
        # polars 2.1 keeps a header's doubled quote ("we""ird" -> we""ird; docs/export.md)
        df = df.rename({c: c.replace('""', '"') for c in df.columns})
    else:
        assert not partitioned
        df = pl.read_ndjson(path, infer_schema_length=None)
    return df.to_dicts()


#: the NaN/NULL words pandas should see per column (text columns keep every word)
CSV_PANDAS_NA = {c: ["", "NaN"] for c in ("stream", "time", "value", "text")}


def read_pandas(path: Path, fmt: str, partitioned: bool, text_cols=()) -> list[dict]:
    if fmt == "parquet":
        df = pd.read_parquet(path)
        if partitioned:  # pyarrow's hive partitioning gives categoricals
            df["project"] = df["project"].astype(str)
            df["run"] = df["run"].astype(str)
    elif fmt == "csv":
        # pandas' default NA words ("null", "NA", ...) would eat text values: docs/export.md
        if "text" in pd.read_csv(path, nrows=0).columns:  # long
            df = pd.read_csv(path, keep_default_na=False, na_values=CSV_PANDAS_NA)
        else:  # wide: the defaults (float columns need pandas' NaN words); text columns
            # of digits ("5", a huge int) would become numbers unless declared str
            df = pd.read_csv(path, dtype=dict.fromkeys(text_cols, str))
    else:
        # pandas' default float parsers may miss the last digit: ask for exact ones
        df = pd.read_json(path, lines=True, dtype=False, precise_float=True)
    return df.to_dict("records")


# -- readback: every format and layout in every reader ----------------------------------------


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
@pytest.mark.parametrize("layout", ["wide", "long"])
def test_one_run_reads_back_in_duckdb_polars_pandas(sweep, tmp_path, fmt, layout):
    run_dir = next(p.run_dir for p in discover(sweep) if p.project == HOSTILE_PROJECT)
    out = tmp_path / f"out.{fmt}"
    res = export_runs(run_dir, out, format=fmt, layout=layout)
    assert res["partitioned"] is False and res["files"] == 1 and out.is_file()
    assert res["producers"] == 3 and res["runs"] == 1
    if layout == "long":
        want = [r for r in expected_long(sweep, False) if r["project"] == HOSTILE_PROJECT]
        cols = ["project", "run", "stream", "rank", "step", "time", "metric", "value", "text"]
    else:  # the metric columns of a one-run export are that run's
        metric_cols, want = expected_wide_of_run(sweep, HOSTILE_PROJECT)
        cols = ["project", "run", "stream", "rank", "step", "time", *metric_cols]
    assert res["columns"] == cols
    assert res["rows"] == len(want)
    text_cols = text_metrics(sweep) if layout == "wide" and fmt == "csv" else ()
    assert norm(read_duckdb(out, fmt, False, text_cols)) == norm(want)
    if fmt != "jsonl":  # polars' JSON reader refuses NaN/Infinity (docs/export.md)
        assert norm(read_polars(out, fmt, False, text_cols)) == norm(want)
    assert lenient(read_pandas(out, fmt, False, text_cols)) == lenient(want)


def expected_wide_of_run(root: Path, project: str) -> tuple[list[str], list[dict]]:
    """expected_wide over the producers of one run only (the metric set is that run's)."""
    import shutil
    import tempfile

    run_dir = next(p.run_dir for p in discover(root) if p.project == project)
    tmp = Path(tempfile.mkdtemp(prefix="et-export-model-"))
    try:
        copy = tmp / project / run_dir.name
        shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns(".et-cache"))
        cols, rows = expected_wide(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return cols, rows


@pytest.mark.parametrize("layout", ["wide", "long"])
def test_a_folder_of_runs_is_one_hive_table_in_every_reader(sweep, tmp_path, layout):
    out = tmp_path / "export"
    res = export_runs(sweep, out, layout=layout)
    assert res["partitioned"] is True and res["runs"] == 2 and res["producers"] == 4
    # every file has the same schema (wide: every metric of the sweep), without project/run
    files = sorted(out.rglob("*.parquet"))
    assert len(files) == 4
    schemas = {tuple(pq.read_schema(f).names) for f in files}
    assert len(schemas) == 1
    assert "project" not in schemas.pop()
    if layout == "long":
        want = expected_long(sweep, True)
    else:
        _, want = expected_wide(sweep)
    assert norm(read_duckdb(out, "parquet", True)) == norm(want)
    assert norm(read_polars(out, "parquet", True)) == norm(want)
    assert lenient(read_pandas(out, "parquet", True)) == lenient(want)
    # pyarrow's dataset API with the partition schema declared
    import pyarrow.dataset as ds

    part = ds.partitioning(
        pa.schema([("project", pa.string()), ("run", pa.string())]), flavor="hive"
    )
    got = ds.dataset(out, format="parquet", partitioning=part).to_table().to_pylist()
    assert norm(got) == norm(want)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_partitioned_csv_and_jsonl_read_back_in_duckdb(sweep, tmp_path, fmt):
    out = tmp_path / "export"
    export_runs(sweep, out, format=fmt, layout="long")
    assert norm(read_duckdb(out, fmt, True)) == norm(expected_long(sweep, True))


def test_hostile_names_round_trip_through_the_partition_path(sweep, tmp_path):
    out = tmp_path / "export"
    export_runs(sweep, out)
    runs = {p.run_id for p in discover(sweep)}
    assert any(HOSTILE_NAME in r for r in runs)
    dirs = {d.name for d in out.glob("project=*/run=*")}
    assert {hive_unescape(d.split("=", 1)[1]) for d in dirs} == runs
    got = (
        duckdb.connect()
        .execute(
            "SELECT DISTINCT project, run FROM read_parquet(?, hive_partitioning=true)",
            [hive_glob(out, "parquet")],
        )
        .fetchall()
    )
    assert sorted(got) == sorted({(p.project, p.run_id) for p in discover(sweep)})


@pytest.mark.parametrize(
    "value",
    ["plain", "a/b", "a=b", "sp ace", "q'u\"ote", "100%", "ü☃", "..", ".", "x\ny", "%2F", "}{"],
)
def test_hive_escape_round_trips_and_never_leaves_a_separator(value):
    text = hive_escape(value)
    assert "/" not in text and "=" not in text and "\n" not in text and text not in (".", "..")
    assert hive_unescape(text) == value


def test_hive_escape_is_hives_set():
    assert hive_escape("a b;ü}") == "a b;ü}"  # Hive leaves these alone
    assert hive_escape("#%'*/:=?\\{[]^\"") == "%23%25%27%2A%2F%3A%3D%3F%5C%7B%5B%5D%5E%22"
    assert hive_escape(None) == "__HIVE_DEFAULT_PARTITION__"


def test_metrics_globs_select_and_a_pattern_matching_nothing_is_an_error(sweep, tmp_path):
    run_dir = next(p.run_dir for p in discover(sweep) if p.project == "p2")
    res = export_runs(sweep, tmp_path / "sel", metrics="train/*,acc")
    assert res["columns"] == ["stream", "rank", "step", "time", "acc", "train/a", "train/b"]
    with pytest.raises(ExportError) as ei:
        export_runs(run_dir, tmp_path / "x.parquet", metrics="acc,los")
    msg = str(ei.value)
    assert "'los'" in msg and "loss" in msg  # names the pattern and a close match
    assert not (tmp_path / "x.parquet").exists()


def test_jsonl_of_finite_metrics_reads_in_polars(sweep, tmp_path):
    run_dir = next(p.run_dir for p in discover(sweep) if p.project == "p2")
    out = tmp_path / "p2.jsonl"
    export_runs(run_dir, out, format="jsonl")
    _, want = expected_wide_of_run(sweep, "p2")
    assert norm(read_polars(out, "jsonl", False)) == norm(want)


def test_nan_and_infinity_are_written_as_documented(sweep, tmp_path):
    run_dir = next(p.run_dir for p in discover(sweep) if p.project == HOSTILE_PROJECT)
    export_runs(run_dir, tmp_path / "a.csv", layout="long", metrics="bad,extra")
    export_runs(run_dir, tmp_path / "a.jsonl", format="jsonl", layout="long", metrics="bad,extra")
    csv_text = (tmp_path / "a.csv").read_text()
    assert ",NaN," in csv_text and ",inf," in csv_text and ",-inf," in csv_text
    js = (tmp_path / "a.jsonl").read_text()
    assert '"value":NaN' in js and '"value":Infinity' in js and '"value":-Infinity' in js


def test_stream_and_rank_select_producers(sweep, tmp_path):
    run_dir = next(p.run_dir for p in discover(sweep) if p.project == HOSTILE_PROJECT)
    res = export_runs(run_dir, tmp_path / "e.parquet", stream="eval", layout="long")
    got = pq.read_table(tmp_path / "e.parquet").to_pylist()
    assert res["producers"] == 1 and {r["stream"] for r in got} == {"eval"}
    res = export_runs(run_dir, tmp_path / "m.parquet", stream="main", rank="1", layout="long")
    got = pq.read_table(tmp_path / "m.parquet").to_pylist()
    assert res["producers"] == 1 and {(r["stream"], r["rank"]) for r in got} == {(None, 1)}
    with pytest.raises(ExportError, match="no stream 'nope'.*eval"):
        export_runs(run_dir, tmp_path / "n.parquet", stream="nope")
    with pytest.raises(ExportError, match="rank='x'"):
        export_runs(run_dir, tmp_path / "n.parquet", rank="x")
    with pytest.raises(ExportError, match="no rank 7.*0, 1"):
        export_runs(run_dir, tmp_path / "n.parquet", rank=7)


def test_an_existing_path_is_refused_without_overwrite(sweep, tmp_path):
    run_dir = next(p.run_dir for p in discover(sweep) if p.project == "p2")
    out = tmp_path / "o.parquet"
    out.write_text("keep me")
    with pytest.raises(ExportError, match="exists; pass --overwrite"):
        export_runs(run_dir, out)
    assert out.read_text() == "keep me"
    export_runs(run_dir, out, overwrite=True)
    assert pq.read_table(out).num_rows == 3
    d = tmp_path / "dir"
    export_runs(sweep, d)
    with pytest.raises(ExportError, match="exists"):
        export_runs(sweep, d)
    stale = d / "project=old" / "run=gone" / "part.csv"
    stale.parent.mkdir(parents=True)
    stale.write_text("old")
    export_runs(sweep, d, overwrite=True, layout="long")
    assert not stale.exists()  # an earlier export is replaced whole, not merged into
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("partitioned", [True, False])
def test_overwrite_never_deletes_a_directory_of_user_files(sweep, tmp_path, partitioned):
    run_dir = next(p.run_dir for p in discover(sweep) if p.project == "p2")
    d = tmp_path / "mydata"
    export_runs(sweep, d)  # an earlier export...
    (d / "thesis.tex").write_text("precious")  # ...that now holds a file of the user's
    (d / "project=p2" / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match=r"mydata --overwrite.*thesis\.tex.*not part of an"):
        export_runs(sweep if partitioned else run_dir, d, overwrite=True)
    (d / "thesis.tex").unlink()
    with pytest.raises(ExportError, match=r"notes\.txt"):
        export_runs(sweep if partitioned else run_dir, d, overwrite=True)
    assert (d / "project=p2" / "notes.txt").read_text() == "mine"
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "a.txt").write_text("keep")
    with pytest.raises(ExportError, match="a.txt"):
        export_runs(sweep if partitioned else run_dir, plain, overwrite=True)
    assert (plain / "a.txt").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mydata", "plain"]


def test_an_output_naming_the_current_folder_is_a_clear_error(sweep, tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for target in (".", "./", "..", "sub/.."):
        with pytest.raises(ExportError, match="names no file or folder of its own"):
            export_runs(sweep, target, overwrite=True)
    assert list(work.iterdir()) == []


def test_bad_arguments_name_the_argument_and_what_is_valid(sweep, tmp_path):
    with pytest.raises(ExportError, match="format='xml'.*parquet, csv, jsonl"):
        export_runs(sweep, tmp_path / "o", format="xml")
    with pytest.raises(ExportError, match="layout='tall'.*wide, long"):
        export_runs(sweep, tmp_path / "o", layout="tall")
    with pytest.raises(ExportError, match="does not exist"):
        export_runs(tmp_path / "missing", tmp_path / "o")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExportError, match="no metrics files"):
        export_runs(tmp_path / "empty", tmp_path / "o")
    with pytest.raises(ExportError, match="holds 2 runs"):
        export_runs(sweep, tmp_path / "o", partition=False)


def test_a_run_exports_partitioned_on_request(sweep, tmp_path):
    run_dir = next(p.run_dir for p in discover(sweep) if p.project == "p2")
    out = tmp_path / "one"
    export_runs(run_dir, out, partition=True, format="csv")
    assert [p.relative_to(out).as_posix() for p in out.rglob("*.csv")] == [
        "project=p2/run=p2%2F2024/part.csv"
    ]


def test_an_interrupted_export_leaves_no_file(sweep, tmp_path, monkeypatch):
    from expr_tracker.query import layouts as mod

    run_dir = next(p.run_dir for p in discover(sweep) if p.project == HOSTILE_PROJECT)
    real = mod.wide_rows

    def boom(*a, **k):
        it = real(*a, **k)
        yield next(it)
        raise KeyboardInterrupt

    monkeypatch.setattr(mod, "wide_rows", boom)
    for fmt in ("parquet", "csv"):
        with pytest.raises(KeyboardInterrupt):
            export_runs(run_dir, tmp_path / f"o.{fmt}", format=fmt)
    with pytest.raises(KeyboardInterrupt):
        export_runs(sweep, tmp_path / "dir")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["r", "r[a]*?{b}"])
def test_out_of_order_steps_are_sorted_and_merged(tmp_path, name):
    """A file written with step_policy="allow" (steps out of order, one step on two
    non-adjacent lines) goes through DuckDB's sort (also from a folder named like a glob)."""
    run = tmp_path / "p" / name
    run.mkdir(parents=True)
    lines = [
        {"_step": 5, "_time": 5.0, "a": 5.0},
        {"_step": 1, "_time": 1.0, "a": 1.0, "b": "x"},
        {"_step": 5, "_time": 5.5, "b": "late"},
        {"_step": 3, "_time": 3.0, "a": NAN},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    export_runs(run, tmp_path / "o.parquet")
    got = pq.read_table(tmp_path / "o.parquet").to_pylist()
    assert [(r["step"], r["time"], r["b"]) for r in got] == [
        (1, 1.0, "x"),
        (3, 3.0, None),
        (5, 5.5, "late"),
    ]
    assert math.isnan(got[1]["a"]) and got[2]["a"] == 5.0


def test_patch_lines_across_batch_boundaries(tmp_path, monkeypatch):
    """A step whose lines straddle a record batch is merged whole (small batches force it)."""
    from expr_tracker.query import stepreader as mod

    monkeypatch.setattr(mod, "BATCH_ROWS", 3)
    run = tmp_path / "p" / "r"
    run.mkdir(parents=True)
    lines = []
    for s in range(20):
        lines.append({"_step": s, "_time": float(s), "a": s, "b": -s})
        if s % 3 == 0:
            lines.append({"_step": s, "_time": float(s), "b": 100 + s, "c": "p"})
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    export_runs(run, tmp_path / "w.parquet")
    export_runs(run, tmp_path / "l.parquet", layout="long")
    wide = pq.read_table(tmp_path / "w.parquet").to_pylist()
    assert [r["step"] for r in wide] == list(range(20))
    for r in wide:
        s = r["step"]
        assert r["a"] == s
        assert r["b"] == (100 + s if s % 3 == 0 else -s)
        assert r["c"] == ("p" if s % 3 == 0 else None)
    long = pq.read_table(tmp_path / "l.parquet").to_pylist()
    assert len(long) == 20 * 2 + 7  # a, b per step; c on steps 0, 3, ..., 18
    assert len({(r["step"], r["metric"]) for r in long}) == len(long)


def test_an_empty_run_exports_its_header(tmp_path):
    run = tmp_path / "p" / "r"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("")
    res = export_runs(run, tmp_path / "o.csv", layout="long")
    assert res["rows"] == 0
    assert (tmp_path / "o.csv").read_text().splitlines() == [
        "project,run,stream,rank,step,time,metric,value,text"
    ]


@pytest.mark.parametrize("order", ["sorted", "shuffled"])
def test_a_torn_last_line_and_lines_without_a_step_are_not_exported(tmp_path, order):
    run = tmp_path / "p" / "r"
    run.mkdir(parents=True)
    first = '{"_step":3,"a":0}\n' if order == "shuffled" else ""
    (run / "metrics.jsonl").write_text(
        first + '{"_step":0,"a":1}\n{"a":9}\n{"_step":"x","a":8}\n{"_step":1,"a":2}\n{"_step":2,"a"'
    )
    export_runs(run, tmp_path / "o.parquet")
    got = [(r["step"], r["a"]) for r in pq.read_table(tmp_path / "o.parquet").to_pylist()]
    assert got == ([(0, 1.0), (1, 2.0), (3, 0.0)] if order == "shuffled" else [(0, 1.0), (1, 2.0)])


WRITER = """
import sys, time
import expr_tracker as et
run = et.init(project="live", name="r", dir=sys.argv[1])
i = 0
while True:
    et.log({"a": float(i), "b": -float(i), "c": "s%d" % i})
    i += 1
    if i % 200 == 0:
        time.sleep(0.001)
"""


@pytest.mark.slow
def test_a_live_run_exports_a_consistent_prefix(tmp_path):
    """While a real process logs, every export holds steps 0..k, each whole."""
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(WRITER), str(tmp_path / "runs")],
        stderr=subprocess.PIPE,
    )
    try:
        run = tmp_path / "runs" / "live" / "r"
        deadline = time.monotonic() + 30
        while not (run / "metrics.jsonl").exists() or (run / "metrics.jsonl").stat().st_size == 0:
            assert time.monotonic() < deadline, proc.stderr
            time.sleep(0.05)
        seen = []
        for i in range(4):
            out = tmp_path / f"o{i}.parquet"
            export_runs(run, out)
            rows = pq.read_table(out).to_pylist()
            steps = [r["step"] for r in rows]
            assert steps == list(range(len(steps)))
            for r in rows:
                s = r["step"]
                assert (r["a"], r["b"], r["c"]) == (float(s), -float(s), f"s{s}")
            seen.append(len(steps))
            time.sleep(0.2)
        assert seen == sorted(seen) and seen[-1] > seen[0]
    finally:
        proc.kill()
        proc.communicate()


def test_many_runs_export_within_a_small_file_descriptor_limit(tmp_path):
    """Parts are opened one at a time: 80 runs export under a limit of 48 open files."""
    root = tmp_path / "many"
    for i in range(80):
        run = root / "p" / f"r{i:02d}"
        run.mkdir(parents=True)
        rows = [{"_step": s, "_time": float(s), "loss": i + s / 10} for s in range(3)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code = f"""
import resource
resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))
from expr_tracker.query.export import export_runs
res = export_runs({str(root)!r}, {str(tmp_path / "out")!r}, cache_dir={str(tmp_path / "c")!r})
assert res["runs"] == 80 and res["rows"] == 240, res
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    got = (
        duckdb.connect()
        .execute(
            "SELECT count(DISTINCT run), count(*) FROM read_parquet(?, hive_partitioning=true)",
            [hive_glob(tmp_path / "out", "parquet")],
        )
        .fetchone()
    )
    assert got == (80, 240)


def test_the_output_never_replaces_or_joins_the_runs_it_reads(sweep, tmp_path):
    run_dir = next(p.run_dir for p in discover(sweep) if p.project == "p2")
    before = (run_dir / "metrics.jsonl").read_bytes()
    for target in (run_dir / "metrics.jsonl", run_dir, sweep, run_dir / "new.parquet"):
        with pytest.raises(ExportError, match="over or inside the run directory"):
            export_runs(run_dir, target, overwrite=True, format="jsonl")
    assert (run_dir / "metrics.jsonl").read_bytes() == before
    # an export kept under the runs folder is not taken for a run by the next export
    export_runs(sweep, sweep / "exported", format="jsonl")
    try:
        res = export_runs(sweep, tmp_path / "again", format="jsonl")
        assert res["runs"] == 2
    finally:
        import shutil

        shutil.rmtree(sweep / "exported")


@pytest.mark.parametrize("partition", [False, True])
def test_a_path_that_appears_during_the_export_is_not_replaced(
    sweep, tmp_path, monkeypatch, partition
):
    from expr_tracker.query import export as mod

    run_dir = next(p.run_dir for p in discover(sweep) if p.project == "p2")
    out = tmp_path / "o.parquet"
    real = mod._write

    def racing(*a, **k):
        n = real(*a, **k)
        if partition:
            out.mkdir(exist_ok=True)
            (out / "theirs.txt").write_text("theirs")
        else:
            out.write_text("theirs")
        return n

    monkeypatch.setattr(mod, "_write", racing)
    with pytest.raises(ExportError, match="appeared during the export"):
        export_runs(run_dir, out, partition=partition)
    theirs = out / "theirs.txt" if partition else out
    assert theirs.read_text() == "theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.parquet"]


def test_duckdb_finds_every_nan_in_an_export_with_its_default_settings(tmp_path):
    """Parquet's min/max statistics leave NaN out, and DuckDB by default takes them to mean a
    row group holds no NaN: the export writes none on the metric values, so a plain
    `WHERE isnan(x)` over the export counts every NaN."""
    r = _run(tmp_path / "runs", "p", "diverged")
    for step in range(40):
        r.log({"loss": float("nan") if step >= 25 else 1.0 / (step + 1)})
    r.finish()
    for layout, col in (("wide", '"loss"'), ("long", "value")):
        out = tmp_path / f"{layout}.parquet"
        export_runs(r.dir, out, layout=layout)
        con = duckdb.connect()
        q = f"SELECT count(*) FROM read_parquet('{out}') WHERE "
        assert con.sql(q + f"isnan({col})").fetchall()[0][0] == 15, layout
        assert con.sql(q + f"{col} > 1e9").fetchall()[0][0] == 15, layout  # NaN sorts above all
        d = tmp_path / f"{layout}-dir"
        export_runs(tmp_path / "runs", d, layout=layout)
        q = f"SELECT count(*) FROM read_parquet('{d}/**/*.parquet') WHERE isnan({col})"
        assert con.sql(q).fetchall()[0][0] == 15, layout


def test_a_full_disk_names_the_output_and_leaves_nothing(sweep, tmp_path, monkeypatch):
    import errno

    from expr_tracker.query import export as export_mod

    real_write = export_mod._write

    def full(path, fmt, schema, batches):
        real_write(path, fmt, schema, batches)  # a partial file is on disk...
        raise OSError(errno.ENOSPC, "No space left on device")  # ...then the disk is full

    monkeypatch.setattr(export_mod, "_write", full)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    for target in (out_dir / "one.csv", out_dir / "many"):
        with pytest.raises(
            OSError, match=re.escape(f"export to {target} failed: No space left")
        ) as ei:
            export_runs(sweep if target.name == "many" else _p2(sweep), target)
        assert ei.value.errno == errno.ENOSPC
    assert list(out_dir.iterdir()) == []


def test_a_read_only_mount_names_the_output(sweep, tmp_path, monkeypatch):
    """On a read-only mount even unlink of a missing file fails (EROFS, not ENOENT): the
    export's clean-up must not hide the real error, which names the output."""
    import errno

    ro = tmp_path / "ro"
    ro.mkdir()

    real = {}
    for name in ("unlink", "mkdir"):
        real["PosixPath." + name] = getattr(Path, name)

    def patched(name):
        def f(self, *a, **k):
            if ro in self.parents:
                raise OSError(errno.EROFS, "Read-only file system", str(self))
            return real["PosixPath." + name](self, *a, **k)

        return f

    for name in ("unlink", "mkdir"):
        monkeypatch.setattr(Path, name, patched(name))
    with pytest.raises(
        OSError, match=re.escape(f"export to {ro / 'x'} failed: Read-only file system")
    ):
        export_runs(sweep, ro / "x")


def _p2(sweep: Path) -> Path:
    return next(p.run_dir for p in discover(sweep) if p.project == "p2")


def test_an_output_inside_another_run_directory_is_refused(tmp_path):
    runs = tmp_path / "runs"
    for name in ("a", "b"):
        r = _run(runs, "p", name)
        r.log({"loss": 1.0})
        r.finish()
    b = runs / "p" / "b"
    before = {f.name: f.read_bytes() for f in b.iterdir() if f.is_file()}
    for name in ("metrics.jsonl", "config.json", "new.parquet"):
        with pytest.raises(ExportError, match="inside the run directory"):
            export_runs(runs / "p" / "a", b / name, overwrite=True)
    assert {f.name: f.read_bytes() for f in b.iterdir() if f.is_file()} == before
    export_runs(runs / "p" / "a", runs / "a.parquet")  # beside the runs: fine


def test_wrong_types_for_every_keyword_name_it_and_what_is_valid(sweep, tmp_path):
    out = tmp_path / "o"
    cases = {
        "metrics": (5, "metrics=5 is not valid: give a string 'a,b' or a list of names"),
        "stream": (5, "stream=5 is not valid: give a string 'a,b' or a list of names"),
        "rank": (1.5, "rank=1.5 is not valid: give a string 'a,b' or a list of numbers"),
        "partition": ("no", "partition='no' is not valid: use True or False"),
        "overwrite": ("no", "overwrite='no' is not valid: use True or False"),
        "cache_dir": (5, "cache_dir=5 is not valid: give a folder's path"),
    }
    for name, (bad, msg) in cases.items():
        with pytest.raises(ExportError, match=re.escape(msg)):
            export_runs(sweep, out, **{name: bad})
    with pytest.raises(ExportError, match=r"rank=True is not valid"):
        export_runs(sweep, out, rank=True)
    with pytest.raises(ExportError, match=r"metrics=\['a', 3\] is not valid"):
        export_runs(sweep, out, metrics=["a", 3])
    with pytest.raises(ExportError, match=r"rank=-1: ranks are 0 or more"):
        export_runs(sweep, out, rank=-1)
    assert not out.exists()
    assert export_runs(sweep, out, rank=[0, 1], overwrite=False)["files"] >= 1


def test_a_value_past_the_sorts_memory_limit_is_a_named_error(tmp_path, monkeypatch, capsys):
    """A run whose steps are out of order is sorted by DuckDB under a memory limit; a
    string value bigger than it (300 MB in a 256 MB limit) ended `et export` with an
    OutOfMemoryException traceback. It is one line naming the run, exit 1, nothing left."""
    from expr_tracker.cli.main import main
    from expr_tracker.query import stepreader as export_mod

    run = tmp_path / "runs" / "p" / "big"
    run.mkdir(parents=True)
    with open(run / "metrics.jsonl", "w") as f:
        f.write(json.dumps({"loss": 1.0, "_step": 5}) + "\n")
        f.write(json.dumps({"loss": 2.0, "_step": 1, "s": "x" * (24 << 20)}) + "\n")
        f.write(json.dumps({"loss": 3.0, "_step": 2}) + "\n")
    monkeypatch.setattr(export_mod, "DUCKDB_MEMORY_LIMIT", "8MB")
    out = tmp_path / "out.jsonl"
    code = main(["export", str(run), "-o", str(out), "--format", "jsonl"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "p/big: its rows could not be exported" in err and "Traceback" not in err
    assert not out.exists() and not list(tmp_path.glob(".out.jsonl*partial"))
