"""Machine-readable output, shared by every ``et`` command that has ``--format``.

Two formats mean the same thing in every command:

- ``json``: ONE JSON document on stdout. A command that lists things (runs, rows, files,
  channels, firings, spec values) prints an array, also for one item and ``[]`` for none;
  each item is written on a line of its own (``[``, ``{...},``, ..., ``]``), so the
  document stays readable and can be streamed.
- ``jsonl``: JSON Lines: one object per line, no enclosing array, nothing for no items.

Both are strict JSON (NaN and ±Infinity become ``null``, so ``jq`` and other strict
parsers accept them) and ASCII (other characters as ``\\u`` escapes, so no terminal
encoding can break it); a value JSON cannot hold is written as its ``str()``. The human
format of each command (``table`` or ``text``) keeps its name.

A command uses it in three lines::

    from expr_tracker.cli import output

    output.add_format_option(parser, human="table")        # table (default) | json | jsonl
    ...
    if output.is_machine(args.format):
        output.write_records(records, args.format)         # records: dicts
        return 0

A command that prints records as they come (``et history --follow``) keeps a
``RecordWriter`` and calls ``write(records)`` for each batch and ``close()`` at the end
(which writes the closing ``]`` of a ``json`` array). A command whose answer is one
object, not a listing (``et rules explain``), uses ``write_object`` (``json``: the object;
``jsonl``: the object on one line).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterable, Iterator
from typing import IO, Any

from expr_tracker.history.values import json_safe

#: the machine-readable formats, meaning the same in every command
MACHINE_FORMATS = ("json", "jsonl")


def printable(text: str) -> str:
    """``text`` for a terminal: every character that is not printable (control characters
    such as ESC, BEL and NUL, line breaks, bidirectional overrides) written as its Python
    escape (``\\x1b``, ``\\n``, ``\\u202e``), as ``ls`` and ``git`` quote names, so a run
    name, metric name or value cannot move the cursor, clear the screen, set the window title
    or write the clipboard (OSC 52). Human output only: ``json``/``jsonl``/``csv`` keep the
    data exact (docs/cli.md "Output for people")."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


class PrintableStream:
    """A text stream (stderr) that writes what it is given through :func:`printable`,
    line breaks and tabs kept: the warnings and error lines of the commands that read runs
    name paths, run names and lines from files anyone may have written (a run folder named
    with ``\x1b]52;...`` writing the clipboard). Everything else is the wrapped stream's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        if not text.isprintable():
            lines = text.split("\n")
            text = "\n".join("\t".join(map(printable, ln.split("\t"))) for ln in lines)
        return self._stream.write(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def sigterm_as_exit(active: bool = True) -> Iterator[None]:
    """While the block runs, SIGTERM (``kill``, ``timeout``, SLURM, Kubernetes) raises
    ``SystemExit(143)``, so the block's ``finally`` clauses run as on Ctrl-C (a temporary
    file removed, the terminal's cursor shown again) and the process exits 143; the previous
    handler is put back after. Nothing changes when not ``active`` or off the main thread."""
    import signal
    import threading

    old = None
    if active and threading.current_thread() is threading.main_thread():

        def on_term(signum: int, frame: Any) -> None:
            raise SystemExit(128 + signum)

        try:
            old = signal.signal(signal.SIGTERM, on_term)
        except (ValueError, OSError):  # pragma: no cover - no signals here
            old = None
    try:
        yield
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


def add_format_option(
    parser: argparse.ArgumentParser,
    human: str = "table",
    *,
    extra: tuple[str, ...] = (),
    what: str = "items",
) -> None:
    """Add ``--format {human, *extra, json, jsonl}`` (default ``human``) to ``parser``.

    ``what`` names the things listed, for the help text (``"runs"``, ``"rows"``).
    """
    parser.add_argument(
        "--format",
        choices=(human, *extra, *MACHINE_FORMATS),
        default=human,
        help=f"{human} (default){''.join(f', {e}' for e in extra)}; json: one JSON "
        f"document (an array of {what}); jsonl: one JSON object per line",
    )


def is_machine(fmt: str | None) -> bool:
    """True for ``json`` and ``jsonl``."""
    return fmt in MACHINE_FORMATS


def dumps(value: Any) -> str:
    """``value`` as compact strict JSON on one line."""
    return json.dumps(json_safe(value, "null"), separators=(",", ":"), default=str)


class RecordWriter:
    """Writes records (JSON-able dicts) to ``out`` in ``json`` or ``jsonl``, a batch at a
    time; ``close()`` ends the ``json`` array (``[]`` when nothing was written). Each
    ``write`` flushes ``out``, so a reader sees every batch as it comes.

    Raises:
        ValueError: ``fmt`` is not ``json`` or ``jsonl``.
    """

    def __init__(self, fmt: str, out: IO[str] | None = None) -> None:
        if fmt not in MACHINE_FORMATS:
            raise ValueError(f"format must be one of {', '.join(MACHINE_FORMATS)}, not {fmt!r}")
        self.fmt = fmt
        self.out = out if out is not None else sys.stdout
        self.count = 0
        self.closed = False

    def write(self, records: Iterable[Any]) -> None:
        parts = []
        for rec in records:
            text = dumps(rec)
            if self.fmt == "jsonl":
                parts.append(text + "\n")
            else:
                parts.append(("[\n" if self.count == 0 else ",\n") + text)
            self.count += 1
        if parts:
            self.out.write("".join(parts))
            self.out.flush()

    def close(self) -> None:
        """End the document (``json``: the closing ``]``); a second call does nothing."""
        if self.closed:
            return
        self.closed = True
        if self.fmt == "json":
            self.out.write("[]\n" if self.count == 0 else "\n]\n")
            self.out.flush()


def write_records(records: Iterable[Any], fmt: str, out: IO[str] | None = None) -> None:
    """Write ``records`` as one ``json`` array or as ``jsonl`` lines (see the module doc)."""
    writer = RecordWriter(fmt, out)
    writer.write(records)
    writer.close()


def write_object(obj: Any, fmt: str, out: IO[str] | None = None) -> None:
    """Write the one object a command answers (not a listing): ``json`` pretty-printed,
    ``jsonl`` on one line."""
    out = out if out is not None else sys.stdout
    if fmt == "jsonl":
        out.write(dumps(obj) + "\n")
    else:
        out.write(json.dumps(json_safe(obj, "null"), indent=2, default=str) + "\n")


def console(file: IO[str] | None = None, width: int | None = None, **kwargs: Any) -> Any:
    """A rich ``Console`` for command output (``highlight=False``, ``soft_wrap=False``,
    ``markup=False``, ``emoji=False`` unless given) that lets a closed pipe raise
    ``BrokenPipeError``, which ``et``'s entry point turns into exit 0. (Rich's own answer to
    a closed pipe is ``SystemExit(1)``, so ``et runs | head -1`` would fail.)

    Strings print as they are: a run named ``[red]x[/red]``, ``[link=...]`` or ``:skull:``
    is not rich markup or an emoji code; style with ``rich.text.Text``. Control characters
    are the caller's to escape (:func:`printable`): rich passes ESC through."""
    global _Console
    if _Console is None:
        from rich.console import Console

        class _PipeConsole(Console):
            def on_broken_pipe(self) -> None:
                self.quiet = True
                raise BrokenPipeError

        _Console = _PipeConsole
    kwargs.setdefault("highlight", False)
    kwargs.setdefault("soft_wrap", False)
    kwargs.setdefault("markup", False)
    kwargs.setdefault("emoji", False)
    return _Console(file=file, width=width, **kwargs)


_Console: Any = None
