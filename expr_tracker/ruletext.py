"""Splitting a one-line alert rule, ``"condition => level: message"``, into its parts.

A leaf (no project imports): the spec normalises name-keyed rule entries with it, and the
alert parser uses it for the one-line form.
"""

from __future__ import annotations

import re

__all__ = ["ACTIONS", "split_for", "split_rule", "top_level_positions"]

#: what may stand in a one-line rule's level slot besides a level: ``=> stop: ...`` ends the
#: training loop, ``=> prune: ...`` prunes the trial (docs/alerts.md "Actions")
ACTIONS = ("stop", "prune")

# " for 3" at the end of a one-line rule's condition (docs/alerts.md "The one-line form")
_FOR = re.compile(r"^(?P<cond>.*?\S)\s+for\s+(?P<n>\S+)\s*$", re.DOTALL)


def top_level_positions(text: str, target: str) -> list[int]:
    """Offsets of ``target`` outside brackets and quoted names."""
    out: list[int] = []
    depth = 0
    quote = None
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if quote is not None:
            if ch == quote:
                quote = None
        elif ch in "\"'`":
            quote = ch
        elif ch in "([":
            depth += 1
        elif ch in ")]":
            depth = max(depth - 1, 0)
        elif depth == 0 and text.startswith(target, i):
            out.append(i)
            i += len(target)
            continue
        i += 1
    return out


def split_rule(text: str) -> tuple[str, str | None, str | None]:
    """Split ``"condition => level: message"`` into its three parts (stripped; ``None`` when
    absent). Falls back to ``"condition, level, message"`` (top-level commas, the message may
    hold more commas) when there is no top-level ``=>``."""
    arrows = top_level_positions(text, "=>")
    if arrows:
        cut = arrows[0]
        cond, rest = text[:cut], text[cut + 2 :]
        level, sep, message = rest.partition(":")
        return (
            cond.strip(),
            level.strip() or None,
            message.strip() or None if sep else None,
        )
    commas = top_level_positions(text, ",")
    if commas:
        cond = text[: commas[0]]
        rest = text[commas[0] + 1 :]
        level, sep, message = rest.partition(",")
        return cond.strip(), level.strip() or None, (message.strip() or None) if sep else None
    return text.strip(), None, None


def split_for(condition: str) -> tuple[str, str | None]:
    """Split a trailing ``for N`` off a one-line rule's condition: ``"x > 95 for 3"`` ->
    ``("x > 95", "3")``; ``(condition, None)`` without one. ``N`` is returned as written
    (the caller checks it is a whole number of steps). A ``for`` inside brackets or a
    quoted name, or one not preceded by a space, is left alone."""
    m = _FOR.match(condition)
    if m is None:
        return condition, None
    cut = m.start("n")
    # the word "for" must be at the top level (not inside brackets or quotes)
    at = condition.rfind("for", 0, cut)
    if at not in top_level_positions(condition, "for"):
        return condition, None
    return m.group("cond").strip(), m.group("n")
