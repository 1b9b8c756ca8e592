"""docs/coming-from-wandb.md lists the wandb calls of a first hour with what to do instead; what
it says of each (works / missing) is what `import expr_tracker as wandb` does."""

from __future__ import annotations

import re

from helpers import ROOT

import expr_tracker as et

DOC = ROOT / "docs" / "coming-from-wandb.md"
SECTION = "### Calls of a first hour, and what to do instead"
#: the calls the section must cover (issue 23)
REQUIRED = {"run.log_code", "run.mark_preempting", "wandb.unwatch", "wandb.plot"}


def _rows() -> dict[str, str]:
    """``{call: "works"|"missing"}`` from the section's table (each `code` name of the first
    column, without arguments; `wandb.plot.line/...` counts as `wandb.plot`)."""
    text = DOC.read_text(encoding="utf-8")
    assert SECTION in text, f"{DOC.name} lacks the section {SECTION!r}"
    body = text.split(SECTION, 1)[1].split("\n#", 1)[0]
    out: dict[str, str] = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[1] not in ("works", "missing"):
            continue
        for code in re.findall(r"`([^`]+)`", cells[0]):
            name = code.split("(")[0]
            if name.startswith("wandb.plot"):
                name = "wandb.plot"
            out[name] = cells[1]
    return out


def _exists(name: str, run) -> bool:
    owner, _, attr = name.partition(".")
    return hasattr(run if owner == "run" else et, attr)


def test_the_section_covers_the_calls_and_says_the_truth(tmp_path):
    rows = _rows()
    assert REQUIRED <= set(rows), REQUIRED - set(rows)
    run = et.init(project="p", name="r", dir=str(tmp_path))
    try:
        wrong = {n: said for n, said in rows.items() if _exists(n, run) != (said == "works")}
    finally:
        et.finish()
    assert not wrong, f"{DOC.name} says otherwise than the API does: {wrong}"
