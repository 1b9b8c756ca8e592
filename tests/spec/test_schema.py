"""schemas/*.json are generated from the models (fresh), draft 7, and accept our YAML files."""

from __future__ import annotations

import json

import pytest
import yaml
from helpers import ROOT

from expr_tracker.cli.main import main
from expr_tracker.spec.schema import alerts_schema, render, run_spec_schema, stale_files, to_draft7

CONF = ROOT / "expr_tracker" / "conf" / "tracker"
GROUP_FILES = sorted(CONF.rglob("*.yaml"))


def test_checked_in_schemas_are_fresh():
    stale = stale_files(ROOT / "schemas")
    assert not stale, f"{stale} are stale: run `et schema` in the repository root"


def test_cli_check_and_write(tmp_path, capsys):
    assert main(["schema", "--check", "--out-dir", str(tmp_path)]) == 1
    assert main(["schema", "--out-dir", str(tmp_path)]) == 0
    assert main(["schema", "--check", "--out-dir", str(tmp_path)]) == 0
    (tmp_path / "alerts.schema.json").write_text("{}")
    assert main(["schema", "--check", "--out-dir", str(tmp_path)]) == 1
    assert "alerts.schema.json" in capsys.readouterr().err


def _no_2020_keywords(node):
    if isinstance(node, dict):
        assert "$defs" not in node and "prefixItems" not in node
        if "$ref" in node:
            assert node["$ref"].startswith("#/definitions/")
            assert len(node) == 1, node  # draft 7 ignores siblings of $ref
        for v in node.values():
            _no_2020_keywords(v)
    elif isinstance(node, list):
        for v in node:
            _no_2020_keywords(v)


@pytest.mark.parametrize("schema", [run_spec_schema(), alerts_schema()])
def test_draft7_shape(schema):
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    _no_2020_keywords(schema)
    for name in json.dumps(schema).split('"#/definitions/')[1:]:
        assert name.split('"')[0] in schema["definitions"]


def test_to_draft7_converts_refs_with_siblings():
    out = to_draft7({"$defs": {"A": {}}, "properties": {"a": {"$ref": "#/$defs/A", "default": 1}}})
    assert out == {
        "definitions": {"A": {}},
        "properties": {"a": {"allOf": [{"$ref": "#/definitions/A"}], "default": 1}},
    }


def test_render_is_deterministic():
    assert render() == render()


@pytest.mark.parametrize("path", GROUP_FILES, ids=lambda p: str(p.relative_to(CONF)))
def test_group_files_carry_package_and_schema_comment(path):
    lines = path.read_text().splitlines()
    assert lines[0] == "# @package tracker"
    assert lines[1].startswith("# yaml-language-server: $schema=")
    target = (path.parent / lines[1].split("$schema=", 1)[1]).resolve()
    assert target == ROOT / "schemas" / "run-spec.schema.json"


jsonschema = pytest.importorskip("jsonschema")


@pytest.mark.parametrize("path", GROUP_FILES, ids=lambda p: str(p.relative_to(CONF)))
def test_group_files_validate_against_schema(path):
    validator = jsonschema.Draft7Validator(run_spec_schema())
    errors = [e.message for e in validator.iter_errors(yaml.safe_load(path.read_text()))]
    assert not errors


def test_schemas_are_valid_draft7_and_reject_bad_values():
    for schema in (run_spec_schema(), alerts_schema()):
        jsonschema.Draft7Validator.check_schema(schema)
    run = jsonschema.Draft7Validator(run_spec_schema())
    assert not run.is_valid({"history": {"buffer": {"size": 0}}})
    assert not run.is_valid({"history": {"bufer": {}}})
    assert run.is_valid({"history": {"buffer": {"interval": "500ms"}, "cache": {"bytes": "1GiB"}}})
    assert run.is_valid({"alerts": {"rules": {"a": {"condition": "loss > 1"}, "b": None}}})
    assert run.is_valid({"alerts": {"rules": ["loss > 1 => error: x"]}})
    assert run.is_valid({"spans": {"plugins": ["cpu_time", {"type": "gpu_stats"}]}})
    alerts = jsonschema.Draft7Validator(alerts_schema())
    assert alerts.is_valid({"rules": {"a": {"condition": "x > 1", "level": "error"}}})
    assert alerts.is_valid({"alerts": {"channels": {"ops": {"type": "slack", "url": "u"}}}})
    assert not alerts.is_valid({"alerts": {}, "other": 1})
