"""The search-path plugin: puts expr_tracker's ``tracker`` config group on Hydra's path.

Hydra discovers plugins only inside the ``hydra_plugins`` namespace package, so
``hydra_plugins/expr_tracker_searchpath/__init__.py`` re-exports this class; the class itself
lives here. ``python app.py --info searchpath`` lists the entry (provider ``expr_tracker``).
"""

from __future__ import annotations

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

#: The package path appended to every Hydra app's search path. ``expr_tracker.conf`` holds
#: only the ``tracker/`` group, so it cannot shadow an app's own config files.
SEARCH_PATH = "pkg://expr_tracker.conf"


class ExprTrackerSearchPathPlugin(SearchPathPlugin):
    """Appends :data:`SEARCH_PATH` (provider ``expr_tracker``) to the search path."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        """Append ``pkg://expr_tracker.conf`` unless an entry for it is already present."""
        for element in search_path.get_path():
            if element.path == SEARCH_PATH:
                return
        search_path.append(provider="expr_tracker", path=SEARCH_PATH)
