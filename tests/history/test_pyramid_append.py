"""Overlay summaries grown in place (expr_tracker.history.pyramid.append_at): only the new
rows and buckets are written, meta.json is the commit point, so an append that dies before
it leaves the old state readable and the next append recovers; planted files are refused."""

from __future__ import annotations

import json
import math
import os
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from expr_tracker.history import pyramid as pm

_vals = st.one_of(
    st.floats(-1e6, 1e6, allow_nan=False),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0]),
)


def _dir(folder: Path) -> int:
    return os.open(folder, os.O_RDONLY | os.O_DIRECTORY)


def _same(p: pm.Pyramid, q: pm.Pyramid) -> None:
    """``p`` and ``q`` hold the same rows and buckets, byte for byte."""
    assert p.n == q.n
    assert np.asarray(p.xs).tobytes() == np.asarray(q.xs).tobytes()
    assert np.asarray(p.ys).tobytes() == np.asarray(q.ys).tobytes()
    assert len(p.full) == len(q.full)
    for a, b in zip(p.levels, q.levels, strict=True):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def _sizes_exact(folder: Path, p: pm.Pyramid) -> None:
    """The data files hold the committed items and nothing past them."""
    g = folder / p.meta["gen"]
    assert os.path.getsize(f"{g}-xs.f8") == p.n * 8 == os.path.getsize(f"{g}-ys.f8")
    for k, f in enumerate(p.full):
        assert os.path.getsize(f"{g}-level{k}.node") == f.shape[0] * pm.NODE.itemsize


@settings(max_examples=20, deadline=None)
@given(
    st.lists(_vals, min_size=0, max_size=300),
    st.lists(st.integers(0, 300), min_size=1, max_size=4),
)
def test_appends_in_place_equal_a_rebuild(vals, cuts):
    ys = np.asarray(vals, dtype=np.float64)
    xs = np.arange(ys.size, dtype=np.float64)
    cuts = sorted({min(c, ys.size) for c in cuts}) + [ys.size]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        fd = _dir(folder)
        try:
            pm.Pyramid(xs[: cuts[0]], ys[: cuts[0]]).save_at(fd)
            gen = pm.read_meta_at(fd)["gen"]
            for a, b in zip(cuts, cuts[1:], strict=False):
                pm.append_at(fd, "", pm.load_at(fd), xs[a:b], ys[a:b], {"step": b})
                p = pm.load_at(fd)
                assert p.meta["step"] == b and p.meta["gen"] == gen  # the same files
                _same(p, pm.Pyramid(xs[:b], ys[:b]))
                _sizes_exact(folder, p)
        finally:
            os.close(fd)


def _series(n: int) -> tuple[np.ndarray, np.ndarray]:
    ys = np.cos(np.arange(n) / 9.0)
    ys[[3, 700]] = [math.nan, -math.inf]
    ys[900] = 1e6
    return np.arange(n, dtype=np.float64), ys


def test_an_append_that_dies_before_its_commit_leaves_the_old_state(tmp_path, monkeypatch):
    xs, ys = _series(1300)
    fd = _dir(tmp_path)
    try:
        pm.Pyramid(xs[:1000], ys[:1000]).save_at(fd)
        reader = pm.load_at(fd)  # a reader that mapped the files before the append
        seen = reader.query(0, 999, 37)

        def crash(*_a, **_k):
            raise OSError("killed before the commit")

        g = tmp_path / reader.meta["gen"]
        assert not os.path.exists(f"{g}-level8.node")
        with monkeypatch.context() as m:
            m.setattr(pm, "_commit", crash)
            other = np.full(100, 5e9)  # rows that will never be committed; 1,100 > 1,024
            with pytest.raises(OSError, match="killed"):
                pm.append_at(fd, "", pm.load_at(fd), xs[1000:1100], other)
        assert os.path.getsize(f"{g}-ys.f8") == 1100 * 8  # written past the commit
        assert os.path.exists(f"{g}-level8.node")  # a level the old state does not have
        # readers see the old state whole, the mapped one included
        after = pm.load_at(fd)
        _same(after, pm.Pyramid(xs[:1000], ys[:1000]))
        for k, v in after.query(0, 999, 37).items():
            assert np.array_equal(v, seen[k]) and np.array_equal(reader.query(0, 999, 37)[k], v)
        # the next append overwrites and cuts what the dead one left
        pm.append_at(fd, "", after, xs[1000:1300], ys[1000:1300])
        p = pm.load_at(fd)
        _same(p, pm.Pyramid(xs, ys))
        _sizes_exact(tmp_path, p)
        assert p.query(0, 1299, 5)["max"].max() == 1e6
    finally:
        os.close(fd)


def test_leftover_bytes_past_the_commit_are_never_read(tmp_path):
    xs, ys = _series(1000)
    fd = _dir(tmp_path)
    try:
        pm.Pyramid(xs, ys).save_at(fd)
        g = tmp_path / pm.read_meta_at(fd)["gen"]
        for name in ("xs.f8", "ys.f8", "level0.node", "level3.node"):
            with open(f"{g}-{name}", "ab") as f:
                f.write(b"\xff" * 4096)
        p = pm.load_at(fd)
        _same(p, pm.Pyramid(xs, ys))
        pm.append_at(fd, "", p, [1000.0, 1001.0], [2.0, 3.0])
        q = pm.load_at(fd)
        _same(q, pm.Pyramid(np.append(xs, [1000, 1001]), np.append(ys, [2, 3])))
        _sizes_exact(tmp_path, q)
    finally:
        os.close(fd)


@pytest.mark.parametrize("what", ["symlink", "fifo", "short"])
def test_a_file_planted_before_an_append_is_refused(tmp_path, what):
    xs, ys = _series(1000)
    folder = tmp_path / "loss"
    pm.Pyramid(xs, ys).save(folder)
    fd = _dir(folder)
    try:
        p = pm.load_at(fd)  # read, then the file is swapped before the append writes
        target = folder / f"{p.meta['gen']}-level0.node"
        secret = tmp_path / "secret"
        secret.write_bytes(b"keep")
        target.unlink()
        if what == "symlink":
            os.symlink(secret, target)
        elif what == "fifo":
            os.mkfifo(target)
        else:
            target.write_bytes(b"\0" * 10)
        box: dict = {}

        def append() -> None:
            try:
                pm.append_at(fd, "", p, [1000.0], [1.0])
            except pm.PyramidError as e:
                box["e"] = e

        t = threading.Thread(target=append)
        t.start()
        t.join(20)
        assert not t.is_alive(), "the append blocked on a planted file"
        assert "level0.node" in str(box["e"])
        assert secret.read_bytes() == b"keep"  # never written through
        assert json.loads((folder / "meta.json").read_text())["n"] == 1000  # not committed
    finally:
        os.close(fd)
    # the next use rebuilds (a new generation) and drops the planted file
    r = pm.build_or_load(folder, np.append(xs, 1000.0), np.append(ys, 1.0))
    assert r.n == 1001 and not os.path.lexists(target)
    _same(pm.load(folder), pm.Pyramid(np.append(xs, 1000.0), np.append(ys, 1.0)))


def test_files_of_the_previous_version_are_outdated_and_removed(tmp_path):
    xs, ys = _series(1000)
    # what version 1 wrote: .npy files and a meta.json without a generation
    np.save(tmp_path / "xs.npy", xs)
    np.save(tmp_path / "level0.npy", np.zeros(125, dtype=pm.NODE))
    (tmp_path / "meta.json").write_text('{"version": 1, "n": 1000, "leaf_log2": 3, "levels": 8}')
    (tmp_path / "notes.txt").write_text("not ours")
    with pytest.raises(pm.PyramidOutdated, match="version"):
        pm.load(tmp_path)
    p = pm.build_or_load(tmp_path, xs, ys)
    names = sorted(os.listdir(tmp_path))
    assert "xs.npy" not in names and "level0.npy" not in names and "notes.txt" in names
    gen = json.loads((tmp_path / "meta.json").read_text())["gen"]
    assert f"{gen}-xs.f8" in names and p.n == 1000
