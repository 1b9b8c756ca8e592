"""What users break: processes racing for one artifact, a publisher killed (SIGKILL) while
copying and between its rename and its index line, a read-only store, a full disk. Real
subprocesses, real signals, real mounts (in a mount namespace of their own)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

import expr_tracker as et
from expr_tracker.artifacts import ArtifactNotFoundError, ArtifactStore

RACER = textwrap.dedent(
    """
    import os, sys, time
    import expr_tracker as et
    runs, go, tag, content = sys.argv[1:5]
    et.init(project="p", name="racer-" + tag, dir=runs)
    src = os.path.join(runs, "..", "src-" + tag)
    os.makedirs(src, exist_ok=True)
    for i in range(20):
        with open(os.path.join(src, f"f{i}.bin"), "wb") as f:
            f.write((content * 2000).encode())
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.005)
    v = et.log_artifact(src, name="shared")
    print(v.version, v.digest, flush=True)
    et.finish()
    """
)


def _racers(tmp_path, contents):
    runs = tmp_path / "runs"
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(runs), str(go), str(i), c],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, c in enumerate(contents)
    ]
    for p in procs:  # every one imported, initialised and staged its files: go together
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
    go.write_text("go")
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        version, digest = out.split()
        results.append((int(version), digest))
    return runs, results


@pytest.mark.slow
def test_racing_processes_get_distinct_complete_versions(tmp_path):
    runs, results = _racers(tmp_path, ["a", "b", "c", "d"])
    assert sorted(v for v, _ in results) == [0, 1, 2, 3]
    assert len({d for _, d in results}) == 4
    store = ArtifactStore(runs / "p" / "artifacts")
    lines = [r for r in store.records() if r["kind"] == "version"]
    assert sorted(r["version"] for r in lines) == [0, 1, 2, 3]
    for version, digest in results:
        v = store.get("shared", f"v{version}")
        assert v.digest == digest and v.verify() and len(v.files()) == 20
    assert not [p for p in (store.root / "shared").iterdir() if p.name.startswith(".staging")]


@pytest.mark.slow
def test_racing_processes_with_identical_contents_share_one_version(tmp_path):
    runs, results = _racers(tmp_path, ["same", "same", "same"])
    assert {v for v, _ in results} == {0}
    store = ArtifactStore(runs / "p" / "artifacts")
    assert [r["version"] for r in store.records()] == [0]


VICTIM = textwrap.dedent(
    """
    import os, sys, time
    import expr_tracker as et
    from expr_tracker.artifacts import store as store_mod
    runs, src, where = sys.argv[1:4]
    et.init(project="p", name="victim", dir=runs, artifacts={"mode": "copy"})
    if where == "copy":
        real, seen = store_mod.copy_hashed, []
        def copy_hashed(a, b):
            seen.append(a)
            if len(seen) == 10:  # mid-copy: 9 files staged, the 10th not yet
                print("stop", flush=True)
                time.sleep(600)
            return real(a, b)
        store_mod.copy_hashed = copy_hashed
    else:  # renamed to v0, manifest written, index line not yet
        real_append = store_mod.ArtifactStore._append
        def _append(self, record):
            print("stop", flush=True)
            time.sleep(600)
        store_mod.ArtifactStore._append = _append
    et.log_artifact(src, name="ds")
    """
)


@pytest.mark.parametrize("where", ["copy", "publish"])
def test_sigkill_leaves_no_half_version(tmp_path, where):
    runs = tmp_path / "runs"
    src = tmp_path / "src"
    src.mkdir()
    for i in range(30):
        (src / f"f{i:02d}.bin").write_bytes(os.urandom(20_000))
    p = subprocess.Popen(
        [sys.executable, "-c", VICTIM, str(runs), str(src), where],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout.readline().strip() == "stop", p.stderr.read()
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.communicate(timeout=30)  # waits, and closes the pipes
    adir = runs / "p" / "artifacts" / "ds"
    left = sorted(x.name for x in adir.iterdir())
    if where == "copy":
        assert any(n.startswith(".staging-") and not n.endswith(".lock") for n in left), left
    else:
        assert "v0" in left and "v0.manifest.json" in left, left  # on disk, not committed
    store = ArtifactStore(runs / "p" / "artifacts")
    assert store.records() == [] and store.names() == []
    with pytest.raises(ArtifactNotFoundError):
        store.get("ds")
    et.init(project="p", name="next", dir=str(runs))
    with pytest.raises(ArtifactNotFoundError):
        et.use_artifact("ds")
    v = et.log_artifact(src, name="ds")
    assert v.version == 0 and v.verify() and len(v.files()) == 30
    et.finish()
    left = sorted(x.name for x in adir.iterdir())
    assert [n for n in left if not n.startswith(".staging-")] == [".lock", "v0", "v0.manifest.json"]
    assert all(n.endswith(".lock") for n in left if n.startswith(".staging-")), left
    # the dead writer's lock file goes once it is old enough (never a live one's)
    store.clean_staging("ds", min_age_s=0)
    assert sorted(x.name for x in adir.iterdir()) == [".lock", "v0", "v0.manifest.json"]


NEEDS_UNSHARE = pytest.mark.skipif(
    shutil.which("unshare") is None or sys.platform != "linux", reason="needs unshare -m"
)

FULL_CHILD = textwrap.dedent(
    """
    import json, os, sys
    import expr_tracker as et
    from expr_tracker.artifacts import ArtifactError, ArtifactStore
    runs, big, small = sys.argv[1:4]
    out = {}
    et.init(project="p", name="r", dir=runs)
    try:
        et.log_artifact(big, name="big")
        out["raised"] = None
    except ArtifactError as exc:
        out["raised"] = str(exc)
    et.log({"still": 1.0})
    store = ArtifactStore(os.path.join(runs, "p", "artifacts"))
    out["records"] = store.records()
    out["left"] = sorted(os.listdir(os.path.join(runs, "p", "artifacts", "big")))
    os.remove(big)  # disk space back: the next log works
    v = et.log_artifact(small, name="small")
    out["small"] = [v.version, v.verify()]
    et.finish()
    print(json.dumps(out))
    """
)


@NEEDS_UNSHARE
def test_a_full_disk_raises_and_leaves_nothing(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    big, small = tmp_path / "big.bin", tmp_path / "small.txt"
    big.write_bytes(os.urandom(600_000))
    small.write_text("small")
    child = tmp_path / "child.py"
    child.write_text(FULL_CHILD)
    # runs/ is a 400 KiB tmpfs; the 600 KB source lives outside it (another device: no
    # clone, no copy_file_range; the plain copy runs out of space)
    script = 'mount -t tmpfs -o size=400k tmpfs "$1" || exit 77\nexec "$PY" "$2" "$1" "$3" "$4"\n'
    p = subprocess.run(
        ["unshare", "-m", "sh", "-c", script, "sh", str(runs), str(child), str(big), str(small)],
        env={**os.environ, "PY": sys.executable},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if p.returncode == 77:
        pytest.skip("no tmpfs mount in a mount namespace here")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["raised"] and "No space left on device" in out["raised"]
    assert "nothing was published" in out["raised"]
    assert out["records"] == []
    assert [n for n in out["left"] if n != ".lock"] == []  # no staging directory or lock file
    assert out["small"] == [0, True]


RO_SCRIPT = """
mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" || exit 77
touch "$1/probe" 2>/dev/null && exit 77
exec "$PY" "$2" "$3" "$4"
"""

RO_CHILD = textwrap.dedent(
    """
    import json, sys
    import expr_tracker as et
    from expr_tracker.artifacts import ArtifactError
    runs, src = sys.argv[1:3]
    out = {}
    et.init(project="p", name="reader", dir=runs)
    try:
        et.log_artifact(src, name="ds")
    except ArtifactError as exc:
        out["raised"] = str(exc)
    v = et.use_artifact("ds")  # reading a read-only store works
    out["used"] = [v.version, v.verify()]
    et.finish()
    print(json.dumps(out))
    """
)


@NEEDS_UNSHARE
def test_a_read_only_store_refuses_to_log_but_reads(tmp_path):
    runs = tmp_path / "runs"
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a")
    et.init(project="p", name="writer", dir=str(runs))
    et.log_artifact(src, name="ds")
    et.finish()
    (src / "a.txt").unlink()
    (src / "a.txt").write_text("changed")
    store_dir = runs / "p" / "artifacts"
    before = (store_dir / "index.jsonl").read_bytes()
    child = tmp_path / "child.py"
    child.write_text(RO_CHILD)
    p = subprocess.run(
        [
            "unshare",
            "-m",
            "sh",
            "-c",
            RO_SCRIPT,
            "sh",
            str(store_dir),
            str(child),
            str(runs),
            str(src),
        ],
        env={**os.environ, "PY": sys.executable},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if p.returncode == 77:
        pytest.skip("no read-only bind mount in a mount namespace here")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert "Read-only file system" in out["raised"] and "ds" in out["raised"]
    assert out["used"] == [0, True]
    assert (store_dir / "index.jsonl").read_bytes() == before
    assert sorted(x.name for x in (store_dir / "ds").iterdir()) == [
        ".lock",
        "v0",
        "v0.manifest.json",
    ]
