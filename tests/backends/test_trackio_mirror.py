"""backends: [trackio] with the real trackio and a local store (TRACKIO_DIR in tmp_path): its
own API (trackio.Api, trackio.SQLiteStorage) returns our rows, config and group.

trackio reads TRACKIO_DIR when it is imported, so the writer and the reader are processes of
their own."""

from __future__ import annotations

import json

import pytest
from helpers import read_lines, run_py

pytest.importorskip("trackio")

WRITER = """
import json
import expr_tracker as et
run = et.init(project="proj", name="r1", backends=["trackio"],
              config={"lr": 0.1, "_target_": "model.Net"})
run.emit("config", {"changes": {"bs": 32}})       # before the first row: part of the config
for i in range(30):
    with et.span("fwd"):
        pass
    et.log({"loss": 1.0 / (i + 1), "tag": "x"})
et.finish()
data = et.init(project="proj", name="r1", stream="data", backends=["trackio"])
for i in range(5):
    et.log({"batches": i})
et.finish()
print(json.dumps({"main": run.info()["backends"], "data": data.info()["backends"]}))
"""

READER = """
import json, trackio
S = trackio.SQLiteStorage
runs = {r.name: r.config for r in trackio.Api().runs("proj")}
print(json.dumps({
    "runs": runs,
    "main": S.get_logs("proj", "r1"),
    "data": S.get_logs("proj", "r1.data"),
}))
"""


@pytest.mark.slow
def test_trackio_local_store_returns_our_rows(tmp_path):
    env = {"TRACKIO_DIR": str(tmp_path / "tio")}
    p = run_py(WRITER, env=env, timeout=120)
    stats = json.loads(p.stdout.strip().splitlines()[-1])
    main = stats["main"]["trackio"]
    assert main["last_error"] is None, main["last_error"]
    assert (main["queued"], main["sent"], main["dropped"]) == (30, 30, {})
    assert main["finished"] is True and stats["data"]["trackio"]["sent"] == 5

    out = json.loads(run_py(READER, env=env, timeout=120).stdout.strip().splitlines()[-1])
    assert set(out["runs"]) == {"r1", "r1.data"}
    config = out["runs"]["r1"]
    assert config["lr"] == 0.1 and config["bs"] == 32 and config["_Group"] == "r1"
    assert "_target_" not in config  # trackio reserves keys starting with "_"
    assert out["runs"]["r1.data"]["_Group"] == "r1"
    ours = read_lines(tmp_path / "runs" / "proj" / "r1" / "metrics.jsonl")
    theirs = out["main"]
    assert [r["step"] for r in theirs] == [r["_step"] for r in ours] == list(range(30))
    for t, o in zip(theirs, ours, strict=True):
        assert t["loss"] == o["loss"] and t["tag"] == "x"
        assert t["time_ms/fwd"] == o["time_ms/fwd"]
    assert [(r["step"], r["batches"]) for r in out["data"]] == [(i, i) for i in range(5)]
