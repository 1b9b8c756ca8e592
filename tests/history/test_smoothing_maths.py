"""The smoothing of charts (``history/smoothing.py``): the debiased EMA and the running
mean against straightforward definitions, NaN/inf and gaps, numpy against the loop."""

from __future__ import annotations

import math

import pytest

from expr_tracker.history.smoothing import (
    Smoothing,
    ema_reference,
    mean_reference,
    parse_smoothing,
    smooth,
)

np = pytest.importorskip("numpy")


def tensorboard_ema(ys, w):
    """TensorBoard's smoothing, written out as its dashboard does it (debias 1 - w**n)."""
    last, n, out = 0.0, 0, []
    for y in ys:
        if not math.isfinite(y):
            out.append(y)
            continue
        last = last * w + (1 - w) * y
        n += 1
        out.append(last / (1 - w**n))
    return out


def test_ema_is_tensorboards_debiased_ema():
    ys = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    for w in (0.0, 0.3, 0.9, 0.999):
        assert ema_reference(ys, w) == pytest.approx(tensorboard_ema(ys, w), rel=1e-12)
    assert ema_reference(ys, 0.9)[0] == 3.0  # debiased: the first point is the first value
    # by hand: s1 = 0.1*3, s2 = 0.9*0.3 + 0.1*1 = 0.37; shown 0.37 / (1 - 0.81)
    assert ema_reference(ys, 0.9)[1] == pytest.approx(0.37 / 0.19)


def test_ema_is_pandas_ewm_adjusted():
    pd = pytest.importorskip("pandas")
    ys = np.random.default_rng(1).normal(size=5000).cumsum()
    for w in (0.2, 0.9, 0.99):
        want = pd.Series(ys).ewm(alpha=1 - w, adjust=True).mean().to_numpy()
        got = smooth(ys, Smoothing("ema", w))
        assert np.allclose(got, want, rtol=1e-9, atol=1e-9)


def test_mean_is_the_trailing_window():
    ys = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert mean_reference(ys, 2) == [1.0, 1.5, 2.5, 3.5, 7.0]
    assert mean_reference(ys, 1) == ys
    assert mean_reference(ys, 100) == pytest.approx([1, 1.5, 2, 2.5, 4])


def test_nan_and_inf_stay_and_are_not_averaged():
    ys = [1.0, math.nan, 3.0, math.inf, -math.inf, 5.0]
    finite = [1.0, 3.0, 5.0]
    for how in (Smoothing("ema", 0.6), Smoothing("mean", 2)):
        for use_numpy in (False, True):
            out = list(smooth(ys, how, use_numpy=use_numpy))
            assert math.isnan(out[1]) and out[3] == math.inf and out[4] == -math.inf
            want = list(smooth(finite, how, use_numpy=False))
            assert [out[0], out[2], out[5]] == pytest.approx(want, rel=1e-12)
    assert list(smooth([math.nan, math.nan], Smoothing("ema", 0.5), use_numpy=True))[0] != 0


def test_gaps_between_steps_are_not_points():
    # a metric logged every 10th step: the smoothing goes point by point, the steps between
    # are not zeros or repeats
    ys = [2.0, 4.0, 8.0]
    assert ema_reference(ys, 0.5) == pytest.approx(tensorboard_ema(ys, 0.5))
    assert mean_reference(ys, 2) == [2.0, 3.0, 6.0]


@pytest.mark.parametrize("w", [0.0001, 0.3, 0.5, 0.6, 0.9, 0.99, 0.9999])
def test_numpy_matches_the_loop(w):
    rng = np.random.default_rng(7)
    ys = rng.normal(size=30_000).cumsum() * 1e6
    ys[rng.integers(0, ys.size, 50)] = np.nan
    ys[123] = np.inf
    want = np.array(ema_reference(ys, w))
    got = smooth(ys, Smoothing("ema", w), use_numpy=True)
    assert np.array_equal(np.isnan(got), np.isnan(want)) and got[123] == np.inf
    f = np.isfinite(want)
    assert np.allclose(got[f], want[f], rtol=1e-9, atol=1e-6 * np.abs(want[f]).max() * 1e-6)
    for n in (1, 7, 500):
        want = np.array(mean_reference(ys[:3000], n))
        got = smooth(ys[:3000], Smoothing("mean", n), use_numpy=True)
        f = np.isfinite(want)
        assert np.allclose(got[f], want[f], rtol=1e-9)


def test_huge_values_do_not_overflow():
    ys = np.full(10_000, 1e300)
    got = smooth(ys, Smoothing("ema", 0.9), use_numpy=True)
    assert np.allclose(got, 1e300)


def test_parse():
    assert parse_smoothing("ema:0.9") == Smoothing("ema", 0.9)
    assert parse_smoothing(" MEAN:20 ") == Smoothing("mean", 20)
    assert parse_smoothing(None) is None and parse_smoothing("none") is None
    assert parse_smoothing("ema:0") is None
    assert Smoothing("ema", 0.95).text == "ema:0.95" and Smoothing("mean", 3).text == "mean:3"
    for bad in ("ema", "ema:1", "ema:-0.1", "ema:x", "mean:0", "mean:2.5", "gauss:3"):
        with pytest.raises(ValueError, match=r"smooth=.*valid: none, ema:W"):
            parse_smoothing(bad)
