"""docs/architecture.md "Module map" is the one map of the package, and the reasons live in
the repository (docs/architecture.md "One home per concept").

- Every module of ``expr_tracker`` has its line in the map (a package's line stands for its
  ``__init__.py``), and every path the map lists exists.
- Docstrings, comments, tests and docs cite the ``docs/`` section that explains a behaviour;
  a cited section exists, and nothing cites a file a reader of this repository cannot open.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from helpers import ROOT

ARCHITECTURE = ROOT / "docs" / "architecture.md"
#: where an entry's name ends and its description begins (continuation lines start here)
DESCRIPTION_COLUMN = 21


def map_entries() -> list[str]:
    """The paths the module map lists, relative to the repository (``expr_tracker/history/``,
    ``expr_tracker/history/store.py``), in order."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text.split("## Module map", 1)[1]
    block = section.split("```", 2)[1]
    entries: list[str] = []
    stack: list[tuple[int, str]] = []  # (indent, folder path)
    for line in block.splitlines()[1:]:
        indent = len(line) - len(line.lstrip(" "))
        if not line.strip() or indent >= DESCRIPTION_COLUMN - 1:
            continue  # a description's continuation
        name = line.split()[0]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = (stack[-1][1] if stack else "") + name
        entries.append(path)
        if name.endswith("/"):
            stack.append((indent, path))
    return entries


def package_modules() -> set[str]:
    """Every module of the package as the map names it: a ``.py`` file, or a package's
    folder for its ``__init__.py``."""
    out = set()
    for path in (ROOT / "expr_tracker").rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        out.add(rel[: -len("__init__.py")] if path.name == "__init__.py" else rel)
    return out


def test_the_map_is_read():
    entries = map_entries()
    assert "expr_tracker/" in entries and "expr_tracker/history/store.py" in entries
    assert "expr_tracker/alerts/delivery/channels/webhook.py" in entries
    assert "tests/" in entries


def test_every_module_is_on_the_map():
    listed = set(map_entries())
    missing = sorted(package_modules() - listed)
    assert not missing, "modules missing from docs/architecture.md:\n" + "\n".join(missing)


def test_every_path_on_the_map_exists():
    entries = map_entries()
    gone = [p for p in entries if not (ROOT / p).exists()]
    assert not gone, "docs/architecture.md lists paths that do not exist:\n" + "\n".join(gone)
    twice = sorted({p for p in entries if entries.count(p) > 1})
    assert not twice, f"listed twice: {twice}"


# ------------------------------------------------------------------ reasons in the repo

#: files that are not part of this repository (design notes, the behavioural spec): a
#: citation of one is a reason a reader cannot follow
OUTSIDE = ("DESIGN" + ".md", "spans" + ".txt", "design" + ".txt", "shared" + "/", "STYLE" + ".md")
#: a citation: docs/<page>.md "Section" (or several sections, comma-separated)
CITATION = re.compile(
    r'docs/([\w-]+\.md)[,:]?(?:\s+|\s*\()((?:"[^"\n]{1,80}"(?:,\s*|\s+and\s+)?)+)'
)


def _tracked() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "expr_tracker", "tests", "docs", "README.md"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [ROOT / p for p in out if p.endswith((".py", ".md", ".lark", ".yaml", ".txt"))]


def _headings() -> dict[str, list[str]]:
    out = {}
    for page in (ROOT / "docs").glob("*.md"):
        text = page.read_text(encoding="utf-8")
        out[page.name] = [
            m.group(1).replace("`", "").strip() for m in re.finditer(r"^#{1,6}\s+(.+)$", text, re.M)
        ]
    return out


def test_nothing_cites_a_file_outside_the_repository():
    found = []
    for path in _tracked():
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if any(name in line for name in OUTSIDE):
                found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not found, "cite the docs/ section instead:\n" + "\n".join(found)


def test_every_cited_section_exists():
    headings = _headings()
    bad = []
    for path in _tracked():
        text = path.read_text(encoding="utf-8")
        flat = re.sub(r"\n\s*(?:#:?|//)?\s*", " ", text)  # a citation may wrap
        for m in CITATION.finditer(flat):
            page = m.group(1)
            for section in re.findall(r'"([^"]+)"', m.group(2)):
                title = section.replace("`", "").strip()
                if not any(h == title or h.startswith(title) for h in headings.get(page, ())):
                    bad.append(f"{path.relative_to(ROOT)}: docs/{page} {section!r}")
    assert not bad, "citations of sections that do not exist:\n" + "\n".join(bad)
