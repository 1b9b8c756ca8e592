"""``et ui [DIR] [--host 127.0.0.1] [--port 8050] [--token VALUE | --no-token]``: the web
dashboard (docs/ui.md)."""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
from pathlib import Path
from typing import Any

UI_EXTRA = "pip install 'expr-tracker[ui]'"
#: the environment variable holding the token (as ``--token``)
TOKEN_ENV = "ET_UI_TOKEN"


def register(subparsers: Any) -> None:
    """Add the ``ui`` sub-command to ``subparsers`` (sets ``func``)."""
    p = subparsers.add_parser(
        "ui",
        help="a local web dashboard over the runs (read-only; charts, live, compare)",
        description=(
            "Serve a read-only web dashboard over the runs under DIR: the runs table, a page "
            "per run (charts of every metric, live while it writes, alerts, config, summary, "
            "span breakdown, Chrome trace download) and a comparison of selected runs. Binds "
            "127.0.0.1 unless --host says otherwise, answers only requests naming its own host "
            "(localhost, 127.0.0.1, [::1] or --host) and needs a token: open the printed "
            f"link (http://127.0.0.1:8050/?token=...). Needs the ui extra: {UI_EXTRA}."
        ),
    )
    p.add_argument(
        "dir",
        nargs="?",
        default="runs",
        help=(
            "folder of runs (default ./runs), or a sync bucket (s3://bucket/prefix, "
            "file:///path; a project or a run of it): served read-only from a local copy "
            "brought up to date on each page load (docs/team.md)"
        ),
    )
    p.add_argument(
        "--endpoint-url",
        default=None,
        metavar="URL",
        help="the S3-compatible endpoint of an s3:// DIR (default: AWS_ENDPOINT_URL)",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; another one exposes the runs to the network)",
    )
    p.add_argument("--port", type=int, default=8050, help="port (default 8050)")
    p.add_argument(
        "--cache-dir", default=None, help="where the columnar cache lives (default: beside runs)"
    )
    tok = p.add_mutually_exclusive_group()
    tok.add_argument(
        "--token",
        default=None,
        metavar="VALUE",
        help=(
            f"the token the page and API calls need (default: ${TOKEN_ENV}, else a random one, "
            "printed in the link); on a shared machine prefer the environment variable, as "
            "other users can read command lines"
        ),
    )
    tok.add_argument(
        "--no-token",
        action="store_true",
        help="serve without a token: any local user (and, with --host, anyone) reads the runs",
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


def _bucket(url: str, endpoint_url: str | None) -> tuple[Path, Any] | None:
    """The local copy standing for a bucket URL, brought up to date, and the callable that
    refreshes it (returns the problems to report); None (the reason on stderr) when the URL
    cannot be read."""
    from expr_tracker.cli import output
    from expr_tracker.sync.mirror import mirror_url
    from expr_tracker.sync.store import StoreError

    try:
        res = mirror_url(url, endpoint_url=endpoint_url)
    except (ValueError, StoreError, OSError) as exc:
        print(f"et ui: {output.printable(str(exc))}", file=sys.stderr)
        return None
    for line in res.problems:
        print(f"et ui: warning: {output.printable(line)}", file=sys.stderr)
    target = res.target or res.path
    # a refresh reads again only what the first look named: the bucket, a project or a run
    rel = target.relative_to(res.path).parts
    base = url.rstrip("/")
    for _ in rel:
        base = base.rsplit("/", 1)[0]
    seen = set(res.problems)

    def refresh() -> list[str]:
        from expr_tracker.sync.mirror import mirror

        got = mirror(
            base,
            cache_dir=res.path,
            endpoint_url=endpoint_url,
            project=rel[0] if rel else None,
            run=rel[1] if len(rel) > 1 else None,
        )
        for line in got.problems:
            if line not in seen:  # each problem once on the terminal; every time in the API
                seen.add(line)
                print(f"et ui: warning: {output.printable(line)}", file=sys.stderr)
        return got.problems

    return target, refresh


def run_ui(args: argparse.Namespace) -> int:
    from expr_tracker.cli.sync import is_bucket_url

    bucket_url = args.dir if is_bucket_url(args.dir) else None
    root = Path(args.dir)
    if bucket_url is None and not root.is_dir():
        print(
            f"et ui: DIR {args.dir!r} is not a folder (a folder of runs or a run)", file=sys.stderr
        )
        return 2
    if not 1 <= args.port <= 65535:
        print(f"et ui: --port {args.port} is not valid: 1..65535", file=sys.stderr)
        return 2
    from expr_tracker.ui.guard import check_token, new_token

    token: str | None
    if args.no_token:
        token = None
    else:
        given, source = args.token, "--token"
        if given is None and os.environ.get(TOKEN_ENV):
            given, source = os.environ[TOKEN_ENV], TOKEN_ENV
        try:
            token = new_token() if given is None else check_token(given)
        except ValueError as exc:
            print(f"et ui: {source} is not valid: {exc}", file=sys.stderr)
            return 2
    try:
        from expr_tracker.ui.server import import_web, plotly_js

        import_web()
        plotly_js()
    except ImportError as exc:  # import_web names the extra; a module the server imports may not
        msg = str(exc) if "expr-tracker[ui]" in str(exc) else f"{exc.name or exc} is missing"
        print(f"et ui: {msg}" + ("" if msg == str(exc) else f": {UI_EXTRA}"), file=sys.stderr)
        return 1
    from expr_tracker.ui.server import serve

    why = _cannot_listen(args.host, args.port)
    if why is not None:
        print(f"et ui: {why} (another --port, or --host)", file=sys.stderr)
        return 1
    refresh = None
    if bucket_url is not None:  # copied now, after every check of the arguments
        got = _bucket(bucket_url, args.endpoint_url)
        if got is None:
            return 1
        root, refresh = got
    if token is None:
        print(
            "et ui: warning: --no-token: anyone who can reach the port "
            + ("(any user of this machine)" if _loopback(args.host) else f"on {args.host}")
            + " reads every run under the folder",
            file=sys.stderr,
        )
    elif not _loopback(args.host):
        print(
            f"et ui: warning: binding {args.host}: the token is all that keeps others on the "
            "network out, and it travels unencrypted (plain HTTP); the default is 127.0.0.1 "
            "(ssh -L 8050:127.0.0.1:8050 host, then the link)",
            file=sys.stderr,
        )
    shown = f"[{args.host}]" if ":" in args.host else args.host
    if args.host in ("0.0.0.0", "::", ""):
        shown = "127.0.0.1"
    url = f"http://{shown}:{args.port}/"
    if token is not None:
        url += f"?token={token}"
    what = f"{bucket_url} (read-only, through the local copy {root})" if bucket_url else str(root)
    print(f"et ui: serving {what} at {url} (Ctrl-C to stop)", file=sys.stderr)
    try:
        serve(
            root,
            args.host,
            args.port,
            cache_dir=args.cache_dir,
            token=token,
            source=bucket_url,
            refresh=refresh,
        )
    except KeyboardInterrupt:
        pass
    return 0
