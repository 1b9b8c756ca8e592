"""expr_tracker: a local-first experiment tracker for machine-learning training.

``import expr_tracker as et``; ``et.init(...)``, ``et.log({...})``, ``et.history(50)``,
``with et.span("forward"):``, ``et.finish()``. Heavy dependencies (torch, pandas, hydra)
are imported only by the functions that need them.

wandb-style: ``et.run`` is the current :class:`Run` or None, ``et.config`` and
``et.summary`` follow the current run, so ``import expr_tracker as wandb`` works for the
common calls (docs/coming-from-wandb.md).
"""

# first: in a compiled build, a module whose source changed since runs from its source
# (docs/performance.md "A compiled build")
from expr_tracker import compiled as _compiled  # noqa: F401
from expr_tracker import (
    history,  # the package, callable: et.history(n=50, ...)
    query,  # the package, callable: et.query(sql, dir=...)
)
from expr_tracker._version import __version__
from expr_tracker.api import (
    add_alert_rule,
    alert,
    configure_alert,
    define_metric,
    finish,
    get_run,
    info,
    init,
    list_alert_rules,
    log,
    log_artifact,
    mark_preempting,
    register_backend,
    register_channel,
    remove_alert_rule,
    should_stop,
    use_artifact,
)
from expr_tracker.errors import (
    ConfigChangeError,
    ExprTrackerError,
    ForkedRunError,
    NoActiveRunError,
    QueryError,
    RunAlreadyActiveError,
    RunLockedError,
)
from expr_tracker.history import read_history, resolve_run_path
from expr_tracker.proxies import config, summary
from expr_tracker.runs import Run
from expr_tracker.spans import Span, span, start_span
from expr_tracker.units import AlertLevel

#: public names loaded on first use (pydantic, the alert rule language, the delivery
#: and artifact packages stay out of ``import expr_tracker``; docs/architecture.md
#: "Cold start"): name -> (module, attribute)
_LAZY = {
    "AlertConfig": ("expr_tracker.spec.alerting", "AlertsSpec"),
    "AlertMessage": ("expr_tracker.alerts.delivery.message", "AlertMessage"),
    "AlertRule": ("expr_tracker.alerts.rules", "AlertRule"),
    "Artifact": ("expr_tracker.artifacts.model", "Artifact"),
    "M": ("expr_tracker.alerts.builder", "M"),
    "ChannelConfig": ("expr_tracker.spec.alerting", "ChannelSpec"),
    "Histogram": ("expr_tracker.media.types", "Histogram"),
    "Image": ("expr_tracker.media.types", "Image"),
    "Table": ("expr_tracker.media.types", "Table"),
    "unwatch": ("expr_tracker.media.watch", "unwatch"),
    "watch": ("expr_tracker.media.watch", "watch"),
    "WebhookPolicy": ("expr_tracker.spec.alerting", "PolicySpec"),
}

__all__ = [
    "AlertConfig",
    "AlertLevel",
    "AlertMessage",
    "AlertRule",
    "Artifact",
    "ChannelConfig",
    "ConfigChangeError",
    "ExprTrackerError",
    "ForkedRunError",
    "Histogram",
    "Image",
    "M",
    "NoActiveRunError",
    "QueryError",
    "Run",
    "RunAlreadyActiveError",
    "RunLockedError",
    "Span",
    "Table",
    "WebhookPolicy",
    "__version__",
    "add_alert_rule",
    "alert",
    "config",
    "configure_alert",
    "define_metric",
    "finish",
    "get_run",
    "history",
    "info",
    "init",
    "list_alert_rules",
    "log",
    "log_artifact",
    "mark_preempting",
    "query",
    "read_history",
    "register_backend",
    "register_channel",
    "remove_alert_rule",
    "resolve_run_path",
    "run",
    "should_stop",
    "span",
    "start_span",
    "summary",
    "unwatch",
    "use_artifact",
    "watch",
]


def __getattr__(name: str) -> object:  # PEP 562
    """``et.run``: the current :class:`Run`, or None (none started, or it finished); the
    names in ``_LAZY`` are imported on first use."""
    if name == "run":
        from expr_tracker import _current

        run = _current.run
        return None if run is None or run.finished else run
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(target[0]), target[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | {"run"})


# Accelerator(log_with="expr_tracker") without importing the integration first: registered
# with Accelerate once it is (or now, if it is) loaded; imports no framework itself
from expr_tracker.integrations.autoload import watch_frameworks  # noqa: E402

watch_frameworks()
del watch_frameworks
