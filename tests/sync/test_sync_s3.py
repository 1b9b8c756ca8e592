"""``et sync`` against a real S3 endpoint (``moto_server`` on 127.0.0.1): conditional
writes, idempotence, concurrent syncers, kill -9, readers during a sync, gc."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from expr_tracker.sync import layout
from expr_tracker.sync.bucket import list_producers, read_log, read_manifest
from expr_tracker.sync.collect import collect
from expr_tracker.sync.store import PreconditionFailed, open_store
from expr_tracker.sync.upload import sync_dir

pytest.importorskip("boto3")
pytest.importorskip("pyarrow")


def write_lines(path: Path, start: int, n: int, *, torn: bool = False) -> None:
    """Append ``n`` metrics lines (steps ``start``..) to ``path``; ``torn``: then half a line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        for i in range(start, start + n):
            f.write(
                json.dumps({"_step": i, "_time": 1e9 + i, "loss": 1.0 / (i + 1)}).encode() + b"\n"
            )
        if torn:
            f.write(b'{"_step": ')


def complete(path: Path) -> bytes:
    data = path.read_bytes()
    return data[: data.rfind(b"\n") + 1]


def bucket_bytes(store, project="proj", run="r1", stream=None, rank=0, kind="metrics") -> bytes:
    m, _etag = read_manifest(store, project, run, stream, rank)
    return b"".join(read_log(store, m, kind)) if m else b""


def all_keys(store) -> set[str]:
    return {k for k, _s, _m in store.list("")}


def test_conditional_writes_are_honoured(s3_bucket):
    store = open_store(s3_bucket.url)
    e1 = store.put("x/m.json", b"1", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        store.put("x/m.json", b"2", if_none_match=True)
    e2 = store.put("x/m.json", b"3", if_match=e1)
    with pytest.raises(PreconditionFailed):
        store.put("x/m.json", b"4", if_match=e1)  # stale: someone committed e2 meanwhile
    assert store.get("x/m.json") == (b"3", e2)
    assert store.get("x/none.json") is None


def test_sync_then_resync_uploads_nothing(s3_bucket, tmp_path):
    import expr_tracker as et

    et.init(project="proj", name="r1", dir=str(tmp_path / "runs"))
    for i in range(50):
        with et.span("fwd"):
            pass
        et.log({"loss": 1.0 / (i + 1)})
    et.finish()
    first = sync_dir(tmp_path / "runs", s3_bucket.url)
    assert first.errors == [] and first.commits == 1 and first.bytes > 0
    store = open_store(s3_bucket.url)
    before = all_keys(store)
    again = sync_dir(tmp_path / "runs", s3_bucket.url)
    assert (again.bytes, again.objects, again.unchanged) == (0, 0, 1)
    full = sync_dir(tmp_path / "runs", s3_bucket.url, full=True)  # asks the bucket: same answer
    assert (full.bytes, full.objects, full.commits, full.unchanged) == (0, 0, 0, 0)
    assert all_keys(store) == before
    run_dir = tmp_path / "runs" / "proj" / "r1"
    assert bucket_bytes(store) == (run_dir / "metrics.jsonl").read_bytes()
    assert bucket_bytes(store, kind="spans") == (run_dir / "spans.jsonl").read_bytes()
    m, _ = read_manifest(store, "proj", "r1", None, 0)
    assert {"run.json", "summary.json", "config.json", "spec.json"} <= set(m["files"])
    assert list_producers(store) == [("proj", "r1", None, 0)]
    from expr_tracker.sync.mirror import mirror

    copy = mirror(s3_bucket.url, cache_dir=tmp_path / "copy")
    assert copy.problems == []
    for name in ("metrics.jsonl", "spans.jsonl", "run.json", "summary.json"):
        assert (copy.path / "proj" / "r1" / name).read_bytes() == (run_dir / name).read_bytes()


def test_parquet_parts_hold_every_line_once_with_hive_columns(s3_bucket, tmp_path):
    import pyarrow.dataset as ds
    import pyarrow.fs as pafs

    path = tmp_path / "runs" / "proj" / "r1" / "metrics.jsonl"
    write_lines(path, 0, 300)
    sync_dir(tmp_path / "runs", s3_bucket.url, part_bytes=4096)
    write_lines(path, 300, 200)
    sync_dir(tmp_path / "runs", s3_bucket.url, part_bytes=4096)
    store = open_store(s3_bucket.url)
    m, _ = read_manifest(store, "proj", "r1", None, 0)
    keys = [
        f"{s3_bucket.bucket}/{s3_bucket.prefix}/{p['parquet']}"
        for p in m["logs"]["metrics"]["parts"]
    ]
    assert len(keys) > 2
    fs = pafs.S3FileSystem(
        endpoint_override=s3_bucket.endpoint,
        access_key="testing",
        secret_key="testing-secret-value",
        region="us-east-1",
        scheme="http",
    )
    base = f"{s3_bucket.bucket}/{s3_bucket.prefix}/metrics"
    t = ds.dataset(
        keys,
        filesystem=fs,
        format="parquet",
        partitioning=ds.partitioning(flavor="hive"),
        partition_base_dir=base,
    ).to_table()
    assert sorted(t.column("step").to_pylist()) == list(range(500))
    assert set(t.column("run").to_pylist()) == {"r1"} and set(t.column("stream").to_pylist()) == {
        ""
    }


def test_a_torn_last_line_waits_for_its_newline(s3_bucket, tmp_path):
    path = tmp_path / "runs" / "proj" / "r1" / "metrics.jsonl"
    write_lines(path, 0, 10, torn=True)
    sync_dir(tmp_path / "runs", s3_bucket.url)
    store = open_store(s3_bucket.url)
    assert bucket_bytes(store) == complete(path)
    with open(path, "ab") as f:
        f.write(b'10, "loss": 0.5}\n')
    sync_dir(tmp_path / "runs", s3_bucket.url)
    assert bucket_bytes(store) == path.read_bytes()


def test_a_lost_commit_is_retried_from_what_the_winner_committed(s3_bucket, tmp_path):
    """Syncer A reads the manifest, then syncer B commits first: A's conditional write
    fails (412), A reads B's manifest and commits only what B did not."""
    runs_a, runs_b = tmp_path / "a", tmp_path / "b"
    write_lines(runs_a / "proj" / "r1" / "metrics.jsonl", 0, 20)
    (runs_b / "proj" / "r1").mkdir(parents=True)
    real = open_store(s3_bucket.url)

    class InterleavedStore:  # the real store; B syncs right before A's first commit
        url = real.url
        fired = False

        def __getattr__(self, name):
            return getattr(real, name)

        def put(self, key, data, **kw):
            if key.startswith("_manifests/") and not self.fired:
                self.fired = True
                b = sync_dir(runs_b, s3_bucket.url, state_dir=tmp_path / "sb")
                assert b.commits == 1
            return real.put(key, data, **kw)

    (runs_b / "proj" / "r1" / "metrics.jsonl").write_bytes(
        (runs_a / "proj" / "r1" / "metrics.jsonl").read_bytes()[:0]
    )
    write_lines(runs_b / "proj" / "r1" / "metrics.jsonl", 0, 12)  # B holds the first 12 lines
    rep = sync_dir(runs_a, s3_bucket.url, store=InterleavedStore(), state_dir=tmp_path / "sa")
    assert rep.lost == 1 and rep.commits == 1 and rep.errors == []
    m, _ = read_manifest(real, "proj", "r1", None, 0)
    assert [p["lines"] for p in m["logs"]["metrics"]["parts"]] == [12, 8]
    assert bucket_bytes(real) == (runs_a / "proj" / "r1" / "metrics.jsonl").read_bytes()


def _sync_cmd(
    url: str, root: Path, state: Path, part_bytes: int, loops: int = 1, pause: float = 0.0
) -> list[str]:
    """A process syncing ``loops`` times, ``pause`` seconds between two passes."""
    code = (
        "import sys, json, time; from expr_tracker.sync.upload import sync_dir\n"
        f"for _ in range({loops}):\n"
        f"    r = sync_dir({str(root)!r}, {url!r}, state_dir={str(state)!r}, part_bytes={part_bytes}, full=True)\n"
        "    print(json.dumps({'lost': r.lost, 'commits': r.commits, 'errors': r.errors}), flush=True)\n"
        f"    time.sleep({pause})\n"
    )
    return [sys.executable, "-c", code]


@pytest.mark.slow
def test_three_concurrent_syncers_of_a_growing_run_lose_nothing(s3_bucket, tmp_path):
    path = tmp_path / "runs" / "proj" / "r1" / "metrics.jsonl"
    write_lines(path, 0, 100)
    stop = threading.Event()

    def writer():
        # bounded growth (1,200 more lines over ~1 s): the syncers race the writer, then
        # catch up; an unbounded writer outruns three 2 KB-part syncers on a slow machine
        for i in range(100, 1300, 25):
            if stop.is_set():
                return
            write_lines(path, i, 25)
            time.sleep(0.02)

    t = threading.Thread(target=writer)
    t.start()
    procs = [
        subprocess.Popen(
            _sync_cmd(s3_bucket.url, tmp_path / "runs", tmp_path / f"state{k}", 2048, loops=8),
            env=s3_bucket.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for k in range(3)
    ]
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        stop.set()
        t.join()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    reports = [json.loads(line) for out, _err in outs for line in out.decode().splitlines()]
    assert all(p.returncode == 0 for p in procs), [e.decode()[-500:] for _o, e in outs]
    assert all(r["errors"] == [] for r in reports)
    final = sync_dir(tmp_path / "runs", s3_bucket.url, state_dir=tmp_path / "sf")
    assert final.errors == []
    store = open_store(s3_bucket.url)
    data = bucket_bytes(store)
    assert data == path.read_bytes()  # every line once, in order
    steps = [json.loads(x)["_step"] for x in data.splitlines()]
    assert steps == list(range(len(steps)))
    print("lost commits retried:", sum(r["lost"] for r in reports))


@pytest.mark.slow
def test_kill_9_anywhere_then_sync_again_loses_and_doubles_nothing(s3_bucket, tmp_path):
    rng = random.Random(26)
    runs = tmp_path / "runs"
    paths = [runs / "proj" / f"r{k}" / "metrics.jsonl" for k in range(3)]
    n = 0
    for _round in range(6):
        for p in paths:
            write_lines(p, n, 400)
        n += 400
        proc = subprocess.Popen(
            _sync_cmd(s3_bucket.url, runs, tmp_path / "state", 1500),
            env=s3_bucket.env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(0.3, 2.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    rep = sync_dir(runs, s3_bucket.url, state_dir=tmp_path / "state")
    assert rep.errors == []
    store = open_store(s3_bucket.url)
    for k, p in enumerate(paths):
        assert bucket_bytes(store, run=f"r{k}") == p.read_bytes()
    gc = collect(store, grace=0)
    assert gc.problems == []
    referenced: set[str] = set()
    for ident in list_producers(store):
        m, _ = read_manifest(store, *ident)
        referenced |= layout.referenced(m)
    manifests = {layout.manifest_key(*ident) for ident in list_producers(store)}
    assert all_keys(store) == referenced | manifests
    assert sync_dir(runs, s3_bucket.url, state_dir=tmp_path / "state", full=True).bytes == 0


@pytest.mark.slow
def test_a_reader_during_a_sync_sees_a_consistent_prefix(s3_bucket, tmp_path):
    """While a run grows and a syncer commits pass after pass, every read (one manifest,
    then its parts) is a prefix of the file made of whole lines."""
    path = tmp_path / "runs" / "proj" / "r1" / "metrics.jsonl"
    write_lines(path, 0, 500)
    stop = threading.Event()
    first_seen = threading.Event()
    enough = tmp_path / "enough"

    def writer():
        # 1,500 more lines over ~1.5 s, started once the reader saw the first commit: the
        # growth races the syncer's later passes however slow its start is on a loaded box
        first_seen.wait(120)
        for i in range(500, 2000, 50):
            if stop.is_set():
                return
            write_lines(path, i, 50)
            time.sleep(0.05)

    t = threading.Thread(target=writer)
    t.start()
    # a syncer passing again and again (bounded) until the test has seen the whole file
    code = (
        "import os, time; from expr_tracker.sync.upload import sync_dir\n"
        "for _ in range(300):\n"
        f"    sync_dir({str(tmp_path / 'runs')!r}, {s3_bucket.url!r}, "
        f"state_dir={str(tmp_path / 'state')!r}, part_bytes=2000, full=True)\n"
        f"    if os.path.exists({str(enough)!r}): break\n"
        "    time.sleep(0.1)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=s3_bucket.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    store = open_store(s3_bucket.url)
    seen = []
    try:
        while proc.poll() is None:
            data = bucket_bytes(store)
            assert path.read_bytes().startswith(data) and (not data or data.endswith(b"\n"))
            steps = [json.loads(x)["_step"] for x in data.splitlines()]
            assert steps == list(range(len(steps)))
            seen.append(len(data))
            if data:
                first_seen.set()
            if not t.is_alive() and len(data) == path.stat().st_size:
                enough.touch()
            time.sleep(0.02)  # a reader polls; it does not hammer the endpoint
    finally:
        stop.set()
        first_seen.set()
        t.join()
    out, err = proc.communicate()
    assert proc.returncode == 0, err.decode()[-500:]
    assert seen == sorted(seen) and len(set(seen)) > 2, seen  # it grew while read


def test_two_local_runs_of_one_name_are_refused_not_merged(s3_bucket, tmp_path):
    write_lines(tmp_path / "a" / "proj" / "r1" / "metrics.jsonl", 0, 10)
    write_lines(tmp_path / "b" / "proj" / "r1" / "metrics.jsonl", 5, 10)  # other lines
    assert sync_dir(tmp_path / "a", s3_bucket.url).errors == []
    rep = sync_dir(tmp_path / "b", s3_bucket.url)
    assert len(rep.errors) == 1 and "differs from what the bucket holds" in rep.errors[0]
    store = open_store(s3_bucket.url)
    assert bucket_bytes(store) == (tmp_path / "a" / "proj" / "r1" / "metrics.jsonl").read_bytes()


def test_media_blobs_are_uploaded_once_by_hash(s3_bucket, tmp_path):
    runs = tmp_path / "runs"
    for name in ("r1", "r2"):
        write_lines(runs / "proj" / name / "metrics.jsonl", 0, 3)
        (runs / "proj" / name / "media").mkdir()
        (runs / "proj" / name / "media" / "img.png").write_bytes(b"\x89PNG same bytes")
    rep = sync_dir(runs, s3_bucket.url)
    store = open_store(s3_bucket.url)
    blobs = [k for k in all_keys(store) if k.startswith("_blobs/")]
    assert len(blobs) == 1 and rep.errors == []
    m, _ = read_manifest(store, "proj", "r2", None, 0)
    assert m["blobs"]["media/img.png"]["size"] == len(b"\x89PNG same bytes")


def test_cli_sync_and_gc_print_what_they_did_and_never_the_secret(s3_bucket, tmp_path):
    write_lines(tmp_path / "runs" / "proj" / "r1" / "metrics.jsonl", 0, 5)
    env = s3_bucket.env()
    et = [sys.executable, "-m", "expr_tracker.cli.main"]
    r = subprocess.run(
        [*et, "sync", "runs", s3_bucket.url], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    assert "1 commit(s)" in r.stdout
    r = subprocess.run(
        [*et, "sync", "runs", s3_bucket.url, "--json"],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert json.loads(r.stdout)["bytes"] == 0
    open_store(s3_bucket.url).put(
        "_raw/project=proj/run=r1/metrics.jsonl/part-000000000099-" + "0" * 32 + ".jsonl", b"x\n"
    )
    r = subprocess.run(
        [*et, "gc", s3_bucket.url, "--grace", "0"], env=env, capture_output=True, text=True
    )
    assert r.returncode == 0 and "deleted 1 unreferenced" in r.stdout, r.stdout + r.stderr
    # a bucket that does not exist: the error names it, never the secret key
    r = subprocess.run(
        [*et, "sync", "runs", "s3://no-such-bucket-et/x"],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 1 and "no-such-bucket-et" in r.stderr
    assert "testing-secret-value" not in r.stdout + r.stderr
    for dirpath, _d, files in os.walk(tmp_path):
        for f in files:
            p = Path(dirpath) / f
            if p.is_file() and not p.is_symlink():
                assert b"testing-secret-value" not in p.read_bytes(), p
