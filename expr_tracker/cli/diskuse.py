"""``et du [DIR]`` and ``et gc [DIR]``: what runs take on disk, and removing what is no
longer needed (docs/runs.md "Disk use" and "Garbage").

``et du``: per run under DIR, the bytes of its metrics (``metrics*.jsonl`` and their
sidecars), spans (``spans*.jsonl``), everything else in its folder (``other``: config,
summary, alerts, lineage, a user's files), its caches (the run's ``.et-cache`` and the
caches kept for it elsewhere: ``$XDG_CACHE_HOME``, ``--cache-dir``) and the artifact
versions it logged (in its project's store, ``<project>/artifacts``); then, per store,
the versions no listed run logged. Sizes are apparent sizes (``st_size``); every file is
counted once however many hard links it has: within a line in the first column it is met
in (metrics, spans, other, cache, artifacts), and in the total once in all. ``shared`` is
what a line holds that another line holds too (an artifact stored by hard link from a
run's checkpoint). Links are never followed; nothing is opened.

``et gc``: removes (``--dry-run``: only lists) the caches of runs that no longer exist (a
``.et-cache/<file>`` folder whose file is gone, a cache folder under ``$XDG_CACHE_HOME`` or
``--cache-dir`` whose manifest names a file under DIR that is gone), what an interrupted
``et runs rm`` left (``.NAME.removing-PID`` of a process that is gone) and the partial media
files of a killed writer (``media/.NAME.PID.tmp`` of a process that is gone); with
``--max-cache SIZE`` then whole caches of existing runs, least recently refreshed first,
until the caches under DIR (and theirs elsewhere) take at most SIZE (a cache a query
holds locked is left); with ``--artifacts`` the artifact versions nothing refers to (see
:func:`unreferenced_versions`), after asking (``--yes`` does not ask). A cache is a
disposable index: a removed one is built again on the next read.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import re
import shutil
import stat
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from expr_tracker.cli import output

__all__ = [
    "CATEGORIES",
    "disk_use",
    "garbage",
    "register",
    "unreferenced_versions",
]

#: the columns of et du, in the order a file is attributed
CATEGORIES = ("metrics", "spans", "other", "cache", "artifacts")
_DIGEST_RE = re.compile(r"^[0-9a-f]{32}$")
_REMOVING_RE = re.compile(r"^\..+\.removing-([0-9]+)$")
#: a media file being written (media/store.py writes ``.NAME.PID.tmp`` then renames it)
_MEDIA_TMP_RE = re.compile(r"^\.[^/]+\.([0-9]+)\.tmp$")
_CACHE = ".et-cache"


def register(subparsers: Any) -> None:
    """Add ``du`` and ``gc`` (set ``func``)."""
    p = subparsers.add_parser(
        "du",
        help="bytes per run: metrics, spans, other files, caches, artifacts (hard links "
        "counted once)",
        description="What each run under DIR takes on disk (apparent sizes; a file with "
        "several hard links counted once).",
    )
    p.add_argument("dir", nargs="?", default="runs", help="runs folder (default ./runs)")
    p.add_argument(
        "--cache-dir",
        action="append",
        default=[],
        metavar="D",
        help="count the caches under D too (et ui / et query --cache-dir)",
    )
    output.add_format_option(p, "table", what="one record per run and store, then the total")
    p.set_defaults(func=run_du)

    p = subparsers.add_parser(
        "gc",
        help="remove caches of deleted runs (--max-cache SIZE: bound the caches; "
        "--artifacts: unreferenced artifact versions); et gc URL: a sync bucket's "
        "unreferenced objects",
        description="Remove what no run needs any more under DIR: caches of runs that are "
        "gone, leftovers of an interrupted et runs rm, and with --artifacts the artifact "
        "versions nothing refers to. Given a sync bucket (s3://bucket/prefix, file:///path), "
        "delete the objects no manifest references that are older than --grace seconds "
        "(docs/team.md).",
    )
    p.add_argument(
        "dir",
        nargs="?",
        default="runs",
        metavar="DIR|URL",
        help="runs folder (default ./runs), or a sync bucket: s3://bucket/prefix, file:///path",
    )
    p.add_argument(
        "--cache-dir", action="append", default=[], metavar="D", help="clean the caches under D too"
    )
    p.add_argument(
        "--max-cache",
        default=None,
        metavar="SIZE",
        help="then remove the least recently refreshed caches until they take at most SIZE (64MiB, 2GB, ...)",
    )
    p.add_argument(
        "--artifacts",
        action="store_true",
        help="also remove artifact versions nothing refers to (asks first)",
    )
    p.add_argument(
        "-n", "--dry-run", action="store_true", help="list what would go; remove nothing"
    )
    p.add_argument("-y", "--yes", action="store_true", help="do not ask")
    bucket = p.add_argument_group("a sync bucket (et gc URL)")
    bucket.add_argument(
        "--endpoint-url", default=None, metavar="URL", help="an S3-compatible endpoint"
    )
    bucket.add_argument(
        "--grace",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="keep unreferenced objects younger than this (default 3600): a sync running now "
        "has uploaded parts it has not committed yet",
    )
    bucket.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run_gc)


# --------------------------------------------------------------------------- walking


def _files(top: Path, skip_cache: bool = True) -> Iterator[tuple[Path, os.stat_result]]:
    """Every non-folder entry under ``top`` (links as themselves, never followed), with its
    ``lstat``; ``.et-cache`` folders left out when ``skip_cache``."""
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        if skip_cache:
            dirnames[:] = [d for d in dirnames if d != _CACHE]
        for n in filenames + dirnames:
            p = Path(dirpath) / n
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode):
                yield p, st


def _category(run_dir: Path, path: Path) -> str:
    if path.parent == run_dir:
        n = path.name
        if n.startswith("metrics") and (n.endswith(".jsonl") or n.endswith(".meta.json")):
            return "metrics"
        if n.startswith("spans") and n.endswith(".jsonl"):
            return "spans"
    return "other"


def _logged_versions(run_dir: Path) -> list[tuple[str, int]]:
    """The artifact versions the run's lineage says it made (``logged`` and new)."""
    from expr_tracker.artifacts.lineage import read_lineage

    out = []
    for rec in read_lineage(run_dir):
        name, version = rec.get("name"), rec.get("version")
        if rec.get("action") == "logged" and rec.get("new") is not False:
            if isinstance(name, str) and type(version) is int:
                out.append((name, version))
    return out


def _version_files(store: Path, name: str, version: int) -> list[tuple[Path, os.stat_result]]:
    from expr_tracker.artifacts.names import validate_name
    from expr_tracker.artifacts.store import manifest_name

    try:
        validate_name(name)
    except Exception:  # noqa: BLE001 - a lineage line is untrusted: a bad name names nothing
        return []
    adir = store / name
    out = list(_files(adir / f"v{version}")) if (adir / f"v{version}").is_dir() else []
    with contextlib.suppress(OSError):
        m = adir / manifest_name(version)
        out.append((m, os.lstat(m)))
    return out


def _stores(root: Path) -> list[Path]:
    """The artifact stores under ``root`` (``<project>/artifacts`` with an ``index.jsonl``,
    and ``root/artifacts``), not through links."""
    out = []
    for dirpath, dirnames, _ in os.walk(root, followlinks=False):
        depth = len(Path(dirpath).relative_to(root).parts)
        dirnames[:] = [d for d in dirnames if not d.startswith(".")] if depth < 6 else []
        if "artifacts" in dirnames:
            s = Path(dirpath) / "artifacts"
            if os.path.isfile(s / "index.jsonl") and not os.path.islink(s):
                out.append(s)
                dirnames.remove("artifacts")
    return out


def disk_use(
    root: str | os.PathLike[str], cache_dirs: Sequence[str | os.PathLike[str]] = ()
) -> list[dict[str, Any]]:
    """One record per run under ``root`` (``run``, ``path``, a byte count per
    :data:`CATEGORIES`, ``shared``, ``total``), one per artifact store (``run``:
    ``<store> (logged by no listed run)``), and last the ``total`` line (every file once).
    See the module doc."""
    from expr_tracker.cli.runops import outside_caches
    from expr_tracker.history.rundirs import find_runs

    root = Path(root)
    lines: list[tuple[str, str, dict[str, list[tuple[tuple[int, int], int]]]]] = []
    attributed: set[tuple[Path, str, int]] = set()
    for d in find_runs(root):
        if os.path.islink(d):
            continue
        cats: dict[str, list[tuple[tuple[int, int], int]]] = {c: [] for c in CATEGORIES}
        for p, st in _files(d):
            cats[_category(d, p)].append(((st.st_dev, st.st_ino), st.st_size))
        caches = (
            [d / _CACHE] if os.path.isdir(d / _CACHE) and not os.path.islink(d / _CACHE) else []
        )
        for cache in caches + outside_caches(d, cache_dirs):
            for _, st in _files(cache, skip_cache=False):
                cats["cache"].append(((st.st_dev, st.st_ino), st.st_size))
        store = d.parent / "artifacts"
        for name, version in _logged_versions(d):
            if (store, name, version) in attributed:
                continue
            attributed.add((store, name, version))
            for _, st in _version_files(store, name, version):
                cats["artifacts"].append(((st.st_dev, st.st_ino), st.st_size))
        rel = str(d.relative_to(root)) if d != root else d.name
        lines.append((rel, str(d), cats))
    for store in _stores(root):
        cats = {c: [] for c in CATEGORIES}
        for p, st in _files(store, skip_cache=False):
            parts = p.relative_to(store).parts
            m = re.match(r"^v([0-9]+)(?:\.manifest\.json)?$", parts[1]) if len(parts) > 1 else None
            if m and (store, parts[0], int(m.group(1))) in attributed:
                continue
            cats["artifacts"].append(((st.st_dev, st.st_ino), st.st_size))
        lines.append((f"{store.relative_to(root)} (logged by no listed run)", str(store), cats))
    owners: dict[tuple[int, int], set[int]] = {}
    for i, (_, _, cats) in enumerate(lines):
        for entries in cats.values():
            for key, _ in entries:
                owners.setdefault(key, set()).add(i)
    records = []
    everything: dict[tuple[int, int], int] = {}
    for label, where, cats in lines:
        seen: set[tuple[int, int]] = set()
        rec: dict[str, Any] = {"run": label, "path": where}
        shared = 0
        for c in CATEGORIES:
            n = 0
            for key, size in cats[c]:
                if key in seen:
                    continue
                seen.add(key)
                n += size
                everything[key] = size
                if len(owners[key]) > 1:
                    shared += size
            rec[c] = n
        rec["shared"] = shared
        rec["total"] = sum(rec[c] for c in CATEGORIES)
        records.append(rec)
    total: dict[str, Any] = {"run": "total", "path": str(root)}
    for c in CATEGORIES:
        total[c] = sum(r[c] for r in records)
    total["shared"] = sum(r["shared"] for r in records)
    total["total"] = sum(everything.values())
    records.append(total)
    return records


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024  # type: ignore[assignment]
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
    return str(n)  # pragma: no cover


def run_du(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    """``et du``: 0, or 1 when DIR is not a folder."""
    out = out or sys.stdout
    root = Path(args.dir)
    if not root.is_dir():
        sys.stderr.write(f"et du: {str(root)!r} is not a directory\n")
        return 1
    records = disk_use(root, args.cache_dir)
    if output.is_machine(args.format):
        output.write_records(records, args.format, out)
        return 0
    from rich.table import Table
    from rich.text import Text

    from expr_tracker.cli.history import table_width

    console = output.console(out, table_width(out))
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("run", overflow="fold")
    for c in (*CATEGORIES, "shared", "total"):
        table.add_column(c, justify="right", no_wrap=True)
    for r in records:
        style = "bold" if r is records[-1] else None
        table.add_row(
            Text(output.printable(r["run"]), style=style or ""),
            *(Text(_size(r[c]), style=style or "") for c in (*CATEGORIES, "shared", "total")),
        )
    console.print(table)
    return 0


# --------------------------------------------------------------------------- garbage


def _ours(path: Path) -> bool:
    """A folder of this user, not a link (a cache we may remove)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()


def _our_file(path: Path) -> bool:
    """A regular file of this user, not a link."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


def _file_bytes(path: Path) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def _remove(path: Path) -> None:
    """Remove a folder tree or, for a leftover file, the file (never through a link)."""
    if stat.S_ISDIR(os.lstat(path).st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _pid_gone(pid: int) -> bool:
    from expr_tracker.history.runinfo import pid_alive

    return pid != os.getpid() and not pid_alive(pid)


def _manifest_source(folder: Path) -> str | None:
    from expr_tracker.history.untrusted import read_json

    try:
        m = read_json(folder / "manifest.json", root=folder, max_bytes=1 << 20)
    except (OSError, ValueError, RecursionError):
        return None
    src = m.get("source") if isinstance(m, dict) else None
    return src if isinstance(src, str) else None


def _under(path: str, tops: set[str]) -> bool:
    return any(path.startswith(t.rstrip(os.sep) + os.sep) for t in tops)


def garbage(
    root: str | os.PathLike[str], cache_dirs: Sequence[str | os.PathLike[str]] = ()
) -> list[tuple[Path, str]]:
    """What ``et gc`` removes without ``--max-cache`` and ``--artifacts``: ``(folder,
    why)`` for each cache of a file that is gone and each leftover of an interrupted
    ``et runs rm``: under ``root``, and under the fallback cache root and ``cache_dirs``
    those whose file lay under ``root`` (only folders of this user, never through a
    link)."""
    from expr_tracker.query.cache import fallback_root

    root = Path(root)
    tops = {os.path.abspath(root), os.path.realpath(root)}
    out: list[tuple[Path, str]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        if here.name == "media":
            for n in filenames:
                m = _MEDIA_TMP_RE.match(n)
                if m and _pid_gone(int(m.group(1))) and _our_file(here / n):
                    out.append((here / n, "a media file a killed writer left"))
        for d in list(dirnames):
            m = _REMOVING_RE.match(d)
            if m and _pid_gone(int(m.group(1))) and _ours(here / d):
                out.append((here / d, "left by an interrupted et runs rm"))
                dirnames.remove(d)
        if _CACHE in dirnames:
            dirnames.remove(_CACHE)
            cache = here / _CACHE
            if not _ours(cache):
                continue
            try:
                names = sorted(os.listdir(cache))
            except OSError:
                continue
            gone = [n for n in names if not os.path.lexists(here / n)]
            if gone and len(gone) == len(names):
                out.append((cache, "the cache of a run that is gone"))
            else:
                out += [
                    (cache / n, f"the cache of {here / n}, which is gone")
                    for n in gone
                    if _ours(cache / n)
                ]
        dirnames[:] = [d for d in dirnames if not d.startswith(".") or _REMOVING_RE.match(d)]
    for base in [fallback_root(), *map(Path, cache_dirs)]:
        try:
            names = sorted(os.listdir(base))
        except OSError:
            continue
        for n in names:
            folder = base / n
            if not _DIGEST_RE.match(n) or not _ours(folder):
                continue
            src = _manifest_source(folder)
            if src is not None and _under(src, tops) and not os.path.lexists(src):
                out.append((folder, f"the cache of {src}, which is gone"))
    return out


def _caches(root: Path, cache_dirs: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Every source's cache folder of the runs under ``root`` (in their ``.et-cache`` and
    kept for them elsewhere)."""
    from expr_tracker.cli.runops import outside_caches
    from expr_tracker.history.rundirs import find_runs

    out = []
    for d in find_runs(root):
        c = d / _CACHE
        if _ours(c):
            with contextlib.suppress(OSError):
                out += [c / n for n in sorted(os.listdir(c)) if _ours(c / n)]
        out += outside_caches(d, cache_dirs)
    return out


def _locked_by_other(folder: Path) -> bool:
    """A refresh or read holds the cache's ``lock`` now."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover
        return False
    try:
        fd = os.open(folder / "lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
    finally:
        os.close(fd)


def _last_used(folder: Path) -> float:
    with contextlib.suppress(OSError):
        return os.lstat(folder / "manifest.json").st_mtime
    with contextlib.suppress(OSError):
        return os.lstat(folder).st_mtime
    return 0.0


def over_bound(
    root: Path, cache_dirs: Sequence[str | os.PathLike[str]], bound: int
) -> list[tuple[Path, str]]:
    """The caches to remove, least recently refreshed first, until those left take at most
    ``bound`` bytes (one a query holds locked is kept)."""
    from expr_tracker.cli.runops import tree_bytes

    sized = [(f, tree_bytes(f)) for f in _caches(root, cache_dirs)]
    total = sum(n for _, n in sized)
    out = []
    for f, n in sorted(sized, key=lambda fn: _last_used(fn[0])):
        if total <= bound:
            break
        if _locked_by_other(f):
            continue
        out.append((f, f"over --max-cache ({_size(n)})"))
        total -= n
    return out


def unreferenced_versions(root: str | os.PathLike[str]) -> list[tuple[Path, str, int, str]]:
    """``(store, name, version, why)`` for each artifact version under ``root`` nothing
    refers to: no lineage line of a run under ``root`` names it (logged or used), it carries
    no alias, and it is not its artifact's newest version (``latest``: kept, so numbers are
    never given twice)."""
    from expr_tracker.artifacts.lineage import read_lineage
    from expr_tracker.artifacts.store import ArtifactStore
    from expr_tracker.history.rundirs import find_runs

    root = Path(root)
    named: set[tuple[Path, str, int]] = set()
    for d in find_runs(root):
        store = Path(os.path.abspath(d.parent / "artifacts"))
        for rec in read_lineage(d):
            if isinstance(rec.get("name"), str) and type(rec.get("version")) is int:
                named.add((store, rec["name"], rec["version"]))
    out = []
    for s in _stores(root):
        store = Path(os.path.abspath(s))
        for name, item in ArtifactStore(store).catalog().items():
            newest = max(item["versions"])
            aliased = set(item["aliases"].values())
            for v in sorted(item["versions"]):
                if v == newest or v in aliased or (store, name, v) in named:
                    continue
                out.append((store, name, v, "no run refers to it and it has no alias"))
    return out


def run_gc(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    """``et gc``: 0 done, 1 DIR is not a folder or something could not be removed, 2 a bad
    ``--max-cache`` or the removal of artifacts not confirmed."""
    from expr_tracker.cli.runops import tree_bytes
    from expr_tracker.units import parse_size

    if "://" in str(args.dir):  # a sync bucket
        from expr_tracker.cli.sync import run_bucket_gc

        local = [
            flag
            for flag, given in (
                ("--cache-dir", args.cache_dir),
                ("--max-cache", args.max_cache),
                ("--artifacts", args.artifacts),
            )
            if given
        ]
        if local:
            sys.stderr.write(f"et gc: {', '.join(local)} apply to a runs folder, not a bucket\n")
            return 2
        return run_bucket_gc(args)
    out, err = out or sys.stdout, sys.stderr
    root = Path(args.dir)
    if not root.is_dir():
        err.write(f"et gc: {str(root)!r} is not a directory\n")
        return 1
    bound = None
    if args.max_cache is not None:
        try:
            bound = parse_size(args.max_cache)
        except ValueError as exc:
            err.write(f"et gc: --max-cache: {exc}\n")
            return 2
    verb = "would remove" if args.dry_run else "removed"
    code = 0
    freed = 0
    found = garbage(root, args.cache_dir)
    gone_now = {f for f, _ in found}
    for f, why in found:
        n = tree_bytes(f) if f.is_dir() else _file_bytes(f)
        if not args.dry_run:
            try:
                _remove(f)
            except OSError as exc:
                err.write(f"et gc: {output.printable(str(f))}: {exc.strerror or exc}\n")
                code = 1
                continue
        freed += n
        out.write(f"{verb} {output.printable(str(f))} ({_size(n)}): {output.printable(why)}\n")
    if bound is not None:
        for f, why in over_bound(root, args.cache_dir, bound):
            if f in gone_now:
                continue
            n = tree_bytes(f)
            if not args.dry_run:
                try:
                    shutil.rmtree(f)
                except OSError as exc:
                    err.write(f"et gc: {output.printable(str(f))}: {exc.strerror or exc}\n")
                    code = 1
                    continue
            freed += n
            out.write(f"{verb} {output.printable(str(f))} ({_size(n)}): {why}\n")
    if args.artifacts:
        from expr_tracker.artifacts.store import ArtifactStore

        versions = unreferenced_versions(root)
        sizes = {}
        for store, name, v, _ in versions:
            sizes[(store, name, v)] = sum(st.st_size for _, st in _version_files(store, name, v))
        if versions and not args.dry_run and not args.yes:
            for store, name, v, _ in versions:
                err.write(
                    f"  {output.printable(str(store))}: {output.printable(name)}:v{v} ({_size(sizes[(store, name, v)])})\n"
                )
            err.write(
                f"remove {len(versions)} artifact version{'s' if len(versions) > 1 else ''}? [y/N] "
            )
            err.flush()
            if sys.stdin.readline().strip().lower() not in ("y", "yes"):
                err.write("et gc: no artifact version was removed\n")
                return 2
        for store, name, v, why in versions:
            if not args.dry_run:
                try:
                    ArtifactStore(store).remove_version(name, v)
                except Exception as exc:  # noqa: BLE001 - one version never stops the others
                    err.write(
                        f"et gc: {output.printable(name)}:v{v}: {output.printable(str(exc))}\n"
                    )
                    code = 1
                    continue
            freed += sizes[(store, name, v)]
            out.write(
                f"{verb} {output.printable(str(store))}: {output.printable(name)}:v{v} "
                f"({_size(sizes[(store, name, v)])}): {why}\n"
            )
    out.write(f"{'would free' if args.dry_run else 'freed'} {_size(freed)}\n")
    return code
