"""Issue 20 (points 7-9, the history side): a runs folder from anyone cannot crash, hang or
empty `et runs`, `et history`, `et alerts` and `et.history(run=...)`.

A line nested 20,000 deep, a lone surrogate escape, a nanosecond `started_at`, a `run.json`
that is a list, a FIFO where a run file should be, a colleague's `0600` run: each is skipped
or shown as unreadable, counted and named in one warning, and the rest is answered as before.
The commands run in real subprocesses (a crash is an exit code and a traceback, a hang a
timeout that fails the test instead of the suite)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading

import pytest
from helpers import CANNOT_READ_SKIP, cannot_read_prefix

import expr_tracker as et

DEEP = b'{"_step": 1, "x": ' + b"[" * 20000 + b"]" * 20000 + b"}\n"
SURROGATE = b'{"_step": 2, "loss": NaN, "name": "\\ud800"}\n'


def et_cli(*args, timeout=60, env=None):
    """`et ARGS` in a fresh process (stdout and stderr as text, never blocking the suite)."""
    return subprocess.run(
        [sys.executable, "-m", "expr_tracker.cli.main", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def make_run(root, name, steps=4):
    run = et.init(project="p", name=name, dir=str(root))
    for i in range(steps):
        et.log({"loss": 1.0 / (i + 1)})
    et.finish()
    return run.dir


def insert_line(path, line, after=1):
    """Put ``line`` after the first ``after`` lines of ``path`` (inside the file, not last)."""
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:after] + [line] + lines[after:]))


def no_traceback(p):
    assert "Traceback" not in p.stderr, p.stderr


# --------------------------------------------------------------------------- point 7: crashes


@pytest.mark.slow
def test_a_line_nested_20000_deep_beside_a_good_run(tmp_path):
    """`et runs` and `et history` answer for the good run exactly as before, exit 0, and
    name the bad line's file (and byte) in one warning; the bad run's other rows are read."""
    root = tmp_path / "runs"
    good = make_run(root, "good")
    bad = make_run(root, "bad")
    before_runs = {r["run"]: r for r in json.loads(et_cli("runs", root, "--format", "json").stdout)}
    before_good = et_cli("history", good, "-n", "-1", "--format", "json").stdout
    insert_line(bad / "metrics.jsonl", DEEP)

    p = et_cli("runs", root, "--format", "json")
    assert p.returncode == 0, p.stderr
    no_traceback(p)
    after = {r["run"]: r for r in json.loads(p.stdout)}
    assert after["p/good"] == before_runs["p/good"]
    assert after["p/bad"]["steps"] == 4 and after["p/bad"]["status"] == "finished"
    warned = [x for x in p.stderr.splitlines() if "metrics.jsonl" in x]
    assert len(warned) == 1 and str(bad / "metrics.jsonl") in warned[0], p.stderr
    assert "nested" in warned[0] and "at byte" in warned[0], warned

    p = et_cli("history", good, "-n", "-1", "--format", "json")
    assert p.returncode == 0 and p.stdout == before_good and p.stderr == ""
    for fmt in ("table", "json"):
        p = et_cli("history", bad, "-n", "-1", "--format", fmt)
        assert p.returncode == 0, p.stderr
        no_traceback(p)
        assert len(p.stderr.splitlines()) == 1 and str(bad / "metrics.jsonl") in p.stderr
    assert [r["_step"] for r in json.loads(p.stdout)] == [0, 1, 2, 3]
    p = et_cli("history", bad, "--step-range", "0:3", "--format", "jsonl")
    assert p.returncode == 0 and len(p.stdout.splitlines()) == 3, p.stderr


def test_et_history_of_a_run_skips_a_deep_line_and_warns_naming_it(tmp_path, caplog):
    root = tmp_path / "runs"
    bad = make_run(root, "bad")
    insert_line(bad / "metrics.jsonl", DEEP)
    insert_line(bad / "metrics.jsonl", SURROGATE, after=3)
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        rows = et.history(-1, run=bad)
        tail = et.history(2, run=bad)
        window = et.history(run=bad, step_range=(0, 2))
    assert [r["_step"] for r in rows] == [0, 1, 2, 3]
    assert rows[2]["loss"] == pytest.approx(1 / 3)  # the lone-surrogate line is not a row
    assert [r["_step"] for r in tail] == [2, 3] and [r["_step"] for r in window] == [0, 1]
    named = [r.getMessage() for r in caplog.records if str(bad / "metrics.jsonl") in r.getMessage()]
    assert len(named) == 1, named


def test_decode_line_refuses_what_no_reader_should_hand_on():
    from expr_tracker.history.codec import MAX_LINE_DEPTH, decode_line

    for line in (DEEP, SURROGATE, b"[" * 2_000_000, b"[" * 1000 + b"]" * 1000):
        with pytest.raises(ValueError):
            decode_line(line)
    nested = b"[" * MAX_LINE_DEPTH + b"]" * MAX_LINE_DEPTH
    assert decode_line(nested) is not None  # as deep as it may be
    assert decode_line(b'{"a": NaN, "s": "\\ud83d\\ude00"}')["s"] == "\U0001f600"  # a pair
    assert decode_line(b'{"_step": 1, "x": -1e308}')["x"] == -1e308


@pytest.mark.slow
def test_a_lone_surrogate_is_a_bad_line_not_a_crash_when_printed(tmp_path):
    root = tmp_path / "runs"
    bad = make_run(root, "bad")
    insert_line(bad / "metrics.jsonl", SURROGATE)
    for args in (("history", bad, "-n", "-1"), ("runs", root)):
        p = et_cli(*args, env=dict(os.environ, PYTHONIOENCODING="utf-8"))
        assert p.returncode == 0, p.stderr
        no_traceback(p)
        assert str(bad / "metrics.jsonl") in p.stderr


@pytest.mark.slow
def test_times_that_cannot_be_times_are_left_out_with_a_warning(tmp_path):
    """A nanosecond `started_at` (1.7e18) and `-1e308` in run.json: `et runs` shows the run
    (without those times) and names the file in a warning; the json keeps the other fields."""
    root = tmp_path / "runs"
    for name, started in (("ns", 1.7e18), ("neg", -1e308)):
        d = make_run(root, name)
        info = json.loads((d / "run.json").read_text())
        info["started_at"] = started
        info["ended_at"] = -1e308
        (d / "run.json").write_text(json.dumps(info))
    p = et_cli("runs", root)
    assert p.returncode == 0, p.stderr
    no_traceback(p)
    assert "p/ns" in p.stdout and "p/neg" in p.stdout
    assert str(root / "p" / "ns" / "run.json") in p.stderr and "1.7e+18" in p.stderr
    p = et_cli("runs", root, "--format", "json")
    runs = {r["run"]: r for r in json.loads(p.stdout)}
    assert runs["p/ns"]["steps"] == 4 and runs["p/ns"]["status"] == "finished"
    assert 1e9 < runs["p/ns"]["started_at"] < 1e11  # the first row's time instead


@pytest.mark.parametrize(
    "content, why",
    [("[1, 2]", "a JSON array"), ('"finished"', "a JSON string"), ("{", "not JSON")],
)
def test_a_run_json_that_is_not_an_object_is_unreadable(tmp_path, capsys, content, why):
    from expr_tracker.cli.main import main

    root = tmp_path / "runs"
    make_run(root, "ok")
    d = make_run(root, "odd")
    (d / "run.json").write_text(content)
    assert main(["runs", str(root), "--format", "json"]) == 0
    runs = {r["run"]: r for r in json.loads(capsys.readouterr().out)}
    assert runs["p/ok"]["status"] == "finished" and runs["p/ok"]["reason"] is None
    assert runs["p/odd"]["status"] == "unreadable"
    assert runs["p/odd"]["reason"].startswith("run.json: ") and why in runs["p/odd"]["reason"]
    assert runs["p/odd"]["producer_status"] == {"run.json": "unreadable"}
    assert runs["p/odd"]["steps"] == 4  # what can be read still is


@pytest.mark.slow
def test_et_alerts_skips_a_deep_line(tmp_path):
    path = tmp_path / "alerts.jsonl"
    rec = {"kind": "transition", "rule": "r", "event": "firing", "level": "error", "step": 1}
    path.write_bytes(json.dumps(rec).encode() + b"\n" + DEEP + SURROGATE)
    p = et_cli("alerts", path, "--format", "json")
    assert p.returncode == 0, p.stderr
    no_traceback(p)
    assert json.loads(p.stdout) == [rec]
    assert "skipped 2 line(s)" in p.stderr and str(path) in p.stderr


# --------------------------------------------------------------------------- point 8: hangs


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["run.json", "metrics.meta.json", "metrics.jsonl", "config.json", "summary.json"]
)
def test_a_fifo_named_like_a_run_file_hangs_no_command(tmp_path, name):
    root = tmp_path / "runs"
    make_run(root, "good")
    bad = make_run(root, "bad")
    (bad / name).unlink()
    os.mkfifo(bad / name)
    p = et_cli("runs", root, "--format", "json", timeout=30)
    assert p.returncode == 0, p.stderr
    no_traceback(p)
    runs = {r["run"]: r for r in json.loads(p.stdout)}
    assert runs["p/good"]["status"] == "finished" and runs["p/good"]["steps"] == 4
    if name in ("run.json", "metrics.jsonl"):
        assert runs["p/bad"]["status"] == "unreadable"
        assert runs["p/bad"]["reason"] == f"{name}: a FIFO, not a regular file"
    else:
        assert runs["p/bad"]["status"] == "finished"
    p = et_cli("history", bad, "--format", "jsonl", timeout=30)
    no_traceback(p)
    if name == "metrics.jsonl":
        assert p.returncode == 1 and "FIFO" in p.stderr
    else:
        assert p.returncode == 0 and len(p.stdout.splitlines()) == 4, p.stderr
    if name != "run.json":
        p = et_cli("history", bad, "--follow", "--format", "jsonl", timeout=30)
        no_traceback(p)
        assert p.returncode == (1 if name == "metrics.jsonl" else 0), p.stderr
        return
    # the end of the run cannot be seen: --follow says so and follows until Ctrl-C
    f = subprocess.Popen(
        [sys.executable, "-m", "expr_tracker.cli.main", "history", str(bad), "-f"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    guard = threading.Timer(60, f.kill)  # a regression fails the test, never hangs the suite
    guard.start()
    try:
        note = f.stderr.readline()
        assert "run.json cannot be read (a FIFO, not a regular file)" in note, note
        shown = [f.stdout.readline() for _ in range(5)]  # the header and the 4 rows
        f.send_signal(signal.SIGINT)
        f.communicate(timeout=30)
    finally:
        guard.cancel()
        if f.poll() is None:
            f.kill()
            f.wait()
    assert f.returncode == 0 and shown[0].split()[:3] == ["step", "time", "loss"], shown


@pytest.mark.slow
def test_a_fifo_in_place_of_alerts_or_metric_defs_hangs_nothing(tmp_path):
    d = make_run(tmp_path / "runs", "r")
    os.mkfifo(d / "alerts.jsonl")
    p = et_cli("alerts", d, timeout=30)
    assert p.returncode == 1 and "a FIFO, not a regular file" in p.stderr, p.stderr
    os.mkfifo(d / "metric_defs.json")
    code = (
        "import sys, expr_tracker as et\n"
        "try:\n"
        "    et.history(run=sys.argv[1], metrics=['loss'], index=True, output_type='pandas')\n"
        "except ValueError as exc:\n"
        "    print('no step metric:', exc)\n"
    )
    pytest.importorskip("pandas")
    p = subprocess.run(
        [sys.executable, "-c", code, str(d)], capture_output=True, text=True, timeout=30
    )
    assert p.returncode == 0 and "no step metric" in p.stdout, p.stderr


# --------------------------------------------------------------------------- point 9: per run


@pytest.mark.slow
def test_a_colleagues_0600_run_is_listed_unreadable_and_the_rest_shows(tmp_path):
    """Files of another uid with mode 0600 (and a 0700 folder): `et runs`, run by a user who
    cannot read them, lists such a run with status `unreadable` and the reason, and every
    other run as before (text and json)."""
    root = tmp_path / "runs"
    make_run(root, "mine")
    theirs = make_run(root, "theirs")
    locked = make_run(root, "locked")
    for f in theirs.iterdir():
        os.chown(f, 65534, 65534)
        f.chmod(0o600)
    os.chown(locked, 65534, 65534)
    locked.chmod(0o700)
    prefix = cannot_read_prefix(theirs / "run.json")
    if prefix is None:
        pytest.skip(CANNOT_READ_SKIP)
    cmd = [*prefix, sys.executable, "-m", "expr_tracker.cli.main", "runs", str(root)]
    p = subprocess.run([*cmd, "--format", "json"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    runs = {r["run"]: r for r in json.loads(p.stdout)}
    assert set(runs) == {"p/mine", "p/theirs", "p/locked"}
    assert runs["p/mine"]["status"] == "finished" and runs["p/mine"]["steps"] == 4
    assert runs["p/theirs"]["status"] == "unreadable"
    assert runs["p/theirs"]["reason"] == (
        "run.json: permission denied; metrics.jsonl: permission denied"
    )
    assert runs["p/locked"]["status"] == "unreadable"
    assert "cannot be listed: permission denied" in runs["p/locked"]["reason"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    lines = {ln.split()[0]: ln for ln in p.stdout.splitlines()[1:]}
    assert "finished" in lines["p/mine"] and "loss=0.25" in lines["p/mine"]
    assert "unreadable" in lines["p/theirs"] and "permission denied" in lines["p/theirs"]
    assert "2 unreadable runs" in p.stderr
    p = subprocess.run(
        [*prefix, sys.executable, "-m", "expr_tracker.cli.main", "history", str(theirs)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 1 and "permission denied" in p.stderr, p.stderr
    no_traceback(p)


@pytest.mark.slow
def test_a_colleagues_unsearchable_folder_or_store_never_ends_a_listing(tmp_path):
    """A colleague's run folder of mode 0744 (listable, not searchable) or a store folder
    of 0700/0744: pathlib's exists()/is_dir()/is_file() raise PermissionError there (Python
    < 3.12), which ended `et runs`, `et query`, `et export`, `et compare` and `et artifacts
    list` over the whole folder with a traceback. Each reports what it cannot read and the
    other runs answer."""
    root = tmp_path / "runs"
    make_run(root, "mine")
    theirs = make_run(root, "theirs")
    src = tmp_path / "data.txt"
    src.write_text("x")
    et.init(project="p", name="logger", dir=str(root))
    et.log_artifact(src, name="ds")
    et.finish()
    store = root / "p" / "artifacts"
    for d, mode in ((theirs, 0o744), (store, 0o700)):
        os.chown(d, 65534, 65534) if os.geteuid() == 0 else None
        d.chmod(mode)
    try:
        prefix = cannot_read_prefix(theirs / "run.json")
        if prefix is None:
            pytest.skip(CANNOT_READ_SKIP)

        def cli(*args):
            p = subprocess.run(
                [*prefix, sys.executable, "-m", "expr_tracker.cli.main", *map(str, args)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            no_traceback(p)
            return p

        p = cli("runs", root, "--format", "json")
        assert p.returncode == 0, p.stderr
        runs = {r["run"]: r for r in json.loads(p.stdout)}
        assert runs["p/mine"]["status"] == "finished" and runs["p/mine"]["steps"] == 4
        assert runs["p/theirs"]["status"] == "unreadable"
        assert "permission denied" in runs["p/theirs"]["reason"]
        p = cli("query", "SELECT run, status FROM runs ORDER BY run", root, "--format", "json")
        assert p.returncode == 0, p.stderr
        by = {r["run"]: r["status"] for r in json.loads(p.stdout)}
        assert by["p/mine"] == "finished" and by["p/theirs"] == "unreadable"
        p = cli("export", root, "-o", tmp_path / "out", "--json")
        assert p.returncode == 0, p.stderr
        p = cli("compare", "--dir", root, "p/mine", "p/logger")
        assert p.returncode == 0, p.stderr
        p = cli("artifacts", "list", root)
        assert p.returncode == 0 and "permission denied" in p.stderr.lower(), p.stderr
    finally:
        theirs.chmod(0o755)
        store.chmod(0o755)
