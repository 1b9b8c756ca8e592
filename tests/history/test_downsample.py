"""The M4 downsampler (expr_tracker/history/downsample.py): first, last, min, max per bucket
and every non-finite point kept, at most 4 finite points per bucket, order kept; numpy and
pure Python agree index for index."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from expr_tracker.history.downsample import bucket_index, downsample, m4

ys_values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.integers(-(10**6), 10**6).map(float),
)


@st.composite
def series(draw):  # type: ignore[no-untyped-def]
    n = draw(st.integers(0, 300))
    sorted_x = draw(st.booleans())
    if sorted_x:
        xs = sorted(draw(st.lists(st.integers(-1000, 10**6), min_size=n, max_size=n)))
    else:
        xs = draw(st.lists(st.floats(-1e6, 1e6), min_size=n, max_size=n))
    ys = draw(st.lists(ys_values, min_size=n, max_size=n))
    buckets = draw(st.integers(1, 64))
    return xs, ys, buckets


def _check(xs, ys, buckets, idx):  # type: ignore[no-untyped-def]
    n = len(xs)
    assert idx == sorted(set(idx)), "ascending, each index once"
    assert all(0 <= i < n for i in idx)
    finite = [i for i in range(n) if math.isfinite(ys[i])]
    nonfinite = [i for i in range(n) if not math.isfinite(ys[i])]
    kept = set(idx)
    assert set(nonfinite) <= kept, "every NaN/inf point is kept"
    assert len([i for i in idx if math.isfinite(ys[i])]) <= 4 * buckets
    if n:
        # the series' first and last points are kept
        assert 0 in kept and n - 1 in kept
    if finite:
        assert finite[0] in kept and finite[-1] in kept
        lo_v = min(ys[i] for i in finite)
        hi_v = max(ys[i] for i in finite)
        assert any(ys[i] == lo_v for i in idx), "the global minimum survives"
        assert any(ys[i] == hi_v for i in idx), "the global maximum survives"
        # per bucket: first, last, min, max
        lo, hi = float(min(xs)), float(max(xs))
        groups: dict[int, list[int]] = {}
        for i in finite:
            groups.setdefault(bucket_index(xs[i], lo, hi, buckets), []).append(i)
        for members in groups.values():
            assert members[0] in kept and members[-1] in kept
            assert min(members, key=lambda i: (ys[i], i)) in kept
            assert min(members, key=lambda i: (-ys[i], i)) in kept


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(series())
def test_m4_keeps_first_last_min_max_and_nonfinite(case) -> None:  # type: ignore[no-untyped-def]
    xs, ys, buckets = case
    idx = m4(xs, ys, buckets, use_numpy=False)
    _check(xs, ys, buckets, idx)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(series())
def test_numpy_and_python_agree(case) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("numpy")
    xs, ys, buckets = case
    assert m4(xs, ys, buckets, use_numpy=True) == m4(xs, ys, buckets, use_numpy=False)


def test_spike_survives_a_million_points() -> None:
    n = 1_000_000
    xs = range(n)
    ys = [math.sin(i / 1000.0) for i in range(n)]
    ys[123_457] = 50.0  # one spike
    ys[777_777] = float("nan")
    ys[900_001] = float("-inf")
    for use_numpy in (False, True):
        if use_numpy:
            pytest.importorskip("numpy")
        idx = m4(xs, ys, 200, use_numpy=use_numpy)
        assert {0, n - 1, 123_457, 777_777, 900_001} <= set(idx)
        assert len(idx) <= 4 * 200 + 2


def test_range_and_degenerate_cases() -> None:
    assert m4([], [], 10) == []
    assert m4([5], [1.0], 10) == [0]
    assert m4([5, 5, 5], [3.0, 1.0, 2.0], 4) == [0, 1, 2]
    # lo/hi: points outside the range are left out, non-finite ones too
    xs = list(range(10))
    ys = [float(i) for i in range(10)]
    ys[1] = float("nan")
    ys[8] = float("inf")
    assert m4(xs, ys, 100, lo=2, hi=6) == [2, 3, 4, 5, 6]
    assert m4(xs, ys, 100, lo=0, hi=3) == [0, 1, 2, 3]
    assert downsample([0, 1, 2], [1.0, 5.0, 2.0], 1) == ([0, 1, 2], [1.0, 5.0, 2.0])


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        m4([1, 2], [1.0], 3)
    with pytest.raises(ValueError, match="buckets=0"):
        m4([1], [1.0], 0)
    with pytest.raises(ValueError, match="lo=5.0 > hi=1.0"):
        m4([1], [1.0], 3, lo=5, hi=1)
    for use_numpy in (False, True):
        with pytest.raises(ValueError, match="not finite"):
            m4([0.0, float("nan"), 2.0], [1.0, 2.0, 3.0], 3, lo=0, hi=2, use_numpy=use_numpy)


def test_random_walk_bucket_budget() -> None:
    rng = random.Random(7)
    ys, y = [], 0.0
    for _ in range(50_000):
        y += rng.gauss(0, 1)
        ys.append(y)
    xs = list(range(len(ys)))
    idx = m4(xs, ys, 80, use_numpy=False)
    assert len(idx) <= 320
    _check(xs, ys, 80, idx)
