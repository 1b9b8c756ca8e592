"""`et COMMAND ...` imports only COMMAND's module (docs/architecture.md "Cold start"): the
table in cli/main.py names, for each command, the module that registers it."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys

import expr_tracker as et
from expr_tracker.cli import main as cli_main


def test_the_command_table_is_what_the_modules_register():
    registered: dict[str, str] = {}
    for name in cli_main.COMMAND_MODULES:
        parser = argparse.ArgumentParser(prog="et")
        sub = parser.add_subparsers(dest="command")
        importlib.import_module(f"expr_tracker.cli.{name}").register(sub)
        registered.update(dict.fromkeys(sub.choices, name))
    assert cli_main.COMMANDS == registered


def test_a_command_parses_the_same_with_its_module_alone():
    argv = ["runs", "some/dir", "--sort=-loss", "--columns", "name,loss"]
    alone = vars(cli_main.build_parser("runs").parse_args(argv))
    every = vars(cli_main.build_parser().parse_args(argv))
    assert alone == every
    full = cli_main.build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(full) == set(cli_main.COMMANDS)  # no word: every command


def test_et_runs_and_history_import_no_other_command_module(tmp_path):
    et.init(dir=str(tmp_path), project="p", name="r", system={"enabled": False})
    et.log({"loss": 1.0})
    et.finish()
    code = (
        "import json, sys\n"
        "from expr_tracker.cli.main import COMMAND_MODULES, main\n"
        "code = main(sys.argv[1:])\n"
        "mods = [m for m in COMMAND_MODULES if 'expr_tracker.cli.' + m in sys.modules]\n"
        "print(json.dumps([code, mods]), file=sys.stderr)\n"
    )
    for argv, own in (
        (["runs", str(tmp_path)], "runs"),
        (["history", str(tmp_path / "p" / "r"), "-n", "5"], "history"),
    ):
        out = subprocess.run(
            [sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True
        )
        code_out, mods = json.loads(out.stderr.strip().splitlines()[-1])
        # runops: run_argv reads `et runs rm ...`; history: the table width helper the
        # table commands share; sync: on_buckets (a bucket URL)
        assert code_out == 0 and own in mods, out.stderr
        assert set(mods) <= {own, "runops", "history", "sync"}, out.stderr
