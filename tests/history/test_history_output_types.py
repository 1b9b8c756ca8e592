"""``et.history(output_type=...)``: ``records``/``list`` (row dicts) and ``pl`` (polars)
besides dict/dicts/pandas/pd/polars, matched exactly (``""`` is the default ``dict``); a bad
value (``"DICT "``, ``"Pandas"``) names the valid ones. ``et.query`` keeps any case."""

from __future__ import annotations

import pytest

import expr_tracker as et
from expr_tracker.history.frame import OUTPUT_TYPES, check_output_type

ROWS = [{"loss": 1.0, "acc": 0.1}, {"loss": 0.5}, {"loss": 0.25, "acc": 0.3}]


@pytest.fixture
def run(tmp_path):
    run = et.init(project="p", name="r", dir=str(tmp_path))
    for row in ROWS:
        et.log(row)
    yield run
    et.finish()


@pytest.mark.parametrize("name", ["dict", "dicts", "records", "list", ""])
def test_row_dict_names(run, name):
    rows = et.history(output_type=name)
    assert isinstance(rows, list) and [r["_step"] for r in rows] == [0, 1, 2]
    assert [{k: v for k, v in r.items() if k != "_time"} for r in rows] == [
        {"loss": 1.0, "acc": 0.1, "_step": 0},
        {"loss": 0.5, "_step": 1},
        {"loss": 0.25, "acc": 0.3, "_step": 2},
    ]


@pytest.mark.parametrize("name", ["pandas", "pd"])
def test_pandas_names(run, name):
    pd = pytest.importorskip("pandas")
    df = et.history(output_type=name, metrics=["loss", "acc"])
    assert isinstance(df, pd.DataFrame)
    assert list(df.columns) == ["_step", "_time", "loss", "acc"]
    assert df["loss"].tolist() == [1.0, 0.5, 0.25]


@pytest.mark.parametrize("name", ["polars", "pl"])
def test_polars_names(run, name):
    pl = pytest.importorskip("polars")
    df = et.history(output_type=name, include_meta=False)
    assert isinstance(df, pl.DataFrame)
    assert df.columns == ["loss", "acc"]
    assert df["acc"].to_list() == [0.1, None, 0.3]


def test_offline_read_takes_the_same_names(run):
    et.get_run().flush()
    rows = et.read_history(run.dir, output_type="records")
    assert [r["loss"] for r in rows] == [1.0, 0.5, 0.25]
    pl = pytest.importorskip("polars")
    assert isinstance(et.history(run=run.dir, output_type="pl"), pl.DataFrame)


@pytest.mark.parametrize(
    "bad",
    ["frame", "numpy", None, 3, "dataframe", "DICT ", "Dict", " dict", "Pandas", "PL", "LIST"],
)
def test_a_bad_value_names_every_valid_one(run, bad):
    with pytest.raises(ValueError) as info:
        et.history(output_type=bad)
    text = str(info.value)
    assert f"output_type={bad!r}" in text
    for name in ("dict", "dicts", "records", "list", "pandas", "pd", "polars", "pl"):
        assert name in text


def test_check_output_type_canonical_shapes():
    assert {check_output_type(n) for n in OUTPUT_TYPES} == {"dicts", "pandas", "polars"}
    assert check_output_type("") == "dicts"
    assert check_output_type("Pandas", exact=False) == "pandas"  # et.query's rule
    assert check_output_type(" PL ", exact=False) == "polars"
