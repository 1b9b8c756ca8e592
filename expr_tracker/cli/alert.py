"""``et alert "message" [--title T] [--level L] [--channel NAME ...] [--tag T ...]``.

Sends one alert through the channels configured by the environment (``ET_*_WEBHOOK_URL``),
``ET_ALERT_CONFIG`` / ``--config FILE`` and ``ET_CONFIG``, waits for each outcome (within
``--timeout`` seconds), prints one line per channel and exits 0 when some channel delivered
it, 1 when none did, 2 on a usage or configuration error.

A ``--channel`` that is configured but off (``enabled: false``, or its ``url_env`` variable
unset) is named as such, exit 1. ``RANK`` / ``LOCAL_RANK`` are not consulted: running
``et alert`` is a person's explicit action, unlike ``et.alert()`` in a run-less process,
which honours ``alerts.on_rank``.
"""

from __future__ import annotations

import argparse
import os
import sys


def register(subparsers) -> None:  # noqa: ANN001
    p = subparsers.add_parser(
        "alert",
        help="send an alert through the configured channels",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    p.add_argument("message", help="the alert text")
    p.add_argument("--title", default=None, help="title (default: the message's first line)")
    p.add_argument("--level", default="warning", help="debug|info|warning|error|critical")
    p.add_argument(
        "--channel", action="append", default=None, help="send only to this channel (repeatable)"
    )
    p.add_argument("--tag", action="append", default=[], help="routing tag (repeatable)")
    p.add_argument("--config", default=None, help="an alerts file (like ET_ALERT_CONFIG)")
    p.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait in all (default 30)"
    )
    p.set_defaults(func=run_alert)


def run_alert(args: argparse.Namespace) -> int:
    from expr_tracker.alerts.delivery import make_message
    from expr_tracker.assemble.delivery import build_dispatcher
    from expr_tracker.spec import resolve

    environ = dict(os.environ)
    if args.config:
        environ["ET_ALERT_CONFIG"] = args.config
    try:
        from expr_tracker.units import level_rank

        level_rank(args.level)
    except ValueError as exc:
        print(f"et alert: {exc}", file=sys.stderr)
        return 2
    try:
        alerts = resolve(environ=environ).spec.alerts
        # every outcome is printed below, with the message the person just typed: no console
        # fallback (it would repeat the alert on stderr)
        d = build_dispatcher(alerts, environ=environ, drain_timeout=args.timeout, fallback=None)
    except Exception as exc:  # noqa: BLE001 - SpecError / ChannelConfigError
        print(f"et alert: configuration error: {exc}", file=sys.stderr)
        return 2
    text = args.message
    title = args.title or (text.splitlines()[0][:120] if text else "alert")
    if args.title is None and title == text:
        text = ""
    message = make_message(title, text, args.level, args.channel, args.tag, source="cli")
    try:
        result = d.submit(message, direct=True, wait=True)
    finally:
        d.close(timeout=min(args.timeout, 5.0))
    if not result.routed:
        off = [(name, d.skipped[name]) for name in (args.channel or ()) if name in d.skipped]
        for name, why in off:
            print(f"et alert: channel {name!r} is off: {_off_reason(why)}", file=sys.stderr)
        if not off:
            print("no channel takes this alert (check --channel, levels and tags)", file=sys.stderr)
        return 1
    for name in result.routed:
        ok = result.delivered.get(name, False)
        mark = "delivered" if ok else "FAILED"
        print(f"{name}: {mark}: {result.detail.get(name, '')}")
    return 0 if any(result.delivered.values()) else 1


def _off_reason(why: str) -> str:
    if why == "disabled":
        return "it is disabled (enabled: false)"
    if why.endswith(" is not set"):
        return f"environment variable {why}"
    return why
