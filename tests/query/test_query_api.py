"""``et.query(sql, dir=..., output_type=...)``: output types, errors, parameters."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

pytest.importorskip("duckdb")
pa = pytest.importorskip("pyarrow")

from helpers import run_py  # noqa: E402

import expr_tracker as et  # noqa: E402
from expr_tracker.errors import ExprTrackerError, QueryError  # noqa: E402

SQL = "SELECT step, metric, value, text FROM metrics ORDER BY run, step, metric"


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    for name, lr in (("a", 0.1), ("b", 0.01)):
        run = et.init(project="p", name=name, dir=str(root), config={"lr": lr}, reinit="create_new")
        run.log({"loss": 1.0, "x": float("nan")})
        run.log({"loss": float("inf"), "x": float("-inf"), "s": "hi"})
        run.finish()
    return root


def _is_nan(v):
    return isinstance(v, float) and math.isnan(v)


def test_dicts_keep_nan_inf_and_null(runs):
    rows = et.query(SQL + " LIMIT 5", runs, output_type="dicts")
    assert [r["metric"] for r in rows] == ["loss", "x", "loss", "s", "x"]
    assert rows[0]["value"] == 1.0 and _is_nan(rows[1]["value"])
    assert rows[2]["value"] == math.inf and rows[4]["value"] == -math.inf
    assert rows[3]["value"] is None and rows[3]["text"] == "hi"


def test_arrow_and_polars_tell_null_from_nan(runs):
    table = et.query(SQL, runs, output_type="arrow")
    assert isinstance(table, pa.Table)
    values = table.column("value").to_pylist()
    assert sum(v is None for v in values) == 2 and sum(_is_nan(v) for v in values) == 2
    pl = pytest.importorskip("polars")
    df = et.query(SQL, runs, output_type="polars")
    assert isinstance(df, pl.DataFrame)
    assert df["value"].null_count() == 2 and df["value"].is_nan().sum() == 2
    assert df["value"].to_list()[2] == math.inf


def test_pandas_is_the_default_and_output_type_ignores_case(runs):
    pd = pytest.importorskip("pandas")
    df = et.query(SQL, runs)
    assert isinstance(df, pd.DataFrame)
    assert list(df.columns) == ["step", "metric", "value", "text"]
    assert len(df) == 10
    assert df["value"].isin([math.inf, -math.inf]).sum() == 4
    assert isinstance(et.query("SELECT 1 AS x", runs, output_type="PANDAS"), pd.DataFrame)
    assert et.query("SELECT 1 AS x", runs, output_type="Dicts") == [{"x": 1}]


@pytest.mark.parametrize("bad", ["json", "", None, 3])
def test_a_bad_output_type_names_the_argument_value_and_choices(runs, bad):
    with pytest.raises(ValueError) as info:
        et.query("SELECT 1", runs, output_type=bad)
    msg = str(info.value)
    assert "output_type" in msg and repr(bad) in msg
    for valid in ("pandas", "polars", "arrow", "dicts"):
        assert valid in msg


def test_bad_sql_is_a_query_error_with_duckdbs_message_and_the_views(runs):
    with pytest.raises(QueryError) as info:
        et.query("SELECT nope FROM metrics", runs)
    err = info.value
    assert isinstance(err, ExprTrackerError) and isinstance(err, et.QueryError)
    assert "nope" in err.message and "nope" in str(err)
    assert set(err.views) == {"runs", "metrics", "spans", "alerts", "artifacts"}
    assert ("config.lr", "DOUBLE") in err.views["runs"]
    assert "metrics(project VARCHAR, run VARCHAR" in str(err)
    assert err.sql == "SELECT nope FROM metrics"
    with pytest.raises(QueryError, match="(?i)syntax|parser"):
        et.query("SELEC 1", runs)


def test_empty_sql_is_a_value_error(runs):
    with pytest.raises(ValueError, match="sql"):
        et.query("  ", runs)


def test_params_are_bound_not_pasted(runs):
    hostile = "loss'; DROP VIEW metrics; --"
    assert et.query(
        "SELECT count(*) AS n FROM metrics WHERE metric = ?",
        runs,
        output_type="dicts",
        params=[hostile],
    ) == [{"n": 0}]
    got = et.query(
        "SELECT count(*) AS n FROM metrics WHERE metric = $m",
        runs,
        output_type="dicts",
        params={"m": "loss"},
    )
    assert got == [{"n": 4}]


def test_config_columns_answer_the_sweep_question(runs):
    got = et.query(
        'SELECT r."config.lr" AS lr, max(m.value) AS best FROM runs r JOIN metrics m USING (run)'
        " WHERE m.metric = 'loss' AND isfinite(m.value) GROUP BY lr ORDER BY lr",
        runs,
        output_type="dicts",
    )
    assert got == [{"lr": 0.01, "best": 1.0}, {"lr": 0.1, "best": 1.0}]


def test_a_statement_without_a_result_gives_an_empty_one(runs):
    assert et.query("CREATE TABLE t AS SELECT 1 AS x", runs, output_type="dicts") in (
        [],
        [{"Count": 1}],
    )
    assert et.query("SELECT 1 AS x; SELECT 2 AS y", runs, output_type="dicts") == [{"y": 2}]


def test_repeated_column_names_are_kept_apart(runs):
    got = et.query("SELECT 1 AS a, 2 AS a", runs, output_type="dicts")
    assert got == [{"a": 1, "a_1": 2}]
    assert et.query("SELECT 1 AS a, 2 AS a", runs, output_type="arrow").column_names == [
        "a",
        "a_1",
    ]


def test_an_empty_dir_answers_with_no_rows(tmp_path):
    (tmp_path / "empty").mkdir()
    assert et.query("SELECT * FROM metrics", tmp_path / "empty", output_type="dicts") == []
    assert et.query("SELECT count(*) AS n FROM runs", tmp_path / "empty", output_type="dicts") == [
        {"n": 0}
    ]


def test_a_missing_dir_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        et.query("SELECT 1", tmp_path / "nope")


def test_default_dir_is_runs_in_the_working_directory(runs, monkeypatch):
    monkeypatch.chdir(runs.parent)
    assert et.query("SELECT count(DISTINCT run) AS n FROM metrics", output_type="dicts") == [
        {"n": 2}
    ]


def test_cache_dir_is_used(runs, tmp_path):
    cache = tmp_path / "cache"
    et.query("SELECT count(*) FROM metrics", runs, cache_dir=cache, output_type="dicts")
    assert cache.exists() and any(cache.rglob("*"))


def test_without_duckdb_the_error_names_the_extra(runs):
    code = (
        "import sys; sys.modules['duckdb'] = None\n"
        "import expr_tracker as et\n"
        "try:\n"
        f"    et.query('SELECT 1', {str(runs)!r}, output_type='dicts')\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'expr-tracker[query]'" in out.stdout


def test_import_expr_tracker_imports_neither_duckdb_nor_pyarrow():
    code = "import sys, expr_tracker; print(sorted({'duckdb', 'pyarrow'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_query_error_over_no_runs_says_none_were_found(tmp_path):
    (tmp_path / "multirun").mkdir()
    with pytest.raises(et.QueryError) as info:
        et.query('SELECT "config.lr" FROM runs', tmp_path / "multirun")
    assert "no runs under" in str(info.value) and "6 folders below" in info.value.message


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"params": 5}, "params"),
        ({"params": "ab"}, "params"),  # not taken as the sequence ('a', 'b')
        ({"dir": None}, "dir"),
        ({"dir": 5}, "dir"),
        ({"cache_dir": 5}, "cache_dir"),
    ],
)
def test_wrong_types_name_the_keyword_and_the_value(tmp_path, kwargs, field):
    (tmp_path / "runs").mkdir()
    kwargs.setdefault("dir", tmp_path / "runs")
    with pytest.raises(TypeError, match=rf"^{field} must be .*not {kwargs[field]!r}"):
        et.query("SELECT ? AS a, ? AS b", **kwargs)


@pytest.mark.parametrize(
    ("sql", "want"),
    [
        ("SELECT * FROM metrics", {"metrics"}),
        ('SELECT "config.lr" FROM RUNS JOIN "metrics" USING (run)', {"runs", "metrics"}),
        ("select count(*) from spans where name = 'alerts'", {"spans", "alerts"}),  # over: ok
        ("SELECT 1", set()),
        ("SHOW TABLES", {"runs", "metrics", "spans", "alerts", "artifacts"}),
        (
            "SELECT * FROM information_schema.columns",
            {"runs", "metrics", "spans", "alerts", "artifacts"},
        ),
        ("SELECT * FROM duckdb_views()", {"runs", "metrics", "spans", "alerts", "artifacts"}),
        ("SELECT * FROM metrics_x", set()),
    ],
)
def test_a_query_builds_the_views_it_names(sql, want):
    from expr_tracker.query.views import referenced_views

    assert referenced_views(sql) == want


def test_a_metrics_query_leaves_the_small_views_out_yet_sees_every_row(runs):
    """A repeated aggregate over ``metrics`` builds no ``runs``/``alerts``/``artifacts``
    table (their files are not read), and answers exactly as with every view built."""
    from expr_tracker.query.views import connect

    sql = "SELECT run, metric, count(*) AS n FROM metrics GROUP BY ALL ORDER BY ALL"
    part = connect(runs, views={"metrics"})
    full = connect(runs)
    try:
        built = {r[0] for r in part.execute("SELECT view_name FROM duckdb_views()").fetchall()}
        assert {"metrics"} <= built and not built & {"runs", "alerts", "artifacts", "spans"}
        assert part.execute(sql).fetchall() == full.execute(sql).fetchall()
    finally:
        part.close()
        full.close()
    assert et.query(sql, runs, output_type="dicts") == et.query(
        sql + " -- runs alerts artifacts spans", runs, output_type="dicts"
    )


def test_a_bad_metrics_query_still_lists_every_view_and_the_config_columns(runs):
    with pytest.raises(QueryError) as err:
        et.query("SELECT nope FROM metrics", runs, output_type="dicts")
    assert set(err.value.views) == {"runs", "metrics", "spans", "alerts", "artifacts"}
    assert "config.lr" in [c for c, _ in err.value.views["runs"]]
    rows = et.query("SHOW TABLES", runs, output_type="dicts")
    assert {"runs", "metrics", "spans", "alerts", "artifacts"} <= {r["name"] for r in rows}


# DuckDB draws its progress bar on standard output once a query runs past
# ``progress_bar_time`` (2 s by default). The script lowers that to 20 ms on every connection
# it opens (longer than the tracker's own setup statements take), so that a query of a
# fraction of a second stands in for a long one: a bar would land among the JSON it prints.
_PROGRESS_SCRIPT = """
import json, sys
import duckdb

_connect = duckdb.connect


def connect(*args, **kwargs):
    con = _connect(*args, **kwargs)
    con.execute("SET progress_bar_time = 20")
    return con


duckdb.connect = connect
import expr_tracker as et

rows = et.query(
    "SELECT count(*) AS n, sum(hash(i)) > 0 AS ok FROM metrics, range(4000000) t(i)",
    sys.argv[1],
    output_type="dicts",
)
print(json.dumps(rows))
"""


def test_a_long_query_prints_no_progress_bar_into_standard_output(runs):
    p = run_py(_PROGRESS_SCRIPT, str(runs), timeout=120)
    assert p.stdout == '[{"n": 40000000, "ok": true}]\n', p.stdout[:300]
