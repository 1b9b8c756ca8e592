"""et ranks: span time across ranks, from rank files written here directly."""

from __future__ import annotations

import argparse
import io
import json
import random

import pytest

from expr_tracker.cli.ranks import run_ranks
from expr_tracker.history.peers import rank_skew
from expr_tracker.history.rankreport import rank_report


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def run3(tmp_path):
    """Three ranks, 10 steps; rank 2 is slow in forward from step 4; rank 1 misses step 9
    of data; rank 0 has an extra span no other rank has."""
    d = tmp_path / "run"
    d.mkdir()
    for r in range(3):
        rows = []
        for s in range(10):
            fwd = 40.0 if (r == 2 and s >= 4) else 10.0 + r
            row = {"_step": s, "_time": 1.7e9 + s, "time_ms/forward": fwd, "loss": 1.0}
            if not (r == 1 and s == 9):
                row["time_ms/data"] = 5.0
            if r == 0:
                row["time_ms/only0"] = 1.0
            rows.append(row)
        write(d / ("metrics.jsonl" if r == 0 else f"metrics.rank{r}.jsonl"), rows)
    return d


def test_report_figures(run3):
    rep = rank_report(run3)
    assert rep["ranks"] == [0, 1, 2]
    spans = {s["span"]: s for s in rep["spans"]}
    fwd = spans["forward"]
    assert fwd["steps"] == 10 and fwd["incomplete"] == 0 and fwd["ranks"] == 3
    assert fwd["median_ms"] == 11.0  # medians per step: 11 each step
    assert fwd["max_ms"] == 40.0  # maxima: 12 x4, 40 x6 -> median 40
    assert fwd["skew_median"] == pytest.approx(40 / 11)
    assert fwd["skew_max"] == pytest.approx(40 / 11)
    assert fwd["slowest"] == {2: 10}
    data = spans["data"]
    assert data["steps"] == 9 and data["incomplete"] == 1
    assert data["slowest"] == {0: 9}  # a tie names the lowest rank, as skew() does
    only0 = spans["only0"]
    assert only0["ranks"] == 1 and only0["steps"] == 0 and only0["median_ms"] is None
    assert [s["span"] for s in rep["spans"]][:2] == ["forward", "data"]


def test_step_range(run3):
    fwd = {s["span"]: s for s in rank_report(run3, step_range=(0, 4))["spans"]}["forward"]
    assert fwd["steps"] == 4 and fwd["slowest"] == {2: 4} and fwd["max_ms"] == 12.0


def test_vectorised_figures_match_rank_skew(tmp_path):
    """The report's numpy skew is the DSL's rank_skew, step by step."""
    rng = random.Random(7)
    d = tmp_path / "run"
    d.mkdir()
    grid = [[rng.choice([rng.uniform(0.1, 50.0), 7.0]) for _ in range(4)] for _ in range(50)]
    for r in range(4):
        rows = [{"_step": s, "time_ms/x": grid[s][r]} for s in range(50)]
        write(d / ("metrics.jsonl" if r == 0 else f"metrics.rank{r}.jsonl"), rows)
    x = rank_report(d)["spans"][0]
    per_step = [rank_skew(row) for row in grid]
    skews = sorted(p[0] for p in per_step)
    assert x["skew_max"] == pytest.approx(skews[-1])
    assert x["skew_median"] == pytest.approx((skews[24] + skews[25]) / 2)
    counts: dict[int, int] = {}
    for _, rank in per_step:
        counts[rank] = counts.get(rank, 0) + 1
    assert x["slowest"] == counts


def args(run, **kw):
    base = {"run": str(run), "stream": None, "step_range": None, "dir": "runs", "format": "table"}
    return argparse.Namespace(**{**base, **kw})


def test_cli_table_and_json(run3, capsys):
    out = io.StringIO()
    assert run_ranks(args(run3), out) == 0
    text = out.getvalue()
    assert "forward" in text and "rank 2: 10" in text and "3.64x" in text
    assert "9 (+1 incomplete)" in text
    out = io.StringIO()
    assert run_ranks(args(run3, format="json"), out) == 0
    doc = json.loads(out.getvalue())
    assert doc[0]["span"] == "forward" and doc[0]["slowest"] == {"2": 10}


def test_cli_errors(tmp_path, capsys):
    assert run_ranks(args(tmp_path / "nope"), io.StringIO()) == 1
    assert "nope" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert run_ranks(args(tmp_path / "empty"), io.StringIO()) == 1
    assert "no metrics file of the main stream" in capsys.readouterr().err
    assert run_ranks(args(tmp_path, step_range="x"), io.StringIO()) == 2
    assert run_ranks(args(tmp_path, stream="a/b"), io.StringIO()) == 2
    one = tmp_path / "one"
    one.mkdir()
    write(one / "metrics.jsonl", [{"_step": 0, "time_ms/f": 1.0}])
    out = io.StringIO()
    assert run_ranks(args(one), out) == 0
    assert "has one rank" in capsys.readouterr().err
    assert out.getvalue() == ""  # the message alone, no empty table under it
    out = io.StringIO()
    assert run_ranks(args(one, format="json"), out) == 0
    assert [r["ranks"] for r in json.loads(out.getvalue())] == [1]  # records stay whole
