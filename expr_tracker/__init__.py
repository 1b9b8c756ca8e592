"""expr_tracker: a local-first experiment tracker for machine-learning training.

``import expr_tracker as et``; ``et.init(...)``, ``et.log({...})``, ``et.history(50)``,
``with et.span("forward"):``, ``et.finish()``. Heavy dependencies (torch, pandas, hydra)
are imported only by the functions that need them.
"""

from expr_tracker import history  # the package, callable: et.history(n=50, ...)
from expr_tracker._version import __version__
from expr_tracker.alerts.builder import M
from expr_tracker.api import (
    add_alert_rule,
    alert,
    configure_alert,
    finish,
    get_run,
    info,
    init,
    log,
    log_artifact,
    register_backend,
    register_channel,
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

__all__ = [
    "Artifact",
    "ExprTrackerError",
    "ForkedRunError",
    "M",
    "NoActiveRunError",
    "Run",
    "RunAlreadyActiveError",
    "RunLockedError",
    "Span",
    "__version__",
    "add_alert_rule",
    "alert",
    "configure_alert",
    "finish",
    "get_run",
    "history",
    "info",
    "init",
    "log",
    "log_artifact",
    "read_history",
    "register_backend",
    "register_channel",
    "resolve_run_path",
    "span",
    "start_span",
    "summary",
    "use_artifact",
]
