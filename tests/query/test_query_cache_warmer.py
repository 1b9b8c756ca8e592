"""A run keeps the query cache of the files it writes (``history.query_cache``; docs/query.md
"Kept by the run"): extended on its own thread as the file grows and once more at finish,
the same rows a reader's cold cache gives, nothing the first query has to decode, nothing
built for a small run, and nothing that can break the run: a planted cache folder, a
symbolic link, SIGTERM in the middle, a resumed run, ``query_cache: false``."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from helpers import run_py
from jsonl_model import long_metric_keys, long_metric_rows

duckdb = pytest.importorskip("duckdb")
pytest.importorskip("pyarrow")

import expr_tracker as et  # noqa: E402
from expr_tracker.query import cache as qcache  # noqa: E402
from expr_tracker.query import warmer  # noqa: E402
from expr_tracker.query.warmer import CacheWarmer  # noqa: E402

#: the step the runs of these tests use (the default is 16 MiB): a few dozen KiB of lines
STEP = 32 << 10


@pytest.fixture(autouse=True)
def _small_step(tmp_path, monkeypatch):
    monkeypatch.setattr(warmer, "STEP_BYTES", STEP)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def expected(path, skip_bad: bool = False) -> list[tuple]:
    """(line, metric, value bits or None, text, step) of every complete line, via json."""
    return long_metric_keys(path, skip_bad=skip_bad)


def part_rows(parts) -> list[tuple]:
    rows = duckdb.sql(
        "select line, metric, value, text, step from read_parquet($p)",
        params={"p": [str(p) for p in parts]},
    ).fetchall()
    return sorted((ln, m, None if v is None else float(v).hex(), t, s) for ln, m, v, t, s in rows)


def manifest(src) -> dict:
    return json.loads((src.parent / ".et-cache" / src.name / "manifest.json").read_text())


#: a child's first lines: a run past the test's step, finished (``run`` stays bound); what
#: the test checks follows, its own lines dedented by ``run_py``
PAST_THE_STEP = """
import expr_tracker as et
from expr_tracker.query import warmer
warmer.STEP_BYTES = {step}
run = et.init(project="p", name="r", dir={root!r}, buffer_size=20)
for i in range(3000):
    et.log({{"loss": 1.0 / (i + 1), "acc": i * 0.5}})
et.finish()
"""


def gone(pid: int, timeout: float = 30) -> bool:
    """True once process ``pid`` has ended (within ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    return not os.path.exists(f"/proc/{pid}")


def log_rows(n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        et.log(
            {
                "loss": 1.0 / (i + 1),
                "acc": i,
                "odd": math.nan if i % 7 == 0 else i * 0.5,
                "tag": f"s{i}",
                "big": 2**60 + i,
            }
        )


def test_a_finished_run_leaves_a_cache_covering_its_file(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="expr_tracker")
    run = et.init(project="p", name="r", dir=str(tmp_path / "runs"), buffer_size=20)
    log_rows(3000)
    et.finish()
    src = run.dir / "metrics.jsonl"
    size = src.stat().st_size
    assert size > 4 * STEP
    m = manifest(src)
    assert (m["covered"], m["lines"]) == (size, 3000)
    stats = run.info()["query_cache"]["metrics"]
    assert stats["warms"] >= 2 and stats["covered"] == size and stats["gave_up"] is None
    # the same rows a reader decodes from the JSONL itself
    got = qcache.refresh(src, "metrics")
    assert part_rows(got.parts) == expected(src)
    assert manifest(src) == m  # the reader found nothing left to decode
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    # and the query answers from it: every row, the NaNs, the exact digits of an int beyond
    # 2**53 that a double does not hold
    n, nan, big = (
        et.query(
            "select count(*), count(*) filter (where isnan(value)), "
            "count(*) filter (where text is not null and metric = 'big') from metrics",
            dir=str(tmp_path / "runs"),
            output_type="arrow",
        )
        .to_pylist()[0]
        .values()
    )
    inexact = sum(1 for i in range(3000) if int(float(2**60 + i)) != 2**60 + i)
    assert (n, nan, big) == (15000, 429, inexact) and inexact > 2900
    assert manifest(src) == m


def test_the_cache_grows_while_the_run_writes(tmp_path):
    run = et.init(project="p", name="r", dir=str(tmp_path / "runs"), buffer_size=20)
    src = run.dir / "metrics.jsonl"
    log_rows(1500)
    run.flush()
    deadline = time.monotonic() + 30
    while run.info()["query_cache"]["metrics"]["warms"] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    m = manifest(src)
    assert 0 < m["covered"] <= src.stat().st_size and m["lines"] > 0
    log_rows(1500, 1500)
    et.finish()
    assert manifest(src)["covered"] == src.stat().st_size
    assert part_rows(qcache.refresh(src, "metrics").parts) == expected(src)


def test_the_training_process_imports_no_pyarrow_and_its_helper_ends_with_it(tmp_path):
    """The extensions run in a helper process: the training process never imports pyarrow
    or polars for them, and the helper exits once the training process has ended."""
    p = run_py(
        PAST_THE_STEP.format(step=STEP, root=str(tmp_path / "runs"))
        + textwrap.dedent(
            """
        import sys
        print(sorted(m for m in ("pyarrow", "polars", "duckdb") if m in sys.modules))
        print(run.info()["query_cache"]["metrics"]["helper_pid"])
        """
        )
    )
    imported, pid = p.stdout.splitlines()[:2]
    assert imported == "[]"
    src = tmp_path / "runs" / "p" / "r" / "metrics.jsonl"
    assert manifest(src)["covered"] == src.stat().st_size
    assert gone(int(pid)), "the helper outlived its process"


def test_the_helper_answers_each_request_and_ends_with_its_input(tmp_path):
    src = tmp_path / "runs" / "p" / "r" / "metrics.jsonl"
    src.parent.mkdir(parents=True)
    src.write_text("".join(f'{{"_step": {i}, "loss": {i}}}\n' for i in range(100)))
    r_in, w_in = os.pipe()
    r_out, w_out = os.pipe()
    requests = [
        {"id": 1, "path": str(src), "kind": "metrics"},
        "not json",
        {"id": 3, "path": str(src), "kind": "alerts"},
        {"id": 4, "path": str(tmp_path / "missing.jsonl"), "kind": "metrics"},
        {"id": 5, "path": str(src), "kind": "metrics"},
    ]
    data = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in requests)
    os.write(w_in, data.encode())
    os.close(w_in)
    warmer.helper_main(r_in, w_out, idle=30)
    os.close(w_out)
    with os.fdopen(r_out, "rb") as f:
        answers = [json.loads(line) for line in f]
    os.close(r_in)
    size = src.stat().st_size
    assert [(a["id"], a["covered"]) for a in answers] == [
        (1, size),
        (None, None),
        (3, None),
        (4, None),
        (5, size),
    ]
    assert "JSONDecodeError" in answers[1]["error"] and "kind='alerts'" in answers[2]["error"]
    assert answers[3]["error"] is None  # a file it cannot read: not kept, no error
    r_in, w_in = os.pipe()
    t0 = time.monotonic()
    warmer.helper_main(r_in, w_out := os.open(os.devnull, os.O_WRONLY), idle=0.2)  # idle: ends
    assert time.monotonic() - t0 < 20
    for fd in (r_in, w_in, w_out):
        os.close(fd)


def test_the_helper_serves_what_it_was_sent_after_its_process_is_gone(tmp_path):
    """A run that ended failed leaves its helper the last extension: the helper, stopped in
    the middle of an earlier one (a reader held the cache's lock), answers into a pipe
    nobody reads any more. It goes on with the requests it was sent, the finish's last
    among them (it ended at its first answer before, that extension never made)."""
    files = []
    for name in ("a", "b"):
        src = tmp_path / "runs" / "p" / name / "metrics.jsonl"
        src.parent.mkdir(parents=True)
        src.write_text("".join(f'{{"_step": {i}, "loss": {i}}}\n' for i in range(100)))
        files.append(src)
    r_in, w_in = os.pipe()
    r_out, w_out = os.pipe()
    os.close(r_out)  # the training process is gone
    data = "".join(
        json.dumps({"id": n, "path": str(src), "kind": "metrics"}) + "\n"
        for n, src in enumerate(files, 1)
    )
    os.write(w_in, data.encode())
    os.close(w_in)
    try:
        warmer.helper_main(r_in, w_out, idle=30)
    finally:
        os.close(r_in)
        os.close(w_out)
    for src in files:
        assert manifest(src)["covered"] == src.stat().st_size
        assert part_rows(qcache.refresh(src, "metrics").parts) == expected(src)


def refuse_threads(monkeypatch=None):
    """Python 3.12's rule at interpreter shutdown (no new thread in an ``atexit`` hook),
    on the Python the tests run on."""

    def start(self):
        raise RuntimeError("can't create new thread at interpreter shutdown")

    if monkeypatch is None:
        threading.Thread.start = start
    else:
        monkeypatch.setattr(threading.Thread, "start", start)


def test_where_no_thread_can_start_the_helper_is_started_inline(tmp_path, monkeypatch):
    """At shutdown on Python 3.12+ (no thread may start): the request goes to a helper
    started on the calling thread, unanswered and not waited for, and the helper extends
    the cache once this end of its input closes (the process gone). The file was given up
    before ("the helper process cannot be reached (RuntimeError ...)")."""
    src = tmp_path / "runs" / "p" / "r" / "metrics.jsonl"
    src.parent.mkdir(parents=True)
    src.write_text("".join(f'{{"_step": {i}, "loss": {i}}}\n' for i in range(100)))
    monkeypatch.setattr(warmer, "_HELPER", None)
    helper = warmer._helper()
    w = CacheWarmer(src, "metrics", step=1)
    start = threading.Thread.start
    refuse_threads(monkeypatch)
    try:
        w.written(src.stat().st_size)
        w.finish(wait=5)  # nothing pending: returns at once, after its own request
        assert (w._pending, w._queued, w.gave_up) == (0, False, None)
        assert w.helper_pid == helper._proc.pid  # both requests to the one helper
    finally:
        monkeypatch.setattr(threading.Thread, "start", start)
        if helper._requests is not None:
            os.close(helper._requests)  # as at this process's end
    assert helper._proc.wait(timeout=30) == 0
    assert manifest(src)["covered"] == src.stat().st_size
    assert part_rows(qcache.refresh(src, "metrics").parts) == expected(src)


def test_a_start_in_flight_as_threads_stop_sends_unanswered(tmp_path, monkeypatch):
    """A helper's start already under way when the interpreter stops allowing threads
    (its answers' reader cannot start): the queued request is sent unanswered and not
    waited for, instead of the file being given up with the helper left idle."""
    src = tmp_path / "runs" / "p" / "r" / "metrics.jsonl"
    src.parent.mkdir(parents=True)
    src.write_text("".join(f'{{"_step": {i}, "loss": {i}}}\n' for i in range(100)))
    helper = warmer._Helper()
    w = CacheWarmer(src, "metrics", step=1)
    helper._queued, helper._starting, w._queued = [w], True, True
    start = threading.Thread.start
    refuse_threads(monkeypatch)
    try:
        helper._start_and_send()  # the starting thread's work, here
    finally:
        monkeypatch.setattr(threading.Thread, "start", start)
        if helper._requests is not None:
            os.close(helper._requests)
    assert (w._pending, w._queued, w.gave_up) == (0, False, None)
    assert helper._reader is None and w.helper_pid == helper._proc.pid
    assert helper._proc.wait(timeout=30) == 0
    assert manifest(src)["covered"] == src.stat().st_size


#: a run whose file first passes the step in the exit hook's last flush (nothing is
#: flushed before), finished by the exit hook where no thread may start (Python 3.12+)
AT_EXIT = """
import atexit, sys, threading
import expr_tracker as et
from expr_tracker.query import warmer
warmer.STEP_BYTES = 240 << 10  # the whole file is ~247 KB; ~64 KB is written before exit
run = et.init(project="p", name="r", dir=sys.argv[1], buffer_size=10**6,
              buffer_interval=3600, max_buffer_seconds=None)
for i in range(3000):
    et.log({"loss": 1.0 / (i + 1), "acc": i * 0.5})
print(run.info()["query_cache"]["metrics"]["helper_pid"])  # None: no helper yet
def refuse_threads():  # Python 3.12's rule at shutdown, on the Python the tests run on
    def start(self):
        raise RuntimeError("can't create new thread at interpreter shutdown")
    threading.Thread.start = start
atexit.register(refuse_threads)  # runs before et's exit hook (registered earlier)
"""


def test_a_run_finished_at_exit_where_no_thread_starts_keeps_its_cache(tmp_path):
    root = tmp_path / "runs"
    p = run_py(AT_EXIT, str(root))
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["None"]  # first needed at exit
    src = root / "p" / "r" / "metrics.jsonl"
    info = json.loads((src.parent / "run.json").read_text())
    assert info["status"] == "finished" and info["steps"] == 3000
    deadline = time.monotonic() + 30  # the helper extends the cache after the process
    while time.monotonic() < deadline:
        try:
            if manifest(src)["covered"] == src.stat().st_size:
                break
        except FileNotFoundError:
            pass
        time.sleep(0.05)
    assert manifest(src)["covered"] == src.stat().st_size
    assert part_rows(qcache.refresh(src, "metrics").parts) == expected(src)


def test_a_small_run_builds_nothing_and_imports_no_pyarrow(tmp_path):
    p = run_py(
        f"""
        import sys
        import expr_tracker as et
        run = et.init(project="p", name="r", dir={str(tmp_path / "runs")!r})
        for i in range(200):
            et.log({{"loss": 1.0 / (i + 1)}})
        et.finish()
        print(sorted(m for m in ("pyarrow", "polars", "duckdb") if m in sys.modules))
        print(run.info()["query_cache"]["metrics"])
        """
    )
    assert p.stdout.splitlines()[0] == "[]"
    assert "'warms': 0" in p.stdout
    assert not (tmp_path / "runs" / "p" / "r" / ".et-cache").exists()


def test_query_cache_false_leaves_it_to_the_reader(tmp_path):
    run = et.init(project="p", name="r", dir=str(tmp_path / "runs"), history={"query_cache": False})
    log_rows(3000)
    et.finish()
    assert "query_cache" not in run.info()
    assert not (run.dir / ".et-cache").exists()
    src = run.dir / "metrics.jsonl"
    assert part_rows(qcache.refresh(src, "metrics").parts) == expected(src)


def test_spans_files_are_kept_too(tmp_path):
    run = et.init(project="p", name="r", dir=str(tmp_path / "runs"), buffer_size=20)
    for i in range(1500):
        with et.span("step", args={"i": i}):
            with et.span("forward"):
                pass
        et.log({"loss": 1.0 / (i + 1)})
    et.finish()
    spans = run.dir / "spans.jsonl"
    m = manifest(spans)
    assert m["covered"] == spans.stat().st_size and m["lines"] == 3000
    n = et.query("select count(*) from spans", dir=str(tmp_path / "runs"), output_type="arrow")
    assert n.column(0).to_pylist() == [3000]
    assert manifest(spans) == m


def test_a_resumed_run_extends_the_cache_of_its_first_attempt(tmp_path):
    root = str(tmp_path / "runs")
    run = et.init(project="p", name="r", dir=root, buffer_size=20)
    log_rows(2000)
    et.finish()
    src = run.dir / "metrics.jsonl"
    first = manifest(src)
    run = et.init(project="p", name="r", dir=root, buffer_size=20, resume="must")
    log_rows(2000, 2000)
    et.finish()
    m = manifest(src)
    assert m["covered"] == src.stat().st_size and m["lines"] == 4000
    # extended, not rebuilt: the first attempt's parts are still listed (or compacted)
    assert {p["file"] for p in first["parts"]} & {p["file"] for p in m["parts"]}
    assert part_rows(qcache.refresh(src, "metrics").parts) == expected(src)


@pytest.mark.parametrize("planted", ["file", "link", "group_writable"])
def test_a_cache_folder_it_does_not_trust_is_left_alone(tmp_path, planted, caplog):
    """A ``.et-cache`` that is a file, a symbolic link to elsewhere or a folder others may
    write into: the run neither writes into it nor warns; the run's data are whole."""
    caplog.set_level(logging.WARNING, logger="expr_tracker")
    root = tmp_path / "runs"
    run_dir = root / "p" / "r"
    run_dir.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if planted == "file":
        (run_dir / ".et-cache").write_text("not a folder")
    elif planted == "link":
        (run_dir / ".et-cache").symlink_to(elsewhere)
    else:
        (run_dir / ".et-cache").mkdir()
        os.chmod(run_dir / ".et-cache", 0o777)
    run = et.init(project="p", name="r", dir=str(root), buffer_size=20)
    assert run.dir == run_dir
    log_rows(2000)
    et.finish()
    assert run.info_record["status"] == "finished"
    gave_up = run.info()["query_cache"]["metrics"]["gave_up"]
    assert gave_up == "its cache folder cannot be used or written"
    assert list(elsewhere.iterdir()) == []
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(long_metric_rows(run_dir / "metrics.jsonl")) == 2000 * 5


def test_a_damaged_cache_is_rebuilt_by_the_run_quietly(tmp_path, caplog):
    root = str(tmp_path / "runs")
    run = et.init(project="p", name="r", dir=root, buffer_size=20)
    log_rows(1000)
    et.finish()
    src = run.dir / "metrics.jsonl"
    folder = src.parent / ".et-cache" / src.name
    (folder / "manifest.json").write_text(
        json.dumps({"version": qcache.VERSION, "parts": ["../../x"]})
    )
    caplog.set_level(logging.WARNING, logger="expr_tracker")
    run = et.init(project="p", name="r", dir=root, buffer_size=20, resume="must")
    log_rows(1000, 1000)
    et.finish()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert manifest(src)["covered"] == src.stat().st_size
    assert part_rows(qcache.refresh(src, "metrics").parts) == expected(src)


# SIGTERM while the run writes and extends its cache: the run ends as SIGTERM ends it, what
# it wrote is whole, and the cache a reader finds afterwards is right (extended, never
# trusted wrong): exactly the rows of the file
CHILD = """
import os, signal, sys, time
# a SIGINT ignored by the shell that started pytest in the background is ignored here too
signal.signal(signal.SIGINT, signal.default_int_handler)
import expr_tracker as et
from expr_tracker.query import warmer
warmer.STEP_BYTES = 16 << 10
run = et.init(project="p", name="r", dir=sys.argv[1], buffer_size=5)
i = 0
while True:
    et.log({"loss": 1.0 / (i + 1), "acc": i * 0.5, "tag": "x" * (i % 13)})
    i += 1
    if i == 3000:
        open(sys.argv[2], "w").close()
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_in_the_middle_leaves_data_and_cache_right(tmp_path, sig):
    root = tmp_path / "runs"
    ready = tmp_path / "ready"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root), str(ready)], env=env, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.01)
        time.sleep(0.2)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode != 0, err
    src = root / "p" / "r" / "metrics.jsonl"
    info = json.loads((src.parent / "run.json").read_text())
    assert info["status"] in ("failed", "preempted", "finished"), info
    rows = expected(src)
    assert len(rows) >= 3000 * 3
    assert part_rows(qcache.refresh(src, "metrics").parts) == rows
    assert b"Traceback" not in err or b"KeyboardInterrupt" in err


def test_the_warmer_refuses_bad_arguments_and_is_idempotent(tmp_path):
    with pytest.raises(ValueError, match="kind='alerts' is not valid"):
        CacheWarmer(tmp_path / "a.jsonl", "alerts")
    with pytest.raises(ValueError, match="step=0 is not valid"):
        CacheWarmer(tmp_path / "a.jsonl", "metrics", step=0)
    w = CacheWarmer(tmp_path / "missing.jsonl", "metrics", step=10)
    w.written(5)  # below its mark: nothing queued
    assert w.next_at == 10 and w.warms == 0
    w.finish()
    w.finish()
    assert w.stats() == {"warms": 0, "covered": 0, "gave_up": None, "helper_pid": None}
    with pytest.raises(ValueError, match="kind='x'"):
        qcache.warm(tmp_path / "a.jsonl", "x")
    assert qcache.warm(tmp_path / "missing.jsonl", "metrics") is None


@pytest.mark.parametrize("why", ["read_only", "another_users"])
def test_warm_never_writes_a_cache_outside_the_run_directory(tmp_path, why):
    """Where a reader falls back (``$XDG_CACHE_HOME``, a temporary folder), a run does not:
    a run directory that is not writable, or not this user's, gets no cache anywhere."""
    is_root = os.geteuid() == 0
    if why == "read_only" and is_root:
        pytest.skip("root writes into a read-only folder")
    if why == "another_users" and not is_root:
        pytest.skip("only root can give a folder to another user")
    run_dir = tmp_path / "runs" / "p" / "r"
    run_dir.mkdir(parents=True)
    src = run_dir / "metrics.jsonl"
    src.write_text("".join(f'{{"_step": {i}, "loss": {i}}}\n' for i in range(100)))
    if why == "read_only":
        os.chmod(run_dir, 0o555)
    else:
        os.chown(run_dir, 65534, 65534)
    try:
        assert qcache.warm(src, "metrics") is None
    finally:
        os.chmod(run_dir, 0o755)
    assert not (tmp_path / "xdg").exists()
    assert not (run_dir / ".et-cache").exists()
    assert qcache.refresh(src, "metrics").rows == 100  # a reader still answers
    shutil.rmtree(run_dir)


def test_a_helper_that_dies_never_kills_a_process_that_restored_sigpipe(tmp_path):
    """A training script that restores SIGPIPE's default action (as scripts piped into
    ``head`` do) must outlive its helper: a request written to a helper that has just died
    raises no SIGPIPE in it (the run gives that file up, quietly)."""
    src = tmp_path / "metrics.jsonl"
    src.write_text("".join(f'{{"_step": {i}, "loss": {i}}}\n' for i in range(100)))
    p = run_py(
        f"""
        import os, signal, time
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        from expr_tracker.query import warmer
        def request():
            w = warmer.CacheWarmer({str(src)!r}, "metrics", step=1)
            w.written(1)  # what a writer's batch does: never raises an Exception
            return w

        for _ in range(40):
            pid = request().helper_pid
            if pid is None:
                continue  # given up: the helper it wrote to had just died
            os.kill(pid, signal.SIGKILL)
            # the helper's end closes as it dies: requests sent meanwhile meet a closed end
            deadline = time.monotonic() + 0.05
            while time.monotonic() < deadline and request().gave_up is None:
                pass
        print("alive")
        """
    )
    assert p.stdout.strip() == "alive"


def test_a_forked_child_does_not_keep_its_parents_helper_alive(tmp_path):
    """A child forked by a training process (a data-loader worker, a daemon) that outlives
    it does not hold the parent's helper open: the helper ends with the parent."""
    child_pid = tmp_path / "child.pid"
    p = run_py(
        PAST_THE_STEP.format(step=STEP, root=str(tmp_path / "runs"))
        + textwrap.dedent(
            f"""
        import os, signal, time
        print(run.info()["query_cache"]["metrics"]["helper_pid"], flush=True)
        pid = os.fork()
        if pid == 0:
            os.close(1)
            os.close(2)  # run_py waits for their end
            signal.pause()  # outlives its parent until the test ends it
            os._exit(0)
        with open({str(child_pid)!r}, "w") as f:
            f.write(str(pid))
        """
        )
    )
    helper = int(p.stdout.split()[0])
    child = int(child_pid.read_text())
    try:
        assert gone(helper), "the child kept its parent's helper"
        assert os.path.exists(f"/proc/{child}")
    finally:
        os.kill(child, signal.SIGKILL)


# the run's finish waits for a helper that does not answer (stopped here, as one blocked on
# the cache's lock by a reader would be): a SIGTERM or a Ctrl-C then ends the wait, the run
# already finished, instead of holding the process up for FINISH_WAIT_S
HUNG = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
import expr_tracker as et
from expr_tracker.query import warmer
warmer.STEP_BYTES = 16 << 10
warmer.FINISH_WAIT_S = 3600.0
run = et.init(project="p", name="r", dir=sys.argv[1], buffer_size=20)
for i in range(2000):
    et.log({"loss": 1.0 / (i + 1), "acc": i * 0.5})
run.flush()
stats = run.info()["query_cache"]["metrics"]
while stats["warms"] == 0 and stats["gave_up"] is None:
    time.sleep(0.01)
    stats = run.info()["query_cache"]["metrics"]
os.kill(stats["helper_pid"], signal.SIGSTOP)
for i in range(2000, 3000):
    et.log({"loss": 1.0 / (i + 1), "acc": i * 0.5})
print("finishing", stats["helper_pid"], flush=True)
et.finish()
"""


def start_hung(child: str, root) -> subprocess.Popen:
    """``child`` (HUNG or a variant) running on ``root``, its output read as text."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.Popen(
        [sys.executable, "-c", child, str(root)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stopped_helper(proc: subprocess.Popen) -> int:
    """The process id of the helper ``proc`` stopped, once it says it is finishing."""
    line = proc.stdout.readline()
    assert line.startswith("finishing"), proc.communicate(timeout=60)
    return int(line.split()[1])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_the_wait_for_a_helper_that_does_not_answer(tmp_path, sig):
    root = tmp_path / "runs"
    proc = start_hung(HUNG, root)
    helper = None
    try:
        helper = stopped_helper(proc)
        src = root / "p" / "r" / "metrics.jsonl"
        deadline = time.monotonic() + 30  # the run is finished, then the cache is waited for
        while time.monotonic() < deadline:
            if json.loads((src.parent / "run.json").read_text()).get("status") == "finished":
                break
            time.sleep(0.02)
        time.sleep(0.2)
        proc.send_signal(sig)
        # well under the default FINISH_WAIT_S (30 s) too, which the code before ignored
        _, err = proc.communicate(timeout=25)
    finally:
        proc.kill()
        if helper is not None:
            os.kill(helper, signal.SIGKILL)
    assert proc.returncode == (143 if sig == signal.SIGTERM else -signal.SIGINT), err
    assert json.loads((src.parent / "run.json").read_text())["status"] == "finished"
    assert part_rows(qcache.refresh(src, "metrics").parts) == expected(src)


#: HUNG's run, ended by what fails a run instead of ``et.finish()``
#: (the code, the exit status it gives)
ENDINGS = {
    "exception": ('raise RuntimeError("boom")', 1),
    "ctrl_c": ("raise KeyboardInterrupt", -signal.SIGINT),
    "exit_code": ("sys.exit(3)", 3),
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_a_failed_run_does_not_wait_for_its_helper(tmp_path, ending):
    """A run that ends failed (an exception, a Ctrl-C, a non-zero exit) finishes without
    waiting for the helper's last extension: the process ends as its error has it, with
    the helper stopped and ``FINISH_WAIT_S`` an hour (the code before waited that hour);
    the helper finishes the extension once it runs again, after the process is gone."""
    root = tmp_path / "runs"
    code, status = ENDINGS[ending]
    proc = start_hung(HUNG.replace("et.finish()", code), root)
    helper = None
    try:
        helper = stopped_helper(proc)
        _, err = proc.communicate(timeout=60)
        src = root / "p" / "r" / "metrics.jsonl"
        assert proc.returncode == status, err
        info = json.loads((src.parent / "run.json").read_text())
        assert info["status"] == "failed" and info["steps"] == 3000
        os.kill(helper, signal.SIGCONT)  # it takes the request sent at finish, then ends
        assert gone(helper)
        helper = None
        assert manifest(src)["covered"] == src.stat().st_size
    finally:
        proc.kill()
        if helper is not None:
            os.kill(helper, signal.SIGKILL)
    assert part_rows(qcache.refresh(src, "metrics").parts) == expected(src)


def test_a_dead_helper_gives_up_only_the_requests_it_took(tmp_path):
    """A helper that died takes its own unanswered requests with it, not those a new
    helper, started meanwhile, already took (they are answered by that one)."""
    helper = warmer._Helper()
    dead = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    alive = subprocess.Popen([sys.executable, "-c", "pass"])
    alive.wait()
    mine, other = (CacheWarmer(tmp_path / f"{n}.jsonl", "metrics") for n in ("a", "b"))
    mine._pending = other._pending = 1
    helper._waiting = {1: (dead, mine), 2: (alive, other)}
    helper._read(dead, iter([b'{"id": 2, "covered": 10, "error": null}\n']))
    assert mine._pending == 0 and mine.gave_up == "the helper process exited (3)"
    # the answer to request 2 came from the dead helper's stream, not from the helper
    # that took it: not taken for that one's
    assert other._pending == 1 and other.gave_up is None and other.warms == 0
    assert list(helper._waiting) == [2]


def test_an_interpreter_that_is_not_python_starts_no_helper(tmp_path, monkeypatch, caplog):
    """Embedded Python (uWSGI, Blender): ``sys.executable`` is another program, which the
    run must never start with its own arguments; the file is given up quietly."""
    caplog.set_level(logging.WARNING, logger="expr_tracker")
    monkeypatch.setattr(warmer, "_HELPER", None)
    monkeypatch.setattr(sys, "executable", "/usr/bin/blender")
    run = et.init(project="p", name="r", dir=str(tmp_path / "runs"), buffer_size=20)
    log_rows(1000)
    et.finish()
    stats = run.info()["query_cache"]["metrics"]
    assert "is not a Python interpreter" in stats["gave_up"]
    assert stats["helper_pid"] is None
    assert run.info_record["status"] == "finished"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not (run.dir / ".et-cache").exists()


def test_a_helper_being_started_never_holds_up_the_writer(tmp_path, monkeypatch):
    """The helper starts on a thread of its own: while its start is held up (``Popen`` on a
    loaded machine, tens of GIL hand-overs with a training loop running), the writer's
    flusher thread goes on writing the rows logged meanwhile, and the request waits in a
    queue that ``finish`` waits for, then reaches the helper."""
    entered, release = threading.Event(), threading.Event()
    real_start = warmer._Helper._start

    def held_start(self):
        entered.set()
        release.wait(60)
        return real_start(self)

    monkeypatch.setattr(warmer, "_HELPER", None)
    monkeypatch.setattr(warmer._Helper, "_start", held_start)
    run = et.init(project="p", name="r", dir=str(tmp_path / "runs"), buffer_size=20)
    try:
        log_rows(1000)  # past the step: the first request starts a helper
        assert entered.wait(30)
        log_rows(1000, start=1000)
        src = run.dir / "metrics.jsonl"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and src.read_bytes().count(b"\n") < 2000:
            time.sleep(0.02)
        assert src.read_bytes().count(b"\n") == 2000  # written while the start is held
        stats = run.info()["query_cache"]["metrics"]
        assert stats["helper_pid"] is None and stats["warms"] == 0
    finally:
        release.set()
    et.finish()
    stats = run.info()["query_cache"]["metrics"]
    assert stats["gave_up"] is None and stats["helper_pid"] is not None
    assert stats["covered"] == src.stat().st_size == manifest(src)["covered"]
    got = qcache.refresh(src, "metrics")
    assert part_rows(got.parts) == expected(src)


def test_a_fork_while_the_helper_starts_does_not_hold_the_start_up(tmp_path):
    """Children forked by the main thread while the helper is being started (data-loader
    workers that live on, an epoch or the whole run) keep none of its descriptors: the
    start ends and the queued request reaches the helper while they live (``Popen`` waited
    for the end of a child holding its exec-status pipe, and ``finish`` with it)."""
    src = tmp_path / "m.jsonl"
    src.write_text("".join(f'{{"_step": {i}, "loss": {i}.5}}\n' for i in range(100)))
    p = run_py(
        f"""
        import os, signal, sys, time
        from expr_tracker.query import warmer
        sys.setswitchinterval(1e-6)  # the GIL handed over as often as a busy loop would
        w = warmer.CacheWarmer({str(src)!r}, "metrics", step=1)
        warmer._helper().send(w)
        kids = []
        try:
            deadline = time.monotonic() + 3
            while w._queued and time.monotonic() < deadline and len(kids) < 200:
                pid = os.fork()
                if pid == 0:
                    os.close(1)
                    os.close(2)  # run_py waits for their end
                    signal.pause()
                    os._exit(0)
                kids.append(pid)
            deadline = time.monotonic() + 30
            while (w._queued or w._pending) and time.monotonic() < deadline:
                time.sleep(0.01)
            print(w._queued, w._pending, w.warms, w.gave_up, len(kids))
        finally:
            for pid in kids:
                os.kill(pid, signal.SIGKILL)
        """,
        timeout=90,
    )
    queued, pending, warms, gave_up, kids = p.stdout.split()
    assert int(kids) > 0
    assert (queued, pending, warms, gave_up) == ("False", "0", "1", "None"), p.stdout


def test_a_ctrl_c_while_a_fork_waits_for_the_helpers_start_reaches_the_program(tmp_path):
    """A Ctrl-C that comes while a fork waits for the helper's start (``os.fork`` swallows
    an exception raised in its hooks) is raised in the program once the fork returned."""
    p = run_py(
        """
        import os, signal, threading, time
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from expr_tracker.query import warmer
        held, release = threading.Event(), threading.Event()
        def start():  # a helper being started, as long as the test needs
            with warmer._NO_FORK:
                held.set()
                release.wait(60)
        threading.Thread(target=start, daemon=True).start()
        held.wait()
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                time.sleep(0.01)
            print("not interrupted")
        except KeyboardInterrupt:
            print("interrupted")
        release.set()
        pid = os.fork()  # the lock is free again
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        print("forked")
        """,
        timeout=90,
    )
    assert p.stdout.split() == ["interrupted", "forked"], p.stderr
