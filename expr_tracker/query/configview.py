"""A run's config as a user reads it: defaults hidden, differences to a baseline run shown
(the run page of ``et ui`` and ``et config run``; docs/ui.md "Config: defaults and a
baseline").

Which values are defaults is known for a run launched by Hydra with the tracker's callback:
its ``run.json`` records the job's overrides (``hydra.overrides``), and every key that no
override set is the composed config's default. An override sets the key it names
(``lr=0.1``, ``+extra=1``, ``++a.b=2``) and, for a config group (``optimizer=adam``,
``model/encoder=big``, ``db@backup=mysql``), every key under the group's package
(``optimizer.*``, ``model.encoder.*``, ``backup.*``). For any other run defaults are not
known and every key is shown.

:func:`config_view` is the pure function both readers call;
:func:`expr_tracker.query.compare.run_config_view` resolves runs by name as ``et compare``
does and reads their files.
"""

from __future__ import annotations

from typing import Any

from expr_tracker.history.values import flatten

__all__ = ["config_view", "hydra_overrides", "override_keys"]

_MISSING = object()


def override_keys(overrides: list[Any]) -> list[tuple[str, ...]]:
    """The config keys (tuples of parts) Hydra ``overrides`` set: ``"lr=0.1"`` ->
    ``("lr",)``, ``"model/encoder=big"`` -> ``("model", "encoder")``, ``"db@backup=x"``
    -> ``("backup",)``; ``hydra.*`` and deletions (``~key``) set none. Items that are not
    text are skipped."""
    out: list[tuple[str, ...]] = []
    for item in overrides:
        if not isinstance(item, str):
            continue
        key = item.partition("=")[0].strip()
        if not key or key.startswith("~"):
            continue
        key = key.lstrip("+")
        group, at, package = key.partition("@")
        path = package if at else group
        if not path or path == "_global_" or path.startswith("_global_."):
            continue
        parts = tuple(p for p in path.replace("/", ".").split(".") if p)
        if parts and parts[0] != "hydra":
            out.append(parts)
    return out


def hydra_overrides(run_info: Any) -> list[Any] | None:
    """The Hydra overrides a ``run.json`` records (``hydra.overrides``), or None when it
    records no Hydra job (the defaults are then not known)."""
    if not isinstance(run_info, dict):
        return None
    hydra = run_info.get("hydra")
    if not isinstance(hydra, dict) or not isinstance(hydra.get("overrides"), list):
        return None
    return list(hydra["overrides"])


def _under(key: tuple[str, ...], prefixes: list[tuple[str, ...]]) -> bool:
    return any(key[: len(p)] == p for p in prefixes)


def config_view(
    config: Any, *, overrides: list[Any] | None = None, baseline: Any = _MISSING
) -> dict:
    """The rows of a config (a nested dict; anything else has none) for a reader.

    Returns ``{"defaults_known", "baseline": bool, "rows": [{"key", "value", "default",
    "baseline", "in_baseline", "differs"}], "only_in_baseline": [{"key", "baseline"}]}``:
    one row per leaf (dotted key), in the config's order; ``default`` True for a key no
    override set, None when defaults are not known (``overrides`` None); with a
    ``baseline`` config (a dict, or None for a baseline without one): its value (None
    when it has no such key: ``in_baseline`` False) and ``differs``; the baseline's keys
    this config lacks in ``only_in_baseline``. Without a baseline ``differs`` is False.
    """
    mine = flatten(config) if isinstance(config, dict) else {}
    has_base = baseline is not _MISSING
    base = flatten(baseline) if has_base and isinstance(baseline, dict) else {}
    set_keys = override_keys(overrides) if overrides is not None else None
    rows = []
    for k, v in mine.items():
        row: dict[str, Any] = {
            "key": ".".join(k),
            "value": v,
            "default": None if set_keys is None else not _under(k, set_keys),
        }
        if has_base:
            row["in_baseline"] = k in base
            row["baseline"] = base.get(k)
            row["differs"] = k not in base or not _same(base[k], v)
        else:
            row["in_baseline"], row["baseline"], row["differs"] = False, None, False
        rows.append(row)
    only = [{"key": ".".join(k), "baseline": v} for k, v in base.items() if k not in mine]
    return {
        "defaults_known": set_keys is not None,
        "baseline": has_base,
        "rows": rows,
        "only_in_baseline": only,
    }


def _same(a: Any, b: Any) -> bool:
    """Equal as config values: 1 and 1.0 are, True and 1 are not, NaN equals NaN."""
    if type(a) is bool or type(b) is bool:
        return type(a) is type(b) and a == b
    if a != a and b != b:
        return True
    return bool(a == b)
