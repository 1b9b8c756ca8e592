"""Groups of seeds and sweeps on the command line: `et plot --group-by`, `et compare
--group-by` (a table of final/best values per group) and `et compare --sweep` (the
importance table from the runs view), over real runs written by et.init/et.log."""

from __future__ import annotations

import json
import math
import random

import pytest

import expr_tracker as et
from expr_tracker.cli.main import main

pytest.importorskip("plotext")


@pytest.fixture
def seeds(tmp_path):
    """Two learning rates x three seeds under one folder (a multirun's layout); seed 1 logs
    every other step and seed 2 stops at step 30; one value of lr=0.1 seed 0 is NaN."""
    root = tmp_path / "multirun"
    for lr in (0.1, 0.01):
        for seed in range(3):
            et.init(
                project="sw",
                name=f"lr{lr}-s{seed}",
                dir=str(root / f"job-{lr}-{seed}"),
                config={"lr": lr, "seed": seed, "model": {"depth": 4}},
            )
            for step in range(40 if seed != 2 else 31):
                if seed == 1 and step % 2:
                    continue
                loss = lr * 10 + seed  # per group: mean over seeds 0..2 = lr*10 + 1
                if lr == 0.1 and seed == 0 and step == 5:
                    loss = float("nan")
                et.log({"train/loss": loss - step / 100, "val/acc": 0.5 + lr + seed}, step=step)
            et.finish()
    return root


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    got = capsys.readouterr()
    return rc, got.out, got.err


def test_plot_group_by_auto_draws_one_line_per_group(seeds, capsys):
    rc, out, err = run(
        capsys,
        "plot",
        str(seeds),
        "train/loss",
        "--group-by",
        "auto",
        "--width",
        "80",
        "--height",
        "12",
    )
    assert rc == 0, err
    assert "train/loss: mean, ± std" in out
    legend = [line for line in out.splitlines() if line.startswith(" ") and "runs" in line]
    assert len(legend) == 2, out
    by = {line.split(":")[0].split()[-1]: line for line in legend}
    assert set(by) == {"lr=0.1", "lr=0.01"}
    # steps 0..39: seed 1 logs even steps, seed 2 stops at 30 -> n per step 1..3
    assert "n per step 1–3" in by["lr=0.1"]
    assert "1 NaN/inf values left out" in by["lr=0.1"]
    # the last step (39) holds seed 0 only: its value, no band
    assert "last mean 0.61 at step 39" in by["lr=0.1"]
    assert "band" not in by["lr=0.1"].split("last mean")[1]


def test_plot_group_by_ci_median_and_usage_errors(seeds, capsys):
    rc, out, err = run(
        capsys,
        "plot",
        str(seeds),
        "train/loss",
        "--group-by",
        "lr",
        "--band",
        "ci",
        "--agg",
        "median",
        "--width",
        "80",
        "--height",
        "12",
    )
    assert rc == 0, err
    assert "median, 95 % bootstrap CI" in out
    rc, _, err = run(capsys, "plot", str(seeds), "train/loss", "--group-by", "depth")
    assert rc == 2 and "'depth' is no config key" in err and "model.depth" in err
    rc, _, err = run(capsys, "plot", str(seeds), "train/loss", "--group-by", "auto", "--x", "time")
    assert rc == 2 and "--x time cannot be grouped" in err


def test_compare_group_by_table_and_json(seeds, capsys):
    rc, out, err = run(capsys, "compare", str(seeds), "--group-by", "auto", "--width", "160")
    assert rc == 0, err
    assert "train/loss (min)" in out and "val/acc (max)" in out
    row = next(line for line in out.splitlines() if line.startswith("lr=0.01"))
    # finals (last steps 39, 38, 30): 0.1 - 0.39, 1.1 - 0.38, 2.1 - 0.30 -> mean 0.743333
    assert row.split()[1] == "3" and row.split()[2] == "0.743333"
    rc, out, _ = run(capsys, "compare", str(seeds), "--group-by", "lr", "--format", "json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["group_keys"] == ["lr"]
    assert [g["label"] for g in doc["groups"]] == ["lr=0.01", "lr=0.1"]
    loss = next(m for m in doc["metrics"] if m["metric"] == "train/loss")
    final = loss["final"][0]
    vals = [0.1 - 0.39, 1.1 - 0.38, 2.1 - 0.30]
    mean = sum(vals) / 3
    assert final["n"] == 3 and final["mean"] == pytest.approx(mean)
    assert final["std"] == pytest.approx(math.sqrt(sum((v - mean) ** 2 for v in vals) / 2))
    lo, hi = final["ci"]
    assert min(vals) <= lo <= mean <= hi <= max(vals)
    # best (min) over the series: the last step's value of each seed
    assert loss["best"][0]["mean"] == pytest.approx(mean)
    nan_group = loss["best"][1]  # lr=0.1: the NaN at step 5 is never a best value
    assert nan_group["n"] == 3


def test_compare_group_by_errors(seeds, capsys):
    rc, _, err = run(capsys, "compare", str(seeds), "--group-by", "nope")
    assert rc == 1 and "'nope' is no config key" in err
    rc, _, err = run(capsys, "compare", "--group-by", "auto")
    assert rc == 2 and "needs runs" in err
    rc, _, err = run(capsys, "compare", str(seeds), "--group-by", "auto", "--sweep")
    assert rc == 2 and "not both" in err
    rc, _, err = run(capsys, "compare", "a", "b", "--metric", "x")
    assert rc == 2 and "go with --sweep" in err


@pytest.fixture
def sweep_runs(tmp_path):
    """16 trials: val/acc depends on lr only (a parabola in log10 lr), wd and opt are noise."""
    pytest.importorskip("duckdb")
    root = tmp_path / "sweep"
    rnd = random.Random(0)
    for i in range(16):
        lr = 10 ** rnd.uniform(-4, -1)
        et.init(
            project="hp",
            name=f"t{i}",
            dir=str(root),
            config={"lr": lr, "wd": rnd.uniform(0, 0.1), "opt": rnd.choice(["adam", "sgd"])},
            group="g1" if i < 10 else "g2",
        )
        et.log({"val/acc": 0.9 - 0.1 * (math.log10(lr) + 2.5) ** 2 + rnd.gauss(0, 0.002)})
        et.finish()
    return root


@pytest.mark.slow
def test_compare_sweep_ranks_the_key_that_matters_first(sweep_runs, capsys):
    pytest.importorskip("sklearn")
    rc, out, err = run(capsys, "compare", "--sweep", "--dir", str(sweep_runs), "--width", "100")
    assert rc == 0, err
    lines = out.splitlines()
    assert "val/acc (max) over 16 runs" in lines[0]
    head = next(i for i, line in enumerate(lines) if line.startswith("key"))
    assert lines[head + 1].split()[:2] == ["lr", "number"]
    opt = next(line for line in lines if line.startswith("opt"))
    assert opt.split()[1] == "category" and len(opt.split()) == 4  # no correlation for text
    rc, out, _ = run(capsys, "compare", "--sweep", "--dir", str(sweep_runs), "--format", "json")
    doc = json.loads(out)
    assert doc["importance"][0]["key"] == "lr"
    assert doc["importance"][0]["importance"] > 5 * doc["importance"][1]["importance"]
    assert len(doc["runs"]) == 16 and doc["fitted_on"] == 16
    # filters: a group, an SQL condition over the runs view
    rc, out, _ = run(
        capsys, "compare", "--sweep", "--dir", str(sweep_runs), "--group", "g2", "--format", "json"
    )
    assert len(json.loads(out)["runs"]) == 6
    rc, out, _ = run(
        capsys,
        "compare",
        "--sweep",
        "--dir",
        str(sweep_runs),
        "--where",
        "\"config.opt\" = 'adam'",
        "--format",
        "json",
    )
    doc = json.loads(out)
    assert doc["runs"] and all(r["config"].get("opt", "adam") == "adam" for r in doc["runs"])
    assert "opt" not in [k["key"] for k in doc["keys"]]  # it no longer varies


def test_compare_sweep_errors(sweep_runs, capsys):
    rc, _, err = run(capsys, "compare", "--sweep", "--dir", str(sweep_runs), "--metric", "val/ac")
    assert rc == 1 and "did you mean 'val/acc'" in err
    rc, _, err = run(capsys, "compare", "--sweep", "--dir", str(sweep_runs), "--where", "lr >")
    assert rc == 1 and "where: 'lr >' is not a valid SQL condition" in err
    rc, _, err = run(capsys, "compare", "--sweep", "--dir", str(sweep_runs), "--group", "none")
    assert rc == 1 and "no runs" in err
