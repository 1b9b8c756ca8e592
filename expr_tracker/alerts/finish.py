"""What an engine reports at finish: metric names rules read that were never logged (with
the logged names they may have meant), rules disabled after errors, truncated windows."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

from expr_tracker.alerts.compiled import CompiledRule

__all__ = ["close_matches", "finish_warnings", "unresolved_metrics"]


def unresolved_metrics(rules: Iterable[CompiledRule], seen: set[str]) -> list[str]:
    """Metric names ``rules`` read that ``seen`` lacks (exact or ``.`` -> ``/``)."""
    out: dict[str, None] = {}
    for c in rules:
        for name in c.expr.needs:
            if name not in seen and name.replace(".", "/") not in seen:
                out.setdefault(name, None)
    return list(out)


def finish_warnings(
    rules: Sequence[CompiledRule], seen: set[str], truncated: Iterable[str], window: int
) -> list[str]:
    """The messages of ``AlertEngine.finish_warnings`` (its docstring says which)."""
    out = []
    logged = sorted(seen - {"_step", "_time"})
    for name in unresolved_metrics(rules, seen):
        users = [c.rule.name for c in rules if name in c.expr.needs]
        close = close_matches(name, logged)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        out.append(
            f"alert rule {', '.join(map(repr, users))} reads metric {name!r}, "
            f"which was never logged, so it never fired{hint}"
        )
    for c in rules:
        if c.disabled and c.rule.enabled:
            out.append(f"alert rule {c.rule.name!r} was disabled after errors: {c.last_error}")
    for name in sorted(truncated):
        out.append(
            f"a duration window over {name!r} held more than alert_window={window} "
            "values and was evaluated on the most recent ones only"
        )
    return out


def close_matches(name: str, seen: list[str]) -> list[str]:
    """Up to three logged names ``name`` may have meant: those ending in the same last path
    part (``loss`` -> ``train/loss``, ``eval/loss``), then difflib's close matches."""
    alt = name.replace(".", "/")
    leaf = alt.rsplit("/", 1)[-1]
    out = [s for s in seen if s.rsplit("/", 1)[-1] == leaf]
    for candidate in (name, alt):
        out += difflib.get_close_matches(candidate, seen, n=3)
    return list(dict.fromkeys(out))[:3]
