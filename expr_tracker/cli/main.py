"""Entry point of the ``et`` console script.

Each command group lives in its own module of this package and exposes
``register(subparsers)``, which adds its sub-parser and sets ``func`` (a callable
taking the parsed ``argparse.Namespace`` and returning the exit code).

Exit codes are stable: 0 success, 1 errors or failed checks, 2 usage error,
3 lint problems only (``et rules check``).
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: command modules, in the order ``et --help`` lists them; a missing module is skipped
COMMAND_MODULES = (
    "runs",
    "history",
    "trace",
    "rules",
    "alert",
    "alerts_cmd",
    "channels",
    "config",
    "schema",
)


def build_parser() -> argparse.ArgumentParser:
    from expr_tracker import __version__

    parser = argparse.ArgumentParser(
        prog="et",
        description="expr_tracker: local-first experiment tracking (history, spans, alerts).",
    )
    parser.add_argument("--version", action="version", version=f"expr_tracker {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"expr_tracker.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"expr_tracker.cli.{name}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
