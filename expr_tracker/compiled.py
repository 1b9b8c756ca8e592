"""Which modules of this install are compiled, and the guard that runs a module's source
instead of its compiled extension once the source has changed (docs/performance.md "A
compiled build").

An ``ET_COMPILE=1`` build (``hatch_build.py``) ships each compiled module's extension beside
its ``.py`` and records the SHA-256 of each source in ``expr_tracker/_compiled.json``. Python
imports an extension before a source of the same name, so a source edited after the build
would silently not run: :func:`guard` (called first thing by ``import expr_tracker``)
compares the digests and, for each module whose source differs, puts a finder in front of
``sys.meta_path`` that loads the source instead, with one warning. A pure-Python install has
no manifest; the guard then costs one failed ``open``.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
MANIFEST = os.path.join(_HERE, "_compiled.json")

#: modules whose sources differ from what was compiled: loaded from the source (guard())
stale: list[str] = []


def source_path(module: str) -> str:
    """The ``.py`` of ``module`` (``expr_tracker.history.store``) in this install."""
    parts = module.split(".")
    if parts[0] != "expr_tracker" or len(parts) < 2 or not all(p.isidentifier() for p in parts):
        raise ValueError(f"{module!r} is not a module of expr_tracker")
    return os.path.join(_HERE, *parts[1:]) + ".py"


def read_build_manifest(path: str = MANIFEST) -> dict[str, str] | None:
    """Module name -> SHA-256 (hex) of the source it was compiled from; None when this
    install is not a compiled build (no manifest).

    Raises:
        ValueError: the manifest is not what a build writes (its path named).
    """
    try:
        with open(path, "rb") as f:
            import json  # only a compiled build has a manifest

            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable build manifest ({exc})") from exc
    sources = data.get("sources") if isinstance(data, dict) else None
    if not isinstance(sources, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in sources.items()
    ):
        raise ValueError(f"{path}: expected {{'sources': {{module: sha256}}}}")
    for module in sources:
        try:
            source_path(module)
        except ValueError as exc:  # a name the guard could not look up (or redirect)
            raise ValueError(f"{path}: {exc}") from None
    return sources


def changed_sources(manifest: dict[str, str]) -> list[str]:
    """The modules of ``manifest`` whose source now has another digest (or is gone)."""
    import hashlib

    out = []
    for module, digest in sorted(manifest.items()):
        try:
            with open(source_path(module), "rb") as f:
                now = hashlib.sha256(f.read()).hexdigest()
        except (OSError, ValueError):
            now = ""
        if now != digest:
            out.append(module)
    return out


class SourceFirst:
    """A ``sys.meta_path`` finder that loads ``modules`` from their ``.py`` files, so an
    extension compiled from an older source is not used."""

    def __init__(self, modules: Sequence[str]) -> None:
        self.modules = frozenset(modules)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.modules:
            return None
        source = source_path(fullname)
        if not os.path.isfile(source):
            return None  # gone: the normal finders decide
        loader = importlib.machinery.SourceFileLoader(fullname, source)
        return importlib.util.spec_from_file_location(fullname, source, loader=loader)


def guard(manifest_path: str = MANIFEST) -> list[str]:
    """Check a compiled build's sources against its manifest (module docstring); returns
    the modules that will run from their source. Never raises: a manifest that cannot be
    read is warned about and the install runs as it is."""
    try:
        manifest = read_build_manifest(manifest_path)
    except ValueError as exc:
        warnings.warn(
            f"expr_tracker: {exc}; the compiled modules are used as they are", stacklevel=2
        )
        return []
    if not manifest:
        return []
    found = changed_sources(manifest)
    if found:
        # the whole build runs from source: its modules were compiled as one group, whose
        # code imports its own members without asking sys.meta_path (an edited cache.py
        # would not run while the compiled store imported the compiled cache)
        group = sorted(manifest)
        loaded = [m for m in group if m in sys.modules]  # imported before the guard ran
        sys.meta_path.insert(0, SourceFirst(group))
        stale[:] = group
        warnings.warn(
            "expr_tracker: the source of "
            + ", ".join(found)
            + " changed after it was compiled; "
            + ", ".join(group)
            + " run from their sources (slower) until the package is reinstalled"
            + (f" (already imported compiled: {', '.join(loaded)})" if loaded else ""),
            stacklevel=2,
        )
    return found


def compiled_modules() -> list[str]:
    """The ``expr_tracker`` modules imported so far that run compiled (from an extension,
    not a ``.py``), sorted."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return sorted(
        name
        for name, mod in list(sys.modules.items())
        if name.startswith("expr_tracker.")
        and isinstance(mod, ModuleType)
        and str(getattr(mod, "__file__", "") or "").endswith(suffixes)
    )


def build_description() -> str:
    """One line for ``et --version``: ``pure Python``, or the modules that run compiled,
    as imported (the manifest's are imported first), and those that run from their source
    because it changed since the build."""
    import importlib

    try:
        manifest = read_build_manifest() or {}
    except ValueError:
        manifest = {}
    for name in sorted(manifest):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a broken install is reported by what did import
            pass
    running = compiled_modules()
    parts = []
    if running:
        parts.append("compiled: " + ", ".join(running))
    if stale:
        parts.append("from source since edited: " + ", ".join(stale))
    return "; ".join(parts) or "pure Python"


guard()  # at import: ``import expr_tracker`` imports this module before any it may redirect
