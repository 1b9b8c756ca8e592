"""compare_runs over real run directories written by et.init/et.log: config and identity
differences, summaries side by side with the best run marked, how RUN names resolve, and
the inputs users break it with (missing vs null, NaN, look-alike values, copied trees,
streams, rank shards, hostile names, a torn summary)."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest

import expr_tracker as et
from expr_tracker.history.values import flatten
from expr_tracker.query.compare import CompareError, compare_runs, goal_from_name


def make_run(name, project="p", config=None, rows=(), dir="runs", summary=None, **init):
    et.init(project=project, name=name, dir=dir, config=config or {}, **init)
    for r in rows:
        et.log(dict(r))
    for k, v in (summary or {}).items():
        et.summary[k] = v
    run_dir = et.get_run().dir
    et.finish()
    return run_dir


def row(result, section, key):
    name = "metric" if section == "summary" else "key"
    found = [r for r in result[section] if r[name] == key]
    assert len(found) == 1, (key, result[section])
    return found[0]


def keys(result, section):
    name = "metric" if section == "summary" else "key"
    return [r[name] for r in result[section]]


# ---------------------------------------------------------------------------- config


def test_config_rows_are_the_differing_dotted_keys_missing_apart_from_null():
    make_run("a", config={"lr": 0.1, "model": {"depth": 3, "act": "relu"}, "x": None, "n": 1})
    make_run("b", config={"lr": 0.01, "model": {"depth": 3, "act": "gelu"}, "n": 1, "y": 2})
    res = compare_runs(["a", "b"])
    assert keys(res, "config") == ["lr", "model.act", "x", "y"]
    assert row(res, "config", "lr")["values"] == [0.1, 0.01]
    x = row(res, "config", "x")
    assert x["values"] == [None, None] and x["missing"] == [1]  # null in a, absent in b
    y = row(res, "config", "y")
    assert y["values"] == [None, 2] and y["missing"] == [0]
    assert row(res, "config", "model.act")["path"] == ["model", "act"]
    every = compare_runs(["a", "b"], include_equal=True)
    assert row(every, "config", "n") == {
        "key": "n",
        "path": ["n"],
        "values": [1, 1],
        "missing": [],
        "equal": True,
    }
    assert row(every, "config", "model.depth")["equal"] is True
    assert not any(r["equal"] for r in res["config"])


def test_look_alike_values_differ_and_nan_equals_nan():
    make_run("a", config={"i": 1, "b": True, "s": "1", "nan": float("nan"), "l": [1, 2], "e": {}})
    make_run("b", config={"i": 1.0, "b": 1, "s": 1, "nan": float("nan"), "l": [1, 2], "e": {}})
    res = compare_runs(["a", "b"], include_equal=True)
    assert {r["key"]: r["equal"] for r in res["config"]} == {
        "i": False,
        "b": False,
        "s": False,
        "nan": True,
        "l": True,
        "e": True,
    }
    assert math.isnan(row(res, "config", "nan")["values"][0])


def test_a_dotted_key_and_a_nested_one_stay_two_rows():
    make_run("a", config={"a.b": 1, "a": {"b": 2}})
    make_run("b", config={"a.b": 1, "a": {"b": 3}})
    res = compare_runs(["a", "b"], include_equal=True)
    assert [(r["path"], r["values"]) for r in res["config"]] == [
        (["a.b"], [1, 1]),
        (["a", "b"], [2, 3]),
    ]


def test_flatten_leaves():
    assert flatten({"a": {"b": {"c": 1}}, "d": [1, {"e": 2}], "f": {}}) == {
        ("a", "b", "c"): 1,
        ("d",): [1, {"e": 2}],
        ("f",): {},
    }
    assert flatten({}) == {}


# ---------------------------------------------------------------------------- resolving


def test_runs_resolve_by_path_project_name_and_name(tmp_path):
    a = make_run("a", config={"lr": 1})
    make_run("b", config={"lr": 2})
    make_run("c", project="q", config={"lr": 3}, dir=str(tmp_path / "elsewhere"))
    res = compare_runs([str(a), "p/b", str(tmp_path / "elsewhere" / "q" / "c")])
    assert [r["run"] for r in res["runs"]] == ["p/a", "p/b", "q/c"]
    assert row(res, "config", "lr")["values"] == [1, 2, 3]
    # a relative path from the cwd and a name under another root
    res = compare_runs(["c", "runs/p/a"], root=tmp_path / "elsewhere")
    assert [r["run"] for r in res["runs"]] == ["q/c", "p/a"]


def test_an_ambiguous_name_lists_its_candidates():
    make_run("same", project="p1")
    make_run("same", project="p2")
    make_run("other")
    with pytest.raises(CompareError, match="ambiguous") as err:
        compare_runs(["same", "other"])
    assert "p1/same" in str(err.value) and "p2/same" in str(err.value)
    assert [r["run"] for r in compare_runs(["p1/same", "p2/same"])["runs"]] == [
        "p1/same",
        "p2/same",
    ]


def test_a_missing_run_names_close_matches():
    make_run("baseline-lr0.1")
    make_run("other")
    with pytest.raises(CompareError, match="close matches: .*baseline-lr0.1") as err:
        compare_runs(["baseline-lr0.01", "other"])
    assert "'baseline-lr0.01'" in str(err.value)
    with pytest.raises(CompareError, match="names no run"):
        compare_runs(["zzz", "other"], root="nowhere")


def test_the_same_run_twice_and_fewer_than_two_are_errors(tmp_path):
    a = make_run("a")
    make_run("b")
    with pytest.raises(CompareError, match="same run as 'a'"):
        compare_runs(["a", str(a)])
    with pytest.raises(CompareError, match="same run"):
        compare_runs(["a", "b", "p/a"])
    with pytest.raises(CompareError, match="at least two runs, got 1"):
        compare_runs(["a"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(CompareError, match="not a run"):
        compare_runs([str(tmp_path / "empty"), "a"])


def test_copied_trees_with_one_identity_are_told_apart_by_path(tmp_path):
    a = make_run("a", config={"lr": 1})
    shutil.copytree(a.parent, tmp_path / "runs" / "copy" / "p")
    cfg = tmp_path / "runs" / "copy" / "p" / "a" / "config.json"
    cfg.write_text(json.dumps({"lr": 2}))
    res = compare_runs(["p/a", "copy/p/a"])
    assert [r["run"] for r in res["runs"]] == ["p/a", "copy/p/a"]
    assert row(res, "config", "lr")["values"] == [1, 2]
    with pytest.raises(CompareError, match="ambiguous"):
        compare_runs(["a", "p/a"])


# ---------------------------------------------------------------------------- summary


def test_summary_side_by_side_with_the_best_run_marked():
    nan, inf = float("nan"), float("inf")
    make_run("a", rows=[{"loss": 0.5, "val/acc": 0.7, "lr": 0.1, "note": "x", "big": 2**70}])
    make_run("b", rows=[{"loss": 0.2, "val/acc": 0.9, "lr": 0.2, "note": "y", "big": 1}])
    make_run("c", rows=[{"loss": nan, "val/acc": 0.9, "lr": inf, "note": "z"}])
    res = compare_runs(["a", "b", "c"])
    # numeric keys only; span timings, _step/_time and strings left out
    assert keys(res, "summary") == ["loss", "val/acc", "lr", "big"]
    loss = row(res, "summary", "loss")
    assert loss["goal"] == "min" and loss["goal_from"] == "name" and loss["best"] == [1]
    assert math.isnan(loss["values"][2])
    acc = row(res, "summary", "val/acc")
    assert acc["goal"] == "max" and acc["best"] == [1, 2]  # a tie marks both
    lr = row(res, "summary", "lr")
    assert lr["goal"] is None and lr["best"] == [] and lr["values"] == [0.1, 0.2, inf]
    big = row(res, "summary", "big")
    assert big["values"] == [2**70, 1, None] and big["missing"] == [2]


def test_metrics_pick_names_and_globs_and_a_define_metric_goal_wins():
    for n, score in (("a", 1.0), ("b", 2.0)):
        et.init(project="p", name=n, dir="runs")
        et.define_metric("score", goal="minimize")  # a name that says max: the goal wins
        et.define_metric("val/*", summary="min,max")
        with et.span("fwd"):
            et.log({"score": score, "val/loss": score, "val/f1": score / 4, "tag": "t"})
        et.finish()
    res = compare_runs(["a", "b"], metrics=["score", "val/loss", "time_ms/*", "tag"])
    assert keys(res, "summary") == ["score", "val/loss.min", "val/loss.max", "time_ms/fwd", "tag"]
    score = row(res, "summary", "score")
    assert (score["goal"], score["goal_from"], score["best"]) == ("min", "define_metric", [0])
    assert row(res, "summary", "val/loss.max")["best"] == [0]
    assert row(res, "summary", "tag")["values"] == ["t", "t"]
    assert keys(compare_runs(["a", "b"], metrics=["val/*.max"]), "summary") == [
        "val/loss.max",
        "val/f1.max",
    ]
    assert row(compare_runs(["a", "b"]), "summary", "val/f1.max")["best"] == [1]
    with pytest.raises(CompareError, match=r"'scor' \(close: score\)"):
        compare_runs(["a", "b"], metrics=["scor"])


def test_goal_from_name():
    assert goal_from_name("train/loss") == "min"
    assert goal_from_name("val_error") == "min"
    assert goal_from_name("eval/ppl") == "min"
    assert goal_from_name("val/accuracy") == "max"
    assert goal_from_name("f1_macro") == "max"
    assert goal_from_name("episode_reward") == "max"
    assert goal_from_name("lr") is None
    assert goal_from_name("acc_loss") is None  # says both
    assert goal_from_name("loss/acc") == "max"  # the last part speaks


# ---------------------------------------------------------------------------- identity


def test_identity_rows_status_steps_tags_group_git():
    a = make_run("a", rows=[{"x": 1}] * 3, tags=["t1"], group="g1")
    make_run("b", rows=[{"x": 1}] * 5, tags=["t2"], group="g1")
    info = json.loads((a / "run.json").read_text())
    info["status"] = "failed"
    info["git"] = {"commit": "abc123", "dirty": True}
    (a / "run.json").write_text(json.dumps(info))
    res = compare_runs(["a", "b"])
    got = {r["key"]: r["values"] for r in res["identity"]}
    assert got["status"] == ["failed", "finished"]
    assert got["steps"][0] < got["steps"][1]
    assert got["tags"] == [["t1"], ["t2"]]
    assert got["git.commit"] == ["abc123", None]
    assert "group" not in got
    every = compare_runs(["a", "b"], include_equal=True)
    assert row(every, "identity", "group")["values"] == ["g1", "g1"]


def test_status_is_the_worst_of_every_producer_as_et_runs_judges_it():
    a = make_run("a")
    make_run("b")
    # a rank shard whose process died while running: the run reads crashed
    (a / "run.rank1.json").write_text(
        json.dumps({"status": "running", "host": os.uname().nodename, "pid": 2**22 + 12345})
    )
    res = compare_runs(["a", "b"])
    assert row(res, "identity", "status")["values"] == ["crashed", "finished"]
    assert json.loads((a / "run.rank1.json").read_text())["status"] == "running"  # only read


# ---------------------------------------------------------------------------- producers


def test_streams_and_rank_shards():
    for n in ("a", "b"):
        et.init(project="p", name=n, dir="runs", config={"k": n})
        et.log({"loss": 1.0})
        et.finish()
        et.init(project="p", name=n, dir="runs", stream="eval", config={"k": n + "-eval"})
        et.log({"eval/acc": 0.5 if n == "a" else 0.6})
        et.finish()
    main = compare_runs(["a", "b"])
    assert keys(main, "summary") == ["loss"]
    ev = compare_runs(["a", "b"], stream="eval")
    assert [r["stream"] for r in ev["runs"]] == ["eval", "eval"]
    assert keys(ev, "summary") == ["eval/acc"] and row(ev, "summary", "eval/acc")["best"] == [1]
    assert row(ev, "config", "k")["values"] == ["a-eval", "b-eval"]
    with pytest.raises(CompareError, match=r"no stream 'nope' \(streams there: \(main\), eval\)"):
        compare_runs(["a", "b"], stream="nope")
    with pytest.raises(CompareError, match="no rank 3"):
        compare_runs(["a", "b"], rank=3)


def test_a_run_with_only_rank_shards_compares_its_lowest_rank(monkeypatch):
    make_run("a", rows=[{"loss": 1.0}])
    monkeypatch.setenv("RANK", "2")
    make_run("b", rows=[{"loss": 0.5}])
    monkeypatch.delenv("RANK")
    assert sorted(p.name for p in Path("runs/p/b").glob("metrics*.jsonl")) == [
        "metrics.rank2.jsonl"
    ]
    res = compare_runs(["a", "b"])
    assert [r["rank"] for r in res["runs"]] == [0, 2]
    assert row(res, "summary", "loss")["values"] == [1.0, 0.5]
    assert row(res, "summary", "loss")["best"] == [1]


# ---------------------------------------------------------------------------- breaking it


def test_hostile_names_and_values_come_back_unchanged():
    hostile = {'it\'s "q"; drop': "[red]x", "ünï/коды": 1, "": "empty"}
    make_run("a'b;\"c", config=hostile, rows=[{"loss'\"; x": 1.0}])
    make_run("ünï", config={'it\'s "q"; drop': "[/]"}, rows=[{"loss'\"; x": 2.0}])
    res = compare_runs(["a'b;\"c", "ünï"])
    assert [r["run"] for r in res["runs"]] == ["p/a'b;\"c", "p/ünï"]
    assert row(res, "config", 'it\'s "q"; drop')["values"] == ["[red]x", "[/]"]
    assert row(res, "config", "ünï/коды")["missing"] == [1]
    assert row(res, "summary", "loss'\"; x")["best"] == [0]


def test_a_torn_summary_and_a_missing_config_warn_and_compare_the_rest():
    a = make_run("a", config={"lr": 1}, rows=[{"loss": 1.0}])
    make_run("b", config={"lr": 2}, rows=[{"loss": 2.0}])
    (a / "summary.json").write_text('{"loss": 1.0, "acc')
    (a / "config.json").unlink()
    res = compare_runs(["a", "b"])
    assert any("summary.json is not valid JSON" in w for w in res["warnings"])
    assert row(res, "config", "lr")["missing"] == [0]
    assert row(res, "summary", "loss")["missing"] == [0]
    assert row(res, "summary", "loss")["best"] == []  # one number is no comparison


def test_a_live_run_compares_while_it_writes():
    make_run("done", rows=[{"loss": 1.0}])
    et.init(project="p", name="live", dir="runs", config={"lr": 3})
    for _ in range(10):
        et.log({"loss": 0.5})
    et.get_run().flush()
    with open("runs/p/live/metrics.jsonl", "a") as f:
        f.write('{"_step": 10, "loss": 0.')  # a torn last line, as a writer mid-write leaves
    res = compare_runs(["done", "live"])
    assert row(res, "identity", "steps")["values"][1] == 10
    assert row(res, "identity", "status")["values"] == ["finished", "running"]
    assert row(res, "config", "lr")["missing"] == [0]
    et.finish()


def test_an_empty_run_compares_and_nothing_is_written(tmp_path):
    make_run("empty", config={"lr": 1})  # init + finish, no row
    make_run("full", config={"lr": 2}, rows=[{"loss": 1.0}])

    def tree():
        return {
            (str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in (tmp_path / "runs").rglob("*")
        }

    before = tree()
    res = compare_runs(["empty", "full"], include_equal=True)
    assert tree() == before  # only read: no cache, no repaired file
    assert row(res, "config", "lr")["values"] == [1, 2]
    loss = row(res, "summary", "loss")
    assert loss["missing"] == [0] and loss["best"] == []
    steps = row(res, "identity", "steps")["values"]
    assert steps[1] == 1 and steps[0] in (0, None)


def test_wrong_types_name_the_argument_and_a_metrics_string_is_a_list():
    make_run("a", rows=[{"train/loss": 1.0, "val/acc": 0.5}])
    make_run("b", rows=[{"train/loss": 2.0, "val/acc": 0.7}])
    # "train/*" was taken letter by letter ('t', 'r', ... match no summary key)
    res = compare_runs(["a", "b"], metrics="train/*")
    assert keys(res, "summary") == ["train/loss"] and row(res, "summary", "train/loss")["best"] == [
        0
    ]
    both = compare_runs(["a", "b"], metrics="val/acc, train/loss")
    assert sorted(keys(both, "summary")) == ["train/loss", "val/acc"]
    with pytest.raises(CompareError, match=r"runs='a' is one value: give a list of two or more"):
        compare_runs("a")  # was: "run 'a'" ... looked up letter by letter
    with pytest.raises(CompareError, match=r"runs: 3 is not a run"):
        compare_runs(["a", 3])  # was a TypeError
    with pytest.raises(CompareError, match=r"metrics: 1 is not a name or glob"):
        compare_runs(["a", "b"], metrics=[1])  # was an AttributeError
    with pytest.raises(CompareError, match=r"root=5 is not valid"):
        compare_runs(["a", "b"], root=5)


def test_a_killed_run_has_a_duration_up_to_its_last_row(tmp_path):
    """A run killed (SIGKILL, OOM) never writes ended_at: its duration is up to its last row
    (as for a running run); it was empty for the very runs a sweep's user looks into."""
    import subprocess
    import sys

    make_run("fin", rows=[{"loss": 1.0}, {"loss": 0.5}])
    code = (
        "import os, signal, expr_tracker as et\n"
        "et.init(project='p', name='dead', dir='runs')\n"
        "for s in range(3):\n"
        "    et.log({'loss': 0.1})\n"
        "et.get_run().flush()\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    subprocess.run([sys.executable, "-c", code], timeout=60)
    rows = [json.loads(line) for line in Path("runs/p/dead/metrics.jsonl").read_text().splitlines()]
    started = json.loads(Path("runs/p/dead/run.json").read_text())["started_at"]
    # include_equal: on a fast machine both runs can last the same millisecond, and a
    # comparison leaves out rows where every run agrees
    res = compare_runs(["fin", "dead"], include_equal=True)
    assert row(res, "identity", "status")["values"] == ["finished", "crashed"]
    # the run's whole life: wall and active time of its one attempt, up to its last row
    for key in ("wall_duration_s", "active_duration_s"):
        assert row(res, "identity", key)["values"][1] == round(rows[-1]["_time"] - started, 3)
    assert row(res, "identity", "first_started_at")["values"][1] == started
