#!/usr/bin/env python3
"""Memory per cached row of the live ``et.history()`` cache (not a test: nothing asserts).

    python benchmarks/bench_history_memory.py --n 200000          # both rows, 3 repeats
    python benchmarks/bench_history_memory.py --n 50000 --repeat 1 --sections floats3

(--n 200000 --repeat 3 takes about 4 minutes per section on a loaded 2-core machine:
tracemalloc slows every allocation.)

Each section runs in a fresh interpreter (benchmarks/harness.py) and reports medians over
the repeats. Sections (the row logged):

- ``floats3``: ``{"loss", "lr", "acc"}``, 3 floats (79 encoded bytes with ``_step`` and
  ``_time``);
- ``mixed``: a float, an int, a bool, a string, None and a 3-int list (109 encoded bytes).

Figures, each in bytes per row over ``--n`` rows after a 1,000-row warm-up:

- ``cache_traced``: what ``tracemalloc`` sees allocated by the cache alone (a
  ``HistoryStore`` without a writer), plus the bytes of any anonymous mappings the cache
  holds (tracemalloc cannot see those: they are counted from the cache's segments);
- ``log_traced`` / ``log_rss`` / ``log_peak_rss``: the same through ``et.init`` + ``et.log``
  with the writer (its queue, the flusher thread); RSS and peak RSS (``ru_maxrss``) growth,
  measured first in the process so that nothing before the loop set the peak (the cache
  alone has no RSS figure: after the ``et.log`` runs it reuses memory they freed);
- ``encoded``: the encoded line's bytes.
"""

from __future__ import annotations

import gc
import mmap
import os
import resource
import tempfile
import tracemalloc
from typing import Any

import harness  # benchmarks/harness.py: the fresh-process driver

SECTIONS = ("floats3", "mixed")
WARMUP = 1000


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def row(section: str, i: int) -> dict[str, Any]:
    if section == "floats3":
        return {"loss": 1.0 + (i % 97) * 1e-3, "lr": 1e-3, "acc": 0.5 + (i % 89) * 1e-3}
    return {
        "loss": 1.0 + (i % 97) * 1e-3,
        "epoch": i // 1000,
        "ok": bool(i & 1),
        "phase": "train" if i % 10 else "eval",
        "note": None,
        "shape": [i % 7, 3, 224],
    }


def mapped_bytes(cache: Any) -> int:
    """Bytes of the anonymous mappings the cache's segments hold (0 when it has none)."""
    segs = getattr(cache, "_segments", ())
    return sum(len(s.data) for s in segs if isinstance(s.data, mmap.mmap))


def live_caches() -> list[Any]:
    """The row caches alive in this process (the run's, found without private API)."""
    return [o for o in gc.get_objects() if type(o).__name__ == "RowCache"]


def child(section: str, n: int) -> dict[str, Any]:
    import expr_tracker as et
    from expr_tracker.history import HistoryStore

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        # first, so that the peak RSS is this loop's (nothing before it grew the process)
        et.init(project="bench", name=section, dir=d, spans=False)
        log = et.log
        for i in range(WARMUP):
            log(row(section, i))
        gc.collect()
        p0, r0 = peak_rss_bytes(), rss_bytes()
        for i in range(n):
            log(row(section, WARMUP + i))
        gc.collect()
        out["log_rss"] = (rss_bytes() - r0) / n
        out["log_peak_rss"] = (peak_rss_bytes() - p0) / n
        et.finish()
        # tracemalloc slows log() several-fold: measured in a run of its own
        et.init(project="bench", name=section + "_traced", dir=d, spans=False)
        for i in range(WARMUP):
            log(row(section, i))
        gc.collect()
        caches = live_caches()
        tracemalloc.start()
        t0, m0 = tracemalloc.get_traced_memory()[0], sum(map(mapped_bytes, caches))
        for i in range(n):
            log(row(section, WARMUP + i))
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] - t0
        out["log_traced"] = (traced + sum(map(mapped_bytes, caches)) - m0) / n
        tracemalloc.stop()
        del caches
        et.finish()
    gc.collect()

    s = HistoryStore(None, max_open_seconds=None)
    for i in range(WARMUP):
        s.ingest(row(section, i))
    gc.collect()
    tracemalloc.start()
    t0, m0 = tracemalloc.get_traced_memory()[0], mapped_bytes(s.cache)
    for i in range(n):
        s.ingest(row(section, WARMUP + i))
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - t0
    tracemalloc.stop()
    out["encoded"] = s.cache.nbytes / s.cache.nrows
    out["cache_traced"] = (traced + mapped_bytes(s.cache) - m0) / n
    return out


def line(section: str, r: dict[str, Any]) -> str:
    return (
        f"{section:<8} encoded {r['encoded']:.0f} B; cache {r['cache_traced']:.0f} B traced; "
        f"through et.log {r['log_traced']:.0f} B traced, "
        f"{r['log_rss']:.0f} B RSS, {r['log_peak_rss']:.0f} B peak RSS (per row)"
    )


if __name__ == "__main__":
    harness.run(__file__, __doc__ or "", SECTIONS, child, line)
