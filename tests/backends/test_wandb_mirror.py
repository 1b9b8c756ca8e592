"""backends: [wandb] with the real wandb in offline mode: its run files hold our rows, config,
summary, define_metric, artifact and exit code; the user's own wandb.run is left alone.

wandb 0.31 has no Python reader for its ``.wandb`` files any more (the Go core reads them), so
:func:`wandb_records` reads the file the way it is written: a ``:W&B`` header, then the
LevelDB log format (32 KiB blocks of records with a 7-byte header: checksum, length, type
full/first/middle/last), each record one ``wandb.proto.wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from helpers import read_lines, run_py

pytest.importorskip("wandb")


def wandb_records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", data[:7]
    block = 32768
    pos, buf, out = 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        chunk, pos = data[pos : pos + length], pos + length
        if kind == 0:
            continue
        if kind in (2, 3):  # first, middle
            buf = (b"" if kind == 2 else buf) + chunk
            continue
        rec = pb.Record()
        rec.ParseFromString(buf + chunk if kind == 4 else chunk)
        buf = b""
        out.append(rec)
    return out


def of_kind(records, kind):
    return [getattr(r, kind) for r in records if r.WhichOneof("record_type") == kind]


def items(updates) -> dict:
    return {(u.key or "/".join(u.nested_key)): json.loads(u.value_json) for u in updates}


def _env(tmp_path):
    return {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DIR": str(tmp_path / "wb"),
        "WANDB_CACHE_DIR": str(tmp_path / "wbcache"),
        "WANDB_CONFIG_DIR": str(tmp_path / "wbconfig"),
        "WANDB_DATA_DIR": str(tmp_path / "wbdata"),
        "WANDB_ARTIFACT_DIR": str(tmp_path / "wbart"),
    }


CHILD = """
import json, os, sys, wandb
import expr_tracker as et

own = wandb.init(project="mine", name="users-own")   # the user's own run, set as wandb.run
run = et.init(project="proj", name="r1", backends=["wandb"], config={"lr": 0.1},
              backend_kwargs={"wandb": {"tags": ["t1"]}})
for i in range(40):
    with et.span("fwd"):
        pass
    et.log({"loss": 1.0 / (i + 1), "acc": i / 40, "tag": "x"})
run.emit("define_metric", {"name": "acc", "step_metric": None, "summary": "max",
                           "hidden": False, "goal": "maximize"})
run.emit("config", {"changes": {"bs": 32}})
run.emit("summary", {"changes": {"best": 0.9}})
et.summary()["final_only"] = 7   # reaches wandb with the final summary
os.makedirs("ds/v1")
with open("ds/v1/data.txt", "w") as f:
    f.write("hello")
run.emit("artifact", {"action": "logged", "name": "ds", "version": 1, "type": "dataset",
                      "digest": "d1", "path": "ds/v1", "aliases": ["latest", "best"],
                      "metadata": {"rows": 1}, "step": 40})
et.finish()
out = {"main": run.info()["backends"], "own_is_current": wandb.run is own}
own.log({"mine": 1})
own.finish()
ev = et.init(project="proj", name="r1", stream="eval", backends=[{"type": "wandb"}])
et.log({"val": 0.5})
et.finish(exit_code=3)
out["eval"] = ev.info()["backends"]
et.init(project="proj", name="r1", backends=["wandb"])   # resumed: the same wandb run id
et.log({"loss": 0.01})
et.finish()
print(json.dumps(out))
"""


@pytest.mark.slow
def test_wandb_offline_files_hold_our_rows(tmp_path):
    p = run_py(CHILD, env=_env(tmp_path), timeout=120)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["own_is_current"] is True  # reinit="create_new": the mirror never clobbers it
    main = out["main"]["wandb"]
    assert main["last_error"] is None, main["last_error"]
    assert (main["queued"], main["sent"], main["dropped"], main["failures"]) == (40, 40, {}, 0)
    assert main["alive"] is True and main["finished"] is True

    files = sorted((tmp_path / "wb" / "wandb").glob("offline-run-*/run-*.wandb"))
    by_name, resumed = {}, None
    for f in files:
        records = wandb_records(f)
        (run_rec,) = of_kind(records, "run")
        if run_rec.display_name == "r1" and "r1" in by_name:
            resumed = (run_rec, records)  # the later attempt (files sort by start time)
            continue
        by_name[run_rec.display_name] = (run_rec, records)
    assert set(by_name) == {"users-own", "r1", "r1.eval"}

    run_rec, records = by_name["r1"]
    assert run_rec.project == "proj" and run_rec.run_group == "r1"
    assert list(run_rec.tags) == ["t1"]
    ours = read_lines(tmp_path / "runs" / "proj" / "r1" / "metrics.jsonl")[:40]  # + 1 resumed
    history = [items(h.item) for h in of_kind(records, "history")]
    assert [h["_step"] for h in history] == [r["_step"] for r in ours] == list(range(40))
    for h, r in zip(history, ours, strict=True):
        assert {k: h[k] for k in r if k not in ("_step", "_time")} == {
            k: v for k, v in r.items() if k not in ("_step", "_time")
        }
        assert "time_ms/fwd" in h  # span metrics arrive with the row
    config = {}
    for c in of_kind(records, "config"):
        config.update(items(c.update))
    config.update(items(run_rec.config.update))
    assert config["lr"] == 0.1 and config["bs"] == 32
    summary = {}
    for s in of_kind(records, "summary"):
        summary.update(items(s.update))
    assert summary["best"] == 0.9 and summary["final_only"] == 7
    assert summary["loss"] == 1.0 / 40  # wandb's own summary of what it was logged
    # our updates (top-level keys) never overwrite the metrics wandb summarises itself
    assigned = {u.key for s in of_kind(records, "summary") for u in s.update if u.key}
    assert {"best", "final_only"} <= assigned
    assert not assigned & {"loss", "acc", "tag", "time_ms/fwd"}
    (metric,) = of_kind(records, "metric")
    assert metric.name == "acc" and metric.summary.max
    (artifact,) = of_kind(records, "artifact")
    assert (artifact.name, artifact.type) == ("ds", "dataset")
    assert set(artifact.aliases) == {"latest", "best"}
    assert json.loads(artifact.metadata)["rows"] == 1
    refs = [e.ref for e in artifact.manifest.contents]
    assert any(ref.startswith("file://") and ref.endswith("data.txt") for ref in refs)
    (exit_rec,) = of_kind(records, "exit")
    assert exit_rec.exit_code == 0

    assert resumed is not None and resumed[0].run_id == run_rec.run_id  # the same wandb run
    assert [items(h.item)["_step"] for h in of_kind(resumed[1], "history")] == [40]

    ev_rec, ev_records = by_name["r1.eval"]
    assert ev_rec.run_group == "r1" and ev_rec.run_id != run_rec.run_id
    assert [items(h.item)["val"] for h in of_kind(ev_records, "history")] == [0.5]
    assert of_kind(ev_records, "exit")[0].exit_code == 3
    assert out["eval"]["wandb"]["sent"] == 1


def test_missing_libraries_warn_once_and_training_goes_on(tmp_path):
    p = run_py(
        """
        import json, sys
        sys.modules["wandb"] = None
        sys.modules["trackio"] = None
        import expr_tracker as et
        run = et.init(project="proj", name="r1", backends=["wandb", "trackio"])
        for i in range(20):
            et.log({"a": i})
        et.finish()
        print(json.dumps(run.info()["backends"]))
        """,
        env=_env(tmp_path),
    )
    stats = json.loads(p.stdout.strip().splitlines()[-1])
    for kind in ("wandb", "trackio"):
        assert stats[kind]["alive"] is False and stats[kind]["queued"] == 0
        assert f"pip install 'expr-tracker[{kind}]'" in stats[kind]["last_error"]
        assert p.stderr.count(f"pip install 'expr-tracker[{kind}]'") == 1
    assert len(read_lines(tmp_path / "runs" / "proj" / "r1" / "metrics.jsonl")) == 20


@pytest.mark.slow
def test_wandb_init_failing_turns_the_mirror_off(tmp_path):
    p = run_py(
        """
        import json
        import expr_tracker as et
        run = et.init(project="proj", name="r1", backends=["wandb"],
                      backend_kwargs={"wandb": {"mode": "bogus"}})
        for i in range(20):
            et.log({"a": i})
        et.finish()
        print(json.dumps(run.info()["backends"]))
        """,
        env=_env(tmp_path),
        timeout=120,
    )
    stats = json.loads(p.stdout.strip().splitlines()[-1])["wandb"]
    assert stats["alive"] is False and stats["sent"] == 0
    assert stats["last_error"].startswith("init failed") and "bogus" in stats["last_error"]
    assert sum(stats["dropped"].values()) == 20
    assert p.stderr.count("the wandb mirror is off") == 1
    assert len(read_lines(tmp_path / "runs" / "proj" / "r1" / "metrics.jsonl")) == 20


@pytest.mark.slow
def test_a_script_without_finish_mirrors_everything_before_wandb_tears_down(tmp_path):
    # wandb registers the teardown of its service at exit when its first run starts (on the
    # mirror's thread, after et.init registered the exit finish): the exit finish must still
    # come first, or every row and the finish fail with "Connection lost"
    p = run_py(
        """
        import time
        import expr_tracker as et
        run = et.init(project="proj", name="r1", backends=["wandb"])
        while run.info()["backends"]["wandb"]["alive"] is None:
            time.sleep(0.05)
        for i in range(5):
            et.log({"loss": 1.0 / (i + 1)})
        raise RuntimeError("boom")
        """,
        env=_env(tmp_path),
        timeout=120,
        check=False,
    )
    assert p.returncode == 1 and "the wandb mirror" not in p.stderr, p.stderr
    assert p.stderr.count("RuntimeError: boom") == 1, p.stderr  # wandb's hook prints it too
    (f,) = (tmp_path / "wb" / "wandb").glob("offline-run-*/run-*.wandb")
    records = wandb_records(f)
    assert [items(h.item)["_step"] for h in of_kind(records, "history")] == list(range(5))
    assert of_kind(records, "exit")[0].exit_code == 1


@pytest.mark.slow
def test_two_wandb_entries_are_two_wandb_runs(tmp_path):
    # backends: [{type: wandb, ...}, {type: wandb, ...}] (two entities, say): each its own
    # id, so neither is refused as "run ID ... is in use"
    p = run_py(
        """
        import json
        import expr_tracker as et
        run = et.init(project="proj", name="r1",
                      backends=[{"type": "wandb", "tags": ["a"]}, {"type": "wandb", "tags": ["b"]}])
        for i in range(3):
            et.log({"loss": 1.0 / (i + 1)})
        et.finish()
        print(json.dumps(run.info()["backends"]))
        """,
        env=_env(tmp_path),
        timeout=120,
    )
    stats = json.loads(p.stdout.strip().splitlines()[-1])
    assert [s["sent"] for s in stats.values()] == [3, 3], stats
    ids = {
        of_kind(wandb_records(f), "run")[0].run_id
        for f in (tmp_path / "wb" / "wandb").glob("offline-run-*/run-*.wandb")
    }
    assert len(ids) == 2
