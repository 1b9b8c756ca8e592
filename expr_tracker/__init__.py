"""expr_tracker: a local-first experiment tracker for machine-learning training.

``import expr_tracker as et``; ``et.init(...)``, ``et.log({...})``, ``et.history(50)``,
``with et.span("forward"):``, ``et.finish()``. Heavy dependencies (torch, pandas, hydra)
are imported only by the functions that need them.

wandb-style: ``et.run`` is the current :class:`Run` or None, ``et.config`` and
``et.summary`` follow the current run, so ``import expr_tracker as wandb`` works for the
common calls (docs/coming-from-wandb.md).
"""

from expr_tracker import history  # the package, callable: et.history(n=50, ...)
from expr_tracker._version import __version__
from expr_tracker.alerts.builder import M
from expr_tracker.api import (
    add_alert_rule,
    alert,
    configure_alert,
    define_metric,
    finish,
    get_run,
    info,
    init,
    log,
    register_backend,
    register_channel,
)
from expr_tracker.errors import (
    ConfigChangeError,
    ExprTrackerError,
    ForkedRunError,
    NoActiveRunError,
    RunAlreadyActiveError,
    RunLockedError,
)
from expr_tracker.history import read_history, resolve_run_path
from expr_tracker.proxies import config, summary
from expr_tracker.runs import Run
from expr_tracker.spans import Span, span, start_span

__all__ = [
    "ConfigChangeError",
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
    "config",
    "configure_alert",
    "define_metric",
    "finish",
    "get_run",
    "history",
    "info",
    "init",
    "log",
    "read_history",
    "register_backend",
    "register_channel",
    "resolve_run_path",
    "run",
    "span",
    "start_span",
    "summary",
]


def __getattr__(name: str) -> object:
    """``et.run``: the current :class:`Run`, or None (none started, or it finished)."""
    if name == "run":
        from expr_tracker import _current

        run = _current.run
        return None if run is None or run.finished else run
    raise AttributeError(f"module 'expr_tracker' has no attribute {name!r}")
