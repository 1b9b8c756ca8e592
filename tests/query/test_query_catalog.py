"""Run discovery and identity for ``et query`` (expr_tracker.query.catalog)."""

from __future__ import annotations

import json
import shutil

import pytest

import expr_tracker as et
from expr_tracker.query.catalog import Producer, discover


def _run(root, project, name, *, steps=2, **init):
    et.init(project=project, name=name, dir=str(root), **init)
    for i in range(steps):
        with et.span("fwd"):
            pass
        et.log({"loss": 1.0 / (i + 1)})
    et.finish()


def test_producers_of_a_run_with_streams(tmp_path):
    root = tmp_path / "runs"
    _run(root, "p", "r1")
    _run(root, "p", "r1", stream="eval")
    prods = discover(root)
    assert [(p.run_id, p.stream, p.rank) for p in prods] == [("p/r1", None, 0), ("p/r1", "eval", 0)]
    main, ev = prods
    d = root / "p" / "r1"
    assert main.metrics == d / "metrics.jsonl" and ev.metrics == d / "metrics.eval.jsonl"
    assert main.spans == d / "spans.jsonl" and ev.spans == d / "spans.eval.jsonl"
    assert main.run_file == d / "run.json" and ev.run_file == d / "run.eval.json"
    assert main.config == d / "config.json" and ev.config == d / "config.eval.json"
    assert main.summary == d / "summary.json"
    assert main.alerts is None and main.artifacts is None
    assert main.project == "p" and main.name == "r1"


def test_root_may_be_the_run_dir_itself(tmp_path):
    root = tmp_path / "runs"
    _run(root, "p", "r1")
    prods = discover(root / "p" / "r1")
    assert [p.run_id for p in prods] == ["p/r1"]


def test_rank_shards_only(tmp_path):
    d = tmp_path / "runs" / "p" / "dist"
    d.mkdir(parents=True)
    for r in (1, 2):
        (d / f"metrics.rank{r}.jsonl").write_text('{"loss":1.0,"_step":0}\n')
    prods = discover(tmp_path / "runs")
    assert [(p.run_id, p.stream, p.rank) for p in prods] == [
        ("p/dist", None, 1),
        ("p/dist", None, 2),
    ]
    assert prods[0].metrics == d / "metrics.rank1.jsonl" and prods[0].run_file is None


def test_identity_from_meta_run_block_then_folder_names(tmp_path):
    d = tmp_path / "runs" / "folder-proj" / "folder-name"
    d.mkdir(parents=True)
    (d / "metrics.jsonl").write_text('{"a":1,"_step":0}\n')
    [p] = discover(tmp_path / "runs")
    assert (p.project, p.name, p.run_id) == (
        "folder-proj",
        "folder-name",
        "folder-proj/folder-name",
    )
    meta = {"schema": 2, "run": {"project": "mp", "name": "mn", "stream": None, "rank": 0}}
    (d / "metrics.meta.json").write_text(json.dumps(meta))
    [p] = discover(tmp_path / "runs")
    assert p.run_id == "mp/mn"


def test_empty_run_is_a_producer_without_metrics(tmp_path):
    d = tmp_path / "runs" / "p" / "empty"
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"status": "finished", "project": "p", "name": "e"}))
    [p] = discover(tmp_path / "runs")
    assert (
        p.run_id == "p/e" and p.metrics is None and p.spans is None and p.run_file == d / "run.json"
    )


def test_copies_of_a_run_get_path_qualified_ids(tmp_path):
    root = tmp_path / "runs"
    _run(root / "a", "p", "r1")
    shutil.copytree(root / "a", root / "b")
    _run(root / "a", "p", "other")
    prods = discover(root)
    ids = sorted(p.run_id for p in prods)
    assert ids == ["a/p/r1", "b/p/r1", "p/other"]
    assert isinstance(prods[0], Producer)


def test_hydra_multirun_nested_dirs_with_same_name(tmp_path):
    base = tmp_path / "multirun" / "2026-12-01" / "20-00-00"
    for n in range(3):
        d = base / str(n)
        d.mkdir(parents=True)
        info = {"status": "finished", "project": "sweep", "name": "job"}
        (d / "run.json").write_text(json.dumps(info))
        (d / "metrics.jsonl").write_text(f'{{"lr":{n},"_step":0}}\n')
    prods = discover(tmp_path)
    assert sorted(p.run_id for p in prods) == [
        f"multirun/2026-12-01/20-00-00/{n}" for n in range(3)
    ]
    assert len({p.run_dir for p in prods}) == 3


def test_missing_root_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        discover(tmp_path / "nope")
