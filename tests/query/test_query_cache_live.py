"""The query cache against real writers and readers: a run still writing in another process,
two refreshers at once, a resumed run with a torn tail, read-only run directories, the
hidden cache folder next to everything else that looks into run directories, and the
vectorised decoder against the line-by-line one."""

from __future__ import annotations

import json
import logging
import math
import os
import random
import subprocess
import sys
import time

import pytest
from jsonl_model import long_metric_keys

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
duckdb = pytest.importorskip("duckdb")

import expr_tracker as et  # noqa: E402
from expr_tracker.history.rundirs import find_runs  # noqa: E402
from expr_tracker.query import cache as qcache  # noqa: E402
from expr_tracker.query import scan  # noqa: E402
from expr_tracker.query.cache import refresh  # noqa: E402
from expr_tracker.query.catalog import discover  # noqa: E402


@pytest.fixture(autouse=True)
def _xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return e


def expected(path, skip_bad: bool = False) -> list[tuple]:
    """(line, metric, value bits or None, text, step) of every complete line, via json."""
    return long_metric_keys(path, skip_bad=skip_bad)


def cached(c) -> list[tuple]:
    if not c.parts:
        return []
    rows = duckdb.sql(
        "select line, metric, value, text, step from read_parquet($p)",
        params={"p": [str(p) for p in c.parts]},
    ).fetchall()
    return sorted((ln, m, None if v is None else float(v).hex(), t, s) for ln, m, v, t, s in rows)


# --------------------------------------------------------------------------- live writer


# at least argv[2] steps, then on until the test says it refreshed enough (the file argv[3]
# exists; bounded): a loaded machine cannot end the writer before the reader has looked twice
CHILD = """
import math, os, sys, time
import expr_tracker as et
et.init(project="p", name="live", dir=sys.argv[1])
i = 0
while i < int(sys.argv[2]) or (not os.path.exists(sys.argv[3]) and i < 100000):
    et.log({"loss": 1.0 / (i + 1), "acc": i, "odd": math.nan if i % 7 == 0 else i * 0.5,
            "tag": "s%d" % i, "q'\\";x": -math.inf})
    if i % 50 == 0:
        time.sleep(0.01)
    i += 1
et.finish()
"""


@pytest.mark.slow
def test_live_run_refreshed_while_writing(tmp_path):
    root = tmp_path / "runs"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root), "3000", str(tmp_path / "enough")],
        env=env(),
        stderr=subprocess.PIPE,
    )
    src = root / "p" / "live" / "metrics.jsonl"
    refreshes = 0
    try:
        while proc.poll() is None:
            if src.exists():
                c = refresh(src, "metrics")
                refreshes += 1
                data = src.read_bytes()
                # covered ends a complete line; the parts hold exactly lines [0, c.lines)
                assert c.covered == 0 or data[c.covered - 1 : c.covered] == b"\n"
                assert data[: c.covered].count(b"\n") == c.lines
                got = cached(c)
                assert len(got) == len(set(got))  # no duplicate row
                assert {r[0] for r in got} <= set(range(c.lines))
                if refreshes == 3:
                    (tmp_path / "enough").touch()
            time.sleep(0.02)
    finally:
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    c = refresh(src, "metrics")
    assert c.covered == src.stat().st_size
    assert cached(c) == expected(src)
    assert c.lines == src.read_bytes().count(b"\n") >= 3000  # + the final commit line, if any
    assert refreshes >= 3
    assert len(c.parts) <= qcache.MAX_PARTS


# --------------------------------------------------------------------------- two refreshers


REFRESHER = """
import sys
from expr_tracker.query.cache import refresh
for _ in range(int(sys.argv[2])):
    c = refresh(sys.argv[1], "metrics")
print(c.rows, c.covered)
"""


def test_two_processes_refreshing_at_once(tmp_path):
    src = tmp_path / "metrics.jsonl"
    with open(src, "wb") as f:
        for i in range(20000):
            f.write(json.dumps({"a": i * 0.5, "b": str(i), "_step": i}).encode() + b"\n")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", REFRESHER, str(src), "3"],
            env=env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    # a writer appending (with a torn tail at times) while they refresh
    with open(src, "ab") as f:
        for i in range(20000, 20200):
            line = json.dumps({"a": i * 0.5, "b": str(i), "_step": i}).encode() + b"\n"
            f.write(line[:5])
            f.flush()
            f.write(line[5:])
            f.flush()
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1].decode() for o in outs]
    c = refresh(src, "metrics")
    assert cached(c) == expected(src)
    man = json.loads((c.cache_dir / "manifest.json").read_text())
    assert [p["file"] for p in man["parts"]] == [p.name for p in c.parts]
    assert not list(c.cache_dir.glob(".tmp-*"))


# --------------------------------------------------------------------------- resume


def test_resumed_run_with_torn_tail(tmp_path):
    root = tmp_path / "runs"
    et.init(project="p", name="r", dir=str(root))
    for i in range(5):
        et.log({"loss": float(i)})
    et.finish()
    src = root / "p" / "r" / "metrics.jsonl"
    with open(src, "ab") as f:
        f.write(b'{"loss": 99.0, "_st')  # a crash mid-write
    c = refresh(src, "metrics")
    assert c.covered == src.stat().st_size - len(b'{"loss": 99.0, "_st')
    before = c.parts
    et.init(project="p", name="r", dir=str(root))  # resumes: repairs the torn tail
    for i in range(3):
        et.log({"loss": 10.0 + i})
    et.finish()
    c = refresh(src, "metrics")
    assert c.parts[: len(before)] == before  # only the appended lines were read
    assert cached(c) == expected(src)


# --------------------------------------------------------------------------- location


def test_unwritable_run_dir_falls_back_to_xdg_then_temp(tmp_path, monkeypatch, caplog):
    src = tmp_path / "run" / "metrics.jsonl"
    src.parent.mkdir()
    src.write_bytes(b'{"a":1.0,"_step":0}\n')
    # running as root makes chmod ineffective: block the run dir's cache folder with a file
    # instead (mkdir fails just as on a read-only directory)
    (src.parent / ".et-cache").write_bytes(b"")
    c = refresh(src, "metrics")
    assert c.cache_dir.parent == tmp_path / "xdg" / "expr_tracker" / "query"
    assert cached(c) == expected(src)
    # nothing writable at all: a temporary folder of this process, one warning
    (tmp_path / "xdg2").write_bytes(b"")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg2"))
    monkeypatch.setattr(qcache, "_warned_temp", False)
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        c1 = refresh(src, "metrics")
        c2 = refresh(src, "metrics")
    assert "temporary folder" in caplog.text and caplog.text.count("temporary folder") == 1
    assert c1.cache_dir == c2.cache_dir and cached(c2) == expected(src)


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() == 0,
    reason="as root, chmod does not make a directory read-only (covered above with a file)",
)
def test_read_only_run_dir(tmp_path):
    src = tmp_path / "run" / "metrics.jsonl"
    src.parent.mkdir()
    src.write_bytes(b'{"a":1.0,"_step":0}\n')
    os.chmod(src.parent, 0o555)
    try:
        c = refresh(src, "metrics")
    finally:
        os.chmod(src.parent, 0o755)
    assert c.cache_dir.parent == tmp_path / "xdg" / "expr_tracker" / "query"
    assert not (src.parent / ".et-cache").exists()
    assert cached(c) == expected(src)
    # a current cache in a run dir this process cannot write is used as it is
    own = refresh(src, "metrics")
    assert own.cache_dir == src.parent / ".et-cache" / "metrics.jsonl"
    os.chmod(own.cache_dir, 0o555)
    try:
        assert refresh(src, "metrics") == own
    finally:
        os.chmod(own.cache_dir, 0o755)


def test_current_cache_of_an_unwritable_run_dir_is_used_read_only(tmp_path, monkeypatch):
    src = tmp_path / "run" / "metrics.jsonl"
    src.parent.mkdir()
    src.write_bytes(b'{"a":1.0,"_step":0}\n')
    owner = refresh(src, "metrics")  # the run's owner built it
    # this process cannot write the run dir (simulated: chmod is no barrier to root)
    real = qcache._lock
    monkeypatch.setattr(qcache, "_lock", lambda f: None if ".et-cache" in f.path.parts else real(f))
    with open(src, "ab") as f:
        f.write(b'{"a":2.0,"_st')  # a torn tail does not make it stale
    c = refresh(src, "metrics")
    assert c == owner
    with open(src, "ab") as f:
        f.write(b'ep":1}\n')  # a new complete line: stale, so our own cache under XDG
    c = refresh(src, "metrics")
    assert c.cache_dir.parent == tmp_path / "xdg" / "expr_tracker" / "query"
    assert cached(c) == expected(src)
    assert [p.name for p in owner.cache_dir.glob("part-*")] == [owner.parts[0].name]


def test_hidden_cache_trips_nothing(tmp_path, capsys):
    root = tmp_path / "runs"
    et.init(project="p", name="r", dir=str(root))
    with et.span("fwd"):
        et.log({"loss": 1.0})
    et.finish()
    run_dir = root / "p" / "r"
    for p in discover(root):
        refresh(p.metrics, "metrics")
        refresh(p.spans, "spans")
    assert (run_dir / ".et-cache").is_dir()
    assert find_runs(root) == [run_dir]
    assert [(p.run_id, p.stream, p.rank) for p in discover(root)] == [("p/r", None, 0)]
    # et runs and et history still see one run
    from expr_tracker.cli.main import main

    assert main(["runs", str(root)]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("p/r ")]
    assert len(lines) == 1 and "finished" in lines[0]
    assert [r["loss"] for r in et.history(run=str(run_dir)) if "loss" in r] == [1.0]
    # resuming the run works and its cache follows
    et.init(project="p", name="r", dir=str(root))
    et.log({"loss": 2.0})
    et.finish()
    src = run_dir / "metrics.jsonl"
    assert cached(refresh(src, "metrics")) == expected(src)


# --------------------------------------------------------------------------- decoders


def _random_value(rnd):
    k = rnd.random()
    if k < 0.5:
        return rnd.uniform(-1e6, 1e6)
    if k < 0.6:
        return rnd.randint(-(10**6), 10**6)
    if k < 0.65:
        return rnd.choice([math.nan, math.inf, -math.inf])
    if k < 0.7:
        return rnd.choice([True, False])
    if k < 0.8:
        return rnd.choice(["x", "", "ünï", "q\"'", "null"])
    if k < 0.85:
        return rnd.choice([None, [1, 2], {"a": 1}])
    if k < 0.9:
        return rnd.choice([2**53 + 1, 2**63 + 5, -(2**70), 1e300, 9007199254740993.0])
    return rnd.random()


@pytest.mark.parametrize("seed", range(6))
def test_vectorised_and_line_by_line_decoders_agree(seed):
    rnd = random.Random(seed)
    names = ["loss", "acc", "q'\";x", "ünï/☃", "x" * 300, "lr", "", "a.b", "new\nline", "tab\t\\"]
    plain = seed % 2 == 0  # half the blocks take the vectorised path
    lines = []
    for i in range(300):
        row = {}
        for n in rnd.sample(names, rnd.randint(0, len(names))):
            row[n] = rnd.uniform(-1, 1) if plain else _random_value(rnd)
        row["_step"] = i
        if rnd.random() < 0.9:
            row["_time"] = 1.7e9 + i
        lines.append(json.dumps(row).encode())
    chunk = b"\n".join(lines) + b"\n"
    fast, fsteps = scan.decode_metrics_block(chunk, 10)
    slow, ssteps = scan.decode_metrics(lines, 10)
    if plain:
        assert scan._fast_metrics(chunk, 10) is not None

    def rows(t):
        return sorted(
            (
                r["line"],
                r["metric"],
                None if r["value"] is None else r["value"].hex(),
                r["text"],
                r["step"],
                r["time"],
            )
            for r in t.to_pylist()
        )

    assert fast.schema == slow.schema == scan.schema("metrics")
    assert rows(fast) == rows(slow)
    assert fsteps.to_pylist() == ssteps


@pytest.mark.parametrize("seed", range(4))
def test_dense_blocks_unpivoted_exactly(seed, monkeypatch):
    """Every line holding every metric as a number (what et.log writes) takes the numpy
    unpivot; its rows are the line-by-line decoder's, bit for bit."""
    calls = []
    real = scan._unpivot_dense
    monkeypatch.setattr(scan, "_unpivot_dense", lambda *a: calls.append(1) or real(*a))
    rnd = random.Random(seed)
    names = ["loss", "acc", "q'x", "ünï/☃", "lr"][: 1 + seed]
    lines = []
    for i in range(200):
        row = {}
        for n in names:
            k = rnd.random()
            row[n] = (
                rnd.randint(-(2**53), 2**53)
                if k < 0.2
                else rnd.choice([math.nan, math.inf, -math.inf, -0.0, 5e-324])
                if k < 0.3
                else rnd.uniform(-1e9, 1e9)
            )
        row["_step"] = i * 3 + 7  # (a negative one is no step: the line-by-line decoder's)
        if seed % 2 == 0 or i % 5:  # odd seeds: some lines without _time
            row["_time"] = 1.7e9 + i / 7
        lines.append(json.dumps(row, separators=(",", ":")).encode())
    chunk = b"\n".join(lines) + b"\n"
    fast = scan._fast_metrics(chunk, 10)
    assert fast is not None and calls
    table, steps = fast
    slow, ssteps = scan.decode_metrics(lines, 10)
    assert table.schema == slow.schema
    for col in ("step", "metric", "text", "line"):
        assert table.column(col).to_pylist() == slow.column(col).to_pylist()
    for col in ("value", "time"):
        a = [None if v is None else v.hex() for v in table.column(col).to_pylist()]
        b = [None if v is None else v.hex() for v in slow.column(col).to_pylist()]
        assert a == b
    assert steps.to_pylist() == ssteps


def test_small_blocks_and_long_lines(tmp_path, monkeypatch):
    monkeypatch.setattr(qcache, "BLOCK_BYTES", 64)
    src = tmp_path / "metrics.jsonl"
    with open(src, "wb") as f:
        for i in range(50):
            f.write(json.dumps({"a": float(i), "s": "y" * (i * 10), "_step": i}).encode())
            f.write(b"\n")
        f.write(b"\nnot json\n[1,2]\n")
    c = refresh(src, "metrics")
    assert c.lines == 53
    rows = cached(c)
    assert {r[0] for r in rows} == set(range(50))
    assert rows == [r for r in expected_valid(src)]


def expected_valid(path):
    """expected() skipping lines that are not JSON objects."""
    return expected(path, skip_bad=True)


def test_memory_is_bounded_by_the_block(tmp_path):
    """A refresh holds one block of lines at a time (a row group each)."""
    src = tmp_path / "metrics.jsonl"
    line = json.dumps({"a": 0.5, "b": 1.5, "_step": 0}).encode() + b"\n"
    src.write_bytes(line * 3000)
    old = qcache.BLOCK_BYTES
    qcache.BLOCK_BYTES = len(line) * 1000
    try:
        c = refresh(src, "metrics")
    finally:
        qcache.BLOCK_BYTES = old
    assert pq.ParquetFile(c.parts[0]).num_row_groups == 3
    assert c.rows == 6000 and c.merged is False  # the same _step in every line


def _random_span(rnd, i, plain):
    rec = {
        "_step": i // 2,
        "name": rnd.choice(["fwd", "fwd/inner", "q'\";x", "ünï"]),
        "depth": rnd.randint(0, 3),
        "start": 1.7e9 + i * 0.001,
        "dur_ms": rnd.random() * 10,
        "id": i + 1,
        "parent": None if i % 3 == 0 else i,
        "pid": 7,
        "tid": 8,
        "thread": "MainThread",
    }
    if rnd.random() < 0.2:
        rec["task"] = "Task-1"
    if rnd.random() < 0.1:
        rec["error"] = "ValueError"
    if rnd.random() < 0.2:
        del rec["_step"]
    if not plain:
        k = rnd.random()
        if k < 0.2:
            rec["args"] = {"n": rnd.randint(0, 9), "x": math.nan}
        elif k < 0.3:
            rec["metrics"] = {"m": 1.5}
        elif k < 0.4:
            rec["depth"] = rnd.choice([1.0, True, 2**40])
        elif k < 0.5:
            rec["error"] = {"type": "E"}
        elif k < 0.6:
            rec["id"] = 2**70
        elif k < 0.7:
            rec["start"] = rnd.choice([3, math.inf])
    return rec


@pytest.mark.parametrize("seed", range(4))
def test_vectorised_and_line_by_line_span_decoders_agree(seed):
    rnd = random.Random(seed)
    plain = seed % 2 == 0
    lines = [json.dumps(_random_span(rnd, i, plain)).encode() for i in range(300)]
    chunk = b"\n".join(lines) + b"\n"
    if plain:
        assert scan._fast_spans(chunk, 5) is not None
    fast = scan.decode_spans_block(chunk, 5)
    slow = scan.decode_spans(lines, 5)
    assert fast.schema == slow.schema == scan.schema("spans")

    def norm(t):
        return [
            {k: (v.hex() if isinstance(v, float) else v) for k, v in r.items()}
            for r in t.to_pylist()
        ]

    assert norm(fast) == norm(slow)


def test_an_unwritable_cache_dir_is_named_in_the_warning(tmp_path, monkeypatch, caplog):
    src = tmp_path / "run" / "metrics.jsonl"
    src.parent.mkdir()
    src.write_bytes(b'{"a":1.0,"_step":0}\n')
    blocked = tmp_path / "not-a-folder"
    blocked.write_bytes(b"")
    monkeypatch.setattr(qcache, "_warned_temp", False)
    with caplog.at_level(logging.WARNING, logger="expr_tracker"):
        c = refresh(src, "metrics", cache_dir=blocked)
    assert cached(c) == expected(src)
    assert f"under cache_dir {str(blocked)!r}" in caplog.text
    assert "beside the runs" not in caplog.text


def test_an_int_just_past_2_53_keeps_its_digits_in_a_block_with_nan():
    """2**53 + 1 in a column pyarrow reads as doubles (a NaN beside it) rounds to 2**53:
    the block must go line by line, which keeps the exact digits in ``text``."""
    chunk = b'{"a":NaN,"_step":0}\n{"a":9007199254740993,"_step":1}\n'
    table, _steps = scan.decode_metrics_block(chunk, 0)
    assert table.column("text").to_pylist() == [None, "9007199254740993"]


def test_a_key_of_invalid_utf8_is_an_unreadable_line_not_an_exception():
    chunk = b'{"a\xff":1,"_step":0}\n{"b":2,"_step":1}\n'
    bad = scan.BadLines()
    table, _steps = scan.decode_metrics_block(chunk, 0, bad)
    assert table.column("metric").to_pylist() == ["b"]
    assert bad.count == 1 and bad.first is not None and bad.first[0] == 0


@pytest.mark.parametrize(
    "lines",
    [
        # dense: every line every metric as a number (polars or the numpy unpivot)
        [
            json.dumps({"loss": 1.0 / (i + 1), "acc": i, "_step": i, "_time": 1.7e9 + i})
            for i in range(50)
        ],
        # sparse and mixed: pyarrow.json's table per metric
        [
            json.dumps({"loss": 0.5, "_step": i} if i % 2 else {"acc": "x", "_step": i})
            for i in range(50)
        ],
        # not plain (nested values): line by line
        [json.dumps({"loss": [1, 2], "acc": 0.5, "_step": i}) for i in range(50)],
    ],
    ids=["dense", "sparse", "nested"],
)
def test_part_decoding_is_the_block_decoding(tmp_path, lines):
    """A part is written from ``decode_metrics_part`` (``metric`` dictionary-encoded, the
    newlines counted in the same pass): its rows, read back, are those of
    ``decode_metrics_block`` with plain strings, and ``lines`` every newline."""
    chunk = ("\n".join(lines) + "\n").encode()
    table, steps = scan.decode_metrics_block(chunk, 3)
    part, psteps, count = scan.decode_metrics_part(chunk, 3)
    assert count == chunk.count(b"\n") == len(lines)
    assert table.schema == scan.schema("metrics")
    assert part.schema == scan.part_schema("metrics")
    assert pa.types.is_dictionary(part.schema.field("metric").type)
    assert part.cast(scan.schema("metrics")).equals(table)
    assert psteps.equals(steps)
    src = tmp_path / "run" / "metrics.jsonl"
    src.parent.mkdir()
    src.write_bytes(chunk)
    cached = refresh(src, "metrics")
    back = pa.concat_tables(pq.read_table(p) for p in cached.parts)
    assert back.schema == scan.schema("metrics")  # read back as strings, as before
    assert back.equals(scan.decode_metrics_block(chunk, 0)[0])
    assert cached.lines == len(lines)
