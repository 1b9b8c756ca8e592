"""The README's command block runs with what the README's main-job install line installs, and
a bare install (the core alone) runs the commands that need no extra while the others name
the extra to install.

Each `et ...` line of the README's "Command line" block runs in a fresh interpreter over real
runs, where every package the install would not have is made absent: a finder on
`sys.meta_path` answers their imports with `ModuleNotFoundError`, as for a package not
installed. Which packages an install has is read from the installed metadata: the
dependencies of expr-tracker's core and of the extras on the README's install line, with
their own dependencies (markers evaluated); the absent ones are those only the other extras
bring. So what each command needs is found by running it, not listed by hand.
"""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from importlib import metadata
from pathlib import Path

import pytest
from helpers import ROOT

requirements = pytest.importorskip("packaging.requirements")
from packaging.utils import canonicalize_name  # noqa: E402

pytestmark = pytest.mark.slow

README = (ROOT / "README.md").read_text(encoding="utf-8")
PYPROJECT = ROOT / "pyproject.toml"

#: the commands a bare install must refuse, each naming its extra (README's own words)
NEED_EXTRAS = {"query": "query", "export": "query", "plot": "plot", "ui": "ui"}


#: options that make a core command need an extra: et compare's statistics (numpy, duckdb)
NEED_EXTRAS_WITH = {("compare", "--group-by"): "query", ("compare", "--sweep"): "query"}


def needs_extra(command: list[str]) -> str | None:
    """The extra a README command needs (None: the core runs it)."""
    for (sub, option), extra in NEED_EXTRAS_WITH.items():
        if command[1] == sub and option in command:
            return extra
    return NEED_EXTRAS.get(command[1])


def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)


def readme_install_extras() -> list[str]:
    """The extras of the main-job install line (`pip install -e '.[a,b]'` in the block that
    runs examples/train_digits.py)."""
    (block,) = [b for b in _bash_blocks(README) if "examples/train_digits.py" in b]
    m = re.search(r"pip install -e '\.\[([^\]]*)\]'", block)
    assert m, f"no `pip install -e '.[...]'` in the main-job block:\n{block}"
    return [e.strip() for e in m.group(1).split(",") if e.strip()]


def readme_commands() -> list[list[str]]:
    """The README command block's `et` lines, as argv lists (comments dropped)."""
    start = README.index("Command line")
    (block,) = _bash_blocks(README[start:])[:1]
    lines = [shlex.split(line, comments=True) for line in block.splitlines()]
    return [argv for argv in lines if argv and argv[0] == "et"]


def _project_requirements() -> tuple[list[str], dict[str, list[str]]]:
    import tomllib

    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    return project["dependencies"], project["optional-dependencies"]


def _closure(reqs: list[str]) -> set[str]:
    """Canonical names of the distributions `reqs` installs, with their dependencies (only
    those installed here: the ones a marker leaves out are not)."""
    seen: set[str] = set()
    todo = [(requirements.Requirement(r), ()) for r in reqs]
    while todo:
        req, extras = todo.pop()
        if req.marker is not None and not any(
            req.marker.evaluate({"extra": e}) for e in (extras or ("",))
        ):
            continue
        name = canonicalize_name(req.name)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            continue
        key = (name, tuple(sorted(req.extras)))
        if key in seen:
            continue
        seen.add(key)
        for sub in dist.requires or ():
            todo.append((requirements.Requirement(sub), tuple(req.extras)))
    return {name for name, _ in seen}


def absent_modules(extras: list[str]) -> set[str]:
    """Top-level modules of the distributions the extras of this project install beyond
    `extras` (and the core); a module another kept distribution also provides stays."""
    core, optional = _project_requirements()
    kept = _closure(core + [r for e in extras for r in optional[e]])
    everything = _closure(core + [r for reqs in optional.values() for r in reqs])
    gone = everything - kept
    out = set()
    for module, dists in metadata.packages_distributions().items():
        names = {canonicalize_name(d) for d in dists}
        if names and names <= gone:
            out.add(module)
    return out


RUNNER = """
import sys
ABSENT = frozenset(sys.argv[1].split(","))

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
from expr_tracker.cli.main import main
sys.argv = ["et", *sys.argv[2:]]
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def workdir(tmp_path):
    """runs/digits/{a,b}: two finished runs shaped like the main job's (train/loss, eval/acc,
    spans), written by a real et.init in a subprocess; a folder per test, as the commands
    write files (exported/, trace.json)."""
    base = tmp_path
    code = (
        "import expr_tracker as et\n"
        "for name, lr in (('a', 0.1), ('b', 0.2)):\n"
        "    et.init(project='digits', name=name, config={'lr': lr})\n"
        "    for step in range(20):\n"
        "        with et.span('step'):\n"
        "            pass\n"
        "        et.log({'train/loss': 1.0 / (step + 1) + lr, 'eval/acc': step / 20})\n"
        "    et.finish()\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=base, check=True, timeout=120)
    return base


def _argv(command: list[str]) -> list[str]:
    names = {"<name>": "a", "<name-a>": "a", "<name-b>": "b"}
    out = []
    for arg in command[1:]:
        for k, v in names.items():
            arg = arg.replace(k, v)
        out.append(arg)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_command(command: list[str], absent: set[str], cwd: Path) -> tuple[int, str, str]:
    """Run one README command with `absent` packages missing; `et ui` is stopped once it
    serves its page (rc 0 then)."""
    argv = [sys.executable, "-c", RUNNER, ",".join(sorted(absent)), *_argv(command)]
    if command[1] != "ui":
        p = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=240)
        return p.returncode, p.stdout, p.stderr
    argv += ["--port", str(_free_port())]
    # et ui prints its link on stderr, then serves until stopped
    p = subprocess.Popen(
        argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    watchdog = threading.Timer(240, p.kill)  # never hang the suite on a silent server
    watchdog.start()
    seen = []
    try:
        for line in p.stderr:
            seen.append(line)
            m = re.search(r"http://127\.0\.0\.1:\d+/\S*", line)
            if m:
                return _served(m.group(0), p), line, ""
        p.wait(timeout=60)
        return p.returncode, "", "".join(seen)
    finally:
        watchdog.cancel()
        p.kill()
        p.wait(timeout=60)
        p.stderr.close()


#: loopback only: never through a proxy from the environment; the login link sets a cookie
#: and redirects to the page, which needs it
NO_PROXY = urllib.request.build_opener(
    urllib.request.ProxyHandler({}), urllib.request.HTTPCookieProcessor()
)


def _served(url: str, p: subprocess.Popen) -> int:
    """0 once the page at ``url`` answers 200 (the server may still be starting), else 1."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None:
        try:
            with NO_PROXY.open(url, timeout=10) as r:
                return 0 if r.status == 200 else 1
        except OSError:
            time.sleep(0.2)
    return 1


def test_the_readme_lists_the_commands_and_the_install():
    commands = readme_commands()
    subcommands = [c[1] for c in commands]
    assert set(NEED_EXTRAS) <= set(subcommands), subcommands
    assert {"examples", *NEED_EXTRAS.values()} <= set(readme_install_extras())
    core, optional = _project_requirements()
    # a bare install is the core alone: no extra's package moved into the core
    core_names = {canonicalize_name(requirements.Requirement(r).name) for r in core}
    for extra in set(NEED_EXTRAS.values()):
        names = {canonicalize_name(requirements.Requirement(r).name) for r in optional[extra]}
        assert not names & core_names, (extra, names & core_names)


def test_every_command_runs_with_the_readme_install(workdir):
    absent = absent_modules(readme_install_extras())
    assert "wandb" in absent and "duckdb" not in absent  # the finder has something to do
    failed = {}
    for command in readme_commands():
        rc, out, err = run_command(command, absent, workdir)
        if rc != 0:
            failed[" ".join(command)] = err.strip()[-600:]
    assert not failed, json.dumps(failed, indent=1)


def test_a_bare_install_runs_the_core_commands_and_names_the_extra_for_the_rest(workdir):
    absent = absent_modules([])
    assert {"duckdb", "pyarrow", "plotext", "starlette"} <= absent
    wrong = {}
    for command in readme_commands():
        rc, out, err = run_command(command, absent, workdir)
        extra = needs_extra(command)
        if extra is None and rc != 0:
            wrong[" ".join(command)] = f"rc {rc}: {err.strip()[-400:]}"
        elif extra is not None and (rc == 0 or f"expr-tracker[{extra}]" not in err):
            wrong[" ".join(command)] = f"rc {rc}, no expr-tracker[{extra}] in: {err[-400:]}"
    assert not wrong, json.dumps(wrong, indent=1)
