"""``et sync DIR URL`` and ``et gc URL`` (a form of ``et gc``): runs to object storage
(docs/team.md)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any


def register(subparsers: Any) -> None:
    """Add the ``sync`` sub-command to ``subparsers`` (``et gc URL``, the bucket's clean-up, is
    one form of ``et gc``: :func:`run_bucket_gc`, called by ``cli/diskuse.py``)."""
    p = subparsers.add_parser(
        "sync",
        help="upload runs to S3 (or a shared folder), incrementally",
        description=(
            "Upload every run under DIR to URL (s3://bucket/prefix, or file:///path for a "
            "shared file system): each producer's new complete lines become immutable parts "
            "(raw JSONL and Parquet) committed by a manifest written with a conditional "
            "write, so syncers running at once never lose each other's commits. Re-running "
            "uploads only what is new (nothing for an unchanged folder). Credentials come "
            "from the standard AWS chain; AWS_ENDPOINT_URL (or --endpoint-url) names an "
            "S3-compatible store. See docs/team.md."
        ),
    )
    p.add_argument("dir", metavar="DIR", help="a folder of runs or one run directory")
    p.add_argument("url", metavar="URL", help="s3://bucket/prefix or file:///path")
    p.add_argument("--endpoint-url", default=None, metavar="URL", help="an S3-compatible endpoint")
    p.add_argument(
        "--full",
        action="store_true",
        help="ask the bucket about every producer (ignore the record of what was synced)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run_sync)


def run_sync(args: argparse.Namespace) -> int:
    """Exit codes: 0 every producer synced, 1 a producer or a media file not synced (each
    named on stderr; the rest synced all the same), a bad URL, a folder that is not there, or a store that cannot be reached."""
    from expr_tracker.sync.store import StoreError
    from expr_tracker.sync.upload import sync_dir

    try:
        rep = sync_dir(args.dir, args.url, endpoint_url=args.endpoint_url, full=args.full)
    except (ValueError, StoreError, FileNotFoundError, ImportError) as exc:
        print(f"et sync: {exc}", file=sys.stderr)
        return 1
    for line in rep.errors + rep.skipped:
        print(f"et sync: {line}", file=sys.stderr)
    if args.json:
        print(json.dumps(dataclasses.asdict(rep)))
    else:
        print(
            f"synced {rep.runs} run(s), {rep.producers} producer(s) to {args.url}: "
            f"{rep.commits} commit(s), {rep.objects} object(s), {rep.bytes} bytes uploaded; "
            f"{rep.unchanged} unchanged"
            + (f"; {rep.lost} commit(s) lost to other syncers and retried" if rep.lost else "")
            + (f"; {len(rep.errors)} not synced" if rep.errors else "")
            + (f"; {len(rep.skipped)} media file(s) not synced" if rep.skipped else "")
        )
    # a media file left out is a file the bucket lacks: a script checking the exit status
    # must see it (the next sync tries it again; docs/team.md "Sync")
    return 1 if rep.errors or rep.skipped else 0


def run_bucket_gc(args: argparse.Namespace) -> int:
    """``et gc URL``. Exit codes: 0 done (manifests not understood are listed on stderr; what they may
    reference was kept), 1 a bad URL, a bad --grace or a store that cannot be reached."""
    from expr_tracker.sync.collect import collect
    from expr_tracker.sync.store import StoreError, open_store

    if not args.grace >= 0:
        print(f"et gc: --grace {args.grace}: must be a number of seconds >= 0", file=sys.stderr)
        return 1
    try:
        store = open_store(args.dir, endpoint_url=args.endpoint_url)
        rep = collect(store, grace=args.grace, dry_run=args.dry_run)
    except (ValueError, StoreError) as exc:
        print(f"et gc: {exc}", file=sys.stderr)
        return 1
    for line in rep.problems:
        print(f"et gc: kept everything {line!s}", file=sys.stderr)
    if args.json:
        print(json.dumps(dataclasses.asdict(rep)))
    else:
        verb = "would delete" if args.dry_run else "deleted"
        print(
            f"{args.dir}: {rep.manifests} manifest(s), {rep.kept} object(s) referenced; "
            f"{verb} {rep.deleted} unreferenced object(s) ({rep.freed} bytes); "
            f"{rep.young} younger than the grace kept"
        )
    return 0


def is_bucket_url(value: Any) -> bool:
    """True for an argument naming a sync bucket: ``s3://...`` or ``file://...`` (one word:
    an SQL text that mentions a URL is not one)."""
    return (
        isinstance(value, str)
        and value.startswith(("s3://", "file://"))
        and not any(c.isspace() for c in value)
    )


def on_buckets(fn: Any, command: str, *names: str, lists: tuple[str, ...] = ()) -> Any:
    """Wrap the ``func`` of a reading command so that each argument in ``names`` holding a
    bucket URL (a string, or items of a list) is replaced by the local folder that stands
    for it, brought up to date first (:func:`expr_tracker.sync.mirror.mirror_url`; docs/team.md
    "Reading the bucket"). Each argument in ``lists`` is a comma-separated list (``--runs
    A,B``) whose URL items are replaced so (an item is joined with the next pieces while
    it names nothing alone: a run name holding a comma). A URL that cannot be read ends
    the command with exit code 1 and the reason on stderr; producers not mirrored are named
    as warnings."""

    def resolve(value: str) -> str:
        from expr_tracker.cli import output
        from expr_tracker.sync.mirror import mirror_url

        res = mirror_url(value, endpoint_url=None)
        for line in res.problems:
            sys.stderr.write(f"et {command}: warning: {output.printable(line)}\n")
        return str(res.target or res.path)

    def fail(exc: Exception) -> _Stop:
        from expr_tracker.cli import output

        sys.stderr.write(f"et {command}: {output.printable(str(exc))}\n")
        return _Stop()

    def local(value: str) -> str:
        from expr_tracker.sync.store import StoreError

        try:
            return resolve(value)
        except (ValueError, StoreError, OSError) as exc:
            raise fail(exc) from None

    def local_list(text: str) -> str:
        from expr_tracker.sync.store import StoreError

        pieces, out, i = text.split(","), [], 0
        while i < len(pieces):
            if not is_bucket_url(pieces[i].strip()):
                out.append(pieces[i])
                i += 1
                continue
            first: Exception | None = None
            j = i + 1
            while True:
                try:
                    out.append(resolve(",".join(pieces[i:j]).strip()))
                    i = j
                    break
                except (ValueError, StoreError, OSError) as exc:
                    first = first or exc
                j += 1
                if j > len(pieces) or is_bucket_url(pieces[j - 1].strip()):
                    raise fail(first) from None
        return ",".join(out)

    def wrapped(args: argparse.Namespace, *a: Any, **kw: Any) -> Any:
        try:
            for name in names:
                value = getattr(args, name, None)
                if isinstance(value, list):
                    setattr(args, name, [local(v) if is_bucket_url(v) else v for v in value])
                elif isinstance(value, str) and is_bucket_url(value):
                    setattr(args, name, local(value))
            for name in lists:
                value = getattr(args, name, None)
                if isinstance(value, str) and "://" in value:
                    setattr(args, name, local_list(value))
        except _Stop:
            return 1
        return fn(args, *a, **kw)

    wrapped.__name__ = getattr(fn, "__name__", "run")
    wrapped.__doc__ = fn.__doc__
    return wrapped


class _Stop(Exception):
    """A bucket URL that could not be read (already reported)."""
