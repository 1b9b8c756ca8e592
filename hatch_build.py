"""The opt-in compiled build: ``ET_COMPILE=1 pip install .`` compiles the modules named in
``pyproject.toml`` (``[tool.hatch.build.targets.wheel.hooks.custom] compile``) with mypyc and
ships each extension beside its source in the wheel (docs/performance.md "A compiled build").

Without ``ET_COMPILE`` (the default) the hook does nothing and asks for nothing: the wheel is
pure Python, as before. An editable install is never compiled: an extension beside a source
someone edits would keep running the old code.

The modules are compiled in a copy of the package in a temporary folder, so no extension is
ever written into the checkout; the wheel also gets ``expr_tracker/_compiled.json``, the
SHA-256 of each compiled module's source, which ``expr_tracker.compiled`` checks at import
(a source edited after the build runs as Python, with a warning).

Needs a C compiler and Python's headers; mypy, setuptools and the package's own dependencies
(mypy analyses the package with them, pydantic's mypy plugin among them) are added to the
build environment only when ``ET_COMPILE`` is set.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

ENV = "ET_COMPILE"
PACKAGE = "expr_tracker"
MANIFEST = "_compiled.json"

SETUP = """\
import sys
from setuptools import setup
from mypyc.build import mypycify

setup(name="expr-tracker-compiled", packages=[], py_modules=[],
      ext_modules=mypycify(sys.argv.pop().split(","), opt_level="3"))
"""


def wanted() -> bool:
    """``ET_COMPILE`` set to anything but empty, ``0``, ``false`` or ``no``."""
    return os.environ.get(ENV, "").strip().lower() not in ("", "0", "false", "no")


class CompileHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def _modules(self) -> list[str]:
        names = self.config.get("compile", [])
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise TypeError(
                f"[tool.hatch.build.targets.wheel.hooks.custom] compile = {names!r}: "
                "expected a list of module paths such as 'expr_tracker/history/store.py'"
            )
        missing = [n for n in names if not (Path(self.root) / n).is_file()]
        if missing:
            raise ValueError(f"{ENV}: no such module to compile: {', '.join(missing)}")
        return names

    def dependencies(self) -> list[str]:
        if not wanted():
            return []
        return ["mypy>=1.10", "setuptools>=68", *self.metadata.core.dependencies]

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if not wanted():
            return
        if version == "editable":
            self.app.display_warning(
                f"{ENV}: an editable install stays pure Python (a compiled module would not "
                "follow edits of its source); use `pip install .` for the compiled build"
            )
            return
        modules = self._modules()
        root = Path(self.root)
        self._tmp = Path(tempfile.mkdtemp(prefix="et-compile-"))
        work = self._tmp / "src"
        shutil.copytree(
            root / PACKAGE,
            work / PACKAGE,
            ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd", MANIFEST),
        )
        shutil.copy2(root / "pyproject.toml", work / "pyproject.toml")  # mypy's settings
        setup = self._tmp / "setup.py"
        setup.write_text(SETUP)
        self.app.display_info(f"{ENV}: compiling {len(modules)} modules with mypyc (minutes)")
        done = subprocess.run(
            [sys.executable, str(setup), "build_ext", "--inplace", ",".join(modules)],
            cwd=work,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        if done.returncode != 0:
            tail = done.stdout.decode("utf-8", "replace")[-6000:]
            raise RuntimeError(
                f"{ENV}: mypyc failed (exit {done.returncode}); unset {ENV} to install the "
                f"pure-Python package (the same behaviour, slower per call):\n{tail}"
            )
        # the package's extensions and mypyc's shared runtime beside it (not setuptools'
        # copies under build/)
        found = [*work.glob("*"), *(work / PACKAGE).rglob("*")]
        built = sorted(p for p in found if p.suffix in (".so", ".pyd") and p.is_file())
        for module in modules:
            stem = (work / module).with_suffix("")
            if not any(
                p.parent == stem.parent and p.name.startswith(stem.name + ".") for p in built
            ):
                raise RuntimeError(f"{ENV}: mypyc gave no extension for {module}")
        for path in built:
            build_data["force_include"][str(path)] = str(path.relative_to(work))
        sources = {  # of the copy that was compiled (the checkout may have changed since)
            m[: -len(".py")].replace("/", "."): hashlib.sha256((work / m).read_bytes()).hexdigest()
            for m in modules
        }
        manifest = work / PACKAGE / MANIFEST
        manifest.write_text(json.dumps({"sources": sources}, indent=1, sort_keys=True) + "\n")
        build_data["force_include"][str(manifest)] = f"{PACKAGE}/{MANIFEST}"
        build_data["pure_python"] = False
        build_data["infer_tag"] = True

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
