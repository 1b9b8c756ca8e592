"""One rule names a run for every command (docs/cli.md "Naming a run"):
``query.catalog.resolve_run`` behind ``et history``, ``et alerts``, ``et plot``,
``et compare`` and the run pages of ``et ui``."""

from __future__ import annotations

import json

import pytest

import expr_tracker as et
from expr_tracker.cli.main import main
from expr_tracker.query.catalog import (
    RunNotFoundError,
    discover,
    match_runs,
    resolve_run,
    run_entries,
)


def _run(root, project, name):
    et.init(project=project, name=name, dir=str(root))
    et.log({"loss": 1.0})
    et.finish()
    return root / project / name


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "runs"
    _run(root, "p", "a")
    _run(root, "q", "a")
    _run(root, "p", "solo")
    return root


def test_the_rule(root, monkeypatch):
    entries = run_entries(discover(root), root)
    assert [e.rel for e in match_runs("p/a", entries)] == ["p/a"]  # the folder wins
    assert [e.rel for e in match_runs("solo", entries)] == ["p/solo"]  # a name
    assert sorted(e.rel for e in match_runs("a", entries)) == ["p/a", "q/a"]
    assert resolve_run("q/a", root).path == root / "q" / "a"
    with pytest.raises(RunNotFoundError, match="ambiguous") as err:
        resolve_run("a", root)
    assert err.value.candidates == ("p/a", "q/a")
    with pytest.raises(RunNotFoundError, match="close matches: .*solo"):
        resolve_run("sol", root)
    monkeypatch.chdir(root / "p")
    assert resolve_run("solo", root).entry is None  # an existing path is that path
    with pytest.raises(RunNotFoundError, match="no such path$"):
        resolve_run("./solo2", root)  # a path only: never looked up as a name


def test_every_command_follows_it(root, capsys):
    assert main(["history", "solo", "--dir", str(root), "--format", "json"]) == 0
    assert [r["loss"] for r in json.loads(capsys.readouterr().out)] == [1.0]
    assert main(["history", "a", "--dir", str(root)]) == 1
    assert "ambiguous" in capsys.readouterr().err
    assert main(["alerts", "q/a", "--dir", str(root), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["compare", "p/a", "q/a", "--dir", str(root), "--format", "json"]) == 0
    capsys.readouterr()
    assert main(["compare", "a", "solo", "--dir", str(root)]) == 1
    assert "ambiguous" in capsys.readouterr().err


def test_the_dashboard_follows_it(root, tmp_path):
    pytest.importorskip("duckdb")
    from expr_tracker.ui.catalog import Catalog
    from expr_tracker.ui.errors import NotFound

    cat = Catalog(root, tmp_path / "cache")
    assert cat.get("solo") == cat.get("p/solo")  # a name, as on the command line
    with pytest.raises(NotFound, match="several runs"):
        cat.get("a")
