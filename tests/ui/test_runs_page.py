"""ui/runs.py runs_page (what /api/runs answers): the config keys that differ as default
columns, `values` without shipping whole configs, order and filter through
query/runselect.py (a bad one a 400 naming it), archived runs hidden and counted, a
summary written later read again."""

from __future__ import annotations

import json

import pytest

import expr_tracker as et

pytest.importorskip("duckdb", reason="et ui needs the query extra")

from expr_tracker.cli.main import main  # noqa: E402
from expr_tracker.ui.catalog import Catalog  # noqa: E402
from expr_tracker.ui.errors import BadRequest  # noqa: E402
from expr_tracker.ui.runs import runs_page  # noqa: E402


def test_runs_page_columns_order_filter_archived(tmp_path):
    root = tmp_path / "runs"
    for name, lr in (("a", 0.1), ("b", 0.01), ("c", 0.001)):
        et.init(project="p", name=name, dir=str(root), config={"lr": lr, "same": 1})
        et.log({"loss": lr})
        et.finish(exit_code=1 if name == "c" else 0)
    cat = Catalog(root, tmp_path / "cache")
    page = runs_page(cat)
    assert page["columns"] == ["config.lr"] and page["labels"] == ["lr"]
    assert "config.same" in page["keys"] and "summary.loss" in page["keys"]
    line = page["runs"][0]
    assert "config" not in line and "summary" not in line and line["values"] == {"config.lr": 0.001}
    page = runs_page(cat, columns="loss,status", sort="-loss", where="status != failed")
    assert [r["run"] for r in page["runs"]] == ["p/a", "p/b"]
    assert page["runs"][0]["values"] == {"summary.loss": 0.1, "status": "finished"}
    with pytest.raises(BadRequest, match="where 'lr >': it ends too early"):
        runs_page(cat, where="lr >")
    with pytest.raises(BadRequest, match="sort 'nope'"):
        runs_page(cat, sort="nope")
    assert main(["runs", "archive", "a", "--dir", str(root)]) == 0
    cat = Catalog(root, tmp_path / "cache")
    page = runs_page(cat)
    assert sorted(r["run"] for r in page["runs"]) == ["p/b", "p/c"]
    assert page["total"] == 3 and page["hidden"] == 1
    page = runs_page(cat, archived=True, where="archived = true")
    assert [r["run"] for r in page["runs"]] == ["p/a"] and page["runs"][0]["archived"] is True
    # a summary changed later is read again
    (root / "p" / "b" / "summary.json").write_text(json.dumps({"loss": 5.0}))
    cat = Catalog(root, tmp_path / "cache")
    page = runs_page(cat, columns="loss", where="loss > 1")
    assert [r["run"] for r in page["runs"]] == ["p/b"]
