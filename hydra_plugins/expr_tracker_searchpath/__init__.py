"""Hydra discovers plugins only in the ``hydra_plugins`` namespace package; this module only
re-exports expr_tracker's search-path plugin (``expr_tracker.hydra.searchpath``)."""

from expr_tracker.hydra.searchpath import ExprTrackerSearchPathPlugin

__all__ = ["ExprTrackerSearchPathPlugin"]
