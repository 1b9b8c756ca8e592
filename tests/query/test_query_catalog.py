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


def _bare_run(d, project, name):
    d.mkdir(parents=True)
    (d / "run.json").write_text(
        json.dumps({"status": "finished", "project": project, "name": name})
    )


def test_qualified_id_never_collides_with_another_run(tmp_path):
    # two copies of x/y (qualified as "p/r1" and "q/r1") and a third run whose own id is p/r1
    _bare_run(tmp_path / "p" / "r1", "x", "y")
    _bare_run(tmp_path / "q" / "r1", "x", "y")
    _bare_run(tmp_path / "z" / "other", "p", "r1")
    prods = discover(tmp_path)
    ids = [p.run_id for p in prods]
    assert len(set(ids)) == 3
    by_dir = {p.run_dir: p.run_id for p in prods}
    assert by_dir[tmp_path / "q" / "r1"] == "q/r1"
    assert by_dir[tmp_path / "z" / "other"] == str((tmp_path / "z" / "other").absolute())


def test_stream_and_rank_suffixes_together(tmp_path):
    d = tmp_path / "p" / "r"
    d.mkdir(parents=True)
    for f in (
        "metrics.eval.rank1.jsonl",
        "spans.eval.rank1.jsonl",
        "run.eval.rank1.json",
        "config.eval.json",
        "metrics.rank2.jsonl",
        "alerts.jsonl",
        "artifacts.jsonl",
        "metrics.meta.json",
        "metric_defs.json",
        "metrics.jsonl.lock",
    ):
        (d / f).write_text("{}\n")
    prods = discover(tmp_path)
    keys = [(p.stream, p.rank) for p in prods]
    assert keys == [(None, 0), (None, 2), ("eval", 1)]
    main, r2, ev = prods
    assert main.alerts == d / "alerts.jsonl" and main.artifacts == d / "artifacts.jsonl"
    assert main.metrics is None and r2.metrics == d / "metrics.rank2.jsonl"
    assert ev.metrics == d / "metrics.eval.rank1.jsonl" and ev.config == d / "config.eval.json"
    assert ev.run_file == d / "run.eval.rank1.json" and ev.spans == d / "spans.eval.rank1.jsonl"


def test_hostile_run_names_kept_exactly(tmp_path):
    name = 'it\'s "x"; drop ☃'
    _run(tmp_path / "runs", "pr'oj", name, steps=1)
    [p] = discover(tmp_path / "runs")
    assert (p.project, p.name, p.run_id) == ("pr'oj", name, f"pr'oj/{name}")
    assert p.metrics is not None and p.metrics.is_file()


def test_hydra_multirun_with_chdir_is_found_from_the_multirun_folder(tmp_path):
    # hydra.job.chdir=true: each job's ./runs is inside its job folder, six folders below
    # multirun/ (<date>/<time>/<job>/runs/<project>/<name>); et query multirun finds them all
    for n in range(3):
        job = tmp_path / "multirun" / "2026-12-01" / "20-00-00" / str(n)
        _run(job / "runs", "sweep", f"job{n}", steps=1)
    prods = discover(tmp_path / "multirun")
    assert sorted(p.run_id for p in prods) == [f"sweep/job{n}" for n in range(3)]


def test_root_that_is_a_file_names_its_run(tmp_path):
    _run(tmp_path, "p", "r", steps=1)
    metrics = tmp_path / "p" / "r" / "metrics.jsonl"
    with pytest.raises(FileNotFoundError, match="is a file") as info:
        discover(metrics)
    assert str(metrics.parent) in str(info.value)


def test_symlinked_runs_are_found_once_and_a_link_cycle_ends(tmp_path):
    # a folder of hand-picked runs linked from the sweep: a link to one run, a link to the
    # whole sweep (which holds that run too) and a link back up (a cycle)
    for n in ("a", "b"):
        _run(tmp_path / "sweep", "p", n, steps=1)
    picked = tmp_path / "picked"
    picked.mkdir()
    (picked / "a").symlink_to(tmp_path / "sweep" / "p" / "a")
    (picked / "all").symlink_to(tmp_path / "sweep")
    (picked / "up").symlink_to(tmp_path)
    prods = discover(picked)
    assert [p.run_id for p in prods] == ["p/a", "p/b"]
    assert prods[0].run_dir == picked / "a"
