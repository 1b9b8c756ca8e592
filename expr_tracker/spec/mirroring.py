"""The mirror settings of the run spec (top-level ``RunSpec`` fields, next to ``backends``).

- ``backends``: ``"wandb"``, ``"trackio"``, ``"jsonl"`` (the local files, always written: a
  no-op) or ``{type: wandb, **init keywords}``; a single entry may be written without the list.
- ``backend_kwargs``: ``{wandb: {...}, trackio: {...}}``, keywords for the library's
  ``init`` per backend type (a ``{type: ...}`` entry's own keys win over them).
- ``backend_on_rank``: the ranks that mirror (a rank, a list of ranks, or ``"all"``).
- ``backend_queue_size``, ``backend_finish_timeout``: the bound of each mirror's queue and
  the deadline of its drain at finish.

The keywords each library's ``init`` accepts are a table here (wandb 0.31, trackio 0.43), so a
misspelt keyword is a ``SpecError`` at ``et.init`` rather than a mirror that silently stays
off; nothing here imports either library.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from expr_tracker.spec.redact import redact_options

__all__ = [
    "BACKEND_TYPES",
    "INIT_KEYWORDS",
    "check_backend_entry",
    "check_backend_kwargs",
    "backends_as_list",
    "redact_backend_kwargs",
]

#: every backend name a spec may hold (``jsonl``: the local files, always written)
BACKEND_TYPES: tuple[str, ...] = ("jsonl", "trackio", "wandb")

#: keywords of ``wandb.init`` (0.31) and ``trackio.init`` (0.43) a spec may pass
INIT_KEYWORDS: dict[str, frozenset[str]] = {
    "wandb": frozenset(
        "entity project dir id name notes tags config config_exclude_keys "
        "config_include_keys allow_val_change group job_type mode force reinit resume "
        "resume_from fork_from save_code tensorboard sync_tensorboard monitor_gym settings "
        "anonymous".split()
    ),
    "trackio": frozenset(
        "project name group space_id server_url dataset_id bucket_id config resume settings "
        "private embed auto_log_gpu gpu_log_interval auto_log_cpu cpu_log_interval "
        "webhook_url webhook_min_level".split()
    ),
    "jsonl": frozenset(),
}

_HINT = "or pass an object with init/log/finish in et.init(backends=[...])"


def _valid_types() -> str:
    return ", ".join(BACKEND_TYPES)


def _check_keys(kind: str, keys: Any, where: str) -> None:
    allowed = INIT_KEYWORDS[kind]
    bad = sorted(str(k) for k in keys if k not in allowed)
    if bad:
        valid = ", ".join(sorted(allowed)) if allowed else "none (jsonl takes no options)"
        raise ValueError(
            f"{where}: unknown {kind}.init keyword(s) {', '.join(bad)}; valid: {valid}"
        )


def backends_as_list(value: Any) -> Any:
    """One entry written without the list (``backends: wandb``) is a list of one."""
    if value is None:
        return []
    if isinstance(value, (str, Mapping)):
        return [value]
    return value


def check_backend_entry(value: Any) -> Any:
    """A ``backends`` entry: a known name, or a mapping with a known ``type`` whose other
    keys are keywords of that library's ``init``."""
    if isinstance(value, str):
        if value not in BACKEND_TYPES:
            raise ValueError(f"unknown backend {value!r}; valid: {_valid_types()} ({_HINT})")
        return value
    if isinstance(value, Mapping):
        kind = value.get("type")
        if kind not in BACKEND_TYPES:
            raise ValueError(
                f"a backend mapping needs 'type' naming a backend, got {kind!r}; "
                f"valid: {_valid_types()}"
            )
        _check_keys(kind, [k for k in value if k != "type"], f"backend {kind!r}")
        return dict(value)
    return value  # the schema rejects it with its own message


def check_backend_kwargs(value: Any) -> Any:
    """``backend_kwargs``: a mapping backend name -> mapping of ``init`` keywords."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        return value  # the schema says what it wants
    for kind, kwargs in value.items():
        if kind not in BACKEND_TYPES:
            raise ValueError(f"unknown backend {kind!r}; valid: {_valid_types()}")
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise ValueError(
                f"backend_kwargs.{kind} must be a mapping of {kind}.init keywords, "
                f"got {type(kwargs).__name__}"
            )
        _check_keys(kind, kwargs or {}, f"backend_kwargs.{kind}")
    return {k: dict(v or {}) for k, v in value.items()}


def redact_backend_kwargs(value: Any) -> Any:
    """``backend_kwargs`` as ``spec.json`` and ``repr()`` show it (api keys hidden)."""
    return redact_options(value)
