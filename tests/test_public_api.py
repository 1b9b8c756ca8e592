"""The public surface of ``import expr_tracker as et`` is a contract: pin it (STYLE item 1)."""

from __future__ import annotations

import subprocess
import sys

from helpers import run_py

import expr_tracker as et

PUBLIC = [
    "AlertConfig",
    "AlertLevel",
    "AlertMessage",
    "AlertRule",
    "Artifact",
    "ChannelConfig",
    "ConfigChangeError",
    "ExprTrackerError",
    "ForkedRunError",
    "Histogram",
    "Image",
    "M",
    "NoActiveRunError",
    "QueryError",
    "Run",
    "RunAlreadyActiveError",
    "RunLockedError",
    "Span",
    "Table",
    "WebhookPolicy",
    "__version__",
    "add_alert_rule",
    "alert",
    "config",
    "configure_alert",
    "define_metric",
    "finish",
    "get_run",
    "history",
    "info",
    "init",
    "list_alert_rules",
    "log",
    "log_artifact",
    "mark_preempting",
    "query",
    "read_history",
    "register_backend",
    "register_channel",
    "remove_alert_rule",
    "resolve_run_path",
    "run",
    "should_stop",
    "span",
    "start_span",
    "summary",
    "unwatch",
    "use_artifact",
    "watch",
]


def test_all_is_the_pinned_surface_and_sorted():
    assert et.__all__ == PUBLIC
    assert sorted(et.__all__) == et.__all__


def test_every_public_name_exists_and_nothing_else_leaks():
    for name in PUBLIC:
        assert hasattr(et, name), name
    import types

    # submodules become attributes once imported (by other tests too): not part of the surface
    leaked = {
        n
        for n, v in vars(et).items()
        if not n.startswith("_") and n not in PUBLIC and not isinstance(v, types.ModuleType)
    }
    assert leaked == set()


def test_documented_import_paths():
    from expr_tracker.history import read_history, resolve_run_path  # noqa: F401
    from expr_tracker.plugins import CpuTime, GpuStats, TorchMemory  # noqa: F401
    from expr_tracker.trace import build_trace, write_trace  # noqa: F401


def test_summary_class_is_importable_from_runs():
    # Summary lives in runsummary.py (not summary.py: importing a submodule of that name
    # would replace et.summary on the package) and stays importable where it always was
    from expr_tracker.runs import Summary
    from expr_tracker.runsummary import Summary as home

    assert Summary is home
    assert callable(et.summary) and type(et.summary).__name__ == "SummaryProxy"


def test_import_stays_light():
    code = (
        "import sys, expr_tracker\n"
        "heavy = {'torch', 'pandas', 'polars', 'hydra', 'numpy', 'pydantic', 'lark', 'pynvml',\n"
        "        'duckdb', 'pyarrow', 'rich', 'yaml', 'psutil', 'ssl', 'http',\n"
        "        'expr_tracker.spec', 'expr_tracker.alerts', 'expr_tracker.artifacts',\n"
        "        'expr_tracker.media', 'expr_tracker.assemble', 'expr_tracker.backends'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_history_is_both_the_package_and_the_query_function():
    import importlib

    module = importlib.import_module("expr_tracker.history")
    assert et.history is module and callable(et.history)
    import expr_tracker.history.writer as writer  # the package's modules import as usual

    assert writer.JsonlWriter is module.JsonlWriter
    import inspect

    assert list(inspect.signature(et.history).parameters)[:2] == ["n", "output_type"]


def test_query_is_both_the_package_and_the_sql_function():
    import importlib
    import inspect

    module = importlib.import_module("expr_tracker.query")
    assert et.query is module and callable(et.query)
    assert list(inspect.signature(et.query).parameters)[:2] == ["sql", "dir"]
    from expr_tracker.query.views import connect  # the package's modules import as usual

    assert callable(connect)


def test_the_package_says_it_is_typed():
    """``py.typed`` (PEP 561) in the package, where wheels and editable installs find it:
    without it a user's type checker ignores every annotation of the public API."""
    from importlib.resources import files

    assert files("expr_tracker").joinpath("py.typed").is_file()


def test_a_plain_init_builds_no_http_stack_and_no_mirror(tmp_path):
    # a run without alert rules, channels or backends, from a plain spec: the spec is not
    # validated by Pydantic (spec.quick), the alert engine and its delivery wait for their
    # first need, the HTTP channels and the mirrors are not imported
    code = (
        "import sys, expr_tracker as et\n"
        "et.init(dir=sys.argv[1], project='p', system={'enabled': False})\n"
        "et.log({'loss': 1.0})\n"
        "et.finish()\n"
        "lazy = {'http.client', 'ssl', 'urllib.request', 'lark', 'numpy', 'duckdb', 'rich', 'yaml',\n"
        "        'expr_tracker.alerts.delivery.channels.bounded_http',\n"
        "        'expr_tracker.backends.mirror', 'expr_tracker.backends.wandb_backend',\n"
        "        'expr_tracker.backends.trackio_backend', 'pydantic', 'expr_tracker.spec.models',\n"
        "        'expr_tracker.alerts', 'importlib.metadata'}\n"
        "print(sorted(lazy & set(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_no_backends_and_rule_texts_start_without_pydantic(tmp_path):
    # `backends=[]` (the shared harness passes it) and one-line rule texts are values the
    # quick check vouches for: the run starts without Pydantic, its rules fire through the
    # console fallback, and `run.spec` is still the models' RunSpec on first access
    code = (
        "import sys, expr_tracker as et\n"
        "run = et.init(dir=sys.argv[1], project='p', backends=[], system=False,\n"
        "              alert_rules=['loss > 1 => error: high loss'])\n"
        "et.log({'loss': 2.0})\n"
        "print(sorted({'pydantic', 'expr_tracker.spec.models'} & set(sys.modules)))\n"
        "et.finish()\n"
        "print(type(run.spec).__name__, run.spec.alerts.rules, run.spec.backends)\n"
    )
    out = run_py(code, str(tmp_path))
    assert out.stdout.strip().splitlines()[-2:] == [
        "[]",
        "RunSpec ['loss > 1 => error: high loss'] []",
    ], out.stderr
    assert "high loss" in out.stdout + out.stderr  # the console channel delivered it


def test_the_start_loads_no_heavy_module_and_starts_no_process(tmp_path):
    # issue 27's cold start: after `import expr_tracker` and after a plain et.init with the
    # system sampler on (its default 10 s interval: psutil waits for its first sample),
    # outside any git repository: none of these is loaded (docs/architecture.md "Cold start")
    code = (
        "import sys\n"
        "heavy = ['pydantic', 'duckdb', 'pyarrow', 'numpy', 'rich', 'torch', 'psutil',\n"
        "         'socket', 'subprocess', 'difflib', 'expr_tracker.spans.plugins']\n"
        "import expr_tracker as et\n"
        "print(sorted(set(heavy) & set(sys.modules)))\n"
        "run = et.init(dir=sys.argv[1], project='p')\n"
        "heavy += ['zipfile', 'expr_tracker.artifacts.store', 'expr_tracker.media.read',\n"
        "          'expr_tracker.alerts', 'importlib.metadata']\n"
        "print(sorted(set(heavy) & set(sys.modules)))\n"
        "et.log({'loss': 1.0})\n"
        "print(run.artifacts.stats()['logged'], et.info()['artifacts']['mode'])\n"
        "et.finish()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    assert out.stdout.strip().splitlines()[-3:] == ["[]", "[]", "0 copy"], out.stderr


def test_the_et_parser_loads_no_heavy_library():
    # every `et` command builds the whole parser: a command module importing pydantic, yaml,
    # rich or duckdb at its top would slow `et runs` and `et history` (issue 27)
    code = (
        "import sys\n"
        "from expr_tracker.cli.main import build_parser\n"
        "build_parser()\n"
        "heavy = {'pydantic', 'yaml', 'rich', 'numpy', 'duckdb', 'pyarrow', 'lark',\n"
        "         'expr_tracker.spec', 'expr_tracker.alerts.rules'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
