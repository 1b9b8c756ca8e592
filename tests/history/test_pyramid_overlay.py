"""Multi-resolution summaries (expr_tracker.history.pyramid): exact per-pixel extremes and
non-finite counts at any zoom, incremental growth equal to a build from scratch, and files
that are checked before use."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from expr_tracker.history import pyramid as pm

_vals = st.one_of(
    st.floats(-1e6, 1e6, allow_nan=False),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, 1.0]),
)


@st.composite
def series(draw):
    n = draw(st.integers(0, 160))
    gaps = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    xs = np.cumsum(np.asarray(gaps, dtype=np.float64))
    ys = np.asarray(draw(st.lists(_vals, min_size=n, max_size=n)), dtype=np.float64)
    return xs, ys


def _truth(xs, ys, lo, hi, pixels):
    edges = lo + (hi - lo) * (np.arange(pixels + 1) / pixels)
    out = []
    for p in range(pixels):
        m = (xs >= edges[p]) & ((xs < edges[p + 1]) if p < pixels - 1 else (xs <= hi))
        rows = np.flatnonzero(m)
        y = ys[rows]
        fin = np.isfinite(y)
        f = rows[fin]
        out.append(
            {
                "min": y[fin].min() if fin.any() else math.inf,
                "max": y[fin].max() if fin.any() else -math.inf,
                "imin": int(f[np.argmin(y[fin])]) if fin.any() else -1,
                "imax": int(f[np.argmax(y[fin])]) if fin.any() else -1,
                "ifirst": int(f[0]) if fin.any() else -1,
                "ilast": int(f[-1]) if fin.any() else -1,
                "count": int(fin.sum()),
                "nan": int(np.isnan(y).sum()),
                "pinf": int((y == math.inf).sum()),
                "ninf": int((y == -math.inf).sum()),
            }
        )
    return out


@settings(max_examples=50, deadline=None)
@given(
    st.lists(series(), min_size=1, max_size=3), st.integers(1, 40), st.floats(0, 1), st.floats(0, 1)
)
def test_pixels_equal_the_truth(runs, pixels, f1, f2):
    top = max([float(xs[-1]) for xs, _ in runs if xs.size] + [10.0])
    lo, hi = sorted((f1 * (top + 2) - 1, f2 * (top + 2) - 1))
    answers = pm.query_many([pm.Pyramid(xs, ys) for xs, ys in runs], lo, hi, pixels)
    for (xs, ys), got in zip(runs, answers, strict=True):
        for p, want in enumerate(_truth(xs, ys, lo, hi, pixels)):
            for k, v in want.items():
                assert got[k][p] == v, (p, k, got[k][p], v)
            fin = ys[got["start"][p] : got["stop"][p]]
            assert got["sum"][p] == pytest.approx(float(fin[np.isfinite(fin)].sum()), abs=1e-6)


@settings(max_examples=50, deadline=None)
@given(series(), st.lists(st.integers(0, 160), max_size=3))
def test_incremental_equals_scratch(s, cuts):
    xs, ys = s
    cuts = sorted({min(c, xs.size) for c in cuts}) + [xs.size]
    p = pm.Pyramid(xs[: cuts[0]], ys[: cuts[0]])
    for a, b in zip(cuts, cuts[1:], strict=False):
        p.extend(xs[a:b], ys[a:b])
    q = pm.Pyramid(xs, ys)
    assert len(p.levels) == len(q.levels)
    for a, b in zip(p.levels, q.levels, strict=True):
        assert a.tobytes() == b.tobytes()


def _series(n=1000):
    xs = np.arange(n, dtype=np.float64) * 2
    ys = np.sin(np.arange(n) / 7.0)
    ys[[5, 400]] = [math.nan, math.inf]
    ys[777] = 1e9
    return xs, ys


def test_saved_pyramid_answers_the_same(tmp_path):
    xs, ys = _series()
    p = pm.build_or_load(tmp_path / "loss", xs, ys)
    q = pm.load(tmp_path / "loss")
    a, b = p.query(0, 2000, 37), q.query(0, 2000, 37)
    for k in a:
        assert np.array_equal(a[k], b[k]), k
    assert b["max"].max() == 1e9 and b["nan"].sum() == 1 and b["pinf"].sum() == 1
    # the cache grows: only the new rows are added
    xs2, ys2 = _series(1500)
    r = pm.build_or_load(tmp_path / "loss", xs2, ys2)
    assert r.n == 1500 and pm.load(tmp_path / "loss").n == 1500


@pytest.mark.parametrize(
    "damage",
    ["meta", "part", "short", "counts", "missing"],
)
def test_damaged_files_are_refused_and_rebuilt(tmp_path, damage):
    xs, ys = _series()
    d = tmp_path / "loss"
    pm.Pyramid(xs, ys).save(d)
    meta = json.loads((d / "meta.json").read_text())
    g = d / meta["gen"]
    if damage == "meta":
        (d / "meta.json").write_text('{"version": 2, "n": -3}')
    elif damage == "part":  # a partial bucket of the wrong size
        k = next(i for i, b in enumerate(meta["part"]) if b)
        meta["part"][k] = meta["part"][k][:-4]
        (d / "meta.json").write_text(json.dumps(meta))
    elif damage == "short":
        (d / f"{g}-ys.f8").write_bytes(np.zeros(999).tobytes())
    elif damage == "counts":  # the right sizes, the top bucket's counts wrong
        meta["part"][-1] = meta["part"][1]
        (d / "meta.json").write_text(json.dumps(meta))
    else:
        (d / f"{g}-level2.node").unlink()
    with pytest.raises(pm.PyramidError):
        pm.load(d)
    p = pm.build_or_load(d, xs, ys)
    assert p.query(0, 2000, 10)["max"].max() == 1e9
    pm.load(d)


def test_bad_input_names_the_problem():
    with pytest.raises(pm.PyramidError, match="ascending"):
        pm.Pyramid([0, 2, 1], [1, 2, 3])
    with pytest.raises(pm.PyramidError, match="not finite"):
        pm.Pyramid([0, math.nan], [1, 2])
    with pytest.raises(pm.PyramidError, match="pixels"):
        pm.Pyramid([0, 1], [1, 2]).query(0, 1, 0)
    with pytest.raises(pm.PyramidError, match="append-only"):
        pm.Pyramid([0, 5], [1, 2]).extend([3], [1])


def test_overlay_points_keep_every_extreme_and_mark_non_finite():
    xs, ys = _series()
    other = pm.Pyramid(xs, -ys)
    a, b = pm.overlay_points([pm.Pyramid(xs, ys), other], 0, 2000, 20)
    assert max(v for v in a.y if v is not None) == 1e9
    assert min(v for v in b.y if v is not None) == -1e9
    assert sorted(k for _, k in a.nonfinite) == ["inf", "nan"]
    assert sorted(k for _, k in b.nonfinite) == ["-inf", "nan"]
    assert all(a.y[i] is None for i, _ in a.nonfinite)
    assert a.index == sorted(a.index) and len(a.x) <= 7 * 20
