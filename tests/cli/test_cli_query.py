"""``et query "SQL" [DIR]``: formats, round trips of NaN/±inf, errors, ``--schema``."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from expr_tracker.history.values import json_safe

pytest.importorskip("duckdb")
pytest.importorskip("pyarrow")

import expr_tracker as et  # noqa: E402
from expr_tracker.cli.main import main  # noqa: E402

SQL = "SELECT run, step, metric, value, text FROM metrics ORDER BY run, step, metric"


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    for name, lr in (("a", 0.1), ("b'q", 0.01)):
        run = et.init(project="p", name=name, dir=str(root), config={"lr": lr}, reinit="create_new")
        run.log({"loss": 1.0 / 3, "x": float("nan")})
        run.log({"loss": float("inf"), "x": float("-inf"), "s": "hi ✓"})
        run.finish()
    return root


def cli(capsys, *argv):
    code = main(["query", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def _same(a, b):
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _rows_equal(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        assert all(_same(g[k], w[k]) for k in g), (g, w)


def test_table_shows_nan_inf_and_null_visibly(runs, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    code, out, _ = cli(capsys, SQL, runs)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["run", "step", "metric", "value", "text"]
    body = "\n".join(lines[1:])
    assert "nan" in body and " inf" in body and "-inf" in body and "NULL" in body
    assert "0.333333" in body and "hi ✓" in body
    assert lines[-1].strip() == "10 rows"


def test_table_shows_the_first_max_rows_and_counts_all(runs, capsys):
    code, out, _ = cli(capsys, SQL, runs, "--max-rows", "3")
    assert code == 0
    assert len(out.splitlines()) == 1 + 3 + 1
    assert "10 rows, the first 3 shown" in out


def test_jsonl_and_json_are_strict_json_with_nan_and_inf_as_null(runs, capsys):
    """The house rule (docs/cli.md "Output for scripts"): json/jsonl are strict JSON, so
    ``jq`` and JSON.parse read them; NaN/±inf become null (csv/parquet keep them)."""
    want = json_safe(et.query(SQL, runs, output_type="dicts"), "null")
    code, out, _ = cli(capsys, SQL, runs, "--format", "jsonl")
    assert code == 0
    strict = {"NaN": None, "Infinity": None, "-Infinity": None}
    got = [
        json.loads(line, parse_constant=lambda c: strict[c] or 1 / 0) for line in out.splitlines()
    ]
    _rows_equal(got, want)
    assert "NaN" not in out and "Infinity" not in out
    assert sum(r["value"] is None for r in got) > sum(
        r["value"] is None for r in et.query(SQL, runs, output_type="dicts")
    )
    code, out, _ = cli(capsys, SQL, runs, "--format", "json")
    assert code == 0 and out.startswith("[\n") and out.endswith("\n]\n")
    _rows_equal(json.loads(out), want)


def test_csv_round_trips_through_pandas(runs, capsys):
    pd = pytest.importorskip("pandas")
    code, out, _ = cli(capsys, SQL, runs, "--format", "csv")
    assert code == 0
    df = pd.read_csv(io.StringIO(out))
    want = et.query(SQL, runs)
    assert list(df.columns) == list(want.columns)
    pd.testing.assert_series_equal(df["value"], want["value"])
    assert df["value"].isin([math.inf, -math.inf]).sum() == 4
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[1][3] == repr(1.0 / 3)  # every digit
    assert {r[3] for r in rows[1:]} >= {"nan", "inf", "-inf", ""}


def test_parquet_needs_o_and_round_trips(runs, capsys, tmp_path):
    code, out, err = cli(capsys, SQL, runs, "--format", "parquet")
    assert code == 2 and "-o" in err and out == ""
    import pyarrow.parquet as pq

    dest = tmp_path / "out.parquet"
    code, out, err = cli(capsys, SQL, runs, "--format", "parquet", "-o", dest)
    assert code == 0, err
    got = pq.read_table(dest).to_pylist()
    _rows_equal(got, et.query(SQL, runs, output_type="dicts"))
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []


def test_o_writes_csv_and_json_to_a_file(runs, capsys, tmp_path):
    for fmt in ("csv", "json", "jsonl", "table"):
        dest = tmp_path / f"out.{fmt}"
        code, out, _ = cli(capsys, SQL, runs, "--format", fmt, "-o", dest)
        assert code == 0 and out == ""
        assert dest.read_text(encoding="utf-8").strip()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith((".tmp", ".partial"))]


def test_bad_sql_exits_2_with_one_screen_naming_the_views(runs, capsys, tmp_path):
    dest = tmp_path / "never.csv"
    code, out, err = cli(capsys, "SELECT nope FROM metrics", runs, "--format", "csv", "-o", dest)
    assert code == 2 and out == ""
    assert "nope" in err
    for view in ("runs(", "metrics(", "spans(", "alerts(", "artifacts("):
        assert view in err
    assert "et query --schema" in err  # the long views are cut
    assert len(err.splitlines()) <= 25
    assert not dest.exists()
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".never")] == []


def test_schema_lists_every_view_and_its_columns(runs, capsys):
    code, out, _ = cli(capsys, "--schema", runs)
    assert code == 0
    for view in ("runs", "metrics", "spans", "alerts", "artifacts"):
        assert f"{view} (" in out
    assert "config.lr" in out and "DOUBLE" in out
    code, out, _ = cli(capsys, "--schema", runs, "--format", "jsonl")
    recs = [json.loads(x) for x in out.splitlines()]
    assert {"view": "metrics", "column": "value", "type": "DOUBLE"} in recs
    assert {"view": "runs", "column": "config.lr", "type": "DOUBLE"} in recs


def test_usage_errors(runs, capsys, tmp_path):
    code, _, err = cli(capsys)
    assert code == 2 and "SQL" in err
    code, _, err = cli(capsys, "--schema", "SELECT 1", runs)
    assert code == 2 and "--schema" in err
    code, _, err = cli(capsys, "SELECT 1", tmp_path / "nope")
    assert code == 1 and "nope" in err
    code, _, err = cli(capsys, "SELECT 1", runs, "--max-rows", "-1")
    assert code == 2 and "--max-rows" in err


def test_an_empty_dir_and_a_statement_without_rows(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, out, _ = cli(capsys, "SELECT * FROM metrics", tmp_path / "empty")
    assert code == 0 and out.splitlines()[-1].strip() == "0 rows"
    code, out, _ = cli(capsys, "SELECT * FROM runs", tmp_path / "empty", "--format", "json")
    assert code == 0 and out == "[]\n"
    code, out, _ = cli(capsys, "SELECT * FROM spans", tmp_path / "empty", "--format", "jsonl")
    assert code == 0 and out == ""


def test_lists_and_timestamps_in_every_format(runs, capsys):
    sql = "SELECT tags, started, [1.5, 'nan'::DOUBLE] AS l FROM runs ORDER BY run"
    code, out, _ = cli(capsys, sql, runs, "--format", "jsonl")
    assert code == 0
    rec = json.loads(out.splitlines()[0])
    assert rec["tags"] is None or isinstance(rec["tags"], list)
    assert isinstance(rec["started"], str) and "T" in rec["started"]
    assert rec["l"] == [1.5, None]
    code, out, _ = cli(capsys, sql, runs, "--format", "csv")
    assert code == 0 and "[1.5,NaN]" in out


def test_the_command_runs_in_a_fresh_process(runs):
    env = {**os.environ, "COLUMNS": "100"}
    sql = "SELECT count(*) AS n FROM metrics"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "expr_tracker.cli.main",
            "query",
            sql,
            str(runs),
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(runs).parent,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [{"n": 10}]


def test_o_into_a_missing_folder_exits_1_and_files_get_ordinary_permissions(runs, capsys, tmp_path):
    code, out, err = cli(
        capsys, "SELECT 1 AS x", runs, "--format", "csv", "-o", tmp_path / "no" / "x.csv"
    )
    assert code == 1 and "cannot write" in err
    dest = tmp_path / "x.csv"
    old = os.umask(0o022)
    try:
        assert cli(capsys, "SELECT 1 AS x", runs, "--format", "csv", "-o", dest)[0] == 0
    finally:
        os.umask(old)
    assert dest.stat().st_mode & 0o777 == 0o644
    assert dest.read_text() == "x\n1\n"


def test_dir_that_is_a_metrics_file_is_a_clean_error(runs, capsys):
    code, out, err = cli(capsys, "SELECT count(*) FROM metrics", runs / "p" / "a" / "metrics.jsonl")
    assert code == 1 and out == ""
    assert "is a file" in err and str(runs / "p" / "a") in err


def test_no_runs_found_says_where_runs_are_looked_for(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, out, err = cli(
        capsys, "SELECT count(*) AS n FROM metrics", tmp_path / "empty", "--format", "csv"
    )
    assert code == 0 and out.splitlines() == ["n", "0"]
    assert "no runs under" in err and "6 folders below" in err
    # a column of runs that do not exist: the error says no run was found
    code, _, err = cli(capsys, 'SELECT "config.lr" FROM runs', tmp_path / "empty")
    assert code == 2 and "no runs under" in err


def test_parquet_of_an_interval_is_a_clean_error_and_leaves_no_file(runs, tmp_path, capsys):
    dest = tmp_path / "out" / "d.parquet"
    dest.parent.mkdir()
    sql = "SELECT run, ended - started AS d FROM runs"
    code, _, err = cli(capsys, sql, runs, "--format", "parquet", "-o", dest)
    assert code == 2 and "'d'" in err and "INTERVAL" in err and "epoch(" in err
    assert list(dest.parent.iterdir()) == []


def test_json_sum_of_integers_is_an_int_and_an_interval_seconds(runs, capsys):
    sql = "SELECT sum(steps) AS s, INTERVAL 90 SECOND AS iv, 1.25::DECIMAL(5, 2) AS d FROM runs"
    code, out, _ = cli(capsys, sql, runs, "--format", "jsonl")
    assert code == 0
    row = json.loads(out)
    assert row == {"s": 4, "iv": 90.0, "d": 1.25} and type(row["s"]) is int
    code, out, _ = cli(capsys, sql, runs, "--format", "csv")
    assert out.splitlines()[1] == "4,90.0,1.25"


def test_ctrl_c_while_writing_o_file_leaves_no_temporary_file(runs, tmp_path, capsys, monkeypatch):
    import expr_tracker.cli.query as cq

    def interrupted(rel, args, sink, **_):
        sink.text().write("run,step\n")
        raise KeyboardInterrupt

    monkeypatch.setattr(cq, "_write", interrupted)
    dest = tmp_path / "out" / "m.csv"
    dest.parent.mkdir()
    code = main(["query", "SELECT * FROM metrics", str(runs), "--format", "csv", "-o", str(dest)])
    assert code == 130 and list(dest.parent.iterdir()) == []


#: every plain column type, with NULL, NaN, ±inf, -0.0, text needing CSV quotes, repeated names
PLAIN_SQL = (
    "SELECT run, step, metric, value, text, value::FLOAT AS f, step::TINYINT AS t, "
    "step::UBIGINT AS u, step % 2 = 0 AS even, NULL::DOUBLE AS nothing, "
    "'-0.0'::DOUBLE AS negzero, 'a,\"b\"\nc' AS quoted, step AS step "
    "FROM metrics ORDER BY run, step, metric"
)


@pytest.mark.parametrize("fmt", ["csv", "json", "jsonl", "table"])
def test_plain_columns_written_without_arrow_as_through_arrow(runs, capsys, monkeypatch, fmt):
    """A result of plain columns (bool, integers, floats, text) is written from DuckDB's
    rows without pyarrow: byte for byte what the Arrow path writes."""
    import expr_tracker.cli.query as cq

    monkeypatch.setenv("COLUMNS", "200")
    calls = []
    real = cq._plain_rows

    def spy(*a):
        got = real(*a)
        calls.append(got is not None)
        return got

    monkeypatch.setattr(cq, "_plain_rows", spy)
    code, plain, err = cli(capsys, PLAIN_SQL, runs, "--format", fmt)
    assert code == 0, err
    assert calls == [True]
    monkeypatch.setattr(cq, "_plain_rows", lambda *a: None)
    code, arrow, err = cli(capsys, PLAIN_SQL, runs, "--format", fmt)
    assert code == 0, err
    assert plain == arrow


def test_other_types_and_scripts_go_through_arrow(runs, capsys, monkeypatch):
    import expr_tracker.cli.query as cq

    calls = []
    real = cq._plain_rows

    def spy(*a):
        got = real(*a)
        calls.append(got is not None)
        return got

    monkeypatch.setattr(cq, "_plain_rows", spy)
    for sql in (
        "SELECT 1.5 AS d, [1, 2] AS l",  # DECIMAL, a list
        "CREATE TABLE t AS SELECT 1 AS a; SELECT a FROM t",  # two statements: run once
    ):
        code, out, err = cli(capsys, sql, runs, "--format", "csv")
        assert code == 0, err
    assert calls == [False, False]
    assert out == "a\n1\n"


def test_warm_csv_query_imports_no_pyarrow(runs):
    """A fresh `et query --format csv` over an up-to-date cache, of plain columns, never
    imports pyarrow (nor numpy): ~0.15 s of a fresh process."""
    code = (
        "import sys\n"
        "from expr_tracker.cli.main import main\n"
        f"rc = main(['query', {SQL!r}, {str(runs)!r}, '--format', 'csv', '-o', sys.argv[1]])\n"
        "print(rc, sorted({'pyarrow', 'numpy', 'pandas'} & set(sys.modules)))\n"
    )
    out_file = runs.parent / "out.csv"
    first = subprocess.run(
        [sys.executable, "-c", code, str(out_file)], capture_output=True, text=True, check=True
    )  # builds the cache: pyarrow is needed there
    assert first.stdout.split()[0] == "0"
    warm = subprocess.run(
        [sys.executable, "-c", code, str(out_file)], capture_output=True, text=True, check=True
    )
    assert warm.stdout.strip() == "0 []", warm.stderr
    with open(out_file, encoding="utf-8") as f:
        assert len(list(csv.reader(f))) == 1 + 2 * 5  # header + 2 runs x (2 + 3 metrics)
