"""Entry point of the ``et`` console script.

Each command group lives in its own module of this package and exposes
``register(subparsers)``, which adds its sub-parser and sets ``func`` (a callable
taking the parsed ``argparse.Namespace`` and returning the exit code).

Exit codes are stable: 0 success, 1 errors or failed checks, 2 usage error,
3 lint problems only (``et rules check``). A reader that closes the pipe early
(``et history RUN -n 100000 | head -1``) is not an error: exit 0, nothing on stderr.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

#: command modules, in the order ``et --help`` lists them; a missing module is skipped
#: the commands that read runs folders anyone may have written: their stderr (warnings,
#: errors naming paths, run names and lines) has control characters escaped
#: (:class:`expr_tracker.cli.output.PrintableStream`; docs/cli.md "Output for people")
READERS = frozenset(
    {"runs", "compare", "history", "query", "plot", "ui", "trace", "export", "alerts", "ranks"}
    | {"artifacts", "rules", "du", "gc"}
    | {"runs-rm", "runs-mv", "runs-archive", "runs-unarchive", "runs-tag"}
)
COMMAND_MODULES = (
    "runs",
    "runops",
    "diskuse",
    "compare",
    "history",
    "query",
    "plot",
    "ui",
    "trace",
    "ranks",
    "export",
    "sync",
    "rules",
    "alert",
    "alerts_cmd",
    "artifacts",
    "channels",
    "config",
    "schema",
)


#: command -> the module of COMMAND_MODULES that registers it: ``et runs DIR`` imports only
#: ``cli/runs.py`` (docs/architecture.md "Cold start"); tests/cli/test_cli_groups.py keeps
#: this table equal to what the modules register
COMMANDS = {
    "runs": "runs",
    **{f"runs-{a}": "runops" for a in ("rm", "mv", "archive", "unarchive", "tag")},
    "du": "diskuse",
    "gc": "diskuse",
    "compare": "compare",
    "history": "history",
    "query": "query",
    "plot": "plot",
    "ui": "ui",
    "trace": "trace",
    "ranks": "ranks",
    "export": "export",
    "sync": "sync",
    "rules": "rules",
    "alert": "alert",
    "alerts": "alerts_cmd",
    "artifacts": "artifacts",
    "channels": "channels",
    "config": "config",
    "schema": "schema",
}


class _VersionAction(argparse.Action):
    """``et --version``: one line, ``expr_tracker X.Y.Z (how it is built)``, printed as it
    is (argparse's own version action wraps it to the terminal's width: a compiled build's
    list of modules came out on several lines), worked out only when asked for. Exits 0, 0
    quietly to a closed pipe, 1 with a line on stderr when stdout cannot be written."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS) -> None:
        super().__init__(
            option_strings,
            dest=dest,
            default=argparse.SUPPRESS,
            nargs=0,
            help="show the version and how it is built (pure Python or compiled), then exit",
        )

    def __call__(self, parser: argparse.ArgumentParser, *_args: Any) -> None:
        from expr_tracker._version import __version__
        from expr_tracker.compiled import build_description

        line = f"expr_tracker {__version__} ({build_description()})\n"
        try:
            sys.stdout.write(line)
            sys.stdout.flush()  # a closed pipe or a full disk shows here, not at exit
        except BrokenPipeError:  # its reader is gone: quiet, as every command
            _silence_stdout()
        except OSError as exc:
            from expr_tracker.history.rundirs import os_reason

            _silence_stdout()
            parser.exit(1, f"et: the version cannot be written: {os_reason(exc)}\n")
        parser.exit()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``et`` parser. ``command`` (the first word of the command line): only the module
    of that command is imported and registered, the command parses the same; any other
    word, or None, registers every module (``et --help``, a misspelt command)."""
    parser = argparse.ArgumentParser(
        prog="et",
        description="expr_tracker: local-first experiment tracking (history, spans, alerts).",
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    only = COMMANDS.get(command) if command is not None else None
    for name in COMMAND_MODULES if only is None else (only,):
        try:
            module = importlib.import_module(f"expr_tracker.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"expr_tracker.cli.{name}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["runs"]:  # `et runs rm ...` -> `runs-rm ...`: runops for runs alone
        from expr_tracker.cli.runops import run_argv

        words = run_argv(words)
    parser = build_parser(words[0] if words else None)
    args = parser.parse_args(words)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    stderr = sys.stderr
    if args.command in READERS:
        from expr_tracker.cli.output import PrintableStream

        sys.stderr = PrintableStream(stderr)  # type: ignore[assignment]
    try:
        code = int(func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the flush at interpreter exit
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        _silence_stdout()
        return 0
    except OSError as exc:
        # a file or folder a command could not read or write and did not report itself (a
        # colleague's 0700 run folder: pathlib's is_file() raises PermissionError): say
        # which and why, as for any unreadable file, never a traceback
        from expr_tracker.history.rundirs import os_reason

        where = f"{str(exc.filename)!r}: " if exc.filename is not None else ""
        sys.stderr.write(f"et {args.command}: {where}{os_reason(exc)}\n")
        return 1
    finally:
        sys.stderr = stderr


def _silence_stdout() -> None:
    """After a closed pipe: point stdout at /dev/null, so that the flush at interpreter exit
    (of what is still buffered) cannot raise a second ``BrokenPipeError`` (which Python
    reports on stderr and turns into exit status 120). As the Python docs advise for
    SIGPIPE."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real file descriptor (tests)
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
