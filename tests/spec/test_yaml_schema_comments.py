"""Every YAML file shipped in conf/ and examples/ names its JSON Schema for editors."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from helpers import ROOT

FILES = sorted(
    p
    for folder in ("conf", "examples", "expr_tracker/conf")
    for p in (ROOT / folder).rglob("*.y*ml")
)
COMMENT = re.compile(r"^# yaml-language-server: \$schema=(\S+)$", re.MULTILINE)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_yaml_names_an_existing_schema(path):
    head = "\n".join(path.read_text().splitlines()[:3])
    m = COMMENT.search(head)
    assert m, f"{path.relative_to(ROOT)} lacks the yaml-language-server $schema comment"
    schema = (path.parent / m.group(1)).resolve()
    assert schema.is_file(), f"{path.relative_to(ROOT)} points at a missing {m.group(1)}"
    json.loads(schema.read_text())


def test_example_alerts_file_validates_against_its_schema():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / "schemas" / "alerts.schema.json").read_text())
    data = yaml.safe_load((ROOT / "examples" / "alerts.yaml").read_text())
    jsonschema.validate(data, schema)


def test_there_are_yaml_files_to_check():
    assert len(FILES) >= 9
