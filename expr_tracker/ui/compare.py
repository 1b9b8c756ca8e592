"""The dashboard's comparison of runs: config and summary side by side, and their metrics.

The differences are ``et compare``'s (:func:`expr_tracker.query.compare.compare_runs`); the
files it reads of each run are first opened here as regular files inside the served folder
(a FIFO, a link out of it or a file this user may not read is refused before compare reads
it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from expr_tracker.history.paths import file_name
from expr_tracker.history.reader import meta_path_for
from expr_tracker.history.untrusted import open_regular
from expr_tracker.history.values import json_safe
from expr_tracker.query.catalog import Producer
from expr_tracker.ui.errors import BadRequest, Unreadable, why
from expr_tracker.ui.parts import metric_names

if TYPE_CHECKING:
    from expr_tracker.ui.catalog import Catalog

__all__ = ["compare"]


def _check_compare_files(run_id: str, prods: list[Producer], root: str) -> None:
    """:class:`Unreadable` unless every file :func:`~expr_tracker.query.compare.compare_runs`
    reads of the run is a regular file inside ``root`` (opened and closed here: a FIFO, a
    link out of the folder or a file this user may not read is refused before compare
    reads it)."""
    files: list[Path] = []
    for p in prods:
        files += [f for f in (p.config, p.summary, p.run_file, p.metrics) if f is not None]
        if p.metrics is not None:
            files.append(meta_path_for(p.metrics))
        files.append(p.run_dir / file_name("metric_defs", p.stream, p.rank))
    for f in files:
        try:
            os.close(open_regular(f, root=root))
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise Unreadable(f"{f.name} of {run_id!r}: {why(exc)}") from None


def compare(catalog: Catalog, run_ids: list[str]) -> dict:
    """Config and summary differences of the runs (:func:`expr_tracker.query.compare.compare_runs`,
    every key, ``equal`` telling which differ) plus the metrics each run has and their step
    metrics (``x_options``)."""
    from expr_tracker.query.compare import CompareError, compare_runs

    if len(run_ids) < 2:
        raise BadRequest(f"compare needs at least two runs, got {len(run_ids)}")
    if len(set(run_ids)) != len(run_ids):
        raise BadRequest("a run is given twice")
    prods = [catalog.get(r) for r in run_ids]
    for rid, ps in zip(run_ids, prods, strict=True):
        _check_compare_files(rid, ps, catalog.root_real)
    try:
        res = compare_runs([p[0].run_dir for p in prods], root=catalog.root, include_equal=True)
    except CompareError as exc:
        raise BadRequest(str(exc)) from None
    for r, rid in zip(res["runs"], run_ids, strict=True):
        r["run"] = rid
    metrics: set[str] = set()
    for ps in prods:
        metrics |= metric_names(catalog, ps)
    res["metrics"] = sorted(metrics)
    res["x_options"] = step_metrics(catalog, prods, metrics)
    return json_safe(res, "string")


def step_metrics(catalog: Catalog, prods: list[list[Producer]], metrics: set[str]) -> list[str]:
    """The step metrics (``define_metric(..., step_metric=)``) of the runs' metrics that
    the runs log: the compare page's x-axis choices besides step and time. A definitions
    file that cannot be read adds none."""
    from expr_tracker.history.metricdefs import MetricDefs, defs_path_for
    from expr_tracker.history.untrusted import read_json

    found: set[str] = set()
    for ps in prods:
        for p in ps:
            if p.metrics is None:
                continue
            defs = MetricDefs()
            try:
                defs.load(read_json(defs_path_for(p.metrics), root=catalog.root_real))
            except Exception:  # noqa: BLE001 - absent or unreadable: no step metrics
                continue
            found.update(sm for m in metrics if (sm := defs.step_metric_of(m)) and sm in metrics)
    return sorted(found)
