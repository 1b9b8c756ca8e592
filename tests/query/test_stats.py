"""The statistics of groups of runs (``expr_tracker.query.stats``): grouping, alignment of
different step grids, the bands, and the calibration of the bootstrap interval."""

from __future__ import annotations

import math

import numpy as np
import pytest

from expr_tracker.query.stats import (
    MISSING,
    GroupError,
    ci_alpha,
    group_band,
    group_keys,
    group_runs,
    is_seed_key,
    summarize,
    t_quantile_975,
)


@pytest.mark.parametrize(
    ("key", "seed"),
    [
        ("seed", True),
        ("trainer.seed", True),
        ("data_seed", True),
        ("Seed", True),
        ("rng", True),
        ("model.rng", True),
        ("seeds", False),
        ("seed_count", False),
        ("rng_state_dim", False),
        ("lr", False),
    ],
)
def test_seed_like_keys(key: str, seed: bool) -> None:
    assert is_seed_key(key) is seed


CONFIGS = [
    {"lr": 0.1, "seed": 0, "model.depth": 4, "data_seed": 7},
    {"lr": 0.1, "seed": 1, "model.depth": 4, "data_seed": 8},
    {"lr": 0.01, "seed": 0, "model.depth": 4, "data_seed": 7},
    {"lr": 0.01, "seed": 1, "model.depth": 4, "data_seed": 8},
    {"lr": 0.01, "seed": 2, "model.depth": 4},  # no data_seed: still the lr=0.01 group
]


def test_auto_groups_by_everything_but_the_seeds() -> None:
    keys, groups = group_runs(CONFIGS, "auto")
    assert keys == ["lr"]
    assert [g.members for g in groups] == [(0, 1), (2, 3, 4)]
    assert [g.label for g in groups] == ["lr=0.1", "lr=0.01"]


def test_group_by_named_keys_and_missing_values() -> None:
    keys, groups = group_runs(CONFIGS, "lr,data_seed")
    assert keys == ["lr", "data_seed"]
    assert [g.members for g in groups] == [(0,), (1,), (2,), (3,), (4,)]
    assert groups[4].values == {"lr": 0.01, "data_seed": MISSING}
    # a missing key is not the same as null
    _, groups = group_runs([{"a": None}, {}], ["a"])
    assert len(groups) == 2


def test_values_compare_as_json() -> None:
    _, groups = group_runs([{"a": 1}, {"a": 1.0}, {"a": True}, {"a": 1}], "a")
    assert [g.members for g in groups] == [(0, 3), (1,), (2,)]


def test_one_group_when_nothing_but_seeds_differ() -> None:
    keys, groups = group_runs([{"seed": 1}, {"seed": 2}], "auto")
    assert keys == [] and [g.label for g in groups] == ["all"]
    assert groups[0].members == (0, 1)


def test_unknown_group_key_names_it() -> None:
    with pytest.raises(GroupError, match=r"'depth' is no config key.*model\.depth"):
        group_keys(CONFIGS, ["depth"])
    with pytest.raises(GroupError, match="empty"):
        group_keys(CONFIGS, " , ")


def test_t_quantiles_match_scipy() -> None:
    st = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 5, 10, 29, 30, 31, 45, 100, 1000, 10**6):
        assert t_quantile_975(df) == pytest.approx(st.t.ppf(0.975, df), abs=1e-4)
    with pytest.raises(GroupError, match="df: 0"):
        t_quantile_975(0)


def test_ci_alpha_widens_few_seeds_and_tends_to_five_percent() -> None:
    assert ci_alpha(5) < ci_alpha(20) < ci_alpha(1000) < 0.05
    assert ci_alpha(10**6) == pytest.approx(0.05, abs=1e-4)
    with pytest.raises(GroupError, match="n >= 2"):
        ci_alpha(1)


def test_mean_std_sem_minmax_by_hand() -> None:
    runs = [([0, 1, 2], [1.0, 2.0, 3.0]), ([0, 1, 2], [3.0, 4.0, 9.0])]
    b = group_band(runs, band="std")
    assert b.x.tolist() == [0, 1, 2]
    assert b.center.tolist() == [2.0, 3.0, 6.0]
    s = math.sqrt(2.0)  # std of (1, 3), ddof 1
    assert b.lo.tolist() == pytest.approx([2 - s, 3 - s, 6 - math.sqrt(18)])
    sem = group_band(runs, band="sem")
    assert sem.hi.tolist() == pytest.approx([2 + 1, 3 + 1, 6 + 3])
    mm = group_band(runs, band="minmax", agg="median")
    assert mm.center.tolist() == [2.0, 3.0, 6.0]
    assert mm.lo.tolist() == [1.0, 2.0, 3.0] and mm.hi.tolist() == [3.0, 4.0, 9.0]
    none = group_band(runs, band="none")
    assert np.isnan(none.lo).all() and np.isnan(none.hi).all()


def test_different_step_grids_are_aligned_without_inventing_points() -> None:
    # run a logs every step, run b every other step and stops early, run c starts late
    a = (list(range(6)), [10.0] * 6)
    b = ([0, 2, 4], [20.0, 20.0, 20.0])
    c = ([4, 5, 7], [30.0, 30.0, 30.0])
    band = group_band([a, b, c], band="minmax")
    assert band.x.tolist() == [0, 1, 2, 3, 4, 5, 7]  # every x some run logged, no other
    assert band.n.tolist() == [2, 1, 2, 1, 3, 2, 1]
    assert band.center.tolist() == [15, 10, 15, 10, 20, 20, 30]
    lo, hi = band.lo.tolist(), band.hi.tolist()
    assert [lo[i] for i in (0, 2, 4, 5)] == [10, 10, 10, 10]
    assert [hi[i] for i in (0, 2, 4, 5)] == [20, 20, 30, 30]
    assert all(math.isnan(lo[i]) and math.isnan(hi[i]) for i in (1, 3, 6))  # n == 1: no band


def test_non_finite_values_are_counted_not_averaged() -> None:
    runs = [([0, 1], [1.0, float("nan")]), ([0, 1], [3.0, 5.0]), ([0, 1], [float("inf"), 7.0])]
    b = group_band(runs, band="std")
    assert b.n.tolist() == [2, 2] and b.nonfinite.tolist() == [1, 1]
    assert b.center.tolist() == [2.0, 6.0]
    all_nan = group_band([([0], [float("nan")]), ([0], [float("nan")])])
    assert all_nan.n.tolist() == [0] and math.isnan(all_nan.center[0])
    assert all_nan.nonfinite.tolist() == [2]


def test_repeated_x_in_one_run_keeps_its_last_point() -> None:
    b = group_band([([0, 0, 1], [1.0, 2.0, 3.0]), ([0, 1], [4.0, 5.0])], band="none")
    assert b.center.tolist() == [3.0, 4.0]
    assert b.n.tolist() == [2, 2]


def test_bootstrap_is_reproducible_and_brackets_the_centre() -> None:
    rng = np.random.default_rng(3)
    runs = [(np.arange(50), rng.normal(size=50)) for _ in range(8)]
    for agg in ("mean", "median"):
        one = group_band(runs, band="ci", agg=agg, seed=5)
        two = group_band(runs, band="ci", agg=agg, seed=5)
        assert np.array_equal(one.lo, two.lo) and np.array_equal(one.hi, two.hi)
        assert (one.lo <= one.center).all() and (one.center <= one.hi).all()
        if agg == "mean":  # (the median's bounds are data values: often the same ones)
            other = group_band(runs, band="ci", agg=agg, seed=6)
            assert not np.array_equal(one.lo, other.lo)


def test_bad_options_name_the_field() -> None:
    with pytest.raises(GroupError, match=r"band: 'iqr' is not valid: one of minmax, std"):
        group_band([([0], [1.0])], band="iqr")
    with pytest.raises(GroupError, match="agg: 'max'"):
        group_band([([0], [1.0])], agg="max")
    with pytest.raises(GroupError, match="resamples"):
        group_band([([0], [1.0])], band="ci", resamples=10)
    with pytest.raises(GroupError, match="series 0: 2 x values but 1 y values"):
        group_band([([0, 1], [1.0])])
    with pytest.raises(GroupError, match="x value is NaN"):
        group_band([([float("nan")], [1.0])])


def test_summarize_counts_what_it_leaves_out() -> None:
    s = summarize([1.0, 2, 3.0, float("nan"), None, "x", True])
    assert s["n"] == 3 and s["nonfinite"] == 1 and s["missing"] == 3
    assert s["mean"] == 2.0 and s["std"] == 1.0 and s["median"] == 2.0
    assert s["min"] == 1.0 and s["max"] == 3.0
    lo, hi = s["ci"]
    assert 1.0 <= lo <= 2.0 <= hi <= 3.0
    one = summarize([4.0])
    assert one["mean"] == 4.0 and one["std"] is None and one["ci"] is None
    assert summarize([])["n"] == 0


@pytest.mark.parametrize("seeds", [10, 20])
def test_bootstrap_ci_covers_the_true_mean_95_percent_of_the_time(seeds: int) -> None:
    """Calibration: 1,000 simulations, each one x of a group of ``seeds`` synthetic runs
    whose values are drawn from N(3, 2^2); the 95 % bootstrap interval of the mean must
    cover 3 in 93-97 % of them (binomial sd at 95 %: 0.7 %)."""
    rng = np.random.default_rng(2026)
    sims = 1000
    runs = [(np.arange(sims), rng.normal(3.0, 2.0, sims)) for _ in range(seeds)]
    band = group_band(runs, band="ci", agg="mean", seed=11)
    assert band.n.tolist() == [seeds] * sims
    covered = float(np.mean((band.lo <= 3.0) & (3.0 <= band.hi)))
    assert 0.93 <= covered <= 0.97, covered


def test_plain_percentile_would_fail_the_calibration() -> None:
    """The same check with the plain percentile interval (alpha' = 0.05) at 5 seeds covers
    far less than 95 %; the expanded interval comes close to what any bootstrap can."""
    rng = np.random.default_rng(7)
    v = rng.normal(0.0, 1.0, (1000, 5))
    w = rng.multinomial(5, [0.2] * 5, size=1000).astype(float)
    boots = v @ w.T / 5
    lo, hi = np.quantile(boots, (0.025, 0.975), axis=1)
    plain = float(np.mean((lo <= 0) & (0 <= hi)))
    runs = [(np.arange(1000), v[:, j]) for j in range(5)]
    band = group_band(runs, band="ci", seed=7)
    expanded = float(np.mean((band.lo <= 0) & (0 <= band.hi)))
    assert plain < 0.86 and expanded > plain + 0.05, (plain, expanded)
    # no bootstrap interval reaches 95 % at 5 seeds: it lies within [min, max], which
    # misses the mean when all 5 values fall on one side (2 / 2^5 = 6.25 %)
    assert expanded <= 1 - 2 / 2**5 + 0.01


def test_median_bootstrap_equals_resampling_by_hand() -> None:
    """The median's bootstrap reads each resample's median off the sorted values by the
    resample's counts; it must equal the medians of the resamples built by hand."""
    rng = np.random.default_rng(4)
    for k in (2, 3, 8):
        values = rng.normal(size=(2, k))
        runs = [(np.arange(2), values[:, j]) for j in range(k)]
        band = group_band(runs, band="ci", agg="median", seed=9)
        w = np.random.default_rng(9).multinomial(k, [1 / k] * k, size=1000)
        a = ci_alpha(k)
        for row in range(2):
            v = np.sort(values[row])
            meds = [np.median(np.repeat(v, counts)) for counts in w]
            lo, hi = np.quantile(meds, (a / 2, 1 - a / 2))
            assert band.lo[row] == pytest.approx(lo) and band.hi[row] == pytest.approx(hi)


def test_median_bootstrap_ci_calibration_for_symmetric_seeds() -> None:
    """For normal seeds the median is the mean: its 95 % interval covers 3 in 93-97 % of
    1,000 simulated groups of 20."""
    rng = np.random.default_rng(2027)
    runs = [(np.arange(1000), rng.normal(3.0, 2.0, 1000)) for _ in range(20)]
    band = group_band(runs, band="ci", agg="median", seed=1)
    covered = float(np.mean((band.lo <= 3.0) & (3.0 <= band.hi)))
    assert 0.93 <= covered <= 0.97, covered
