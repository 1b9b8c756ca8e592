"""``et ranks``: span time per rank of a multi-rank run, the skew and the slowest rank
(docs/streams.md "Straggler ranks").

Reads the ``time_ms/<span path>`` columns of every rank's metrics file of one stream
(``metrics[.S].jsonl`` for rank 0, ``metrics[.S].rankN.jsonl`` for the others) in one pass
each (:func:`~expr_tracker.history.columns.read_columns`), lines them up by step and, per
span path, over the steps every rank recorded it:

- ``median_ms``: the median over steps of the per-step median across ranks;
- ``max_ms``: the median over steps of the per-step maximum across ranks;
- ``skew_median`` / ``skew_max``: the median and the maximum over steps of the per-step
  skew, max / median across ranks (:func:`~expr_tracker.history.peers.rank_skew`, the one
  definition ``skew(m)`` in rules uses; computed here vectorised, tested against it);
- ``slowest``: ``{rank: steps}``, how often each rank held the step's maximum (ties: the
  lowest rank).

Steps some rank did not record are counted (``incomplete``), never guessed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from expr_tracker.history.columns import read_columns
from expr_tracker.history.paths import file_name, rank_shards

__all__ = ["rank_files", "rank_report"]

PREFIX = "time_ms/"


def rank_files(run_dir: str | os.PathLike[str], stream: str | None = None) -> dict[int, Path]:
    """``{rank: metrics file}`` of ``stream`` in ``run_dir``, rank 0 first (when present).

    Raises:
        FileNotFoundError: ``run_dir`` is not a directory, or holds no metrics file of the
            stream.
    """
    p = Path(run_dir)
    if not p.is_dir():
        raise FileNotFoundError(f"{str(p)!r} is not a run directory")
    files: dict[int, Path] = {}
    main = p / file_name("metrics", stream, 0)
    if main.is_file():
        files[0] = main
    for r, name in rank_shards(p, stream).items():
        files[r] = p / name
    if not files:
        which = f"stream {stream!r}" if stream else "the main stream"
        raise FileNotFoundError(f"no metrics file of {which} in {str(p)!r}")
    return files


def rank_report(
    run_dir: str | os.PathLike[str],
    stream: str | None = None,
    *,
    step_range: tuple[int | None, int | None] | None = None,
) -> dict[str, Any]:
    """Per span path, the time across ranks (see the module docstring).

    ``step_range``: ``(a, b)``, steps a..b-1 (either side None: open).

    Returns ``{"run", "stream", "ranks": [0, 1, ...], "spans": [{"span", "ranks", "steps",
    "incomplete", "median_ms", "max_ms", "skew_median", "skew_max", "slowest": {rank:
    steps}}, ...]}``, spans sorted by their median time, largest first; a span with no
    complete step has None for the figures.

    Raises:
        FileNotFoundError: as :func:`rank_files`.
        OSError: a metrics file cannot be read.
    """
    import numpy as np

    files = rank_files(run_dir, stream)
    lo, hi = step_range if step_range else (None, None)
    ranks = sorted(files)
    per_rank = {}
    for r in ranks:
        cols = read_columns(files[r], lambda n: n.startswith(PREFIX), since=lo)
        per_rank[r] = {name: col.ordered() for name, col in cols.columns.items()}
    names = sorted({n for cols in per_rank.values() for n in cols})
    spans = []
    for name in names:
        have = [r for r in ranks if name in per_rank[r]]
        steps = None
        for r in have:
            s = np.frombuffer(per_rank[r][name].steps, dtype=np.int64)
            steps = s if steps is None else np.intersect1d(steps, s, assume_unique=True)
        assert steps is not None
        if hi is not None:
            steps = steps[steps < hi]
        every = len(have) == len(ranks)
        union = set()
        for r in have:
            s = np.frombuffer(per_rank[r][name].steps, dtype=np.int64)
            if hi is not None:
                s = s[s < hi]
            union.update(s.tolist())
        if not every or len(have) < 2:
            steps = steps[:0]
        incomplete = len(union) - len(steps)
        entry: dict[str, Any] = {
            "span": name[len(PREFIX) :],
            "ranks": len(have),
            "steps": int(len(steps)),
            "incomplete": int(incomplete),
            "median_ms": None,
            "max_ms": None,
            "skew_median": None,
            "skew_max": None,
            "slowest": {},
        }
        if len(steps):
            grid = np.empty((len(steps), len(have)))
            for j, r in enumerate(have):
                col = per_rank[r][name]
                s = np.frombuffer(col.steps, dtype=np.int64)
                v = np.frombuffer(col.values, dtype=np.float64)
                grid[:, j] = v[np.searchsorted(s, steps)]
            entry.update(_figures(grid, have))
        spans.append(entry)
    spans.sort(key=lambda e: -(e["median_ms"] if e["median_ms"] is not None else -1.0))
    return {"run": str(run_dir), "stream": stream, "ranks": ranks, "spans": spans}


def _figures(grid: Any, ranks: list[int]) -> dict[str, Any]:
    """The figures of one span from its ``steps x ranks`` grid of milliseconds."""
    import numpy as np

    ok = ~np.isnan(grid).any(axis=1)
    grid = grid[ok]
    if not len(grid):
        return {}
    med = np.median(grid, axis=1)
    top = grid.max(axis=1)
    slow = grid.argmax(axis=1)  # the first maximum: the lowest rank on a tie
    good = (med > 0) & np.isfinite(med)
    skew = top[good] / med[good]
    counts = np.bincount(slow[good], minlength=len(ranks))
    return {
        "median_ms": float(np.median(med)),
        "max_ms": float(np.median(top)),
        "skew_median": float(np.median(skew)) if len(skew) else None,
        "skew_max": float(skew.max()) if len(skew) else None,
        "slowest": {ranks[i]: int(c) for i, c in enumerate(counts) if c},
    }
