"""``et ui [DIR] [--host 127.0.0.1] [--port 8050]``: the web dashboard (docs/ui.md)."""

from __future__ import annotations

import argparse
import ipaddress
import socket
import sys
from pathlib import Path
from typing import Any

UI_EXTRA = "pip install 'expr-tracker[ui]'"


def register(subparsers: Any) -> None:
    """Add the ``ui`` sub-command to ``subparsers`` (sets ``func``)."""
    p = subparsers.add_parser(
        "ui",
        help="a local web dashboard over the runs (read-only; charts, live, compare)",
        description=(
            "Serve a read-only web dashboard over the runs under DIR: the runs table, a page "
            "per run (charts of every metric, live while it writes, alerts, config, summary, "
            "span breakdown, Chrome trace download) and a comparison of selected runs. Binds "
            f"127.0.0.1 unless --host says otherwise. Needs the ui extra: {UI_EXTRA}."
        ),
    )
    p.add_argument("dir", nargs="?", default="runs", help="folder of runs (default ./runs)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; another one exposes the runs to the network)",
    )
    p.add_argument("--port", type=int, default=8050, help="port (default 8050)")
    p.add_argument(
        "--cache-dir", default=None, help="where the columnar cache lives (default: beside runs)"
    )
    p.set_defaults(func=run_ui)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _cannot_listen(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on (the port in use, an address not of this
    machine, a name that does not resolve), or None: checked before serving so that the
    user reads one line rather than uvicorn's error after "serving ..."."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        return f"cannot resolve --host {host!r}: {exc.strerror or exc}"
    family, kind, proto, _, addr = infos[0]
    try:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            s.bind(addr)
    except OSError as exc:
        return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    return None


def run_ui(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    if not root.is_dir():
        print(
            f"et ui: DIR {args.dir!r} is not a folder (a folder of runs or a run)", file=sys.stderr
        )
        return 2
    if not 1 <= args.port <= 65535:
        print(f"et ui: --port {args.port} is not valid: 1..65535", file=sys.stderr)
        return 2
    try:
        from expr_tracker.ui.server import import_web, plotly_js

        import_web()
        plotly_js()
    except ImportError as exc:
        print(f"et ui: {exc}", file=sys.stderr)
        return 1
    from expr_tracker.ui.server import serve

    why = _cannot_listen(args.host, args.port)
    if why is not None:
        print(f"et ui: {why} (another --port, or --host)", file=sys.stderr)
        return 1
    if not _loopback(args.host):
        print(
            f"et ui: warning: binding {args.host}: anyone who can reach this address can read "
            "every run under the folder (no authentication); the default is 127.0.0.1",
            file=sys.stderr,
        )
    shown = f"[{args.host}]" if ":" in args.host else args.host
    print(f"et ui: serving {root} at http://{shown}:{args.port}/ (Ctrl-C to stop)", file=sys.stderr)
    try:
        serve(root, args.host, args.port, cache_dir=args.cache_dir)
    except KeyboardInterrupt:
        pass
    return 0
