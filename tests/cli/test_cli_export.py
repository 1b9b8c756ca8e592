"""`et export`: the command line over expr_tracker.query.export (exit codes, messages, the
format from the suffix, partitioning, a real `et` process interrupted mid-export)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest

pq = pytest.importorskip("pyarrow.parquet")
duckdb = pytest.importorskip("duckdb")

import expr_tracker as et  # noqa: E402
from expr_tracker.cli.main import main  # noqa: E402


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    for name in ("a", "b c"):
        et.init(project="proj", name=name, dir=str(root))
        for i in range(5):
            et.log({"loss": 1.0 / (i + 1), "acc": i, "note": f"n{i}"})
        et.log({"loss": float("nan")})
        et.finish()
    return root


def test_one_run_to_a_file_with_the_format_from_the_suffix(runs, tmp_path, capsys):
    out = tmp_path / "a.csv"
    assert main(["export", str(runs / "proj" / "a"), "-o", str(out)]) == 0
    msg = capsys.readouterr().out
    assert msg.startswith(f"wrote {out}: 6 rows (wide, 9 columns)") and " csv file" in msg
    header = out.read_text().splitlines()[0]
    assert header == "project,run,stream,rank,step,time,acc,loss,note"


def test_a_folder_to_a_partitioned_directory_json_summary(runs, tmp_path, capsys):
    out = tmp_path / "export"
    args = ["export", str(runs), "-o", str(out), "--layout", "long", "--metrics", "loss", "--json"]
    assert main(args) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["partitioned"] and res["runs"] == 2 and res["rows"] == 12 and res["files"] == 2
    got = (
        duckdb.connect()
        .execute(
            "SELECT run, count(*), count(*) FILTER (WHERE isnan(value)) FROM read_parquet(?, "
            "hive_partitioning=true) GROUP BY run ORDER BY run",
            [str(out / "**" / "*.parquet")],
        )
        .fetchall()
    )
    assert got == [("proj/a", 6, 1), ("proj/b c", 6, 1)]


def test_errors_exit_1_with_the_reason(runs, tmp_path, capsys):
    out = tmp_path / "o.parquet"
    out.write_text("x")
    assert main(["export", str(runs / "proj" / "a"), "-o", str(out)]) == 1
    assert "exists; pass --overwrite" in capsys.readouterr().err
    assert main(["export", str(runs / "proj" / "a"), "-o", str(out), "--overwrite"]) == 0
    capsys.readouterr()
    assert main(["export", str(tmp_path / "nope"), "-o", str(tmp_path / "x")]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert main(["export", str(runs), "-o", str(tmp_path / "x"), "--metrics", "zzz*"]) == 1
    assert "'zzz*' matches no metric" in capsys.readouterr().err
    assert main(["export", str(runs), "-o", str(tmp_path / "x"), "--no-partition"]) == 1
    assert "holds 2 runs" in capsys.readouterr().err


def test_usage_errors_exit_2(runs, tmp_path):
    with pytest.raises(SystemExit) as ei:
        main(["export", str(runs), "-o", str(tmp_path / "x"), "--format", "xml"])
    assert ei.value.code == 2
    with pytest.raises(SystemExit) as ei:
        main(["export", str(runs)])  # -o is required
    assert ei.value.code == 2


@pytest.mark.slow
def test_ctrl_c_mid_export_leaves_no_file(tmp_path):
    """A real `et export` process interrupted (SIGINT) while writing: exit 130, no output
    file, no temporary left beside it."""
    run_dir = tmp_path / "big"
    code = (
        "import expr_tracker as et, sys\n"
        # no system sampler: its rows would join the export as lines of their own
        f"et.init(run_dir={str(run_dir)!r}, project='p', name='big', system=False)\n"
        "for i in range(300000):\n"
        "    et.log({'a': i * 0.5, 'b': -i * 0.25, 'c': i})\n"
        "et.finish()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    out = tmp_path / "out" / "big.jsonl"
    out.parent.mkdir()
    env = dict(os.environ)
    proc = subprocess.Popen(
        [sys.executable, "-m", "expr_tracker.cli.main", "export", str(run_dir), "-o", str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    # interrupt once the temporary file exists (the export is writing)
    deadline = time.monotonic() + 60
    while not any(out.parent.iterdir()):
        if proc.poll() is not None or time.monotonic() > deadline:
            break
        time.sleep(0.005)
    if proc.poll() is not None:
        pytest.skip("the export finished before it could be interrupted")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode in (130, 1), err
    assert list(out.parent.iterdir()) == []
    # and a complete export afterwards is whole
    assert main(["export", str(run_dir), "-o", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 300000
    last = json.loads(lines[-1])
    assert last["step"] == 299999 and math.isclose(last["a"], 299999 * 0.5)


@pytest.mark.parametrize("partition", ["--partition", "--no-partition"])
def test_sigterm_mid_export_leaves_no_temporary(runs, tmp_path, partition):
    """SIGTERM (kill, SLURM, Kubernetes) while the export is written: exit 143 and the
    half-written `.PATH.<pid>.partial` is removed, as on Ctrl-C (a `**` glob over the parent
    folder reads a leftover one). The export is held just before its rename."""
    out_dir = tmp_path / "exports"
    out_dir.mkdir()
    code = (
        "import sys, time\n"
        "from expr_tracker.query import export\n"
        "from expr_tracker.cli.main import main\n"
        "size = export._tree_size\n"
        "def held(p):\n"
        "    print('written', flush=True)\n"
        "    for _ in range(1200):  # short sleeps: a signal is handled within one\n"
        "        time.sleep(0.05)\n"
        "    return size(p)\n"
        "export._tree_size = held\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    src = runs / "proj" / "a"
    before = (src / "metrics.jsonl").read_bytes()
    args = ["export", str(src), "-o", str(out_dir / "a.csv"), partition]
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert proc.stdout.readline() == b"written\n"
        assert [p.name.endswith(".partial") for p in out_dir.iterdir()] == [True]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 143, err
    assert list(out_dir.iterdir()) == []
    assert (src / "metrics.jsonl").read_bytes() == before  # the run untouched
