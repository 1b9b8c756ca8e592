"""Reading runs from anyone (issue 20, the query side; docs/query.md "Security"): a planted
cache manifest deletes nothing outside the cache, a cache folder of another user is never
used, a run file that is a FIFO, deeply nested, a lone surrogate or unreadable is reported
per run while the other runs answer, a damaged cache is rebuilt, and a cache deleted under
a query never changes the answer.

Commands that would hang or crash on bad input run as subprocesses with a timeout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import ROOT

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("duckdb")

import expr_tracker as et  # noqa: E402
from expr_tracker.query import cache as qcache  # noqa: E402
from expr_tracker.query.cache import refresh  # noqa: E402

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
OTHER_UID = 65534
COUNT = "SELECT run, count(*) AS n, sum(value) AS s FROM metrics GROUP BY run ORDER BY run"


@pytest.fixture(autouse=True)
def _xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def write_run(run_dir: Path, rows: list[dict], **info) -> Path:
    """A run directory as the writer leaves it: metrics.jsonl and run.json."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "metrics.jsonl", "w") as f:
        for i, r in enumerate(rows):
            f.write(json.dumps({**r, "_step": i, "_time": 1.7e9 + i}) + "\n")
    base = {"project": run_dir.parent.name, "name": run_dir.name, "status": "finished"}
    (run_dir / "run.json").write_text(json.dumps({**base, **info}))
    return run_dir


def good_runs(root: Path) -> None:
    write_run(root / "p" / "a", [{"loss": 1.0}, {"loss": 2.0}])
    write_run(root / "p" / "b", [{"loss": 3.0}])


GOOD = [
    {"run": "p/a", "n": 2, "s": 3.0},
    {"run": "p/b", "n": 1, "s": 3.0},
]


def et_query(*args: str, timeout: float = 120, env: dict | None = None, prefix=()):
    """``et query`` in a fresh process (a hang or a crash fails the test, not the run)."""
    return subprocess.run(
        [*prefix, sys.executable, "-m", "expr_tracker.cli.main", "query", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **(env or {})},
    )


def plant_manifest(cache_dir: Path, **fields) -> None:
    cache_dir.mkdir(parents=True, exist_ok=True)
    m = {
        "version": qcache.VERSION,
        "kind": "metrics",
        "source": "x",
        "dev": 0,
        "ino": 0,
        "covered": 0,
        "lines": 0,
        "rows": 0,
        "fingerprint": None,
        "max_step": None,
        "monotonic": True,
        "merged": True,
        "parts": [],
        "garbage": [],
        **fields,
    }
    (cache_dir / "manifest.json").write_text(json.dumps(m))


# --------------------------------------------------------------------------- 1: planted manifests


@pytest.mark.parametrize(
    "name",
    ["../../thesis.txt", "../../../thesis.txt", "ABS", "lock", "manifest.json", "../metrics.jsonl"],
)
def test_a_planted_manifest_removes_nothing_outside_the_cache(tmp_path, name):
    """The garbage and the parts of a manifest found in a run's .et-cache (a tarball, a
    colleague) decided what a refresh unlinked: `../../thesis.txt` was deleted."""
    root = tmp_path / "runs"
    good_runs(root)
    run = root / "p" / "a"
    sentinels = [run / "thesis.txt", root / "p" / "thesis.txt", tmp_path / "abs-thesis.txt"]
    for s in sentinels:
        s.write_text("years of work")
    target = str(tmp_path / "abs-thesis.txt") if name == "ABS" else name
    cdir = run / ".et-cache" / "metrics.jsonl"
    plant_manifest(
        cdir,
        source=str((run / "metrics.jsonl").absolute()),
        garbage=[{"file": target, "replaced_at": 0}],
        parts=[{"file": target, "rows": 1, "first_line": 0, "lines": 1, "bytes": 13}],
    )
    rows = et.query(COUNT, root, output_type="dicts")
    assert rows == GOOD
    assert all(s.read_text() == "years of work" for s in sentinels)
    assert (run / "metrics.jsonl").exists() and (cdir / "lock").exists()
    # and again, past the grace time of replaced parts
    qcache.GRACE_S, old = 0.0, qcache.GRACE_S
    try:
        assert et.query(COUNT, root, output_type="dicts") == GOOD
    finally:
        qcache.GRACE_S = old
    assert all(s.read_text() == "years of work" for s in sentinels)
    assert json.loads((cdir / "manifest.json").read_text())["garbage"] == []


@pytest.mark.slow
@pytest.mark.parametrize(
    "numbers",
    [
        {"replaced_at": "BIG"},  # an int no float holds: `now - replaced_at` overflowed
        {"replaced_at": "NaN"},  # never past its grace time: kept for ever
        {"covered": "BIG"},
        {"ino": "BIG"},
    ],
)
def test_a_planted_manifest_with_numbers_out_of_range_is_rebuilt(tmp_path, numbers):
    """A manifest's numbers come from a file anyone may have written: an int past 2**64 or
    a NaN (the standard decoder's dialect, reached when the text holds `NaN`) made every
    query of the run fail ("cannot be read (OverflowError ...)") for good, not rebuilt."""
    root = tmp_path / "runs"
    good_runs(root)
    run = root / "p" / "a"
    cdir = run / ".et-cache" / "metrics.jsonl"
    fields = {"replaced_at": 0, "covered": 0, "ino": 0}
    fields.update({k: 10**400 if v == "BIG" else v for k, v in numbers.items()})
    plant_manifest(
        cdir,
        source=str((run / "metrics.jsonl").absolute()),
        covered=fields["covered"],
        ino=fields["ino"],
        bad_lines=0,
        bad_first=None,
        fingerprint="NaN",  # a token the standard decoder's fallback is used for
        garbage=[{"file": "part-000000000000-deadbeef.parquet", "replaced_at": 0}],
    )
    text = (cdir / "manifest.json").read_text()
    text = text.replace('"replaced_at": 0', f'"replaced_at": {fields["replaced_at"]}')
    (cdir / "manifest.json").write_text(text)
    p = et_query(COUNT, str(root), "--format", "json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == GOOD, p.stderr
    assert "cannot be read" not in p.stderr
    again = et_query(COUNT, str(root), "--format", "json")
    assert json.loads(again.stdout) == GOOD and again.stderr == ""
    assert json.loads((cdir / "manifest.json").read_text())["garbage"] == []


def test_a_manifest_whose_parts_are_links_is_not_trusted(tmp_path, monkeypatch):
    """Parts named as the cache names them but linked to a file elsewhere: never read as
    the run's rows, and removing them removes the link only."""
    src_dir = tmp_path / "run"
    write_run(src_dir, [{"loss": 1.0}, {"loss": 2.0}])
    c = refresh(src_dir / "metrics.jsonl", "metrics")
    other = tmp_path / "elsewhere"
    write_run(other, [{"loss": 99.0}] * 5)
    theirs = refresh(other / "metrics.jsonl", "metrics", cache_dir=tmp_path / "cc")
    secret = theirs.parts[0]
    part = c.parts[0]
    part.unlink()
    part.symlink_to(secret)
    m = json.loads((c.cache_dir / "manifest.json").read_text())
    m["parts"][0]["bytes"] = secret.stat().st_size
    (c.cache_dir / "manifest.json").write_text(json.dumps(m))
    again = refresh(src_dir / "metrics.jsonl", "metrics")
    assert again.parts != c.parts and not any(p.is_symlink() for p in again.parts)
    rows = pq.read_table(again.parts[0]).column("value").to_pylist()
    assert rows == [1.0, 2.0]
    monkeypatch.setattr(qcache, "GRACE_S", 0.0)
    refresh(src_dir / "metrics.jsonl", "metrics")
    assert not os.path.lexists(part) and secret.exists()


@pytest.mark.skipif(not IS_ROOT, reason="chown to another uid needs root")
@pytest.mark.parametrize("how", ["owner", "group-writable", "link"])
def test_a_cache_folder_not_this_users_own_is_never_used(tmp_path, how):
    """A .et-cache folder owned by another user (or writable by others, or a link to
    elsewhere) is left alone: the reader's cache goes to its own XDG folder."""
    src_dir = tmp_path / "run"
    write_run(src_dir, [{"loss": 1.0}, {"loss": 2.0}])
    top = src_dir / ".et-cache"
    if how == "link":
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        top.symlink_to(elsewhere)
    else:
        top.mkdir()
    cdir = top / "metrics.jsonl"
    sentinel = cdir / "part-000000000000-00000000.parquet"
    plant_manifest(
        cdir,
        source=str((src_dir / "metrics.jsonl").absolute()),
        garbage=[{"file": sentinel.name, "replaced_at": 0}],
    )
    sentinel.write_text("theirs")
    if how == "owner":
        for p in (top, cdir, cdir / "manifest.json", sentinel):
            os.chown(p, OTHER_UID, OTHER_UID)
    elif how == "group-writable":
        os.chmod(cdir, 0o777)
    before = sorted(os.listdir(cdir))
    c = refresh(src_dir / "metrics.jsonl", "metrics")
    assert c.cache_dir.parent == tmp_path / "xdg" / "expr_tracker" / "query"
    assert sorted(os.listdir(cdir)) == before and sentinel.read_text() == "theirs"
    assert pq.read_table(c.parts[0]).column("value").to_pylist() == [1.0, 2.0]


def test_no_cache_is_made_where_the_run_directory_was_swapped_to(tmp_path, monkeypatch):
    """The run directory swapped for a link to another folder of this user right after the
    source was opened: the cache was made in that other folder (`.et-cache` beside files
    the reader never asked about). It is made only in the folder holding the file opened."""
    run = write_run(tmp_path / "runs" / "p" / "a", [{"loss": 1.0}, {"loss": 2.0}])
    elsewhere = write_run(tmp_path / "home" / "thesis", [{"loss": 9.0}])
    real_open = qcache.untrusted.open_regular

    def open_then_swap(path, *, root=None):
        fd = real_open(path, root=root)
        moved = tmp_path / "moved"
        if not moved.exists():
            run.rename(moved)
            run.symlink_to(elsewhere, target_is_directory=True)
        return fd

    monkeypatch.setattr(qcache.untrusted, "open_regular", open_then_swap)
    c = refresh(run / "metrics.jsonl", "metrics", root=os.path.realpath(run))
    assert not (elsewhere / ".et-cache").exists()
    assert c.rows == 2 and c.cache_dir is not None and "xdg" in str(c.cache_dir)


@pytest.mark.skipif(not IS_ROOT, reason="chown to another uid needs root")
def test_no_cache_is_made_in_a_run_directory_of_another_user(tmp_path):
    """A cache folder made by this user inside someone else's run would be a folder its
    owner cannot delete (rm -rf of their own run fails): it goes to XDG instead."""
    root = tmp_path / "runs"
    good_runs(root)
    run = root / "p" / "a"
    os.chown(run, OTHER_UID, OTHER_UID)
    assert et.query(COUNT, root, output_type="dicts") == GOOD
    assert not (run / ".et-cache").exists()
    assert (root / "p" / "b" / ".et-cache").is_dir()  # this user's own run keeps its cache
    xdg = tmp_path / "xdg" / "expr_tracker" / "query"
    assert len(os.listdir(xdg)) == 1


def test_cache_folders_are_made_0755_whatever_the_umask(tmp_path):
    write_run(tmp_path / "run", [{"loss": 1.0}])
    old = os.umask(0o002)
    try:
        c = refresh(tmp_path / "run" / "metrics.jsonl", "metrics")
    finally:
        os.umask(old)
    for d in (c.cache_dir, c.cache_dir.parent):
        assert d.stat().st_mode & 0o777 == 0o755
    assert refresh(tmp_path / "run" / "metrics.jsonl", "metrics").cache_dir == c.cache_dir


# --------------------------------------------------------------------------- 7: bad values


DEEP = 20_000


def bad_lines_runs(root: Path) -> None:
    good_runs(root)
    line = '{"_step": 0, "a": ' + "[" * DEEP + "]" * DEEP + "}\n"
    # a block of that one line: pyarrow.json's parser recursed per level and crashed
    (root / "p" / "deep").mkdir(parents=True)
    (root / "p" / "deep" / "metrics.jsonl").write_text(line)
    (root / "p" / "deep2").mkdir(parents=True)
    (root / "p" / "deep2" / "metrics.jsonl").write_text(line + '{"a": 5.0, "_step": 1}\n')
    sur = root / "p" / "surrogate"
    sur.mkdir(parents=True)
    (sur / "metrics.jsonl").write_text(
        '{"a": 1.0, "s": "\\ud800", "_step": 0}\n{"a": 2.0, "_step": 1}\n'
        '{"big": 123456789012345678901234567890, "t": "\\udfff", "_step": 2}\n'
    )


@pytest.mark.slow
def test_a_deeply_nested_line_beside_good_runs(tmp_path):
    """`et query` died with a segfault (exit 139) on a line of 20,000 nested brackets, and
    with a traceback on a lone surrogate escape: now each bad line is skipped, counted and
    named in one warning, and every other line and run answers."""
    root = tmp_path / "runs"
    bad_lines_runs(root)
    sql = "SELECT run, count(*) AS n, sum(value) AS s FROM metrics GROUP BY run ORDER BY run"
    p = et_query(sql, str(root), "--format", "json")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert rows == [
        *GOOD,
        {"run": "p/deep2", "n": 1, "s": 5.0},
        {"run": "p/surrogate", "n": 1, "s": 2.0},
    ]
    assert p.stderr.count("could not be read whole") == 1
    for rid in ("p/deep", "p/deep2"):
        want = f"{rid}: metrics.jsonl: 1 unreadable line skipped (line 1: nested too deeply)"
        assert want in p.stderr
    assert "p/surrogate: metrics.jsonl: 2 unreadable lines skipped (line 1:" in p.stderr
    problems = et.query(
        "SELECT run, problem FROM runs WHERE problem IS NOT NULL ORDER BY run",
        root,
        output_type="dicts",
    )
    assert [r["run"] for r in problems] == ["p/deep", "p/deep2", "p/surrogate"]


def test_hostile_small_files_are_reported_per_run(tmp_path):
    """run.json, config.json, summary.json, alerts and lineage nested 20,000 deep, holding a
    lone surrogate, a nanosecond started_at or -1e308: read or reported, never a crash."""
    root = tmp_path / "runs"
    good_runs(root)
    deep = "[" * DEEP + "]" * DEEP
    odd = write_run(root / "p" / "odd", [{"loss": 1.0}], started_at=1.7e18, ended_at=-1e308)
    (odd / "config.json").write_text('{"lr": -1e308, "s": "\\ud800"}')
    (odd / "summary.json").write_text('{"loss": ' + deep + "}")
    (odd / "alerts.jsonl").write_text('{"rule": "r", "metrics": ' + deep + "}\n")
    (odd / "artifacts.jsonl").write_text('{"name": "\\udc00"}\n{"name": "ok", "version": 1}\n')
    meta = {"run": {"name": "x" + "[" * 5000}, "max_step": 10**30}
    (odd / "metrics.meta.json").write_text(json.dumps(meta))
    deeper = write_run(root / "p" / "deeprun", [{"loss": 1.0}])
    (deeper / "run.json").write_text('{"name": ' + deep + "}")
    # every view read (alerts and lineage are read only by a query naming them)
    rows = et.query(
        "SELECT run, status, steps, started, ended_at, problem, config, summary FROM runs "
        "WHERE (SELECT count(*) FROM alerts) + (SELECT count(*) FROM artifacts) >= 0 "
        "ORDER BY run",
        root,
        output_type="dicts",
    )
    by = {r["run"]: r for r in rows}
    assert set(by) == {"p/a", "p/b", "p/odd", "p/deeprun"}
    assert by["p/a"]["problem"] is None and by["p/a"]["status"] == "finished"
    odd_row = by["p/odd"]
    assert odd_row["status"] == "finished" and odd_row["steps"] == 1
    assert odd_row["started"] is None and odd_row["ended_at"] == -1e308
    assert odd_row["config"] is None and odd_row["summary"] is None
    assert "config.json: not JSON" in odd_row["problem"]
    assert "summary.json: not JSON" in odd_row["problem"]
    assert (
        "alerts.jsonl: 1 unreadable line skipped (line 1: nested too deeply)"
        in (odd_row["problem"])
    )
    assert "artifacts.jsonl: 1 unreadable line skipped (line 1:" in odd_row["problem"]
    assert by["p/deeprun"]["status"] == "unreadable"
    assert "run.json: not JSON" in by["p/deeprun"]["problem"]
    assert et.query("SELECT name FROM artifacts", root, output_type="dicts") == [{"name": "ok"}]
    assert et.query(COUNT + "", root, output_type="dicts")[:2] == GOOD


def test_wide_lines_decode_as_the_line_path_does():
    """A line of 50,000 metrics goes line by line (pyarrow.json made a column per key at
    ~1 MB/s); the rows are those of the per-line decoder, in the line's key order."""
    from expr_tracker.query import scan

    keys = [f"layer{i // 100}/w{i % 100}" for i in range(50_000)]
    lines = [
        json.dumps({**{k: float(i + j) for j, k in enumerate(keys)}, "_step": i}).encode()
        for i in range(2)
    ]
    chunk = b"\n".join(lines) + b"\n"
    table, steps = scan.decode_metrics_block(chunk, 0)
    slow, slow_steps = scan.decode_metrics(lines, 0)
    assert table.equals(slow) and steps.to_pylist() == slow_steps == [0, 1]
    assert table.num_rows == 100_000 and table.column("metric")[49_999].as_py() == keys[-1]


def test_brackets_inside_names_keep_the_vectorised_path_exact():
    from expr_tracker.query import scan

    chunk = b'{"acc[0]": 1.0, "{x}": 2, "_step": 0}\n{"acc[0]": 3.0, "{x}": 4, "_step": 1}\n'
    table, _ = scan.decode_metrics_block(chunk, 0)
    slow, _ = scan.decode_metrics(chunk[:-1].split(b"\n"), 0)
    assert table.sort_by("line").to_pylist() == slow.sort_by("line").to_pylist()
    assert scan._flat_objects(chunk, 2)
    assert not scan._flat_objects(b'{"a": [1]}\n', 1)
    assert not scan._flat_objects(b'{"a": {"b": 1}}\n', 1)


# --------------------------------------------------------------------------- 8: no hang


FIFO_NAMES = [
    "metrics.jsonl",
    "run.json",
    "config.json",
    "summary.json",
    "metrics.meta.json",
    "alerts.jsonl",
    "artifacts.jsonl",
    "spans.jsonl",
]


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifos_named_like_run_files_never_hang_a_query(tmp_path):
    """A FIFO named like any run file hung `et query` for good: now the run is reported
    (the file is not a regular file) and the others answer."""
    root = tmp_path / "runs"
    good_runs(root)
    for i, name in enumerate(FIFO_NAMES):
        run = write_run(root / "fifo" / f"r{i}", [{"loss": 1.0}])
        (run / name).unlink(missing_ok=True)
        os.mkfifo(run / name)
    sql = (
        "SELECT r.run, r.status, r.problem, (SELECT count(*) FROM metrics m WHERE m.run = r.run) "
        "AS n, (SELECT count(*) FROM spans s WHERE s.run = r.run) AS sp, "
        "(SELECT count(*) FROM alerts a WHERE a.run = r.run) AS al, "
        "(SELECT count(*) FROM artifacts x WHERE x.run = r.run) AS ar FROM runs r ORDER BY r.run"
    )
    p = et_query(sql, str(root), "--format", "json", timeout=120)
    assert p.returncode == 0, p.stderr
    by = {r["run"]: r for r in json.loads(p.stdout)}
    assert by["p/a"]["n"] == 2 and by["p/b"]["n"] == 1 and by["p/a"]["problem"] is None
    for i, name in enumerate(FIFO_NAMES):
        rid = f"fifo/r{i}"
        assert rid in by, (name, sorted(by))
        assert f"{name}: a FIFO, not a regular file" in by[rid]["problem"], by[rid]
        assert f"  {rid}: {name}: a FIFO, not a regular file" in p.stderr
    assert by["fifo/r1"]["status"] == "unreadable"  # its run.json
    assert p.stderr.count("could not be read whole") == 1


# --------------------------------------------------------------------------- 9: per run


def no_dac(*argv: str) -> list[str]:
    """A command run without root's right to read any file (CAP_DAC_OVERRIDE and
    CAP_DAC_READ_SEARCH dropped): another user's 0600 file is refused to it, as to a
    colleague. (A true uid switch cannot run this interpreter: it lives under /root.)"""
    caps = "-dac_override,-dac_read_search"
    return ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}", *argv]


@pytest.mark.slow
@pytest.mark.skipif(not IS_ROOT or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_a_colleagues_0600_run_is_reported_and_the_rest_answers(tmp_path):
    root = tmp_path / "runs"
    good_runs(root)
    theirs = write_run(root / "p" / "theirs", [{"loss": 7.0}])
    (theirs / "config.json").write_text('{"lr": 0.1}')
    for f in theirs.iterdir():
        os.chown(f, OTHER_UID, OTHER_UID)
        os.chmod(f, 0o600)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    sql = "SELECT run, status, problem, steps FROM runs ORDER BY run"
    p = et_query(sql, str(root), "--format", "json", prefix=no_dac())
    assert p.returncode == 0, p.stderr
    by = {r["run"]: r for r in json.loads(p.stdout)}
    assert by["p/a"]["steps"] == 2 and by["p/a"]["problem"] is None
    row = by["p/theirs"]
    assert row["status"] == "unreadable"
    for name in ("metrics.jsonl", "run.json", "config.json"):
        assert f"{name}: permission denied" in row["problem"]
    assert "could not be read whole" in p.stderr and "permission denied" in p.stderr
    p = et_query(COUNT, str(root), "--format", "json", prefix=no_dac())
    assert p.returncode == 0 and json.loads(p.stdout) == GOOD, p.stderr
    assert not (theirs / ".et-cache").exists()  # nothing made in their run


@pytest.mark.slow
@pytest.mark.skipif(not IS_ROOT or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_a_colleagues_0700_run_folder_is_reported_not_left_out(tmp_path):
    """A run folder that cannot be listed (another uid, mode 0700) was left out of `et
    query` and `et export` without a word (`et runs` lists it as unreadable): the runs view
    had no row for it and no warning named it."""
    root = tmp_path / "runs"
    good_runs(root)
    theirs = write_run(root / "p" / "theirs", [{"loss": 7.0}])
    os.chown(theirs, OTHER_UID, OTHER_UID)
    os.chmod(theirs, 0o700)
    sql = "SELECT run, status, run_status, problem FROM runs ORDER BY run"
    p = et_query(sql, str(root), "--format", "json", prefix=no_dac())
    assert p.returncode == 0, p.stderr
    by = {r["run"]: r for r in json.loads(p.stdout)}
    assert set(by) == {"p/a", "p/b", "p/theirs"}
    assert by["p/theirs"]["status"] == by["p/theirs"]["run_status"] == "unreadable"
    assert by["p/theirs"]["problem"] == "the folder cannot be listed: permission denied"
    assert by["p/a"]["problem"] is None
    # a query of the metrics alone answers from the others and names it
    p = et_query(COUNT, str(root), "--format", "json", prefix=no_dac())
    assert p.returncode == 0 and json.loads(p.stdout) == GOOD, p.stderr
    assert "p/theirs: the folder cannot be listed: permission denied" in p.stderr
    out = tmp_path / "out"
    p = subprocess.run(
        no_dac(sys.executable, "-m", "expr_tracker.cli.main", "export", str(root))
        + ["-o", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert [s["run"] for s in summary["skipped"]] == ["p/theirs"], summary
    assert "p/theirs: the folder cannot be listed: permission denied" in p.stderr


def test_a_file_swapped_for_a_link_after_discovery_is_not_read(tmp_path):
    """config.json replaced by a link to a file outside the run between discovery and
    reading: refused (the problem says so), never read into the answer."""
    from expr_tracker.query.catalog import discover
    from expr_tracker.query.tables import runs_table

    root = tmp_path / "runs"
    run = write_run(root / "p" / "a", [{"loss": 1.0}])
    (run / "config.json").write_text('{"lr": 0.1}')
    secret = tmp_path / "docker-config.json"
    secret.write_text('{"auths": {"registry": "s3cr3t"}}')
    producers = discover(root)
    (run / "config.json").unlink()
    (run / "config.json").symlink_to(secret)
    row = runs_table(producers, {}).to_pylist()[0]
    assert "s3cr3t" not in json.dumps(row) and row["config"] is None
    assert "config.json: outside" in row["problem"]


# --------------------------------------------------------------------------- 10: damaged cache


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage", "manifest-torn"])
def test_a_damaged_cache_is_rebuilt_with_one_warning(tmp_path, damage, caplog):
    root = tmp_path / "runs"
    good_runs(root)
    assert et.query(COUNT, root, output_type="dicts") == GOOD
    cdir = root / "p" / "a" / ".et-cache" / "metrics.jsonl"
    part = next(cdir.glob("part-*.parquet"))
    data = part.read_bytes()
    if damage == "empty":
        part.write_bytes(b"")
    elif damage == "truncated":
        part.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":  # same size, Parquet's magic kept: only a read finds it
        part.write_bytes(data[:4] + b"\x00" * (len(data) - 8) + data[-4:])
    else:
        m = (cdir / "manifest.json").read_bytes()
        (cdir / "manifest.json").write_bytes(m[: len(m) // 2])
    caplog.clear()
    with caplog.at_level("WARNING", logger="expr_tracker"):
        assert et.query(COUNT, root, output_type="dicts") == GOOD
        assert et.query(COUNT, root, output_type="dicts") == GOOD
    warnings = [r for r in caplog.records if "rebuilt" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    assert str(root / "p" / "a") in warnings[0].getMessage()


def current_part(cdir: Path) -> Path:
    """The first part the cache's manifest lists (a replaced part stays a while beside it)."""
    return cdir / json.loads((cdir / "manifest.json").read_text())["parts"][0]["file"]


def damage_footer(part: Path) -> None:
    """Overwrite 16 bytes in the middle of a part's Thrift footer: size and Parquet's magic
    stay, and DuckDB's error ("don't know what type", "invalid TType") names no file."""
    data = bytearray(part.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little")
    mid = len(data) - 8 - footer // 2
    data[mid : mid + 16] = b"\xff" * 16
    part.write_bytes(bytes(data))


def test_a_part_whose_footer_is_damaged_is_rebuilt(tmp_path, caplog):
    """DuckDB's error for a damaged footer names no file, so the query layer took it for
    an error of the SQL: `et query` exited 2 printing the schema, `et.query` raised
    QueryError and `et export` exited 1, at every try, until .et-cache was deleted by hand."""
    root = tmp_path / "runs"
    good_runs(root)
    assert et.query(COUNT, root, output_type="dicts") == GOOD
    cdir = root / "p" / "a" / ".et-cache" / "metrics.jsonl"
    damage_footer(current_part(cdir))
    caplog.clear()
    with caplog.at_level("WARNING", logger="expr_tracker"):
        assert et.query(COUNT, root, output_type="dicts") == GOOD
        assert et.query(COUNT, root, output_type="dicts") == GOOD
    warnings = [r.getMessage() for r in caplog.records if "rebuilt" in r.getMessage()]
    assert len(warnings) == 1 and str(cdir) in warnings[0], caplog.text
    # the command line, and a damaged part of the spans view, the same
    damage_footer(current_part(cdir))
    p = et_query(COUNT, str(root), "--format", "json")
    assert p.returncode == 0 and json.loads(p.stdout) == GOOD, p.stderr
    assert "rebuilt" in p.stderr and "Traceback" not in p.stderr


def test_export_rebuilds_a_part_whose_bytes_changed(tmp_path):
    """A part damaged in its middle keeps its size and magic: `et export` failed for good
    on a damaged footer (exit 1, "Couldn't deserialize thrift") and exported whatever a
    damaged page decoded to. Its bytes are checked against the SHA-256 written with it."""
    root = tmp_path / "runs"
    good_runs(root)
    assert et.query(COUNT, root, output_type="dicts") == GOOD
    cdir = root / "p" / "a" / ".et-cache" / "metrics.jsonl"
    part = current_part(cdir)
    for how in ("footer", "middle"):
        if how == "footer":
            damage_footer(part)
        else:  # a byte of the data pages: decodes to other numbers, or fails
            data = bytearray(part.read_bytes())
            footer = int.from_bytes(data[-8:-4], "little")
            data[(4 + len(data) - 8 - footer) // 2] ^= 0x01
            part.write_bytes(bytes(data))
        out = tmp_path / f"out-{how}.jsonl"
        p = subprocess.run(
            [sys.executable, "-m", "expr_tracker.cli.main", "export", str(root / "p" / "a")]
            + ["-o", str(out), "--format", "jsonl", "--layout", "long"],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert p.returncode == 0, p.stderr
        assert "rebuilt" in p.stderr and "Traceback" not in p.stderr
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert sorted(r["value"] for r in rows) == [1.0, 2.0], (how, rows)
        part = current_part(cdir)


def test_et_query_raises_query_error_for_a_part_it_cannot_read(tmp_path):
    """A Parquet file a query names itself is no cache part of ours: QueryError, not a
    raw DuckDB or pyarrow exception."""
    bad = tmp_path / "x.parquet"
    bad.write_bytes(b"PAR1" + b"\x00" * 20 + b"PAR1")
    with pytest.raises(et.QueryError):
        et.query(f"SELECT * FROM read_parquet('{bad}')", tmp_path)


def tmpfs(path: Path, size: str = "2m") -> None:
    path.mkdir()
    p = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if p.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({p.stderr.strip() or p.returncode})")


@pytest.mark.slow
@pytest.mark.skipif(not IS_ROOT, reason="mounting a small tmpfs needs root")
def test_a_full_disk_under_the_cache_still_answers(tmp_path):
    """The cache on a 2 MB file system that fills up: one warning line naming the folder
    (one for the disk, not one per run), and the query answers from the JSONL decoded in
    memory; et export too."""
    import random

    root = tmp_path / "runs"
    rng = random.Random(5)
    for name in ("big", "other"):
        rows = [{f"m{k}": rng.random() for k in range(5)} for _ in range(20_000)]
        write_run(root / "p" / name, rows)
    full = tmp_path / "full"
    tmpfs(full)
    try:
        with open(full / "ballast", "wb") as f:  # all but what a folder and a lock need
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        sql = "SELECT count(*) AS n, count(DISTINCT run) AS runs FROM metrics"
        p = et_query(sql, str(root), "--format", "json", "--cache-dir", str(full))
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout) == [{"n": 200_000, "runs": 2}]
        lines = [ln for ln in p.stderr.splitlines() if "cannot write the query cache" in ln]
        assert len(lines) == 1 and str(full) in lines[0], p.stderr
        assert "Traceback" not in p.stderr
        leftovers = [n for d in full.iterdir() if d.is_dir() for n in os.listdir(d)]
        assert not [n for n in leftovers if n.startswith(".tmp-")]
        # et export reads it the same way
        out = tmp_path / "out.parquet"
        p = subprocess.run(
            [sys.executable, "-m", "expr_tracker.cli.main", "export", str(root / "p" / "big")]
            + ["-o", str(out), "--cache-dir", str(full)],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert p.returncode == 0, p.stderr
        assert pq.read_metadata(out).num_rows == 20_000
    finally:
        subprocess.run(["umount", "-l", str(full)], check=False)


# --------------------------------------------------------------------------- 11: deleted cache


@pytest.mark.slow
def test_deleting_the_cache_in_a_loop_never_changes_an_answer(tmp_path):
    """A cleaner deleting every .et-cache in a loop while 100 queries run: every answer is
    exact (96 of 97 counted one run as absent before)."""
    root = tmp_path / "runs"
    for i in range(3):
        write_run(root / "p" / f"r{i}", [{"loss": float(k), "acc": 1.0} for k in range(50 + i)])
    want = [
        {"run": f"p/r{i}", "n": 2 * (50 + i), "s": sum(range(50 + i)) + 50.0 + i} for i in range(3)
    ]
    assert et.query(COUNT, root, output_type="dicts") == want
    stop = threading.Event()
    deletions = [0]

    def cleaner():
        while not stop.wait(0.001):
            for i in range(3):
                d = root / "p" / f"r{i}" / ".et-cache"
                if d.exists():
                    shutil.rmtree(d, ignore_errors=True)
                    deletions[0] += 1

    t = threading.Thread(target=cleaner, daemon=True)
    t.start()
    try:
        answers = [et.query(COUNT, root, output_type="dicts") for _ in range(100)]
    finally:
        stop.set()
        t.join()
    assert deletions[0] > 10
    wrong = [a for a in answers if a != want]
    assert not wrong, (len(wrong), wrong[:2])


# --------------------------------------------------------------------------- terminal output


def test_table_output_escapes_control_characters_json_keeps_them(tmp_path, capsys):
    from expr_tracker.cli.main import main

    root = tmp_path / "runs"
    write_run(root / "p" / "a", [{"x\x1b]52;c;aGk=\x07": 1.0, "\x1b[2J": 2.0}])
    assert main(["query", "SELECT metric FROM metrics ORDER BY metric", str(root)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b[2J" in out and "\\x1b]52;c;aGk=\\x07" in out
    assert main(["query", "SELECT metric FROM metrics", str(root), "--format", "jsonl"]) == 0
    got = {json.loads(ln)["metric"] for ln in capsys.readouterr().out.splitlines()}
    assert got == {"x\x1b]52;c;aGk=\x07", "\x1b[2J"}


# --------------------------------------------------------------------------- et export


def et_export(*args: str, timeout: float = 300):
    return subprocess.run(
        [sys.executable, "-m", "expr_tracker.cli.main", "export", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _host() -> str:
    import re
    import socket

    return re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname())[:64] or "host"


def test_export_removes_partials_of_killed_exports_only(tmp_path):
    from expr_tracker.query.export import export_runs

    root = tmp_path / "runs"
    good_runs(root)
    out = tmp_path / "out"
    dead = dead_pid()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale = [
            tmp_path / f".out.{_host()}.{dead}.partial",  # a folder, as a partitioned export
            tmp_path / f".out.{dead}.partial",  # the name of earlier versions
        ]
        stale[0].mkdir()
        (stale[0] / "x.parquet").write_bytes(b"half")
        stale[1].write_bytes(b"half")
        kept = [
            tmp_path / f".out.{_host()}.{live.pid}.partial",  # still running
            tmp_path / f".out.otherhost.{dead}.partial",  # another host's
            tmp_path / f".other.{dead}.partial",  # another output's
            tmp_path / f"out.{dead}.partial",  # not a name an export makes
        ]
        for k in kept:
            k.write_bytes(b"keep")
        res = export_runs(root, out)
        assert res["rows"] == 3
        assert not any(os.path.lexists(s) for s in stale)
        assert all(k.read_bytes() == b"keep" for k in kept)
    finally:
        live.kill()
        live.wait()


@pytest.mark.slow
def test_a_killed_export_leaves_no_partial_after_the_next(tmp_path):
    import signal
    import time

    root = tmp_path / "runs"
    write_run(root / "p" / "big", [{"a": float(i), "b": 1.0} for i in range(200_000)])
    write_run(root / "p" / "small", [{"a": 1.0}])
    et_export(str(root), "-o", str(tmp_path / "warm"))  # the cache, built once
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "expr_tracker.cli.main", "export", str(root), "-o", str(out)]
        + ["--format", "csv", "--layout", "long"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".out.*.partial")) and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if proc.returncode != -signal.SIGKILL:
        pytest.skip("the export finished before it could be killed")
    assert list(tmp_path.glob(".out.*.partial"))
    p = et_export(str(root), "-o", str(out))
    assert p.returncode == 0, p.stderr
    assert not list(tmp_path.glob(".out.*")) and out.is_dir()


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_export_reports_an_unreadable_run_and_exports_the_rest(tmp_path):
    root = tmp_path / "runs"
    good_runs(root)
    fifo = write_run(root / "p" / "fifo", [{"loss": 1.0}])
    (fifo / "metrics.jsonl").unlink()
    os.mkfifo(fifo / "metrics.jsonl")
    deep = root / "p" / "deep"
    deep.mkdir()
    (deep / "metrics.jsonl").write_text('{"_step": 0, "a": ' + "[" * DEEP + "]" * DEEP + "}\n")
    out = tmp_path / "out"
    p = et_export(str(root), "-o", str(out), "--json", timeout=120)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["rows"] == 3 and res["producers"] == 3  # a, b and the deep run (no rows)
    assert {s["run"]: s["problem"] for s in res["skipped"]} == {
        "p/deep": "metrics.jsonl: 1 unreadable line skipped (line 1: nested too deeply)",
        "p/fifo": "metrics.jsonl: a FIFO, not a regular file",
    }
    assert p.stderr.count("could not be read whole") == 1 and "p/fifo" in p.stderr
    got = pq.read_table(out).to_pylist()
    assert sorted((r["run"], r["loss"]) for r in got) == [("p/a", 1.0), ("p/a", 2.0), ("p/b", 3.0)]


@pytest.mark.slow
def test_a_config_of_many_keys_is_flattened_in_linear_time(tmp_path):
    """The runs view flattens config.json into config.* columns; they were appended to the
    table one at a time (the schema copied each time): a config of 20,000 keys took 80 s
    to 160 s, of 30,000 several minutes."""
    root = tmp_path / "runs"
    good_runs(root)
    cfg = {f"k{i}": i for i in range(30_000)}
    (root / "p" / "a" / "config.json").write_text(json.dumps(cfg))
    p = et_query(
        'SELECT run, "config.k29999" AS k FROM runs ORDER BY run',
        str(root),
        "--format",
        "json",
        timeout=90,
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [{"run": "p/a", "k": 29999}, {"run": "p/b", "k": None}]


#: ``_step``s no writer writes (docs/logging.md "The commit table": a step is an int in
#: [0, 2**63-1]): -7 read into the middle of ``et query``'s and ``et history``'s order before
BAD_STEPS = [-7, -(2**63), 2**63, 2**64]


@pytest.mark.parametrize("dense", [True, False], ids=["dense", "mixed"])
def test_a_step_no_writer_writes_is_no_row_to_any_reader(tmp_path, dense):
    """A line whose ``_step`` is negative or past 2**63-1 is skipped by ``et.history``,
    ``et history`` and ``et query`` alike (counted, warned once), whichever decoder reads
    its block: dense lines (polars), mixed keys (pyarrow.json), or line by line."""
    root = tmp_path / "runs"
    rows = [
        {"loss": float(i)} if dense or i % 3 else {"loss": float(i), "acc": 0.5} for i in range(300)
    ]
    src = write_run(root / "p" / "a", rows) / "metrics.jsonl"
    lines = src.read_bytes().splitlines(keepends=True)
    planted = [
        json.dumps({"loss": -1.0, "_step": s, "_time": 1.7e9}).encode() + b"\n" for s in BAD_STEPS
    ]
    src.write_bytes(b"".join(lines[:100] + planted + lines[100:]))

    p = et_query("--format", "json", "SELECT step, value FROM metrics ORDER BY step", str(root))
    assert p.returncode == 0, p.stderr
    got = [(r["step"], r["value"]) for r in json.loads(p.stdout) if r["value"] is not None]
    want = [(i, float(i)) for i in range(300)]
    assert [g for g in got if g[1] == float(g[0])] == want
    assert -1.0 not in [v for _s, v in got]

    assert [r["_step"] for r in et.history(None, run=str(src.parent))] == list(range(300))
    h = subprocess.run(
        [sys.executable, "-m", "expr_tracker.cli.main", "history", str(src.parent), "-n", "400"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
    )
    assert h.returncode == 0 and "-7" not in h.stdout and "-1" not in h.stdout, h.stdout
    assert h.stderr.count("without an integer _step in [0, 2**63-1]") == 1, h.stderr


def test_a_negative_span_step_is_no_step_on_either_span_decoder():
    """A span line's negative ``_step`` is NULL (no step) on the vectorised decoder as on
    the line-by-line one (it was kept on the vectorised one)."""
    from expr_tracker.query import scan

    lines = [
        json.dumps(
            {"_step": s, "name": "fwd", "depth": 0, "start": 1.5, "dur_ms": 2.0, "id": i}
        ).encode()
        for i, s in enumerate([0, -3, 2, -(2**63)])
    ]
    chunk = b"\n".join(lines) + b"\n"
    assert scan._fast_spans(chunk, 0) is not None
    fast = scan.decode_spans_block(chunk, 0)
    assert fast.equals(scan.decode_spans(lines, 0))
    assert fast.column("step").to_pylist() == [0, None, 2, None]
