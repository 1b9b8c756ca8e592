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


#: commands whose module is the only one a run of them needs: ``et query ...`` builds a
#: parser of that module alone (a fresh ``et query`` skips importing the other 18
#: commands' modules, ~0.1 s of CPU); any other first word builds every command
SOLO_COMMANDS = {"query": "query"}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``et`` parser: every command, or, for a ``command`` of :data:`SOLO_COMMANDS`,
    only that one (what ``et COMMAND ...`` parses the same way)."""
    from expr_tracker import __version__

    parser = argparse.ArgumentParser(
        prog="et",
        description="expr_tracker: local-first experiment tracking (history, spans, alerts).",
    )
    parser.add_argument("--version", action="version", version=f"expr_tracker {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = (SOLO_COMMANDS[command],) if command in SOLO_COMMANDS else COMMAND_MODULES
    for name in modules:
        try:
            module = importlib.import_module(f"expr_tracker.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"expr_tracker.cli.{name}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["runs"]:
        from expr_tracker.cli.runops import run_argv

        argv = run_argv(argv)
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
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
