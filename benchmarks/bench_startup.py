#!/usr/bin/env python3
"""Cold start (issue 27; budgets: ``import expr_tracker`` ≤ 80 ms, the first ``et.init``
after it ≤ 30 ms, ``et runs`` / ``et history -n 5`` as whole processes ≤ 0.25 s).

    python benchmarks/bench_startup.py                       # this checkout, median of 7
    python benchmarks/bench_startup.py --repeat 7 --against /path/to/other/checkout
    python benchmarks/bench_startup.py --no-bytecode   # every module compiled on each start

Each sample is a fresh interpreter. Measured (medians of ``--repeat``):

- ``import_ms``: ``import expr_tracker`` timed inside the child (interpreter start excluded);
- ``init_ms``: the first ``et.init(dir=TMP, project="p")`` right after that import;
- ``init_no_backends_ms``: the same with ``backends=[]`` (what the shared harness,
  ``bench_core.py``, passes), in a fresh interpreter of its own;
- ``init_rules_ms``: the same with ``backends=[]`` and the harness's two rules
  (``zscore(loss[50]) > 3``, ``isnan(loss)``): the rule engine and its console delivery
  built, in a fresh interpreter of its own;
- ``start_ms``: both (what a training script waits for before its first step);
- ``import_cpu_ms``, ``init_cpu_ms``: the same two as CPU time of the main thread, which a
  loaded machine disturbs far less than the wall clock (the sampler's thread not counted);
- ``finish_ms``: the ``et.finish()`` that follows;
- ``runs_s``, ``history_s``: ``python -m expr_tracker.cli.main runs DIR`` and
  ``... history RUN -n 5`` over a folder of 20 small runs, whole process, wall clock.

``--against DIR`` measures another checkout (e.g. ``git archive main | tar -x -C DIR``)
with the samples interleaved one by one, so both sides see the same load on a shared
machine; the report gives both medians side by side.

``--no-bytecode`` measures what a ``PYTHONDONTWRITEBYTECODE=1`` shell sees where no
bytecode was ever written: the children get that variable and an empty
``PYTHONPYCACHEPREFIX``, so every module (ours, the standard library's, the packages')
is compiled from source on each start.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: the keywords of the first ``et.init`` per reported figure (besides ``dir`` and ``project``)
INIT_SHAPES = {
    "init_ms": {},
    "init_no_backends_ms": {"backends": []},
    "init_rules_ms": {
        "backends": [],
        "alert_rules": ["zscore(loss[50]) > 3 => error: spike", "isnan(loss) => critical: nan"],
    },
}

CHILD = """
import sys, time, tempfile, json
c0, t0 = time.thread_time(), time.perf_counter()
import expr_tracker as et
c1, t1 = time.thread_time(), time.perf_counter()
d = tempfile.mkdtemp()
et.init(dir=d, project="p", **json.loads(sys.argv[1]))
c2, t2 = time.thread_time(), time.perf_counter()
et.finish()
t3 = time.perf_counter()
import json, shutil
shutil.rmtree(d, ignore_errors=True)
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "init_ms": (t2 - t1) * 1e3,
                  "start_ms": (t2 - t0) * 1e3, "import_cpu_ms": (c1 - c0) * 1e3,
                  "init_cpu_ms": (c2 - c1) * 1e3,
                  "finish_ms": (t3 - t2) * 1e3, "modules": len(sys.modules),
                  "file": et.__file__}))
"""


def make_data(root: Path, checkout: Path) -> Path:
    """20 runs of 50 steps x 3 metrics under ``root`` (written once with ``checkout``)."""
    code = (
        "import sys, expr_tracker as et\n"
        "for i in range(20):\n"
        "    et.init(dir=sys.argv[1], project='bench', name=f'r{i}', config={'lr': i})\n"
        "    for s in range(50):\n"
        "        et.log({'loss': 1 / (s + 1), 'acc': s / 50, 'lr': 0.1})\n"
        "    et.finish()\n"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(root)], env=child_env(checkout), cwd=root, check=True
    )
    return root


#: set by ``--no-bytecode``: an empty folder for PYTHONPYCACHEPREFIX
NO_BYTECODE: str | None = None


def child_env(checkout: Path) -> dict[str, str]:
    """The environment of a sample: ``checkout`` first on the path, bytecode written and
    read as in an installed package (a ``PYTHONDONTWRITEBYTECODE=1`` shell would time the
    compiler: about 3x the import); with ``--no-bytecode``, none read or written."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("PYTHONPYCACHEPREFIX", None)
    if NO_BYTECODE is not None:
        env.update(PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX=NO_BYTECODE)
    return env


def sample(checkout: Path, data: Path, run: str) -> dict[str, Any]:
    env = child_env(checkout)
    # cwd: the data folder, so that neither ``-c`` nor ``-m`` puts this checkout first on
    # the path (both prepend the working directory, ahead of PYTHONPATH)
    res: dict[str, Any] = {}
    for key, kwargs in INIT_SHAPES.items():
        out = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps(kwargs)],
            env=env,
            cwd=data,
            capture_output=True,
            text=True,
        )
        if out.returncode:
            raise SystemExit(f"{checkout}: the import/init child failed:\n{out.stderr}")
        one = json.loads(out.stdout.strip().splitlines()[-1])
        if not one["file"].startswith(str(checkout)):
            raise SystemExit(f"{checkout}: imported {one['file']} instead")
        if not res:
            res = one
        else:
            res[key] = one["init_ms"]
    for key, argv in (("runs_s", ["runs", str(data)]), ("history_s", ["history", run, "-n", "5"])):
        t0 = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "expr_tracker.cli.main", *argv],
            env=env,
            cwd=data,
            capture_output=True,
            text=True,
        )
        res[key] = time.perf_counter() - t0
        if done.returncode:
            raise SystemExit(f"{checkout}: et {' '.join(argv)} failed:\n{done.stderr}")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--against", type=Path, help="another checkout, sampled interleaved")
    ap.add_argument("--no-bytecode", action="store_true", help="compile every module on each start")
    args = ap.parse_args()
    global NO_BYTECODE
    sides = {"this": ROOT}
    if args.against:
        sides["against"] = args.against.resolve()
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as empty:
        data = make_data(Path(tmp), ROOT)  # with bytecode: the data is not what is timed
        NO_BYTECODE = empty if args.no_bytecode else None
        run = str(next(Path(tmp).rglob("run.json")).parent)
        for checkout in sides.values():  # warm-up: bytecode caches written, not counted
            sample(checkout, data, run)
        samples: dict[str, list[dict[str, float]]] = {k: [] for k in sides}
        for _ in range(args.repeat):
            for name, checkout in sides.items():
                samples[name].append(sample(checkout, data, run))
    report = {
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "repeat": args.repeat,
        "bytecode": not args.no_bytecode,
    }
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    report["load1"] = load
    for name, runs in samples.items():
        med = {k: round(statistics.median(r[k] for r in runs), 4) for k in runs[0] if k != "file"}
        report[name] = med
        print(
            f"{name:8s} import {med['import_ms']:6.1f} ms  init {med['init_ms']:6.1f} ms  "
            f"(both {med['start_ms']:6.1f} ms; CPU {med['import_cpu_ms']:5.1f} + "
            f"{med['init_cpu_ms']:5.1f} ms)  init backends=[] {med['init_no_backends_ms']:6.1f} ms  "
            f"with 2 rules {med['init_rules_ms']:6.1f} ms  finish {med['finish_ms']:5.1f} ms  modules {med['modules']:.0f}  "
            f"runs {med['runs_s']:.3f} s  history -n 5 {med['history_s']:.3f} s",
            flush=True,
        )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
