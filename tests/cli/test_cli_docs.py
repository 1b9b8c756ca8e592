"""docs/cli.md's command table matches the real `et` parser: every sub-command has a row,
every option of it appears in its row (and every option the row's synopsis names exists),
and every format a command supports is listed in its row and in its `--help`."""

from __future__ import annotations

import argparse
import re

from helpers import ROOT

from expr_tracker.cli.main import build_parser

DOC = ROOT / "docs" / "cli.md"


def _commands(parser, path=()):
    """``(("config", "show"), parser)`` for every leaf sub-command."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs and path:
        yield path, parser
    for action in subs:
        for name, sub in action.choices.items():
            # `et runs rm` is registered as runs-rm (cli/runops.py run_argv)
            yield from _commands(sub, (*path, *name.split("-")))


def _rows():
    """{("config", "show"): (synopsis, whole row)} from the table's `et ...` rows."""
    rows = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        m = re.match(r"\| `et ([^`]*)` \|", line)
        if not m:
            continue
        synopsis = m.group(1).replace("\\|", "|")
        words = []
        for token in synopsis.split():
            if not re.fullmatch(r"[a-z]+", token):
                break
            words.append(token)
        rows[tuple(words)] = (synopsis, line.replace("\\|", "|"))
    return rows


def _mentions(text: str, option: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text) is not None


def _options(parser):
    return [
        a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)
    ]


def test_every_command_and_option_is_in_the_docs_table():
    rows = _rows()
    commands = list(_commands(build_parser()))
    assert len(commands) >= 13
    missing = []
    for path, parser in commands:
        assert path in rows, f"docs/cli.md has no row for `et {' '.join(path)}`"
        synopsis, row = rows[path]
        for action in _options(parser):
            if not any(_mentions(row, s) for s in action.option_strings):
                missing.append(f"et {' '.join(path)}: {'/'.join(action.option_strings)}")
        # the other way: an option the synopsis names is a real one
        real = {s for a in _options(parser) for s in a.option_strings}
        for option in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", synopsis):
            assert option in real, f"docs/cli.md: `et {' '.join(path)}` has no option {option}"
    assert not missing, "options missing from docs/cli.md's table: " + "; ".join(missing)


def test_help_and_docs_list_every_format():
    rows = _rows()
    with_format = 0
    for path, parser in _commands(build_parser()):
        (action,) = [a for a in _options(parser) if "--format" in a.option_strings] or [None]
        if action is None:
            continue
        with_format += 1
        # `et export` writes files (parquet|csv|jsonl, default from the -o suffix); the
        # commands that print offer json and jsonl and name their default
        prints = path != ("export",)
        assert not prints or {"json", "jsonl"} <= set(action.choices), path
        text = parser.format_help()
        row = rows[path][1]
        for fmt in action.choices:
            # the usage line ({table,json,jsonl}) and the option's own help say each one
            assert re.search(rf"\b{fmt}\b", action.help or ""), (path, fmt, action.help)
            assert fmt in text and _mentions(row, fmt), (path, fmt)
        assert not prints or f"{action.default} (default)" in action.help, (path, action.help)
    assert with_format >= 8
