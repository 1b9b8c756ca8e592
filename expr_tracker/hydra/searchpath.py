"""The search-path plugin: puts expr_tracker's config groups on Hydra's path: ``tracker`` (the
run spec, ``+tracker=default``) and ``logger`` (its one option ``expr_tracker``, the Lightning
logger node of lightning-hydra-template style apps: ``logger=expr_tracker``).

Hydra discovers plugins only inside the ``hydra_plugins`` namespace package, so
``hydra_plugins/expr_tracker_searchpath/__init__.py`` re-exports this class; the class itself
lives here. ``python app.py --info searchpath`` lists the entry (provider ``expr_tracker``).
"""

from __future__ import annotations

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

#: The package path appended to every Hydra app's search path. ``expr_tracker.conf`` holds
#: only the ``tracker/`` group and ``logger/expr_tracker.yaml``, and an appended entry comes
#: after the app's own, so it cannot shadow an app's config files (its own ``logger/``
#: options stay as they are; ours is one more option of that group).
SEARCH_PATH = "pkg://expr_tracker.conf"


class ExprTrackerSearchPathPlugin(SearchPathPlugin):
    """Appends :data:`SEARCH_PATH` (provider ``expr_tracker``) to the search path."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        """Append ``pkg://expr_tracker.conf`` unless an entry for it is already present."""
        for element in search_path.get_path():
            if element.path == SEARCH_PATH:
                return
        search_path.append(provider="expr_tracker", path=SEARCH_PATH)
