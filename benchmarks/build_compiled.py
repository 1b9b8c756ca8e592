#!/usr/bin/env python3
"""Build the compiled wheel (``ET_COMPILE=1``, docs/performance.md "A compiled build") and
install it into a folder of its own, to benchmark or test it beside the checkout.

    python benchmarks/build_compiled.py                  # into /tmp/et-compiled
    PYTHONPATH=/tmp/et-compiled/site python benchmarks/bench_log.py --sections log,nested
    python benchmarks/build_compiled.py --test           # build, then the not-slow suite on it
    python benchmarks/build_compiled.py --remove         # delete the folder

What it does: ``pip wheel`` of this checkout (its working tree, uncommitted edits included)
with ``ET_COMPILE=1`` into ``--into``/wheel, then ``pip install --no-deps --target`` of that
wheel into ``--into``/site. With ``PYTHONPATH`` set to the site folder, a script run by path
(``benchmarks/*.py``) imports the compiled package; ``python -c`` and ``python -m`` put the
current folder first, so run those with ``-P`` or from a folder that is not a checkout.

``--test`` runs ``python -P -m pytest -m "not slow"`` from the checkout with that
``PYTHONPATH``, after checking that the compiled modules are the ones imported. Test
subprocesses inherit it; a few run ``python -c`` in the checkout and so import its Python
source, which the pure-Python suite covers anyway.

Takes ~4-6 min on a 2-core machine (mypy's analysis of the package, then gcc); needs a C
compiler, Python's headers and the package index pip uses for the build environment.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(cmd: list[str], **kw: object) -> None:
    done = subprocess.run(cmd, **kw)  # type: ignore[call-overload]
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd[:4])} ... failed (exit {done.returncode})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--into", type=Path, default=Path(tempfile.gettempdir()) / "et-compiled")
    ap.add_argument("--test", action="store_true", help="run the not-slow suite on the build")
    ap.add_argument("--remove", action="store_true", help="delete --into and stop")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments for --test")
    args = ap.parse_args()
    into = args.into.resolve()
    if into == ROOT or ROOT.is_relative_to(into):
        sys.exit(f"--into {into}: the checkout itself, or a folder holding it")
    if args.remove:
        shutil.rmtree(into, ignore_errors=True)
        return
    wheel, site = into / "wheel", into / "site"
    shutil.rmtree(into, ignore_errors=True)
    wheel.mkdir(parents=True)
    t0 = time.perf_counter()
    env = {**os.environ, "ET_COMPILE": "1"}
    pip = [sys.executable, "-m", "pip"]
    run([*pip, "wheel", "--no-deps", "-q", "-w", str(wheel), str(ROOT)], env=env)
    built = sorted(wheel.glob("expr_tracker-*.whl"))
    if len(built) != 1 or built[0].name.endswith("-none-any.whl"):
        sys.exit(f"expected one platform wheel in {wheel}, found {[p.name for p in built]}")
    run([*pip, "install", "--no-deps", "-q", "--target", str(site), str(built[0])])
    print(f"built {built[0].name} in {time.perf_counter() - t0:.0f} s; installed into {site}")
    probe = (  # every module the manifest names imports from its extension
        "import importlib, expr_tracker.compiled as c\n"
        "names = sorted(c.read_build_manifest() or ())\n"
        "for name in names: importlib.import_module(name)\n"
        "mods = c.compiled_modules()\n"
        "print('compiled:', ', '.join(mods) or 'nothing')\n"
        "raise SystemExit(0 if names and mods == names and not c.stale else 1)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    run([sys.executable, "-P", "-c", probe], env=env, cwd=tempfile.gettempdir())
    print(f"use: PYTHONPATH={site} python benchmarks/bench_log.py ...")
    if args.test:
        cmd = [sys.executable, "-P", "-m", "pytest", "-p", "no:cacheprovider", "-m", "not slow"]
        sys.exit(subprocess.run([*cmd, *args.pytest_args], env=env, cwd=ROOT).returncode)


if __name__ == "__main__":
    main()
