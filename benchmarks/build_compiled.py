#!/usr/bin/env python3
"""A copy of the library with its hot modules compiled by mypyc, to measure what compiling
them would buy (issue 27). Not how the library is installed: an experiment's bench.

    python benchmarks/build_compiled.py                  # into /tmp/et-compiled
    python benchmarks/build_compiled.py --into DIR --modules expr_tracker/api.py,...
    PYTHONPATH=/tmp/et-compiled python benchmarks/bench_log.py --sections log,nested
    python benchmarks/build_compiled.py --remove         # the worktree and its build

What it does: a detached git worktree of ``HEAD`` at ``--into`` (made anew each time), then
``mypyc`` over ``--modules`` in it (``setup.py build_ext --inplace`` with a throw-away setup
script outside the tree), so each compiled module's extension lies beside its source there.
With ``PYTHONPATH`` set to that folder, a script run by path (``benchmarks/*.py``, whose own
folder comes first on ``sys.path``) imports the compiled modules; ``python -c`` and the
shared harness's identity probe put the current folder first, so run those from a folder
that is not a checkout. The modules not listed stay Python.

Takes ~3.5 min of mypy's analysis and ~1-2 min of gcc on a 2-core machine; needs a C
compiler and Python's headers. The default modules are the ones that compile and run the
benchmarks today: ``history/writer.py`` (methods reassigned on its instances),
``spans/core.py`` (mypyc stops on ``__enter__ = _start``) and ``spans/recorder.py`` (weak
references) do not yet; what else differs once compiled is listed in the README ("Issue
27, what is left made of").
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_MODULES = (
    "expr_tracker/history/store.py",
    "expr_tracker/history/cache.py",
    "expr_tracker/history/spanfold.py",
    "expr_tracker/api.py",
)

SETUP = """\
import sys
from setuptools import setup
from mypyc.build import mypycify

setup(name="et-compiled", packages=[], py_modules=[], ext_modules=mypycify(sys.argv.pop()
    .split(","), opt_level="3"))
"""


def git(repo: Path, *args: str) -> None:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"git {' '.join(args)}: {done.stderr.strip() or done.returncode}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--into", type=Path, default=Path(tempfile.gettempdir()) / "et-compiled")
    ap.add_argument("--modules", default=",".join(DEFAULT_MODULES))
    ap.add_argument("--remove", action="store_true", help="remove the worktree and stop")
    args = ap.parse_args()
    repo = Path(__file__).resolve().parent.parent
    into = args.into.resolve()
    if into.exists():  # git removes only a worktree of this repository, never another folder
        git(repo, "worktree", "remove", "--force", str(into))
    git(repo, "worktree", "prune")
    if args.remove:
        return
    git(repo, "worktree", "add", "--detach", "--quiet", str(into), "HEAD")
    modules = [m.strip() for m in args.modules.split(",") if m.strip()]
    missing = [m for m in modules if not (into / m).is_file()]
    if missing:
        sys.exit(f"--modules: no such file in the checkout: {', '.join(missing)}")
    with tempfile.TemporaryDirectory() as tmp:
        setup = Path(tmp) / "setup.py"
        setup.write_text(SETUP)
        t0 = time.perf_counter()
        cmd = [sys.executable, str(setup), "build_ext", "--inplace", ",".join(modules)]
        done = subprocess.run(cmd, cwd=into, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        sys.exit(f"mypyc failed (exit {done.returncode}); the worktree is left at {into}")
    built = sorted(str(p.relative_to(into)) for p in into.glob("expr_tracker/**/*.so"))
    print(f"compiled {len(built)} modules in {time.perf_counter() - t0:.0f} s into {into}:")
    for name in built:
        print(f"  {name}")
    print(f"use: PYTHONPATH={into} python benchmarks/bench_log.py ...")


if __name__ == "__main__":
    main()
