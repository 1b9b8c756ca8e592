"""Resuming a run whose directory cannot be written at start (a read-only mount) and whose
metrics file ends with a torn line: the resume continues after the last complete step on
disk, never at step 0, so no step is written twice once the directory is writable again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import expr_tracker as et

CHILD = textwrap.dedent(
    """
    import os, sys, time
    import expr_tracker as et
    runs, go = sys.argv[1], sys.argv[2]
    et.init(project="ro", name="r", dir=runs)
    print("init done", flush=True)
    for _ in range(600):  # the directory is made writable again meanwhile
        if os.path.exists(go):
            break
        time.sleep(0.05)
    for i in range(5):
        et.log({"loss2": float(i)})
    et.finish()
    print("finished", flush=True)
    """
)

# a mount namespace of its own: runs/ bind-mounted read-only, the child started, runs/ made
# writable again once the child's et.init returned (root ignores file permissions, so only
# a read-only mount makes the repair of the torn line really fail)
SCRIPT = """
mount --bind "$RUNS" "$RUNS" && mount -o remount,ro,bind "$RUNS" || exit 77
touch "$RUNS/probe" 2>/dev/null && exit 77
"$PY" "$CHILD" "$RUNS" "$GO" > "$OUT" 2> "$ERR" &
pid=$!
for i in $(seq 600); do grep -q "init done" "$OUT" 2>/dev/null && break; sleep 0.05; done
mount -o remount,rw,bind "$RUNS" || exit 78
touch "$GO"
wait $pid
"""


@pytest.mark.skipif(
    shutil.which("unshare") is None or sys.platform != "linux", reason="needs unshare -m"
)
@pytest.mark.parametrize(
    ("tail", "resume_at"),
    [(b'{"loss": 99, "_st', 10), (b'{"loss": 99, "_step": 10}', 11)],
    ids=["torn", "whole-record-without-newline"],
)
def test_resume_while_the_run_dir_is_read_only(tmp_path, tail, resume_at):
    runs = tmp_path / "runs"
    et.init(project="ro", name="r", dir=str(runs))
    for i in range(10):
        et.log({"loss": float(i)})
    et.finish()
    metrics = runs / "ro" / "r" / "metrics.jsonl"
    with open(metrics, "ab") as f:
        f.write(tail)
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    out, err = tmp_path / "out", tmp_path / "err"
    env = {
        "RUNS": str(runs),
        "GO": str(tmp_path / "go"),
        "PY": sys.executable,
        "CHILD": str(child),
        "OUT": str(out),
        "ERR": str(err),
    }
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", SCRIPT],
        env={**os.environ, **env},
        capture_output=True,
        timeout=120,
    )
    if proc.returncode == 77:
        pytest.skip("no read-only bind mount in a mount namespace here")
    stderr = err.read_text()
    assert proc.returncode == 0, (proc.stderr, stderr)
    assert "finished" in out.read_text()
    assert f"resuming run ro/r at step {resume_at};" in stderr
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    steps = [r["_step"] for r in rows]
    assert steps == list(range(resume_at + 5))  # every step once, none written twice
    assert [r["loss2"] for r in rows[resume_at:]] == [0.0, 1.0, 2.0, 3.0, 4.0]
    info = json.loads((metrics.parent / "run.json").read_text())
    assert info["resumed_at_step"] == resume_at
