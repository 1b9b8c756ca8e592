"""Ctrl-C at every point of ``log_artifact``: never a half version listed, never a committed
version undone, no lock left held (the next call would hang), the next call works."""

from __future__ import annotations

import pytest
from helpers import Injector, count_events

import expr_tracker as et
from expr_tracker.artifacts import ArtifactStore


def _check(store: ArtifactStore) -> list[int]:
    versions = store.versions("ds")
    for v in versions:
        assert v.verify()
    assert [v.version for v in versions] == sorted({v.version for v in versions})
    return [v.version for v in versions]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["link", "copy"])
def test_interrupt_at_every_point_of_log_artifact(tmp_path, mode):
    run = et.init(project="p", name="r", dir=str(tmp_path / "runs"), artifacts={"mode": mode})
    store = run.artifacts.store
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    counter = [0]

    def write_new():
        counter[0] += 1
        for name in ("a.txt", "d/b.txt"):
            p = src / name
            p.unlink(missing_ok=True)  # a new file each time: no in-place edit
            p.write_text(f"{name} {counter[0]}")

    write_new()
    n = count_events(et.log_artifact, src, "ds") + 10
    fired = 0
    for at in range(1, n, 3):  # every point: 40 s; every third covers each stage
        write_new()
        inj = Injector(at, stdlib=False)
        try:
            inj.run(et.log_artifact, src, "ds")
        except KeyboardInterrupt:
            pass
        fired += inj.fired
        before = _check(store)
        write_new()
        v = et.log_artifact(src, name="ds")  # works: no lock left held
        assert v.version == max(before, default=-1) + 1 and v.verify()
    assert fired > n // 4
    store.clean_staging("ds", min_age_s=0)
    left = [p.name for p in (store.root / "ds").iterdir() if p.name.startswith(".staging-")]
    assert left == []
