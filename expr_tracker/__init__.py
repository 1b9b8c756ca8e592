"""expr_tracker: a local-first experiment tracker for machine-learning training.

``import expr_tracker as et``; ``et.init(...)``, ``et.log({...})``, ``et.history(50)``,
``with et.span("forward"):``, ``et.finish()``. Heavy dependencies (torch, pandas, hydra)
are imported only by the functions that need them.
"""

from expr_tracker import history  # the package, callable: et.history(n=50, ...)
from expr_tracker._version import __version__
from expr_tracker.alerts.builder import M
from expr_tracker.alerts.rules import AlertRule
from expr_tracker.api import (
    add_alert_rule,
    alert,
    configure_alert,
    finish,
    get_run,
    info,
    init,
    list_alert_rules,
    log,
    log_artifact,
    register_backend,
    register_channel,
    remove_alert_rule,
    summary,
    use_artifact,
)
from expr_tracker.artifacts import Artifact
from expr_tracker.errors import (
    ExprTrackerError,
    ForkedRunError,
    NoActiveRunError,
    RunAlreadyActiveError,
    RunLockedError,
)
from expr_tracker.history import read_history, resolve_run_path
from expr_tracker.runs import Run
from expr_tracker.spans import Span, span, start_span
from expr_tracker.units import AlertLevel

#: public names loaded on first use (pydantic and the delivery package stay out of
#: ``import expr_tracker``): name -> (module, attribute)
_LAZY = {
    "AlertConfig": ("expr_tracker.spec.alerting", "AlertsSpec"),
    "AlertMessage": ("expr_tracker.alerts.delivery.message", "AlertMessage"),
    "ChannelConfig": ("expr_tracker.spec.alerting", "ChannelSpec"),
    "WebhookPolicy": ("expr_tracker.spec.alerting", "PolicySpec"),
}

__all__ = [
    "AlertConfig",
    "AlertLevel",
    "AlertMessage",
    "AlertRule",
    "Artifact",
    "ChannelConfig",
    "ExprTrackerError",
    "ForkedRunError",
    "M",
    "NoActiveRunError",
    "Run",
    "RunAlreadyActiveError",
    "RunLockedError",
    "Span",
    "WebhookPolicy",
    "__version__",
    "add_alert_rule",
    "alert",
    "configure_alert",
    "finish",
    "get_run",
    "history",
    "info",
    "init",
    "list_alert_rules",
    "log",
    "log_artifact",
    "read_history",
    "register_backend",
    "register_channel",
    "remove_alert_rule",
    "resolve_run_path",
    "span",
    "start_span",
    "summary",
    "use_artifact",
]


def __getattr__(name: str):  # noqa: ANN202 - PEP 562
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(target[0]), target[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
