"""Every Python and shell code block in docs/ and README.md runs.

Blocks fenced as ``python``/``py`` or ``bash``/``sh``/``shell`` run in document order, one
fresh subprocess per document, in a fresh temporary working directory that holds links to the
repository's ``examples/``, ``conf/`` and ``schemas/``: Python blocks share one namespace
(like a reader pasting them into one session), shell blocks run with ``bash -e`` and the
interpreter's ``bin/`` first on PATH (so ``et`` and ``python`` are this environment's).

A block is excluded only with a stated reason, on the line before its fence (blank lines
between are allowed)::

    <!-- skip-test: needs a CUDA device -->

A marker without a reason is an error. Other languages (yaml, text, none) are not run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import ROOT

DOCS = sorted([*(ROOT / "docs").glob("*.md"), ROOT / "README.md"])
RUN_LANGS = {"python": "python", "py": "python", "bash": "shell", "sh": "shell", "shell": "shell"}
SKIP = re.compile(r"^<!--\s*skip-test:(?P<reason>.*?)-->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)")
TIMEOUT_S = 300


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str  # "python" | "shell" | other
    code: str
    skip: str | None  # the reason, when excluded


def parse_blocks(path: Path) -> list[Block]:
    """Fenced code blocks of a Markdown file, with their skip reasons.

    Raises:
        ValueError: a ``skip-test`` marker without a reason, or an unclosed fence.
    """
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent, lang = m["fence"], len(m["indent"]), m["lang"].lower()
        start = i
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][indent:] if lines[i][:indent].isspace() else lines[i])
            i += 1
        if i >= len(lines):
            raise ValueError(f"{path}:{start + 1}: unclosed code fence")
        i += 1
        skip = None
        j = start - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        if j >= 0:
            s = SKIP.match(lines[j].strip())
            if s:
                skip = s["reason"].strip()
                if not skip:
                    raise ValueError(f"{path}:{j + 1}: skip-test needs a reason")
        blocks.append(Block(path, start + 1, RUN_LANGS.get(lang, lang), "\n".join(body), skip))
    return blocks


DRIVER = textwrap.dedent(
    """
    import json, subprocess, sys, traceback
    blocks = json.load(open(sys.argv[1]))
    ns = {"__name__": "__main__"}
    for b in blocks:
        where = f"{b['path']}:{b['line']}"
        if b["lang"] == "python":
            try:
                # padded so a traceback shows the line number in the Markdown file
                exec(compile(chr(10) * b["line"] + b["code"], b["path"], "exec"), ns)
            except SystemExit as e:
                if e.code not in (0, None):
                    print(f"BLOCK FAILED {where}: SystemExit({e.code})", file=sys.stderr)
                    sys.exit(1)
            except BaseException:
                traceback.print_exc()
                print(f"BLOCK FAILED {where}", file=sys.stderr)
                sys.exit(1)
        else:
            sys.stdout.flush()
            rc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", b["code"]]).returncode
            if rc != 0:
                print(f"BLOCK FAILED {where}: exit {rc}", file=sys.stderr)
                sys.exit(1)
    """
)


def _runnable(path: Path) -> list[Block]:
    return [b for b in parse_blocks(path) if b.lang in ("python", "shell")]


#: docs whose blocks take about a second or more (Hydra apps, subprocesses): marked slow
SLOW_DOCS = {
    "alerts.md",
    "artifacts.md",
    "channels.md",
    "cli.md",
    "coming-from-wandb.md",
    "compare.md",
    "export.md",
    "getting-started.md",
    "history.md",
    "hydra.md",
    "integrations.md",
    "mirrors.md",
    "plot.md",
    "query.md",
    "runs.md",
    "streams.md",
    "ui.md",
}


@pytest.mark.parametrize(
    "path",
    [pytest.param(p, marks=pytest.mark.slow) if p.name in SLOW_DOCS else p for p in DOCS],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_doc_blocks_run(path: Path, tmp_path: Path) -> None:
    blocks = _runnable(path)
    to_run = [b for b in blocks if b.skip is None]
    if not to_run:
        pytest.skip("no runnable blocks" if not blocks else "every block skipped with a reason")
    work = tmp_path / "cwd"
    work.mkdir()
    # copies, not links: a block may write into them (docs/hydra.md creates conf/config.yaml)
    for name in ("examples", "conf", "schemas"):
        if (ROOT / name).exists():
            shutil.copytree(ROOT / name, work / name, ignore=shutil.ignore_patterns("__pycache__"))
    spec = tmp_path / "blocks.json"
    rel = str(path.relative_to(ROOT))
    spec.write_text(
        json.dumps([{"path": rel, "line": b.line, "lang": b.lang, "code": b.code} for b in to_run])
    )
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("ET_", "WEBHOOK_")) and k != "RANK"
    }
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["MPLBACKEND"] = "Agg"
    proc = subprocess.run(
        [sys.executable, str(driver), str(spec)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, (
        f"{rel}: a code block failed\n--- stdout ---\n{proc.stdout[-4000:]}"
        f"\n--- stderr ---\n{proc.stderr[-4000:]}"
    )


def test_parser_reads_fences_and_reasons(tmp_path: Path) -> None:
    doc = tmp_path / "d.md"
    doc.write_text(
        "text\n```python\nx = 1\n```\n\n<!-- skip-test: needs a GPU -->\n\n```bash\nnvidia-smi\n```\n"
        "```yaml\na: 1\n```\n"
    )
    blocks = parse_blocks(doc)
    assert [(b.lang, b.line, b.skip) for b in blocks] == [
        ("python", 2, None),
        ("shell", 8, "needs a GPU"),
        ("yaml", 11, None),
    ]
    doc.write_text("<!-- skip-test: -->\n```python\nx\n```\n")
    with pytest.raises(ValueError, match="needs a reason"):
        parse_blocks(doc)


def test_every_skip_states_a_reason() -> None:
    for path in DOCS:
        for block in parse_blocks(path):  # raises on a marker without a reason
            assert block.skip is None or len(block.skip) >= 5, f"{path}:{block.line}"
