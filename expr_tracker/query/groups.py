"""Runs read for grouping: their flattened configs, run folders expanded into their runs, and
a group's band thinned for a chart.

The statistics themselves are pure functions in ``query/stats.py``; this module reads the
files they need (``config[.S].json``, as untrusted input) and prepares what ``et plot
--group-by`` and the dashboard draw. docs/compare.md "Groups of runs" describes both.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["band_points", "expand_run_args", "read_config"]


def read_config(run_dir: str | os.PathLike[str], stream: str | None = None) -> dict[str, Any]:
    """The run's config flattened to dotted keys (``{"model.depth": 4}``), from
    ``config[.S].json`` in ``run_dir``; ``{}`` when there is none or it cannot be read (an
    unreadable or damaged file groups the run with the runs without a config)."""
    from expr_tracker.history import untrusted
    from expr_tracker.history.paths import file_name
    from expr_tracker.history.values import flatten

    path = Path(run_dir) / file_name("config", stream, None)
    try:
        value = untrusted.read_json(path, root=path.parent)
    except (OSError, ValueError):
        return {}
    if not isinstance(value, dict):
        return {}
    return {".".join(k): v for k, v in flatten(value).items()}


def expand_run_args(args: Sequence[str]) -> list[str]:
    """RUN arguments with each folder that holds runs but is none (a Hydra multirun
    directory, a project folder) replaced by the runs in it, in name order; other
    arguments as given."""
    from expr_tracker.history.rundirs import find_runs

    out: list[str] = []
    for a in args:
        p = Path(a)
        if p.is_dir() and not find_runs(p, max_depth=0):
            inside = sorted(find_runs(p), key=lambda d: d.as_posix())
            if inside:
                out.extend(str(d) for d in inside)
                continue
        out.append(a)
    return out


def band_points(band: Any, buckets: int) -> dict[str, list[Any]]:
    """A :class:`~expr_tracker.query.stats.Band` cut to ``buckets`` chart columns, as JSON
    lists (``x``, ``center``, ``lo``, ``hi``, ``n``; None where a value is NaN): per column
    the points M4 keeps of the centre line, of the band's lower edge (its lowest) and of
    its upper edge (its highest), so no extreme of the line or the band is lost."""
    import numpy as np

    from expr_tracker.history.downsample import m4

    x = band.x
    keep: set[int] = set()
    for ys in (band.center, band.lo, band.hi):
        fin = np.flatnonzero(np.isfinite(ys))
        if len(fin):
            keep.update(int(fin[i]) for i in m4(x[fin], ys[fin], max(1, buckets), x[0], x[-1]))
    idx = np.array(sorted(keep), dtype=np.int64)

    def js(a: Any) -> list[Any]:
        return [None if not np.isfinite(v) else float(v) for v in a[idx]]

    return {
        "x": [float(v) for v in x[idx]],
        "center": js(band.center),
        "lo": js(band.lo),
        "hi": js(band.hi),
        "n": [int(v) for v in band.n[idx]],
    }
