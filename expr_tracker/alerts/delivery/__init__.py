"""Alert delivery: messages, the per-channel policy stages, lanes, the dispatcher, the alert
log, secret scrubbing and the channel types (``channels/``). See docs/channels.md.

Everything here takes plain values; a dispatcher made from an ``AlertsSpec``
(``build_dispatcher``) comes from the composition root, ``expr_tracker.assemble``.

The public names below load on first use, so ``import expr_tracker`` (which imports the
alert log) does not pay for the dispatcher or the channels:

    from expr_tracker.alerts.delivery import AlertMessage, Dispatcher, Policy
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the module of this package defining it
_PUBLIC = {
    "AlertLog": "record",
    "AlertMessage": "message",
    "ConsoleNotifier": "record",
    "Dispatcher": "dispatcher",
    "Lane": "lane",
    "Policy": "policy",
    "Submission": "dispatcher",
    "TokenBucket": "policy",
    "alert": "direct",
    "event_to_message": "message",
    "make_message": "direct",
    "rank_alerts": "direct",
    "run_end_message": "message",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
