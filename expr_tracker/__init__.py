"""expr_tracker: a local-first experiment tracker for machine-learning training."""

from expr_tracker._version import __version__

__all__ = ["__version__"]
