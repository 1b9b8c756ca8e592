"""Message templates: ``{name}`` placeholders filled by literal key, and nothing else.

Used by rule messages (``{step} {run} {loss:.4f} {expr}``, docs/alerts.md "Message templates")
and by the
generic webhook's body template. A placeholder is looked up as one whole key (so
``{train/loss:.3f}`` works) and never by attribute or index: ``{loss.__class__}`` and
``{a[0]}`` stay as written, as does an unknown placeholder or a format spec the value
rejects. Only plain scalars (None, bool, int, float, str) are formatted. Never raises.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any

_FORMATTER = string.Formatter()


def render_template(template: str, values: Mapping[str, Any], none: str = "None") -> str:
    """Fill ``{field}`` / ``{field:spec}`` / ``{field!r}`` / ``{field!s}`` / ``{field!a}``
    from ``values``; ``none`` is how a None value reads (without a conversion)."""
    try:
        parsed = list(_FORMATTER.parse(template))
    except (ValueError, TypeError):
        return str(template)
    out = []
    for literal, name, spec, conv in parsed:
        out.append(literal)
        if name is None:
            continue
        if name in values:
            value = values[name]
            if value is None or isinstance(value, (bool, int, float, str)):
                try:
                    if conv == "r":
                        value = repr(value)
                    elif conv == "a":
                        value = ascii(value)
                    elif conv == "s":
                        value = str(value)
                    elif value is None:
                        value = none
                    out.append(format(value, spec or ""))
                    continue
                except (ValueError, TypeError):
                    pass
        out.append("{" + name + ("!" + conv if conv else "") + (":" + spec if spec else "") + "}")
    return "".join(out)
