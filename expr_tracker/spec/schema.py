"""JSON Schemas of the YAML files, from the models (``et schema`` writes them).

Two files are generated from the Pydantic models of ``expr_tracker.spec``:

- ``run-spec.schema.json``: a whole run spec (``RunSpec``) — ``ET_CONFIG`` files, files given
  to ``et.init(spec=...)`` and the files of the Hydra ``tracker`` config group.
- ``alerts.schema.json``: an alerts file (``ET_ALERT_CONFIG``, ``et rules check``): the
  ``alerts`` section itself, or a mapping whose only key is ``alerts``.

Editors (yaml-language-server) validate and complete a YAML file that starts with
``# yaml-language-server: $schema=<path>``. yaml-language-server documents JSON Schema
draft 7 while Pydantic emits 2020-12, so the output is converted: ``$defs`` becomes
``definitions``, a ``$ref`` with sibling keywords is wrapped in ``allOf``, and the named lists
``alerts.rules``/``alerts.channels`` also accept their ``{name: entry}`` mapping form (what
Hydra rule sets use), as the models do.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

DRAFT7 = "http://json-schema.org/draft-07/schema#"
#: file name -> builder; the order ``et schema`` writes them in
SCHEMA_FILES = ("run-spec.schema.json", "alerts.schema.json")


# ------------------------------------------------------------------ conversion


def to_draft7(schema: dict[str, Any]) -> dict[str, Any]:
    """Convert a Pydantic (JSON Schema 2020-12) schema into draft 7.

    ``$defs`` -> ``definitions`` (and every ``#/$defs/`` reference), a ``$ref`` with sibling
    keywords -> ``allOf: [{$ref}]`` plus the siblings (draft 7 ignores siblings of ``$ref``),
    ``prefixItems`` -> array-form ``items``, a one-member ``oneOf``/``anyOf`` inlined.
    Returns a new dict; ``schema`` is not changed.
    """

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(v) for v in node]
        if not isinstance(node, dict):
            return node
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "$defs":
                out["definitions"] = {k: walk(v) for k, v in value.items()}
            elif key == "$ref" and isinstance(value, str):
                out["$ref"] = value.replace("#/$defs/", "#/definitions/")
            elif key == "prefixItems":
                out["items"] = walk(value)
            else:
                out[key] = walk(value)
        for key in ("oneOf", "anyOf"):
            members = out.get(key)
            if isinstance(members, list) and len(members) == 1 and isinstance(members[0], dict):
                del out[key]
                inner = members[0]
                if set(inner) & set(out):
                    out.setdefault("allOf", []).append(inner)
                else:
                    out.update(inner)
        if "$ref" in out and len(out) > 1:
            ref = out.pop("$ref")
            out["allOf"] = [{"$ref": ref}, *out.get("allOf", [])]
        return out

    return walk(copy.deepcopy(schema))


def _named_mapping_form(schema: dict[str, Any]) -> None:
    """``alerts.rules``/``alerts.channels`` accept a list or ``{name: entry-or-null}``;
    ``spans.plugins`` items may be a plugin name. Edits ``schema`` (draft 7) in place."""
    defs = schema["definitions"]
    alerts = defs["AlertsSpec"]["properties"]
    for key, entry in (
        ("rules", {"anyOf": [{"type": "string", "minLength": 1}, _optional_name("RuleSpec")]}),
        ("channels", _optional_name("ChannelSpec")),
    ):
        listed = alerts[key]
        description = listed.pop("description", None)
        title = listed.pop("title", None)
        alerts[key] = {
            "anyOf": [
                listed,
                {
                    "type": "object",
                    "additionalProperties": {"anyOf": [entry, {"type": "null"}]},
                    "description": "name -> entry; null removes an entry given earlier",
                },
            ],
            **({"title": title} if title else {}),
            **({"description": description} if description else {}),
        }
    plugins = defs["SpansSpec"]["properties"]["plugins"]
    item = plugins.get("items", {})
    plugins["items"] = {
        "anyOf": [item, {"type": "string", "minLength": 1, "description": "a plugin type name"}]
    }


def _optional_name(model: str) -> dict[str, Any]:
    """A reference to ``model`` (its ``name`` comes from the mapping key)."""
    return {"$ref": f"#/definitions/{model}"}


def run_spec_schema() -> dict[str, Any]:
    """The draft-7 JSON Schema of a whole run spec (``RunSpec``), as a dict."""
    from expr_tracker.spec import RunSpec

    raw = RunSpec.model_json_schema(mode="validation")
    schema = to_draft7(raw)
    _named_mapping_form(schema)
    return {
        "$schema": DRAFT7,
        "$id": "https://expr-tracker.invalid/schemas/run-spec.schema.json",
        "title": "expr_tracker run spec",
        **{k: v for k, v in schema.items() if k not in ("title",)},
    }


def alerts_schema() -> dict[str, Any]:
    """The draft-7 JSON Schema of an alerts file: the ``alerts`` section, or ``{alerts: ...}``."""
    full = run_spec_schema()
    defs = full["definitions"]
    return {
        "$schema": DRAFT7,
        "$id": "https://expr-tracker.invalid/schemas/alerts.schema.json",
        "title": "expr_tracker alerts file",
        "description": "The alerts section of a run spec, or a mapping with only an `alerts` key.",
        "definitions": defs,
        "anyOf": [
            {"$ref": "#/definitions/AlertsSpec"},
            {
                "type": "object",
                "properties": {"alerts": {"$ref": "#/definitions/AlertsSpec"}},
                "required": ["alerts"],
                "additionalProperties": False,
            },
        ],
    }


def render() -> dict[str, str]:
    """File name -> file text (sorted keys, 2-space indent, trailing newline) of every schema."""
    builders = {"run-spec.schema.json": run_spec_schema, "alerts.schema.json": alerts_schema}
    return {
        name: json.dumps(builders[name](), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        for name in SCHEMA_FILES
    }


def stale_files(out_dir: str | Path) -> list[str]:
    """Names of the schema files under ``out_dir`` that are missing or differ from ``render()``."""
    out = Path(out_dir)
    stale = []
    for name, text in render().items():
        path = out / name
        try:
            current = path.read_text(encoding="utf-8")
        except OSError:
            current = None
        if current != text:
            stale.append(name)
    return stale


def write(out_dir: str | Path) -> list[Path]:
    """Write every schema into ``out_dir`` (created if needed); returns the paths written.

    Raises:
        OSError: the directory or a file cannot be written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in render().items():
        path = out / name
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths
