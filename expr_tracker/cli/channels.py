"""``et channels test [NAME ...] [--config FILE] [--format text|json|jsonl]``.

Sends one test message straight through each configured channel (or the named ones) —
one attempt, no queue, no rate limit — and prints what each endpoint answered (HTTP status
and body, or the error), with URLs redacted.

A channel whose ``url_env`` variable is not set (and that has no ``url``) is off, not broken:
that is how a checked-in channel stays quiet until its variable is set. It is listed as
``off (VAR not set)`` and not tested.

Exit 0 when every tested channel accepted the message (channels that are off do not count
as failures); 1 when one failed, or when nothing could be tested (none configured, or every
selected channel off); 2 on a configuration error (a file that does not load, or a channel
whose settings are invalid: the other channels are still tested and listed) or an unknown
channel name, as ``et alert`` does.
"""

from __future__ import annotations

import argparse
import os
import sys

from expr_tracker.cli import appconfig, output


def register(subparsers) -> None:  # noqa: ANN001
    p = subparsers.add_parser("channels", help="alert channels: test the configured ones")
    sub = p.add_subparsers(dest="channels_command", metavar="COMMAND")
    t = sub.add_parser(
        "test",
        help="send a test message through each configured channel",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    t.add_argument("names", nargs="*", help="channel names (default: all)")
    t.add_argument(
        "--config",
        default=None,
        help="an alerts file (like ET_ALERT_CONFIG), or a run spec or Hydra app config with a "
        "tracker: section (see --package)",
    )
    appconfig.add_package_option(t)
    t.add_argument("--timeout", type=float, default=10.0, help="seconds per channel (default 10)")
    output.add_format_option(t, "text", what="channel results")
    t.add_argument(
        "--json",
        dest="format",
        action="store_const",
        const="jsonl",
        help="the same as --format jsonl (one JSON object per channel; kept for scripts)",
    )
    t.set_defaults(func=run_test)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def run_test(args: argparse.Namespace) -> int:
    from expr_tracker.alerts.delivery.channels import DeliveryError, create_channel
    from expr_tracker.alerts.delivery.channels.base import excerpt
    from expr_tracker.alerts.delivery.message import AlertMessage
    from expr_tracker.spec import resolve
    from expr_tracker.spec.sources import file_layer

    environ = dict(os.environ)
    package = appconfig.package_of(args.config, args.package) if args.config else None
    if args.config and package is None:
        environ["ET_ALERT_CONFIG"] = args.config
    try:
        # a section of an app's config is a run spec: its alerts, over the environment's
        spec = file_layer(args.config, "run", package) if package else None
        alerts = resolve(spec, environ=environ).spec.alerts
    except Exception as exc:  # noqa: BLE001 - SpecError
        print(f"et channels test: configuration error: {exc}", file=sys.stderr)
        return 2
    specs = list(alerts.channels)
    if args.names:
        unknown = sorted(set(args.names) - {c.name for c in specs})
        if unknown:
            known = ", ".join(c.name for c in specs) or "none"
            print(
                f"et channels test: unknown channel(s) {', '.join(unknown)} (configured: {known})",
                file=sys.stderr,
            )
            return 2
        specs = [c for c in specs if c.name in args.names]
    if not specs:
        if output.is_machine(args.format):
            output.write_records([], args.format)  # json: `[]`, a document all the same
        print(
            "no alert channel is configured (set ET_SLACK_WEBHOOK_URL, ET_LARK_WEBHOOK_URL, "
            "..., or give --config / ET_ALERT_CONFIG)",
            file=sys.stderr,
        )
        return 1
    failures = 0
    tested = 0
    bad_config = 0  # channels whose settings are invalid: a configuration error, exit 2
    records = output.RecordWriter(args.format) if output.is_machine(args.format) else None
    for spec in specs:
        row = {"channel": spec.name, "type": spec.type}
        if spec.url_env and spec.url is None:
            value = environ.get(spec.url_env)
            if not value or not value.strip():
                row.update(ok=None, off=True, answer=f"off ({spec.url_env} not set)")
                _print(row, records)
                continue
        tested += 1
        try:
            channel = create_channel(spec, environ)
        except Exception as exc:  # noqa: BLE001 - ChannelConfigError
            row.update(ok=False, answer=f"configuration error: {exc}")
            bad_config += 1
            _print(row, records)
            continue
        row["target"] = channel.target
        secrets = tuple(channel.secrets())
        message = AlertMessage(
            title="expr_tracker test alert",
            text=f"A test message for channel {spec.name!r} from `et channels test`.",
            level="info",
            fields={"channel": spec.name, "type": spec.type},
            source="test",
        )
        try:
            result = channel.send(message, args.timeout)
            row.update(ok=True, status=result.status, answer=excerpt(result.describe(), secrets))
        except DeliveryError as exc:
            answer = excerpt(exc.reason, secrets)
            if exc.body:
                answer += f": {excerpt(exc.body, secrets)}"
            row.update(ok=False, status=exc.status, answer=answer)
            failures += 1
        except Exception as exc:  # noqa: BLE001 - a broken channel class
            row.update(ok=False, answer=excerpt(f"{type(exc).__name__}: {exc}", secrets))
            failures += 1
        _print(row, records)
    if records is not None:
        records.close()
    if bad_config:
        print(
            f"et channels test: configuration error in {bad_config} channel(s) (see above)",
            file=sys.stderr,
        )
        return 2
    if not tested:
        print("et channels test: no channel was tested: every one selected is off", file=sys.stderr)
        return 1
    return 1 if failures else 0


def _print(row: dict, records: output.RecordWriter | None) -> None:
    """One channel's result: a record of ``records`` (json/jsonl), else a line of text."""
    if records is not None:
        records.write([row])
        return
    if row.get("off"):
        print(f"{row['channel']} ({row['type']}): {row['answer']}")
        return
    mark = "ok" if row.get("ok") else "FAILED"
    target = row.get("target", "")
    print(f"{row['channel']} ({row['type']}, {target}): {mark}: {row.get('answer', '')}")
