"""Tracker names frameworks look up, registered without importing the framework:
``Accelerator(log_with="expr_tracker")`` (docs/integrations.md, "Accelerate").

Accelerate resolves a ``log_with`` name in its own registry, filled by
``accelerate.tracking.register_tracker_class``, and loads no plugins or entry points, so the
name must be registered by the time an ``Accelerator`` is built. ``import expr_tracker``
calls :func:`watch_frameworks`: when ``accelerate.tracking`` is already loaded, the tracker
is registered at once (by importing ``expr_tracker.integrations.accelerate``, which registers
itself); else one finder on ``sys.meta_path`` waits for that module to be imported, registers
the tracker right after the module ran, and removes itself. So the import order of
``expr_tracker`` and ``accelerate`` does not matter, and nothing imports Accelerate that
would not have. The finder answers every other name with None at once (a string comparison
per import).

A registration that fails (an Accelerate without ``register_tracker_class``, an error in the
integration) never breaks Accelerate's import: it is logged once and ``log_with`` takes an
``ExprTrackerTracker`` instance as before.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

__all__ = ["watch_frameworks"]

log = logging.getLogger("expr_tracker")

#: the module whose import registers the tracker, and the integration that does it
WATCHED = "accelerate.tracking"
INTEGRATION = "expr_tracker.integrations.accelerate"


def watch_frameworks() -> None:
    """Register ``"expr_tracker"`` with Accelerate now if it is loaded, else as soon as
    ``accelerate.tracking`` is imported (idempotent; never imports Accelerate itself)."""
    if WATCHED in sys.modules:
        _register()
        return
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


def _register() -> None:
    try:
        import expr_tracker.integrations.accelerate  # noqa: F401 - registers on import
    except Exception as exc:  # noqa: BLE001 - Accelerate's import must go on
        log.warning(
            "expr_tracker: could not register the Accelerate tracker 'expr_tracker' (%s: %s); "
            "pass log_with=ExprTrackerTracker(...) instead",
            type(exc).__name__,
            exc,
        )


class _AfterImport:
    """A ``sys.meta_path`` finder that finds nothing itself: for :data:`WATCHED` it asks the
    finders after it for the module's spec and runs :func:`_register` once its loader has
    executed the module."""

    def __init__(self) -> None:
        self._busy = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != WATCHED or self._busy:
            return None
        self._busy = True
        try:
            spec = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        _remove(self)
        loader = spec.loader
        had_own = "exec_module" in vars(loader)
        original = loader.exec_module

        def exec_module(module: Any) -> None:
            # this loader object may serve other modules too (a zip archive's): restore it
            if had_own:
                loader.exec_module = original
            else:
                del loader.exec_module
            original(module)
            if getattr(module, "__name__", None) == WATCHED:
                _register()

        try:
            loader.exec_module = exec_module
        except (AttributeError, TypeError):  # a loader that takes no attributes: as before
            log.debug("expr_tracker: cannot watch %s's loader %r", WATCHED, loader)
        return spec


def _remove(finder: _AfterImport) -> None:
    try:
        sys.meta_path.remove(finder)
    except ValueError:
        pass
