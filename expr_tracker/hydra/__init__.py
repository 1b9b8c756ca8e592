"""Hydra integration: the ``tracker`` config group on Hydra's search path, and a job callback.

- :class:`ExprTrackerSearchPathPlugin` (discovered by Hydra through
  ``hydra_plugins/expr_tracker_searchpath``) appends ``pkg://expr_tracker.conf`` to every
  Hydra app's search path, so ``+tracker=default`` and ``+tracker/alerts=nan_guard`` work with
  no change to the app's config.
- :class:`TrackerCallback` (opt in with ``hydra.callbacks``) starts one run per Hydra job and
  finishes it when the job ends, also when the job raised.

Importing this package needs ``hydra-core`` (``pip install expr-tracker[hydra]``).
"""

from expr_tracker.hydra.callback import TrackerCallback, job_run_name
from expr_tracker.hydra.searchpath import SEARCH_PATH, ExprTrackerSearchPathPlugin

__all__ = ["SEARCH_PATH", "ExprTrackerSearchPathPlugin", "TrackerCallback", "job_run_name"]
