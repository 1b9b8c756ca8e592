"""The fresh-process driver shared by the per-call benchmarks (bench_log.py, bench_mirror.py).

Each section runs ``--repeat`` times, each time in a fresh interpreter (``script --child
SECTION --n N`` prints one JSON object), and the per-key median of those runs is reported:
one line per section (``line(section, medians)``), then the whole report as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any


def run(
    script: str,
    doc: str,
    sections: Sequence[str],
    child: Callable[[str, int], dict[str, Any]],
    line: Callable[[str, dict[str, Any]], str],
) -> None:
    """Parse the command line of ``script`` and run its sections (or, with ``--child``, the
    one section in this process)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sections", default=",".join(sections))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.n)))
        return
    report: dict[str, Any] = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    report["sections"] = {}
    report["load"] = _load()
    for sec in args.sections.split(","):
        runs = child_runs([script, "--child", sec, "--n", str(args.n)], args.repeat)
        merged = medians(runs)
        merged.update(spreads(runs))
        report["sections"][sec] = merged
        print(line(sec, merged), flush=True)
    report["load_after"] = _load()
    print(json.dumps(report))


def child_runs(argv: Sequence[str], repeat: int) -> list[dict[str, Any]]:
    """Run ``python argv...`` ``repeat`` times, each a fresh interpreter whose last stdout
    line is one JSON object; returns those objects."""
    runs = []
    for _ in range(repeat):
        # each child's temporary files (its runs) in a folder of its own, removed after it
        with tempfile.TemporaryDirectory(prefix="et-bench-") as tmp:
            out = subprocess.run(
                [sys.executable, *argv],
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "TMPDIR": tmp},
            )
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return runs


def medians(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The per-key median of ``runs``."""
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def spreads(runs: Sequence[dict[str, Any]]) -> dict[str, float]:
    """``<key>_spread``: max/min across the fresh processes of every ``*p50_us`` key (the
    run-to-run spread the budgets bound) and of ``x_floor`` (the same spread with the
    machine's own speed phases divided out: the floor is measured beside each chunk)."""
    out = {}
    for k in runs[0]:
        if k.endswith("p50_us") or k == "x_floor":
            lo = min(r[k] for r in runs)
            out[k + "_spread"] = max(r[k] for r in runs) / lo if lo > 0 else float("nan")
    return out


def child_medians(argv: Sequence[str], repeat: int) -> dict[str, Any]:
    """Run ``python argv...`` ``repeat`` times, each a fresh interpreter whose last stdout
    line is one JSON object, and return the per-key median of those objects."""
    return medians(child_runs(argv, repeat))


def _load() -> list[float] | None:
    """The 1-, 5- and 15-minute load averages (None where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
