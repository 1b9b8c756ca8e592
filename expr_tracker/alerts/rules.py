"""AlertRule (every option of docs/alerts.md "Rule options") and its state machine.

Build a rule from any front end with ``make_rule(obj, **overrides)``:
  - a one-line DSL string ``"zscore(loss[50]) > 4 => error: spike"``
  - an AST node or an ``M`` builder expression (``M.loss.isnan()``)
  - a dict / YAML entry ``{name, condition | expr, level, title, message, mode, for_steps,
    cooldown, max_fires, notify_recovery, channels, tags, enabled}``
  - a ``RuleSpec`` (anything with ``model_dump()``) or another ``AlertRule``.
Every problem raises ``RuleError`` (a ``ValueError``) at construction: syntax, unknown
function, arity, argument kinds, bad level/mode/for_steps/cooldown, unknown keys.

Levels: debug < info < warning < error < critical, aliases warn/err/fatal/crit, compared by
severity (``level_rank``), the one table of ``expr_tracker.units``.

``RuleState.advance(result, mono)`` is the state machine OK -> PENDING -> FIRING: True
advances (``for_steps`` consecutive Trues fire), False returns to OK, UNKNOWN (``None``)
changes nothing. Callers hold ``RuleState.lock``: transitions are serialised
(docs/architecture.md "Locks and their order").
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace

from expr_tracker import units
from expr_tracker.alerts import ast
from expr_tracker.alerts.parse import RuleError, parse_expr, split_rule
from expr_tracker.ruletext import ACTIONS, split_for
from expr_tracker.units import LEVEL_RANK, LEVELS

__all__ = [
    "ACTIONS",
    "FIRING",
    "LEVELS",
    "OK",
    "PENDING",
    "AlertRule",
    "RuleState",
    "entry_errors",
    "make_rule",
    "rule_level",
    "parse_seconds",
]

#: rich style of each level, for the console channel and ConsoleNotifier
LEVEL_STYLE = {
    "debug": "dim",
    "info": "cyan",
    "warning": "yellow",
    "error": "bold red",
    "critical": "bold white on red",
}

OK, PENDING, FIRING = "ok", "pending", "firing"
MODES = ("edge", "level")


def rule_level(level: str) -> str:
    """A rule's ``level``: the canonical name (``"WARN" -> "warning"``,
    ``units.normalize_level``), ``RuleError`` when it is none."""
    key = units.normalize_level(str(level))
    if key not in LEVEL_RANK:
        raise RuleError(
            units.level_error(level)
            + f"; or an action, {' or '.join(ACTIONS)} (`=> stop: ...`, or the action field)"
        )
    return key


def parse_seconds(value, what: str) -> float:
    """Seconds of ``value`` (a number, or a duration such as ``"30s"``, ``"5m"``; the parser
    of ``expr_tracker.units``). Raises ``RuleError`` naming ``what``."""
    if isinstance(value, bool):
        raise RuleError(f"{what} must be a number of seconds or a duration like '5m'")
    if isinstance(value, (int, float)):
        out = float(value)
    else:
        try:
            out = units.parse_duration(str(value))
        except ValueError:
            raise RuleError(
                f"{what}: {value!r} is not a duration (e.g. 300, '30s', '5m')"
            ) from None
    if not (out >= 0 and math.isfinite(out)):
        raise RuleError(f"{what} must be >= 0 seconds, got {value!r}")
    return out


def _names(value, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple, set, frozenset)):  # an int, a bool, a mapping ...
        raise RuleError(f"{what} must be a list of non-empty strings, got {value!r}", field=what)
    out = tuple(value)
    if not all(isinstance(v, str) and v for v in out):
        raise RuleError(f"{what} must be a list of non-empty strings, got {value!r}", field=what)
    return out


def _condition(cond, source: str) -> tuple[ast.Node, str]:
    """A condition as given (DSL text, node, ``M`` expression) -> ``(node, source)``."""
    if cond is None:
        raise RuleError("an alert rule needs a condition", field="condition")
    if hasattr(cond, "node") and isinstance(cond.node, ast.Node):  # M builder
        cond = cond.node
    if isinstance(cond, str):
        if "=>" in cond and split_rule(cond)[1] is not None:
            raise RuleError(
                "the condition holds '=>': give level and message as fields, or pass "
                "the one-line form to make_rule()/AlertRule.parse()",
                text=cond,
                field="condition",
            )
        if split_for(cond)[1] is not None:
            raise RuleError(
                f"the condition ends in 'for {split_for(cond)[1]}': give it as the field "
                "for_steps, or pass the one-line form to make_rule()/AlertRule.parse()",
                text=cond,
                field="condition",
            )
        source = source or cond.strip()
        cond = parse_expr(cond)
    if not isinstance(cond, ast.Node):
        raise RuleError(
            f"condition must be DSL text, an expression node or M expression, "
            f"got {type(cond).__name__}",
            field="condition",
        )
    return cond, source or cond.to_source()


def _check_mode(value):
    if value not in MODES:
        raise RuleError(f"mode must be 'edge' or 'level', got {value!r}")
    return value


def _check_for_steps(value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise RuleError(f"for_steps must be an integer >= 1, got {value!r}")
    if value < 1:
        raise RuleError(f"for_steps must be >= 1, got {value}")
    return value


def _check_action(value):
    if value is not None and value not in ACTIONS:
        raise RuleError(
            f"action must be one of {', '.join(ACTIONS)} (or null for none), got {value!r}"
        )
    return value


def for_steps_of(text: str, rule: str = "") -> int:
    """The ``N`` of a one-line rule's ``for N`` as an int (``RuleError`` when it is not a
    whole number of steps >= 1)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1 or not text.isdigit():
        raise RuleError(
            f"'for {text}': for takes a whole number of consecutive steps >= 1 "
            "(e.g. 'loss > 3 for 5 => warning: ...'); a duration is no_data()/age()'s",
            text=rule,
            field="for_steps",
        )
    return n


def _check_max_fires(value):
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise RuleError(f"max_fires must be an integer >= 1 or None, got {value!r}")
    return value


def _check_text(key: str):
    def check(value):
        if value is not None and not isinstance(value, str):
            raise RuleError(f"{key} must be a string, got {type(value).__name__}")
        return value

    return check


def _check_bool(key: str):
    def check(value):
        if not isinstance(value, bool):
            raise RuleError(f"{key} must be true or false, got {value!r}")
        return value

    return check


def _check_name(value) -> None:
    if not isinstance(value, str) or not value.strip():
        raise RuleError(f"a rule name must be a non-empty string, got {value!r}", field="name")


#: field -> check returning the canonical value (``RuleError`` when invalid), in the order
#: ``AlertRule`` applies them.
_FIELD_CHECKS = {
    "action": _check_action,
    "level": lambda v: v if v is None else rule_level(v),
    "mode": _check_mode,
    "for_steps": _check_for_steps,
    "cooldown": lambda v: parse_seconds(v, "cooldown"),
    "max_fires": _check_max_fires,
    "channels": lambda v: None if v is None else _names(v, "channels"),
    "tags": lambda v: _names(v, "tags"),
    "title": _check_text("title"),
    "message": _check_text("message"),
    "notify_recovery": _check_bool("notify_recovery"),
    "enabled": _check_bool("enabled"),
}


@dataclass(frozen=True, slots=True)
class AlertRule:
    """One alert rule (docs/alerts.md "Rule options"). Immutable; ``replace()`` makes variants.

    ``condition`` is an AST node (a DSL condition string or an ``M`` expression is accepted
    and converted); ``level`` is canonical (None: ``error`` for a rule with an ``action``,
    else ``warning``); ``action`` is None, ``"stop"`` (end the training loop:
    ``et.should_stop()``) or ``"prune"`` (prune the trial), taken when the rule enters
    FIRING (docs/alerts.md "Actions"); ``cooldown`` is seconds (level mode only);
    ``channels=None`` routes to every channel admitting the level and tags. ``name=None``
    derives a name from everything that distinguishes two rules (condition, level, title,
    message, mode, for_steps, cooldown, max_fires, notify_recovery, channels, tags).
    ``source`` is the condition as written (display only; not compared).
    """

    name: str | None = None
    condition: ast.Node | str = field(default=None)  # type: ignore[assignment]
    level: str = None  # type: ignore[assignment]  # None: error with an action, else warning
    title: str | None = None
    message: str | None = None
    mode: str = "edge"
    for_steps: int = 1
    cooldown: float = 300.0
    max_fires: int | None = None
    notify_recovery: bool = False
    channels: tuple[str, ...] | None = None
    tags: tuple[str, ...] = ()
    enabled: bool = True
    action: str | None = None
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        cond, source = _condition(self.condition, self.source)
        set_ = object.__setattr__
        set_(self, "condition", cond)
        set_(self, "source", source)
        for key, check in _FIELD_CHECKS.items():
            try:
                set_(self, key, check(getattr(self, key)))
            except RuleError as exc:
                exc.field = exc.field or key
                raise
        if self.level is None:
            set_(self, "level", "error" if self.action is not None else "warning")
        if self.name is None:
            set_(self, "name", self._auto_name())
        else:
            _check_name(self.name)
        # every function, arity and kind check, now (the window cap is the engine's)
        from expr_tracker.alerts.evaluate import compile_expr

        compile_expr(cond, window=None, text=self.source)

    def _auto_name(self) -> str:
        key = json.dumps(
            [
                self.condition.to_source(canonical=True),  # the spelling of numbers aside
                self.level,
                self.title,
                self.message,
                self.mode,
                self.for_steps,
                self.cooldown,
                self.max_fires,
                self.notify_recovery,
                self.channels,
                self.tags,
                # only when set, so the names of rules without an action never change
                *([self.action] if self.action is not None else []),
            ]
        )
        digest = hashlib.sha1(key.encode()).hexdigest()[:6]
        short = " ".join(self.source.split())
        if len(short) > 60:
            short = short[:57] + "..."
        return f"{short} [{self.action or self.level}#{digest}]"

    def __str__(self) -> str:
        """The one-line form, ``"condition [for N] => level: message"`` (``for N`` when
        ``for_steps`` > 1, the action in place of the level when there is one, ``": message"``
        only when there is one), the condition with the fewest parentheses;
        ``AlertRule.parse`` of it gives back the condition, for_steps, level (or action) and
        message."""
        text = self.condition.to_source()
        if self.for_steps > 1:
            text += f" for {self.for_steps}"
        text += f" => {self.action or self.level}"
        return text if self.message is None else f"{text}: {self.message}"

    @property
    def metrics(self) -> tuple[str, ...]:
        """Metric names the condition reads."""
        return self.condition.metrics()

    def replace(self, **changes) -> AlertRule:
        """A copy with ``changes``; an auto-derived name is derived again."""
        if "name" not in changes and self.name == self._auto_name():
            changes["name"] = None
        if "condition" in changes and "source" not in changes:
            changes["source"] = ""
        return replace(self, **changes)

    def to_dict(self) -> dict:
        """JSON-able form (the YAML entry shape: ``condition`` as DSL text)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "source"}
        out["condition"] = self.source
        out["channels"] = list(self.channels) if self.channels is not None else None
        out["tags"] = list(self.tags)
        return out

    @classmethod
    def parse(cls, text: str, **options) -> AlertRule:
        """From the one-line form ``"condition [for N] => level: message"``, where an action
        (``stop``, ``prune``) may stand in the level's place (docs/alerts.md "The one-line
        form", "Actions"); ``options`` win over what the text says."""
        cond, level, message = split_rule(text)
        cond, steps = split_for(cond)
        kwargs: dict = {"condition": cond, "source": cond}
        if steps is not None:
            kwargs["for_steps"] = for_steps_of(steps, text)
        if level is not None and level.lower() in ACTIONS:
            kwargs["action"] = level.lower()
        elif level is not None:
            kwargs["level"] = level
        if message is not None:
            kwargs["message"] = message
        kwargs.update(options)
        return cls(**kwargs)

    @classmethod
    def from_dict(cls, data: Mapping, **options) -> AlertRule:
        """From a dict / YAML entry. ``condition`` (alias ``expr``) holds only the DSL
        condition. Unknown keys raise ``RuleError`` naming the valid ones."""
        data = dict(data)
        if "expr" in data:
            if "condition" in data:
                raise RuleError(
                    "give either 'condition' or its alias 'expr', not both", field="expr"
                )
            data["condition"] = data.pop("expr")
        stream_error = _pop_stream(data)
        if stream_error is not None:
            raise stream_error
        unknown = _unknown_fields(data)
        if unknown:
            raise RuleError(
                f"unknown rule field {', '.join(_hint(k) for k in unknown)}; "
                f"valid: {', '.join(_VALID_FIELDS)}",
                field=str(unknown[0]),
            )
        if "condition" not in data:
            raise RuleError("a rule entry needs a 'condition' (or 'expr')", field="condition")
        data = {k: v for k, v in data.items() if v is not None or k in ("name", "max_fires")}
        if isinstance(data.get("condition"), str):
            data.setdefault("source", data["condition"].strip())
        data.update(options)
        return cls(**data)


_VALID_FIELDS: tuple[str, ...] = tuple(
    sorted(f.name for f in fields(AlertRule) if f.name != "source")
)


#: ``stream`` of a rule entry: which rows it reads (None: the run's own; ``system``: the
#: system sampler's, docs/system.md). The engine a rule is given to decides; the
#: AlertRule itself has no such field.
RULE_STREAMS = (None, "system")


def _pop_stream(data: dict) -> RuleError | None:
    """Take ``stream`` out of a rule entry; the error when its value is not one of
    :data:`RULE_STREAMS`."""
    if "stream" not in data:
        return None
    value = data.pop("stream")
    if value in RULE_STREAMS:
        return None
    return RuleError(
        f"stream {value!r} is not valid: null (the run's own rows) or 'system' (the system "
        "sampler's rows, docs/system.md)",
        field="stream",
    )


def _unknown_fields(data: Mapping) -> list:
    return sorted((k for k in data if k not in _VALID_FIELDS), key=str)


def _hint(key) -> str:
    import difflib

    close = difflib.get_close_matches(str(key), _VALID_FIELDS, n=1)
    return f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else "")


def entry_errors(
    data: Mapping, *, window: int | None = None, known_metrics: set[str] | None = None
) -> list[RuleError]:
    """Every problem of a dict / YAML rule entry, not just the first (``et rules check``).

    Each ``RuleError`` has ``field`` set to the key at fault as written (``"expr"`` when the
    condition was given under its alias; an unknown key is its own field). ``window`` caps
    point windows like the engine's ``alert_window`` (None: no cap, the engine's is checked
    when the rule is registered); ``known_metrics`` makes unknown metric names errors. An
    empty list means ``AlertRule.from_dict(data)`` succeeds.
    """
    from expr_tracker.alerts.evaluate import compile_expr

    errors: list[RuleError] = []
    data = dict(data)
    cond_key = "condition"
    if "expr" in data:
        if "condition" in data:
            errors.append(
                RuleError("give either 'condition' or its alias 'expr', not both", field="expr")
            )
        else:
            cond_key = "expr"
            data["condition"] = data.pop("expr")
    stream_error = _pop_stream(data)
    if stream_error is not None:
        errors.append(stream_error)
    for key in _unknown_fields(data):
        errors.append(
            RuleError(
                f"unknown rule field {_hint(key)}; valid: {', '.join(_VALID_FIELDS)}",
                field=str(key),
            )
        )
    if data.get("condition") is None:
        errors.append(RuleError("a rule entry needs a 'condition' (or 'expr')", field=cond_key))
    else:
        try:
            cond, source = _condition(data["condition"], "")
            compile_expr(
                cond,
                window=window,
                text=source,
                known_metrics=known_metrics,
            )
        except RuleError as exc:
            exc.field = cond_key
            errors.append(exc)
    for key, check in _FIELD_CHECKS.items():
        if data.get(key) is None and key != "max_fires":
            continue
        try:
            check(data.get(key))
        except RuleError as exc:
            exc.field = key
            errors.append(exc)
    if data.get("name") is not None:
        try:
            _check_name(data["name"])
        except RuleError as exc:
            errors.append(exc)
    return errors


def make_rule(obj, **overrides) -> AlertRule:
    """Any rule front end -> ``AlertRule`` (see the module docstring). ``overrides`` are
    rule options that win over what ``obj`` says. Raises ``RuleError``."""
    if isinstance(obj, AlertRule):
        return obj.replace(**overrides) if overrides else obj
    if isinstance(obj, str):
        return AlertRule.parse(obj, **overrides)
    if isinstance(obj, Mapping):
        return AlertRule.from_dict(obj, **overrides)
    if hasattr(obj, "model_dump"):  # RuleSpec (pydantic)
        data = obj.model_dump()
        data = {k: v for k, v in data.items() if v is not None or k == "max_fires"}
        return AlertRule.from_dict(data, **overrides)
    if isinstance(obj, ast.Node) or hasattr(obj, "node"):
        return AlertRule(condition=obj, **overrides)
    raise RuleError(
        "a rule is a DSL string, an M expression, a dict/YAML entry, a RuleSpec or an "
        f"AlertRule, got {type(obj).__name__}"
    )


class RuleState:
    """Runtime state of one rule in one engine. ``advance()`` under ``lock``.

    ``state`` OK/PENDING/FIRING, ``streak`` consecutive True evaluations, ``fires``
    notifications sent (firing + level-mode repeats), ``last_notify`` monotonic seconds,
    ``episode`` how many times the rule entered FIRING (the current firing episode; it tells
    one incident's notifications from the next one's, see ``event_to_message``),
    ``notified`` whether the current episode sent a notification (its recovery notice goes
    out only then: with ``max_fires`` spent, an episode whose firing was suppressed ends
    quietly too).
    """

    __slots__ = ("rule", "state", "streak", "fires", "last_notify", "episode", "notified", "lock")

    def __init__(self, rule: AlertRule) -> None:
        self.rule = rule
        self.state = OK
        self.streak = 0
        self.fires = 0
        self.last_notify: float | None = None
        self.episode = 0
        self.notified = False
        self.lock = threading.Lock()

    def snapshot(self) -> tuple:
        return (
            self.state,
            self.streak,
            self.fires,
            self.last_notify,
            self.episode,
            self.notified,
        )

    def restore(self, snap: tuple) -> None:
        (
            self.state,
            self.streak,
            self.fires,
            self.last_notify,
            self.episode,
            self.notified,
        ) = snap

    def advance(self, result: bool | None, mono: float) -> tuple[str, bool] | None:
        """Apply one evaluation result. Returns ``(event, notify)`` or ``None``.

        Events: ``pending`` (OK -> PENDING), ``firing`` (-> FIRING), ``repeat`` (level mode,
        still FIRING after ``cooldown`` s), ``resolved`` (FIRING -> OK), ``cancelled``
        (PENDING -> OK). ``notify`` is True for ``firing``/``repeat`` within ``max_fires``
        and for ``resolved`` with ``notify_recovery`` when the episode it ends notified
        (a recovery of an episode whose firing ``max_fires`` suppressed is not announced).
        """
        if result is None:
            return None
        rule = self.rule
        if result is True:
            self.streak += 1
            if self.state != FIRING:
                if self.streak >= rule.for_steps:
                    self.state = FIRING
                    self.episode += 1
                    self.notified = notify = self._count_fire(mono)
                    return "firing", notify
                if self.state == OK:
                    self.state = PENDING
                    return "pending", False
                return None
            if rule.mode == "level" and (
                self.last_notify is None or mono - self.last_notify >= rule.cooldown
            ):
                notify = self._count_fire(mono)
                if not notify:
                    return None
                self.notified = True
                return "repeat", True
            return None
        self.streak = 0
        if self.state == FIRING:
            self.state = OK
            notified, self.notified = self.notified, False
            return "resolved", rule.notify_recovery and notified
        if self.state == PENDING:
            self.state = OK
            return "cancelled", False
        return None

    def _count_fire(self, mono: float) -> bool:
        cap = self.rule.max_fires
        if cap is not None and self.fires >= cap:
            return False
        self.fires += 1
        self.last_notify = mono
        return True
