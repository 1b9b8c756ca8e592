"""How a logged value is handed on: as JSON for another reader, flattened, or for people.

The one home of these forms (docs/architecture.md "One home per concept"):

- ``json_safe(value, nonfinite)``: ``value`` as JSON data for a reader that takes no
  ``NaN``/``Infinity`` tokens, non-finite floats written the ``nonfinite`` way:
  ``"null"`` (strict JSON: the CLI's ``--format json|jsonl``) or ``"string"`` (the strings
  ``"NaN"``, ``"Infinity"``, ``"-Infinity"``: the dashboard's answers, trace arguments).
- ``json_text(value, nonfinite="token")``: compact one-line JSON text; ``"token"`` writes
  ``NaN``/``Infinity``/``-Infinity`` as our own files do.
- ``flatten(value)``: nested mappings -> ``{("model", "depth"): 3, ...}``.
- ``format_value(value, style)``: a value for people, in the style of a table cell, a rule
  message's ``{expr}`` or an alert's fields.

Pure functions of their arguments; they import nothing of the project.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["NONFINITE", "flatten", "format_value", "json_safe", "json_text", "media_label"]

#: the ways a JSON dialect writes NaN, inf and -inf (docs/architecture.md "One home per
#: concept": JSON dialects)
NONFINITE = ("token", "null", "string")


def _as_string(v: float) -> str:
    return "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")


def _as_null(v: float) -> None:
    return None


def json_safe(value: Any, nonfinite: str) -> Any:
    """``value`` with every non-finite float (NaN, ±inf) replaced, recursively through
    lists, tuples and mappings (tuples become lists, keys strings).

    ``nonfinite``: ``"null"`` (None: strict JSON that ``jq`` and any RFC 8259 parser takes,
    losing which non-finite value it was) or ``"string"`` (``"NaN"``, ``"Infinity"``,
    ``"-Infinity"``: strict JSON that keeps it, for a browser). ``"token"`` (our files'
    dialect) leaves the floats as they are: :func:`json_text` writes them.

    Raises:
        ValueError: an unknown ``nonfinite``.
    """
    if nonfinite == "token":
        return value
    if nonfinite == "null":
        return _replace(value, _as_null)
    if nonfinite == "string":
        return _replace(value, _as_string)
    raise ValueError(f"nonfinite={nonfinite!r}: one of {', '.join(NONFINITE)}")


def _replace(value: Any, how: Any) -> Any:
    t = type(value)
    if t is float:
        return value if value - value == 0.0 else how(value)
    if t is dict or isinstance(value, Mapping):
        return {k if type(k) is str else str(k): _replace(x, how) for k, x in value.items()}
    if t is list or t is tuple:
        return [_replace(x, how) for x in value]
    if isinstance(value, float):  # a float subclass (numpy.float64)
        return value if math.isfinite(value) else how(value)
    return value


def json_text(value: Any, nonfinite: str = "token") -> str:
    """Compact one-line JSON text of ``value`` (non-ASCII kept; a value JSON cannot hold as
    its ``str()``), non-finite floats written the ``nonfinite`` way (see :func:`json_safe`;
    ``"token"``: ``NaN``/``Infinity``/``-Infinity``, as our files write them)."""
    return json.dumps(
        json_safe(value, nonfinite), separators=(",", ":"), ensure_ascii=False, default=str
    )


def flatten(value: Any, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Nested mappings -> ``{("model", "depth"): 3, ...}``: one entry per leaf; a list, a
    scalar or an empty mapping below the top is a leaf (an empty top gives ``{}``). The key
    is a tuple, so ``{"a.b": 1}`` and ``{"a": {"b": 1}}`` stay two keys (both shown as
    ``a.b``: join them with ``"."``, first one kept, where one column per name is needed)."""
    out: dict[tuple[str, ...], Any] = {}
    if isinstance(value, Mapping) and (value or not prefix):
        for k, v in value.items():
            out.update(flatten(v, (*prefix, str(k))))
    else:
        out[prefix] = value
    return out


def dotted(d: Mapping[str, Any]) -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (:func:`flatten`, names joined by ``"."``; of
    two keys that read the same, ``{"a.b": 1}`` and ``{"a": {"b": 2}}``, the first is
    kept). Not a mapping: ``{}``."""
    out: dict[str, Any] = {}
    if not isinstance(d, Mapping):
        return out
    for key, value in flatten(d).items():
        out.setdefault(".".join(key), value)
    return out


#: the styles of :func:`format_value`
STYLES = ("plain", "cell", "rule")


def _is_image(v: Any) -> bool:
    return isinstance(v, dict) and v.get("_type") == "image"


def media_label(ref: dict[str, Any]) -> str:
    """A media reference for a table cell (docs/media.md): ``<image 64x64>``,
    ``<histogram 64 bins>``, ``<table 10x3>``; another ``_type`` as ``<TYPE>``."""
    kind = str(ref.get("_type"))[:40]
    if kind == "image":
        return f"<image {ref.get('width')}x{ref.get('height')}>"
    if kind == "histogram":
        n = ref.get("num_bins")  # older runs: the counts themselves in the row
        if not isinstance(n, int) or isinstance(n, bool):
            values = ref.get("values")
            n = len(values) if isinstance(values, list) else "?"
        return f"<histogram {n} bins>"
    if kind == "table":
        return f"<table {ref.get('nrows')}x{ref.get('ncols')}>"
    return f"<{kind}>"


def format_value(value: Any, style: str = "plain") -> str:
    """``value`` for people; floats to 6 significant digits in every style.

    - ``"plain"``: anything else as ``str()`` (an alert's fields in a channel's message).
    - ``"cell"``: a table cell of the CLI: None empty, lists and dicts as compact strict
      JSON (NaN and ±inf as ``null``).
    - ``"rule"``: as ``{expr}`` reads in a rule's message: None (no value yet) ``UNKNOWN``,
      booleans ``true``/``false`` (docs/alerts.md "Message templates").

    Raises:
        ValueError: an unknown ``style``.
    """
    if isinstance(value, float):
        return f"{value:.6g}"
    if style == "plain":
        return str(value)
    if style == "cell":
        if value is None:
            return ""
        if isinstance(value, dict) and isinstance(value.get("_type"), str):
            return media_label(value)
        if isinstance(value, list) and value and all(_is_image(v) for v in value):
            return f"<{len(value)} images>"
        if isinstance(value, (list, dict)):
            return json.dumps(json_safe(value, "null"), separators=(",", ":"), default=str)
        return str(value)
    if style == "rule":
        if value is None:
            return "UNKNOWN"
        if value is True or value is False:
            return "true" if value else "false"
        return str(value)
    raise ValueError(f"style={style!r}: one of {', '.join(STYLES)}")
