"""Hydra config shipped with expr_tracker: the ``tracker`` config group, and the ``logger``
group's option ``expr_tracker`` (a Lightning logger node, ``logger=expr_tracker``).

This package exists so Hydra can find the YAML files at ``pkg://expr_tracker.conf`` (the
search-path plugin in ``hydra_plugins/expr_tracker_searchpath`` adds it). It holds no code.
"""
