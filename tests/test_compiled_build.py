"""The compiled build's guard (docs/performance.md "A compiled build"): a module whose source
changed after it was compiled runs from its source, with a warning; ``et --version`` says
what runs compiled. The build itself (``ET_COMPILE=1 pip install .``, minutes of mypyc) is
checked by ``benchmarks/build_compiled.py --test``, not here."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from helpers import ROOT

import expr_tracker as et
from expr_tracker import compiled

STORE = "expr_tracker.history.store"
SPANFOLD = "expr_tracker.history.spanfold"


def digest(module: str) -> str:
    return hashlib.sha256(Path(compiled.source_path(module)).read_bytes()).hexdigest()


def write_manifest(path: Path, sources: dict[str, str]) -> Path:
    path.write_text(json.dumps({"sources": sources}))
    return path


@pytest.fixture
def meta_path(monkeypatch):
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setattr(compiled, "stale", [])


def test_a_pure_python_install_has_no_manifest_and_changes_nothing(tmp_path, meta_path):
    before = list(sys.meta_path)
    assert compiled.guard(str(tmp_path / "none.json")) == []
    assert sys.meta_path == before
    if compiled.read_build_manifest() is None:  # a checkout (not a compiled install)
        assert compiled.build_description() == "pure Python"


def test_sources_as_compiled_keep_the_extensions(tmp_path, meta_path):
    manifest = write_manifest(
        tmp_path / "m.json", {STORE: digest(STORE), SPANFOLD: digest(SPANFOLD)}
    )
    before = list(sys.meta_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compiled.guard(str(manifest)) == []
    assert sys.meta_path == before


def test_a_changed_source_is_loaded_from_the_source_with_a_warning(tmp_path, meta_path):
    manifest = write_manifest(tmp_path / "m.json", {STORE: digest(STORE), SPANFOLD: "0" * 64})
    with pytest.warns(UserWarning, match="spanfold changed after it was compiled"):
        assert compiled.guard(str(manifest)) == [SPANFOLD]
    finder = sys.meta_path[0]
    assert isinstance(finder, compiled.SourceFirst)
    spec = finder.find_spec(SPANFOLD)
    assert spec.origin == compiled.source_path(SPANFOLD) and spec.origin.endswith(".py")
    # the store's source is unchanged, but the build's modules were compiled as one group
    # (whose code imports its members directly): the whole group runs from source
    assert finder.find_spec(STORE).origin == compiled.source_path(STORE)
    assert finder.find_spec("expr_tracker.history.cache") is None  # not in this manifest
    assert compiled.stale == [SPANFOLD, STORE]


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        json.dumps({"sources": ["a"]}),
        json.dumps({"sources": {"a": 1}}),
        json.dumps({"sources": {"os": "0" * 64}}),  # not the package's: never redirected
    ],
)
def test_a_broken_manifest_is_named_and_the_install_runs_as_it_is(tmp_path, meta_path, text):
    path = tmp_path / "m.json"
    path.write_text(text)
    before = list(sys.meta_path)
    with pytest.warns(UserWarning, match="m.json"):
        assert compiled.guard(str(path)) == []
    assert sys.meta_path == before
    with pytest.raises(ValueError, match="m.json"):
        compiled.read_build_manifest(str(path))


@pytest.mark.parametrize("name", ["os.path", "expr_tracker", "expr_tracker.../x", "x.y"])
def test_only_modules_of_the_package_have_a_source_path(name):
    with pytest.raises(ValueError, match="not a module of expr_tracker"):
        compiled.source_path(name)


def test_an_installed_build_with_an_edited_source_runs_it_at_import(tmp_path):
    """The whole path in a fresh process: an install whose manifest no longer matches the
    store's source imports that source (the guard runs before the store is imported) and
    ``et --version`` says so."""
    site = tmp_path / "site"
    shutil.copytree(
        ROOT / "expr_tracker",
        site / "expr_tracker",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    store_py = site / "expr_tracker" / "history" / "store.py"
    store_py.write_text(store_py.read_text() + "\nEDITED_AFTER_THE_BUILD = True\n")
    write_manifest(site / "expr_tracker" / "_compiled.json", {STORE: "0" * 64})
    code = (
        "import sys, expr_tracker\n"
        "from expr_tracker.history import store\n"
        "from expr_tracker.compiled import build_description\n"
        "print(store.EDITED_AFTER_THE_BUILD, [type(f).__name__ for f in sys.meta_path])\n"
        "print(build_description())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    p = subprocess.run(
        [sys.executable, "-P", "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    first, second = p.stdout.splitlines()
    assert first.startswith("True [") and "'SourceFirst'" in first
    assert second == f"from source since edited: {STORE}"
    assert "expr_tracker.history.store changed after it was compiled" in p.stderr
    assert p.stderr.count("changed after it was compiled") == 1
    # `et --version` says it in one line, however narrow the terminal (argparse's own
    # version action wrapped it at the terminal's width)
    v = subprocess.run(
        [sys.executable, "-P", "-m", "expr_tracker.cli.main", "--version"],
        capture_output=True,
        text=True,
        env={**env, "COLUMNS": "30"},
        cwd=tmp_path,
        timeout=120,
    )
    assert v.returncode == 0, v.stderr
    assert v.stdout.splitlines() == [f"expr_tracker {et.__version__} ({second})"]


def _project_copy(tmp_path: Path) -> Path:
    """The files a wheel is built from, copied (a build never touches the checkout)."""
    proj = tmp_path / "proj"
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.pyd")
    for name in ("expr_tracker", "hydra_plugins"):
        shutil.copytree(ROOT / name, proj / name, ignore=ignore)
    for name in ("pyproject.toml", "hatch_build.py", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, proj / name)
    return proj


def _wheel(proj: Path, out: Path, **env: str) -> subprocess.CompletedProcess:
    pytest.importorskip("hatchling")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    environ = {k: v for k, v in os.environ.items() if k != "ET_COMPILE"}
    return subprocess.run(
        [*cmd, "-w", str(out), str(proj)],
        capture_output=True,
        text=True,
        env={**environ, **env},
        timeout=300,
    )


@pytest.mark.slow
def test_without_et_compile_the_wheel_is_pure_python(tmp_path):
    import zipfile

    proj = _project_copy(tmp_path)
    p = _wheel(proj, tmp_path / "out")
    assert p.returncode == 0, p.stderr
    (wheel,) = (tmp_path / "out").glob("*.whl")
    assert wheel.name.endswith("-py3-none-any.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "expr_tracker/history/store.py" in names
    assert not [n for n in names if n.endswith((".so", ".pyd", "_compiled.json"))]


@pytest.mark.slow
@pytest.mark.parametrize(
    "setting, message",
    [
        ('compile = ["expr_tracker/history/nope.py"]', "no such module to compile"),
        ('compile = "expr_tracker/history/store.py"', "expected a list of module paths"),
    ],
)
def test_a_bad_compile_list_is_refused_by_name(tmp_path, setting, message):
    proj = _project_copy(tmp_path)
    text = (proj / "pyproject.toml").read_text()
    start = text.index("[tool.hatch.build.targets.wheel.hooks.custom]\ncompile = [")
    end = text.index("]\n", start + len("[tool.hatch.build.targets.wheel.hooks.custom]\n")) + 2
    (proj / "pyproject.toml").write_text(
        text[:start]
        + "[tool.hatch.build.targets.wheel.hooks.custom]\n"
        + setting
        + "\n"
        + text[end:]
    )
    p = _wheel(proj, tmp_path / "out", ET_COMPILE="1")
    assert p.returncode != 0
    assert message in p.stdout + p.stderr
