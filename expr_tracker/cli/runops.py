"""``et runs rm|mv|archive|unarchive|tag``: cleaning up runs (docs/runs.md).

Every command names runs as every other command does (docs/cli.md "Naming a run": a path,
or a name under ``--dir``) and checks each one before it touches anything
(:func:`check_run`):

- it is a folder holding a run (a ``run*.json`` or a metrics file), not a symbolic link,
  not the runs folder itself, and its real path lies inside the runs folder (``--dir``,
  or the folder holding it when RUN is a path elsewhere): nothing outside is ever reached
  through a link;
- it holds no other run (removing it would remove that one too);
- it is not live: no producer's ``run*.json`` says ``running`` with a process alive (as
  ``et runs`` judges it; a run of another host that says ``running`` counts as live), and
  no writer holds a producer's one-writer lock. The command takes those locks itself
  (:class:`WriterLocks`, never following a link) and holds them while it works, so a run
  cannot start writing (a resume) under it.

``rm`` renames the folder to a hidden name first (the name is free at once, and a removal
cut short leaves nothing ``et runs`` lists) and then deletes it without following links
inside it; with it go the run's caches kept outside it (:func:`outside_caches`: the
fallback cache under ``$XDG_CACHE_HOME`` and those under ``--cache-dir``). ``mv`` renames
the folder within its parent and writes the new name into every ``run*.json``. ``archive``,
``unarchive`` and ``tag`` rewrite the ``run*.json`` files (atomically; a file read through
:mod:`expr_tracker.history.untrusted`).
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from expr_tracker.cli import output

__all__ = [
    "ACTIONS",
    "RunCheckError",
    "WriterLocks",
    "check_run",
    "outside_caches",
    "register",
    "run_argv",
    "tree_bytes",
]

#: the words after ``et runs`` that are commands (``et runs ./rm`` lists a folder named so)
ACTIONS = ("rm", "mv", "archive", "unarchive", "tag")


class RunCheckError(Exception):
    """A run that may not be touched, and why (the message names the run and the reason)."""


def run_argv(argv: Sequence[str]) -> list[str]:
    """``et runs rm ...`` as the parser reads it (``runs-rm ...``); ``tag``'s ``-t`` (remove
    t) becomes ``--remove=t`` and ``et runs --sort -loss`` ``--sort=-loss``, so argparse
    does not take them for options. Other argv is returned as it is."""
    argv = list(argv)
    if argv[:1] == ["runs"] and "--sort" in argv:  # --sort -loss: a value, not an option
        out_sort: list[str] = []
        for a in argv:
            if out_sort and out_sort[-1] == "--sort" and a.startswith("-") and a != "--":
                out_sort[-1] = f"--sort={a}"
            else:
                out_sort.append(a)
        argv = out_sort
    if len(argv) < 2 or argv[0] != "runs" or argv[1] not in ACTIONS:
        return argv
    rest = argv[2:]
    if argv[1] == "tag":
        out: list[str] = []
        takes_value = False
        for a in rest:
            if takes_value:
                out.append(a)
                takes_value = False
            elif a in ("--dir", "--add", "--remove", "--format"):
                out.append(a)
                takes_value = True
            elif a.startswith("-") and not a.startswith("--") and a != "-h":
                out.append(f"--remove={a[1:]}")
            elif a.startswith("+"):
                out.append(f"--add={a[1:]}")
            else:
                out.append(a)
        rest = out
    return [f"runs-{argv[1]}", *rest]


def register(subparsers: Any) -> None:
    """Add ``runs-rm``, ``runs-mv``, ``runs-archive``, ``runs-unarchive``, ``runs-tag`` (typed
    ``et runs rm`` ...: :func:`run_argv`; not listed in ``et --help``, ``et runs --help``
    names them)."""

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--dir", default="runs", help="where run names are looked up (default ./runs)"
        )

    p = subparsers.add_parser(
        "runs-rm",
        prog="et runs rm",
        description="Remove runs: their folders and the caches kept for them elsewhere. "
        "Asks first (--yes does not); a live run is refused.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN")
    common(p)
    p.add_argument("-y", "--yes", action="store_true", help="do not ask")
    p.add_argument(
        "--cache-dir",
        action="append",
        default=[],
        metavar="D",
        help="also remove the run's caches under D (the --cache-dir of et ui / et query)",
    )
    p.set_defaults(func=run_rm)

    p = subparsers.add_parser(
        "runs-mv",
        prog="et runs mv",
        description="Rename a run: its folder (within its parent) and the name in its "
        "run*.json files. A live run is refused.",
    )
    p.add_argument("run", metavar="RUN")
    p.add_argument("new_name", metavar="NEWNAME")
    common(p)
    p.set_defaults(func=run_mv)

    for word, on in (("archive", True), ("unarchive", False)):
        p = subparsers.add_parser(
            f"runs-{word}",
            prog=f"et runs {word}",
            description=(
                "Archive runs: et runs and et ui hide them unless asked (--archived)."
                if on
                else "Show archived runs again."
            ),
        )
        p.add_argument("runs", nargs="+", metavar="RUN")
        common(p)
        p.set_defaults(func=run_archive, archive=on)

    p = subparsers.add_parser(
        "runs-tag",
        prog="et runs tag",
        description="Add (+t) and remove (-t) tags of a run: et runs tag RUN +best -draft.",
    )
    p.add_argument("run", metavar="RUN")
    p.add_argument("plain", nargs="*", metavar="+T|-T", help="+T adds T, -T removes T")
    p.add_argument("--add", action="append", default=[], metavar="T", help="add tag T")
    p.add_argument("--remove", action="append", default=[], metavar="T", help="remove tag T")
    common(p)
    p.set_defaults(func=run_tag)


# --------------------------------------------------------------------------- checks


def _inside(path: str, root_real: str) -> bool:
    return path == root_real or path.startswith(root_real.rstrip(os.sep) + os.sep)


def _runs_folder(run_dir: Path, runs_dir: Path) -> Path:
    """The runs folder ``run_dir`` is checked against: ``runs_dir`` when ``run_dir`` lies
    under it (as written, before links are followed), else its parent folder."""
    a, r = os.path.abspath(run_dir), os.path.abspath(runs_dir)
    return Path(r) if _inside(a, r) and a != r else Path(a).parent


def check_run(given: str, runs_dir: str | os.PathLike[str]) -> Path:
    """The run folder RUN names, checked (see the module doc) but not yet locked.

    Raises:
        RunCheckError: no such run, a name that matches several, not a run folder, a link,
            a folder outside the runs folder, the runs folder itself, a folder holding
            other runs, a live run (the message says which and why).
    """
    from expr_tracker.history.paths import hostname
    from expr_tracker.history.rundirs import find_runs, read_producers
    from expr_tracker.history.runinfo import is_dead
    from expr_tracker.query.catalog import RunNotFoundError, resolve_run

    try:
        match = resolve_run(given, runs_dir)
    except RunNotFoundError as exc:
        raise RunCheckError(str(exc)) from None
    d = Path(os.path.abspath(match.path))
    try:
        st = os.lstat(d)
    except OSError as exc:
        raise RunCheckError(f"{given!r}: {d} cannot be read ({exc.strerror})") from None
    if stat.S_ISLNK(st.st_mode):
        raise RunCheckError(
            f"{given!r}: {d} is a symbolic link; the run it points to is not touched through "
            "it (name the run's own folder, or remove the link with rm)"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise RunCheckError(f"{given!r}: {d} is a file; name the run's folder")
    root = _runs_folder(d, Path(runs_dir))
    root_real, real = os.path.realpath(root), os.path.realpath(d)
    if real in (root_real, os.path.realpath(runs_dir)):
        raise RunCheckError(f"{given!r}: {d} is the runs folder itself; name one run in it")
    if not _inside(real, root_real):
        raise RunCheckError(
            f"{given!r}: {d} lies outside the runs folder {str(root)!r} (through a symbolic "
            f"link, to {real}); nothing there is touched"
        )
    found = find_runs(d)
    if d not in found and Path(real) not in [Path(os.path.realpath(f)) for f in found]:
        raise RunCheckError(
            f"{given!r}: {d} holds no run (no run*.json and no metrics*.jsonl in it)"
        )
    nested = _runs_below(d)
    if nested:
        names = ", ".join(str(f.relative_to(d)) for f in nested[:5])
        raise RunCheckError(
            f"{given!r}: {d} holds other runs too ({names}{', ...' if len(nested) > 5 else ''}); "
            "they would go with it: clean those up first"
        )
    infos, problems = read_producers(d)
    for name, info in infos.items():
        if info.get("status") == "running" and not is_dead(info):
            where = f"pid {info.get('pid')} on {info.get('host')}"
            other = info.get("host") != hostname()
            raise RunCheckError(
                f"{given!r}: {d} is live ({name} says running, {where}"
                f"{'; another host: its process cannot be checked from here' if other else ''}); "
                "stop it first"
            )
    if "." in problems:
        raise RunCheckError(f"{given!r}: {d} cannot be listed ({problems['.']})")
    return d


def _runs_below(d: Path) -> list[Path]:
    """Folders below ``d`` (links not followed, its ``.et-cache`` left out) holding a run's
    file: removing ``d`` would remove them. (``find_runs`` does not look inside a run.)"""
    from expr_tracker.history.paths import parse_metrics_name
    from expr_tracker.history.rundirs import RUN_FILE_RE

    out = []
    for dirpath, dirnames, filenames in os.walk(d, followlinks=False):
        dirnames[:] = sorted(n for n in dirnames if n != ".et-cache")
        if dirpath == str(d):
            continue
        if any(RUN_FILE_RE.match(n) or parse_metrics_name(n) for n in filenames):
            out.append(Path(dirpath))
            dirnames[:] = []
    return out


class WriterLocks:
    """The one-writer locks of every producer of ``run_dir`` (``<metrics file>.lock``), held
    until :meth:`release`: no run starts writing there meanwhile. A lock file is opened
    without following a link and only when it is a regular file; one that does not exist is
    made (``O_EXCL``). Where ``flock`` does not exist, nothing is locked.

    Raises:
        RunCheckError: a live writer holds a lock, or a lock file is not a regular file.
    """

    def __init__(self, run_dir: Path, given: str) -> None:
        from expr_tracker.history.paths import parse_metrics_name
        from expr_tracker.history.recovery import lock_path_of
        from expr_tracker.history.rundirs import RUN_FILE_RE

        self.fds: list[int] = []
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not on Linux
            return
        names = set()
        for name in sorted(os.listdir(run_dir)):
            if parse_metrics_name(name) is not None:
                names.add(name)
            m = RUN_FILE_RE.match(name)
            if m:
                stream, rank = m.group(1), m.group(2)
                names.add(
                    "metrics"
                    + (f".{stream}" if stream else "")
                    + (f".rank{rank}" if rank else "")
                    + ".jsonl"
                )
        try:
            for name in sorted(names):
                lock = lock_path_of(run_dir / name)
                flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
                try:
                    fd = os.open(lock, flags | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    try:
                        fd = os.open(lock, flags)
                    except OSError as exc:
                        if exc.errno == errno.ELOOP:
                            raise RunCheckError(
                                f"{given!r}: {lock} is a symbolic link, not a lock file; "
                                "nothing was touched"
                            ) from None
                        raise
                self.fds.append(fd)
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise RunCheckError(
                        f"{given!r}: {lock} is not a regular file; nothing was touched"
                    )
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:
                    if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                        holder = os.pread(fd, 256, 0).decode("utf-8", "replace").strip()
                        raise RunCheckError(
                            f"{given!r}: {run_dir} is live (a writer holds {lock.name}: "
                            f"{holder or 'a process'}); stop it first"
                        ) from None
                    raise
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []


def outside_caches(run_dir: Path, cache_dirs: Sequence[str | os.PathLike[str]] = ()) -> list[Path]:
    """The cache folders of the run's sources (``metrics*.jsonl``, ``spans*.jsonl``) kept
    outside the run folder that exist: the fallback under ``$XDG_CACHE_HOME`` and one under
    each of ``cache_dirs`` (docs/query.md; the cache in the run's own ``.et-cache`` goes
    with its folder)."""
    from expr_tracker.query.cache import cache_location, fallback_location

    out = []
    for name in sorted(os.listdir(run_dir)):
        if not (name.startswith(("metrics", "spans")) and name.endswith(".jsonl")):
            continue
        src = run_dir / name
        for c in [fallback_location(src), *(cache_location(src, d) for d in cache_dirs)]:
            try:
                st = os.lstat(c)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
                out.append(c)
    return out


def tree_bytes(path: Path, seen: set[tuple[int, int]] | None = None) -> int:
    """Bytes of the files under ``path`` (apparent sizes; links not followed; a file with
    several hard links counted once, across calls sharing ``seen``)."""
    seen = set() if seen is None else seen
    total = 0
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        for n in filenames + dirnames:
            try:
                st = os.lstat(os.path.join(dirpath, n))
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total


# --------------------------------------------------------------------------- commands


def _checked(
    given: Sequence[str], runs_dir: str, err: IO[str]
) -> list[tuple[str, Path, WriterLocks]] | None:
    """Each RUN checked and locked; None (every lock released, each problem written to
    ``err``) when one cannot be."""
    held: list[tuple[str, Path, WriterLocks]] = []
    bad = False
    seen: set[str] = set()
    refused = _read_only(given, runs_dir)
    if refused is not None:
        err.write(f"{output.printable(refused)}\n")
        return None
    for g in given:
        try:
            d = check_run(g, runs_dir)
            if os.path.realpath(d) in seen:
                continue
            seen.add(os.path.realpath(d))
            held.append((g, d, WriterLocks(d, g)))
        except RunCheckError as exc:
            err.write(f"{output.printable(str(exc))}\n")
            bad = True
    if bad:
        for _, _, locks in held:
            locks.release()
        return None
    return held


def _read_only(given: Sequence[str], runs_dir: str) -> str | None:
    """Why these runs cannot be changed here (None: they can): a sync bucket's URL, or a
    run of a bucket's local copy (which the next read of the bucket would put back), is
    read-only (docs/team.md "Reading the bucket")."""
    from expr_tracker.cli.sync import is_bucket_url
    from expr_tracker.sync.mirror import mirror_root

    copies = os.path.realpath(mirror_root("").parent) + os.sep
    for g in (runs_dir, *given):
        if is_bucket_url(g):
            return (
                f"{g}: a sync bucket is read-only: change the run where it is written "
                "(et runs tag|archive|mv|rm there), then et sync it again"
            )
    for g in given:
        if os.path.realpath(os.path.join(runs_dir, g) if not os.path.exists(g) else g).startswith(
            copies
        ):
            return (
                f"{g}: a run of a sync bucket's local copy is read-only (the next read of the "
                "bucket puts it back): change it where it is written, then et sync it again"
            )
    return None


def _ask(question: str, err: IO[str]) -> bool:
    err.write(question)
    err.flush()
    answer = sys.stdin.readline()
    return answer.strip().lower() in ("y", "yes")


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)  # pragma: no cover


def run_rm(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    """``et runs rm``: 0 removed (or nothing asked for was refused), 1 a run refused or not
    removed, 2 not confirmed."""
    out, err = out or sys.stdout, sys.stderr
    held = _checked(args.runs, args.dir, err)
    if held is None:
        err.write("et runs rm: nothing was removed\n")
        return 1
    try:
        plan = []
        for g, d, _ in held:
            caches = outside_caches(d, args.cache_dir)
            size = tree_bytes(d) + sum(tree_bytes(c) for c in caches)
            plan.append((g, d, caches, size))
        if not args.yes:
            for _, d, _, size in plan:
                err.write(f"  {output.printable(str(d))}  ({_human(size)})\n")
            n = len(plan)
            if not _ask(f"remove {n} run{'s' if n > 1 else ''}? [y/N] ", err):
                err.write("et runs rm: nothing was removed\n")
                return 2
        code = 0
        for _, d, caches, size in plan:
            try:
                _remove_run(d, caches)
                out.write(f"removed {output.printable(str(d))} ({_human(size)})\n")
            except OSError as exc:
                err.write(f"et runs rm: {output.printable(str(d))}: {exc.strerror or exc}\n")
                code = 1
        return code
    finally:
        for _, _, locks in held:
            locks.release()


def _remove_run(d: Path, caches: list[Path]) -> None:
    """Rename ``d`` to a hidden name beside it (its name free at once; what a failure leaves
    is listed by nothing), then delete it and ``caches`` without following links."""
    hidden = d.with_name(f".{d.name}.removing-{os.getpid()}")
    os.rename(d, hidden)
    import shutil  # here: `et runs` imports this module for run_argv

    shutil.rmtree(hidden)
    for c in caches:
        shutil.rmtree(c, ignore_errors=True)


def _check_new_name(name: str) -> str | None:
    if not name or name in (".", "..") or "/" in name or os.sep in name or "\0" in name:
        return "a folder name: not empty, not . or .., without '/'"
    if name.startswith("."):
        return "a name not starting with '.' (hidden folders are not searched for runs)"
    if len(os.fsencode(name)) > 255:
        return "at most 255 bytes"
    if any(ord(c) < 32 for c in name):
        return "without control characters"
    return None


def _rewrite_infos(d: Path, change: Any) -> list[str]:
    """Apply ``change(info) -> bool`` to every ``run*.json`` of ``d`` (read through
    history/untrusted.py, written atomically when changed); the names written."""
    from expr_tracker.history.rundirs import RUN_FILE_RE
    from expr_tracker.history.runinfo import write_run_info
    from expr_tracker.history.untrusted import read_json

    written = []
    for name in sorted(os.listdir(d)):
        if not RUN_FILE_RE.match(name):
            continue
        path = d / name
        try:
            info = read_json(path, root=d)
        except (OSError, ValueError) as exc:
            raise RunCheckError(
                f"{path} cannot be read ({exc}); nothing of it was changed"
            ) from None
        if not isinstance(info, dict):
            raise RunCheckError(f"{path} is not a JSON object; nothing of it was changed")
        if change(info):
            write_run_info(path, info)
            written.append(name)
    return written


def run_mv(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    """``et runs mv RUN NEWNAME``: 0 renamed, 1 refused (the reason on stderr), 2 a bad
    NEWNAME."""
    out, err = out or sys.stdout, sys.stderr
    bad = _check_new_name(args.new_name)
    if bad is not None:
        err.write(f"et runs mv: NEWNAME {args.new_name!r} is not valid: {bad}\n")
        return 2
    held = _checked([args.run], args.dir, err)
    if held is None:
        return 1
    _, d, locks = held[0]
    try:
        target = d.with_name(args.new_name)
        if os.path.lexists(target):
            err.write(f"et runs mv: {output.printable(str(target))} exists; nothing was moved\n")
            return 1
        old_caches = outside_caches(d)
        os.rename(d, target)
        old_name = d.name

        def rename(info: dict[str, Any]) -> bool:
            if info.get("name") != args.new_name:
                info["name"] = args.new_name
                if "run_dir" in info:
                    info["run_dir"] = str(target)
                return True
            return False

        _rewrite_infos(target, rename)
        import shutil

        for c in old_caches:  # keyed by the old path: of no use any more
            shutil.rmtree(c, ignore_errors=True)
        out.write(
            f"renamed {output.printable(old_name)} -> {output.printable(args.new_name)} "
            f"({output.printable(str(target))})\n"
        )
        return 0
    finally:
        locks.release()


def run_archive(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    """``et runs archive|unarchive RUN...``: 0 done, 1 a run refused (nothing changed)."""
    out, err = out or sys.stdout, sys.stderr
    word = "archive" if args.archive else "unarchive"
    held = _checked(args.runs, args.dir, err)
    if held is None:
        err.write(f"et runs {word}: nothing was changed\n")
        return 1
    try:

        def mark(info: dict[str, Any]) -> bool:
            if args.archive and info.get("archived") is not True:
                info["archived"] = True
                return True
            if not args.archive and "archived" in info:
                del info["archived"]
                return True
            return False

        code = 0
        for _, d, _ in held:
            try:
                changed = _rewrite_infos(d, mark)
            except (RunCheckError, OSError) as exc:
                err.write(f"et runs {word}: {output.printable(str(exc))}\n")
                code = 1
                continue
            state = "archived" if args.archive else "not archived"
            note = "" if changed else " (already)"
            out.write(f"{output.printable(str(d))}: {state}{note}\n")
        return code
    finally:
        for _, _, locks in held:
            locks.release()


def _check_tag(tag: str) -> str | None:
    if not tag.strip():
        return "a tag is not empty"
    if any(ord(c) < 32 for c in tag):
        return "a tag has no control characters"
    return None


def run_tag(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    """``et runs tag RUN +t -t``: 0 done, 1 refused, 2 no change asked for or a bad tag."""
    out, err = out or sys.stdout, sys.stderr
    add, remove = list(args.add), list(args.remove)
    for p in args.plain:  # +t and -t arrive as --add/--remove; a bare word adds
        add.append(p)
    if not add and not remove:
        err.write("et runs tag: give tags to add (+T) or remove (-T)\n")
        return 2
    for t in add + remove:
        bad = _check_tag(t)
        if bad is not None:
            err.write(f"et runs tag: tag {t!r} is not valid: {bad}\n")
            return 2
    held = _checked([args.run], args.dir, err)
    if held is None:
        return 1
    _, d, locks = held[0]
    try:
        final: list[str] = []

        def retag(info: dict[str, Any]) -> bool:
            tags = info.get("tags")
            tags = [str(t) for t in tags] if isinstance(tags, list) else []
            new = [t for t in tags if t not in remove]
            new += [t for t in dict.fromkeys(add) if t not in new]
            final[:] = new
            if new != tags:
                info["tags"] = new
                return True
            return False

        try:
            _rewrite_infos(d, retag)
        except (RunCheckError, OSError) as exc:
            err.write(f"et runs tag: {output.printable(str(exc))}\n")
            return 1
        out.write(
            f"{output.printable(str(d))}: tags {output.printable(', '.join(final) or '(none)')}\n"
        )
        return 0
    finally:
        locks.release()
