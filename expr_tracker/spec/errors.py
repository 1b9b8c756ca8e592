"""SpecError: every problem of a run spec, each with its path, value, what is valid and source.

``str(SpecError)`` lists every problem on its own line::

    history.buffer.size: -1 is not valid: must be an integer >= 1 (from file conf/x.yaml)
    conf/x.yaml:7:5: history.buffer.szie: unknown key; did you mean `size`? (from file conf/x.yaml)

Secrets never reach the text: values under keys that look secret (url, token, password,
secret, webhook, api_key), ``SecretStr`` values and strings holding ``://`` show as ``***``
(``expr_tracker.spec.redact``, whose names are re-exported here).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # Pydantic is imported only once a spec is validated by it
    from pydantic import BaseModel, ValidationError

from expr_tracker.errors import ExprTrackerError
from expr_tracker.spec.redact import (
    SECRET_KEY_PATTERN,
    display_value,
    is_credential_key,
    is_secret_key,
    is_webhook_url,
    mask_url_credentials,
    redact_config,
    redact_options,
    scrub_argv,
)

__all__ = [
    "SECRET_KEY_PATTERN",
    "SpecError",
    "SpecIssue",
    "describe_source",
    "display_value",
    "is_credential_key",
    "is_secret_key",
    "is_webhook_url",
    "issues_from_validation_error",
    "join_path",
    "mask_url_credentials",
    "redact_config",
    "redact_options",
    "scrub_argv",
    "suggest",
]

_PLAIN_SEGMENT = re.compile(r"^[A-Za-z0-9_\-]+$")


class _NotGiven:
    """Marks an issue without a value (a missing or unknown key); survives pickling."""

    def __repr__(self) -> str:
        return "<not given>"

    def __reduce__(self) -> str:
        return "_NOT_GIVEN"


_NOT_GIVEN: Any = _NotGiven()


def join_path(parent: str, key: Any) -> str:
    """Dotted path of ``key`` under ``parent``: ``a.b``, ``a[3]`` for an index, ``a["x y"]``."""
    if isinstance(key, int) and not isinstance(key, bool):
        return f"{parent}[{key}]"
    key = str(key)
    segment = key if _PLAIN_SEGMENT.match(key) else f"[{json.dumps(key)}]"
    if not parent:
        return segment
    return f"{parent}{segment}" if segment.startswith("[") else f"{parent}.{segment}"


def suggest(key: str, valid: Iterable[str]) -> str | None:
    """``"did you mean `size`?"`` for the closest valid key, or None when nothing is close."""
    import difflib  # here: a start whose spec is valid never needs it

    matches = difflib.get_close_matches(str(key), sorted(set(valid)), n=3, cutoff=0.6)
    if not matches:
        return None
    return "did you mean " + " or ".join(f"`{m}`" for m in matches) + "?"


def describe_source(source: str | None) -> str:
    """Human words for a provenance string (``"file:conf/x.yaml"`` -> ``"file conf/x.yaml"``)."""
    if not source:
        return ""
    kind, _, rest = source.partition(":")
    if kind == "file":
        return f"file {rest}"
    if kind == "env":
        return f"environment variable {rest}"
    if kind in ("ET_CONFIG", "ET_ALERT_CONFIG") and rest:
        return f"{kind} file {rest}"
    if source == "init":
        return "et.init() keyword arguments"
    if source == "history":
        return "et.history() keyword arguments"
    if source == "spec":
        return "the spec given to et.init()"
    if source == "configure_alert":
        return "et.configure_alert()"
    return source


@dataclass(frozen=True)
class SpecIssue:
    """One problem of a spec.

    Attributes:
        path: dotted spec path (``history.buffer.size``; ``alerts.rules.nan_guard.level``).
        message: what is valid (``must be an integer >= 1``) or what is wrong (``unknown key``).
        value: the value given; absent when the problem is a missing value.
        suggestion: for unknown keys, ``did you mean `size`?``.
        source: provenance string of the value (``file:conf/x.yaml``, ``init``, ...).
        location: ``(file, line, column)`` (1-based) when the value came from a YAML file.
        config_key: the key in the OmegaConf/Hydra config when that is where it came from.
    """

    path: str
    message: str
    value: Any = field(default=_NOT_GIVEN, compare=False)
    suggestion: str | None = None
    source: str | None = None
    location: tuple[str, int, int] | None = None
    config_key: str | None = None

    @property
    def has_value(self) -> bool:
        return self.value is not _NOT_GIVEN

    def format(self) -> str:
        """One line: ``[file:line:col: ][path: ][value is not valid: ]message[; suggestion]
        [(from ...)]`` (no path for a problem of the whole spec or file)."""
        parts = []
        if self.location is not None:
            file, line, col = self.location
            parts.append(f"{file}:{line}:{col}: ")
        if self.path:  # the root of the spec: just the location
            parts.append(f"{self.path}: ")
        if self.has_value:
            parts.append(f"{display_value(self.path, self.value)} is not valid: ")
        parts.append(self.message)
        if self.suggestion:
            parts.append(f"; {self.suggestion}")
        origin = []
        if self.source and not (
            self.location is not None and self.source.endswith(":" + self.location[0])
        ):
            origin.append(f"from {describe_source(self.source)}")
        if self.config_key:
            origin.append(f"config key `{self.config_key}`")
        if origin:
            parts.append(f" ({', '.join(origin)})")
        return "".join(parts)

    def __str__(self) -> str:
        return self.format()


class SpecError(ExprTrackerError, ValueError):
    """A run spec (or one of its sources) is invalid.

    ``issues`` lists every problem found across every source; ``str()`` shows all of them,
    one per line, never a secret value.
    """

    def __init__(self, issues: Sequence[SpecIssue], title: str | None = None):
        self.issues: list[SpecIssue] = list(issues)
        self.title = title
        super().__init__(self._render())

    def _render(self) -> str:
        n = len(self.issues)
        if n == 1 and not self.title:
            return self.issues[0].format()
        head = self.title or "invalid run spec"
        lines = [f"{head} ({n} problem{'s' if n != 1 else ''}):"]
        lines += [f"  {issue.format()}" for issue in self.issues]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self._render()

    def __reduce__(self):  # picklable across processes
        return (type(self), (self.issues, self.title))


# --- pydantic ValidationError -> SpecIssue -------------------------------------------------


def _bound(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _kind(ctx_value: Any) -> str:
    return (
        "an integer"
        if isinstance(ctx_value, int) and not isinstance(ctx_value, bool)
        else "a number"
    )


def _message(error: Mapping[str, Any]) -> str:
    kind = error.get("type", "")
    ctx = error.get("ctx") or {}
    if kind == "greater_than_equal":
        return f"must be {_kind(ctx.get('ge'))} >= {_bound(ctx.get('ge'))}"
    if kind == "greater_than":
        return f"must be {_kind(ctx.get('gt'))} > {_bound(ctx.get('gt'))}"
    if kind == "less_than_equal":
        return f"must be {_kind(ctx.get('le'))} <= {_bound(ctx.get('le'))}"
    if kind == "less_than":
        return f"must be {_kind(ctx.get('lt'))} < {_bound(ctx.get('lt'))}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return "must be an integer"
    if kind in ("float_parsing", "float_type", "finite_number"):
        return "must be a number"
    if kind in ("bool_parsing", "bool_type"):
        return "must be true or false"
    if kind in ("string_type", "string_unicode"):
        return "must be a string"
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "string_pattern_mismatch":
        return f"must match the pattern {ctx.get('pattern')}"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}"
    if kind in ("dict_type", "model_type", "model_attributes_type", "mapping_type"):
        return "must be a mapping"
    if kind in ("list_type", "tuple_type", "set_type", "iterable_type"):
        return "must be a list"
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "unknown key"
    if kind in ("value_error", "assertion_error"):
        msg = str(error.get("msg", ""))
        for prefix in ("Value error, ", "Assertion failed, "):
            if msg.startswith(prefix):
                msg = msg[len(prefix) :]
        return msg
    msg = str(error.get("msg", "is not valid"))
    return msg[:1].lower() + msg[1:]


def _unwrap_models(annotation: Any) -> list[type[BaseModel]]:
    """Every BaseModel class mentioned by a type annotation (through unions, lists, Annotated)."""
    from typing import get_args

    from pydantic import BaseModel

    found: list[type[BaseModel]] = []
    stack = [annotation]
    seen = 0
    while stack and seen < 64:
        seen += 1
        ann = stack.pop()
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            found.append(ann)
            continue
        stack.extend(get_args(ann))
    return found


def _valid_keys(model: type[BaseModel]) -> list[str]:
    keys = []
    for name, info in model.model_fields.items():
        keys.append(name)
        alias = info.validation_alias
        choices = getattr(alias, "choices", None)
        if choices:
            keys.extend(c for c in choices if isinstance(c, str))
        elif isinstance(alias, str):
            keys.append(alias)
        if info.alias:
            keys.append(info.alias)
    return keys


def _model_at(root: type[BaseModel], keys: Sequence[Any]) -> type[BaseModel] | None:
    """The model class that holds the fields at ``keys`` (a path of data keys) under ``root``."""
    model: type[BaseModel] | None = root
    for key in keys:
        if model is None:
            return None
        if isinstance(key, int):
            continue
        info = model.model_fields.get(key)
        if info is None:
            return None
        models = _unwrap_models(info.annotation)
        model = models[0] if models else None
    return model


def issues_from_validation_error(
    exc: ValidationError,
    data: Any,
    *,
    root: type[BaseModel] | None = None,
    path_prefix: str = "",
    item_key=None,
    source_of=None,
    location_of=None,
) -> list[SpecIssue]:
    """Convert a pydantic ``ValidationError`` raised on ``data`` into ``SpecIssue`` s.

    Args:
        exc: the error pydantic raised validating ``data``.
        data: the input that was validated; locations are walked along it, so union and
            validator tags in pydantic's ``loc`` drop out of the path.
        root: the model validated (for the valid-key suggestions of unknown keys).
        path_prefix: prepended to every path (``"alerts"`` when ``data`` is that section).
        item_key: ``item_key(list_path, item, index) -> key`` naming list items in paths.
        source_of: ``source_of(path) -> str | None``.
        location_of: ``location_of(path) -> (file, line, col) | None``.

    Returns:
        One issue per distinct (path, message), in pydantic's order.
    """
    issues: list[SpecIssue] = []
    seen: set[str] = set()
    for error in exc.errors(include_url=False):
        loc = list(error.get("loc", ()))
        kind = error.get("type", "")
        node = data
        path = path_prefix
        keys: list[Any] = []
        unknown_key = None
        for i, part in enumerate(loc):
            last = i == len(loc) - 1
            if isinstance(node, Mapping) and part in node:
                keys.append(part)
                path = join_path(path, part)
                node = node[part]
            elif (
                isinstance(node, (list, tuple)) and isinstance(part, int) and 0 <= part < len(node)
            ):
                keys.append(part)
                key = item_key(path, node[part], part) if item_key else part
                path = join_path(path, key)
                node = node[part]
            elif last and kind == "missing":
                keys.append(part)
                path = join_path(path, part)
            # anything else is a union member or validator tag: not part of the data path
        if kind == "extra_forbidden" and loc:
            unknown_key = loc[-1]
        message = _message(error)
        if kind == "value_error" and "input" in error:
            # "'oops' is not a duration: expected ..." -> "expected ..." (the value is shown once)
            lead = f"{error['input']!r} is not a "
            if message.startswith(lead) and ": " in message:
                message = message.split(": ", 1)[1]
        suggestion = None
        if kind == "string_type" and isinstance(error.get("input"), bool):
            what = "the name" if keys and keys[-1] == "name" else "it"
            suggestion = f"YAML reads off/on/yes/no as booleans: quote {what}"
        if unknown_key is not None and root is not None:
            parent_model = _model_at(root, keys[:-1])
            if parent_model is not None:
                valid = _valid_keys(parent_model)
                suggestion = suggest(str(unknown_key), valid)
                if suggestion is None:
                    message = f"unknown key (valid keys: {', '.join(sorted(set(valid)))})"
        value = (
            _NOT_GIVEN if kind in ("missing", "extra_forbidden") else error.get("input", _NOT_GIVEN)
        )
        if path in seen:
            # several members of a union rejected the same value: one line, every alternative
            j = next(k for k, issue in enumerate(issues) if issue.path == path)
            before = issues[j]
            if message not in before.message:
                extra = message[len("must be ") :] if message.startswith("must be ") else message
                issues[j] = replace(before, message=f"{before.message} or {extra}")
            continue
        seen.add(path)
        issues.append(
            SpecIssue(
                path=path,
                message=message,
                value=value,
                suggestion=suggestion,
                source=source_of(path) if source_of else None,
                location=location_of(path) if location_of else None,
            )
        )
    return issues
