"""History query benchmarks (not a test: nothing here asserts a time).

Sections, each in a fresh child interpreter so RSS figures start clean:

- ``history_1k`` / ``history_100k``: ``et.history(50)`` with 1k / 100k steps logged
  (3 floats per row), cached; p50/p99 µs of repeated queries ("repeat"), and of queries
  with one new row logged between them ("live", the training-loop pattern; the ``log``
  call is outside the timed region), plus the disk reads counted (must be 0);
- ``range_1m``: ``read_history(run, step_range=(a, a+100))`` deep in a 1,000,000-row file
  (written directly, with a sidecar like the writer's): time and bytes read vs file size;
  and the same read on a live store whose cache holds only the newest 100k rows;
- ``rss``: bytes of RSS per cached row for 1M rows of 3 floats (``HistoryStore`` without a
  writer so only the cache is measured; and through ``et.log`` with the writer).

Usage::

    python benchmarks/bench_history.py                 # every section
    python benchmarks/bench_history.py history_100k rss

The last stdout line is one JSON object with every figure.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time

SECTIONS = ("history_1k", "history_100k", "range_1m", "rss")
QUERIES = 2000


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def pct(samples: list[int], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * q / 100))] / 1e3


def row(i: int) -> dict[str, float]:
    return {"loss": 1.0 + (i % 97) * 1e-3, "lr": 1e-3, "acc": 0.5 + (i % 89) * 1e-3}


def sec_history(n_rows: int) -> dict:
    import expr_tracker as et

    with tempfile.TemporaryDirectory() as d:
        et.init(project="bench", name="h", dir=d, spans=False)
        log = et.log
        for i in range(n_rows):
            log(row(i))
        history = et.history
        for _ in range(100):
            history(50)
        pc = time.perf_counter_ns
        gc.collect()
        rep = []
        for _ in range(QUERIES):
            t = pc()
            history(50)
            rep.append(pc() - t)
        live = []
        for i in range(QUERIES):
            log(row(i))
            t = pc()
            history(50)
            live.append(pc() - t)
        h = et.info()["history"]
        et.finish()
    return {
        "rows": n_rows,
        "repeat_p50_us": pct(rep, 50),
        "repeat_p99_us": pct(rep, 99),
        "live_p50_us": pct(live, 50),
        "live_p99_us": pct(live, 99),
        "disk_queries": h["disk_queries"],
        "disk_bytes_read": h["disk_bytes_read"],
    }


def sec_range_1m() -> dict:
    from expr_tracker.history import HistoryStore, read_history
    from expr_tracker.history.reader import JsonlReader, meta_path_for
    from expr_tracker.history.writer import JsonlWriter

    n = 1_000_000
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "metrics.jsonl")
        index, off, buf = [], 0, []
        with open(path, "wb") as f:
            for i in range(n):
                line = b'{"loss":%d.25,"lr":0.001,"acc":0.5,"_step":%d,"_time":1700000000.5}\n' % (
                    i % 997,
                    i,
                )
                if i % 1000 == 0:
                    index.append([i, i, off])
                off += len(line)
                buf.append(line)
                if len(buf) >= 100_000:
                    f.write(b"".join(buf))
                    buf = []
            f.write(b"".join(buf))
        meta = {"schema": 2, "size": off, "lines": n, "last_step": n - 1, "max_step": n - 1}
        meta.update(sorted=True, has_duplicate_steps=False, index_every=1000, index=index)
        with open(meta_path_for(path), "w") as f:
            json.dump(meta, f)

        times = []
        for k in range(20):
            a = 123_457 + k * 40_000
            t = time.perf_counter_ns()
            got = read_history(path, step_range=(a, a + 100))
            times.append(time.perf_counter_ns() - t)
            assert len(got) == 100 and got[0]["_step"] == a
        r = JsonlReader(path)
        r.read_range(500_000, 500_100)
        offline_bytes = r.bytes_read
        t = time.perf_counter_ns()
        nosc = JsonlReader(path, meta={})
        nosc.read_range(500_000, 500_100)
        full_scan_ms = (time.perf_counter_ns() - t) / 1e6

        # a live store resumed on that file: the cache holds what is logged now (100k rows)
        w = JsonlWriter(path, meta_path=meta_path_for(path), lock=False)
        s = HistoryStore(w, cache_rows=100_000, start_step=n, max_open_seconds=None)
        for i in range(100_000):
            s.ingest(row(i))
        live = []
        for k in range(20):
            a = 200_000 + k * 30_000
            t = time.perf_counter_ns()
            got = s.step_range(a, a + 100)
            live.append(time.perf_counter_ns() - t)
            assert len(got) == 100
        cached = []
        for k in range(20):
            a = n + 1000 + k * 4000
            t = time.perf_counter_ns()
            s.step_range(a, a + 100)
            cached.append(time.perf_counter_ns() - t)
        st = s.stats()
        s.close()
    return {
        "file_rows": n,
        "file_bytes": off,
        "offline_range100_p50_ms": pct(times, 50) / 1e3,
        "offline_bytes_read": offline_bytes,
        "offline_full_scan_no_sidecar_ms": full_scan_ms,
        "live_disk_range100_p50_ms": pct(live, 50) / 1e3,
        "live_cached_range100_p50_ms": pct(cached, 50) / 1e3,
        "live_disk_bytes_read_per_query": st["disk_bytes_read"] // max(1, st["disk_queries"]),
    }


def sec_rss() -> dict:
    from expr_tracker.history import HistoryStore

    n = 1_000_000
    s = HistoryStore(None, max_open_seconds=None)
    for i in range(1000):
        s.ingest(row(i))
    gc.collect()
    base = rss_bytes()
    for i in range(n):
        s.ingest(row(i))
    gc.collect()
    grown = rss_bytes() - base
    out = {
        "rows": n,
        "cache_only_rss_per_row": grown / n,
        "encoded_bytes_per_row": s.cache.nbytes / s.cache.nrows,
    }
    del s
    import expr_tracker as et

    with tempfile.TemporaryDirectory() as d:
        et.init(project="bench", name="rss", dir=d, spans=False)
        for i in range(1000):
            et.log(row(i))
        gc.collect()
        base = rss_bytes()
        for i in range(n):
            et.log(row(i))
        gc.collect()
        out["et_log_rss_per_row"] = (rss_bytes() - base) / n
        et.finish()
    return out


def child(name: str) -> dict:
    if name == "history_1k":
        return sec_history(1_000)
    if name == "history_100k":
        return sec_history(100_000)
    if name == "range_1m":
        return sec_range_1m()
    return sec_rss()


def main(argv: list[str]) -> None:
    if argv[:1] == ["--child"]:
        print(json.dumps(child(argv[1])))
        return
    names = argv or list(SECTIONS)
    results = {"load_avg": os.getloadavg(), "python": sys.version.split()[0]}
    for name in names:
        proc = subprocess.run(
            [sys.executable, __file__, "--child", name], capture_output=True, text=True
        )
        if proc.returncode != 0:
            results[name] = {"error": proc.stderr.strip().splitlines()[-1:]}
        else:
            results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{name}: {json.dumps(results[name])}", file=sys.stderr)
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1:])
