"""Hydra config shipped with expr_tracker: the ``tracker`` config group.

This package exists so Hydra can find the YAML files at ``pkg://expr_tracker.conf`` (the
search-path plugin in ``hydra_plugins/expr_tracker_searchpath`` adds it). It holds no code.
"""
