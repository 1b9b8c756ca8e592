"""A Hydra app's own config file as the input of ``et rules check``, ``et config validate``,
``et config show`` and ``et channels test --config``.

An app that composes the tracker with Hydra keeps its spec under ``tracker:`` in its config
(``python app.py --cfg job`` prints the composed config that way). Those commands read such
a file's section: the one ``--package a.b`` names, else ``tracker`` when the file's top level
has a ``tracker:`` mapping (no spec file has that key), else the whole file.

Hydra's ``defaults:`` list is not composed: only what the file itself holds is checked, and a
note on stderr says so. To check what the app really gets, check the composed config:
``python app.py +tracker=default --cfg job --resolve > composed.yaml && et config validate composed.yaml``.

Nor are OmegaConf interpolations resolved (``${oc.select:...guard_metric,loss}`` in a shipped
rule set): only Hydra can, in the composed config. A value holding one is not checked; the
commands say so at its path (``spec.yaml.interpolation``, ``interpolation_note``) instead of reporting
the ``${...}`` text as a bad rule or value.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

#: the section a Hydra app's config holds the tracker's spec in (``+tracker=...``)
TRACKER_PACKAGE = "tracker"  # == expr_tracker.spec.sources.APP_PACKAGE


def add_package_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--package DOTTED.PATH`` to ``parser``."""
    parser.add_argument(
        "--package",
        default=None,
        metavar="A.B",
        help="read the spec from this dotted section of the file (a Hydra app's config); "
        f"default: {TRACKER_PACKAGE!r} when the file has a top-level {TRACKER_PACKAGE}: "
        "mapping, else the whole file",
    )


def _top_level(path: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return None  # unreadable: the command's own validation says why


def package_of(path: str, package: str | None = None, *, note: bool = True) -> str | None:
    """The dotted section of ``path`` holding the spec: ``package`` when given, else
    ``"tracker"`` when the file's top level has a ``tracker:`` mapping, else None (the file
    is the spec). With ``note``, a file with a Hydra ``defaults:`` list gets one line on
    stderr saying the list is not composed."""
    data = _top_level(path) if (note or package is None) else None
    if package is None:
        from expr_tracker.spec.sources import app_package  # the rule et.init(spec=PATH) follows

        package = app_package(data)
    defaults = data.get("defaults") if isinstance(data, dict) else None
    if note and isinstance(defaults, list) and [d for d in defaults if d != "_self_"]:
        what = f"its {package!r} section" if package else "the file"
        sys.stderr.write(
            f"note: {path}: Hydra's defaults list is not composed; checking {what} as "
            f"written (to check the composed config: python app.py --cfg job --resolve > composed.yaml)\n"
        )
    return package
