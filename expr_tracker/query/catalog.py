"""Runs and their producers under a folder: what ``et query`` reads and how it names it.

A *producer* is one writer of a run: a (stream, rank) pair, with its files
``metrics[.S][.rankN].jsonl``, ``spans...``, ``alerts...``, ``artifacts...`` (JSONL),
``run[.S][.rankN].json``, ``summary[.S][.rankN].json`` and its stream's ``config[.S].json``.
Run directories are found with :func:`expr_tracker.history.rundirs.find_runs` (hidden
folders such as the query cache ``.et-cache`` are never searched).

Identity of a run directory (the same for all its producers):

- ``project`` / ``name``: from the first ``run*.json`` that names them (the main stream's
  rank 0 first), else from the ``"run"`` block of a ``metrics*.meta.json``, else the
  parent folder's name / the run directory's name;
- ``run_id`` is ``"project/name"`` (``name`` alone without a project). When two run
  directories under the searched root have the same ``project/name`` (a copied tree, a
  Hydra multirun whose jobs share a name), each of them gets its path relative to the root
  instead (``"copy-a/proj/run1"``; the absolute path when the root is that run itself), so
  two runs are never merged.

Every file is untrusted input (docs/query.md "Security"): ``run*.json`` and the metrics
sidecar are read with :mod:`expr_tracker.history.untrusted` (regular files only, inside the
run directory's real path as discovered, JSON depth-limited); one that cannot be read is
passed over here (the views say why). A producer file that is not a regular file (a FIFO
named ``metrics.jsonl``) is still listed, so its run is reported as unreadable instead of
silently missing.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from expr_tracker.errors import ExprTrackerError
from expr_tracker.history import untrusted
from expr_tracker.history.rundirs import find_runs

__all__ = [
    "Producer",
    "RunEntry",
    "RunMatch",
    "RunNotFoundError",
    "discover",
    "is_path_only",
    "match_runs",
    "producers_of",
    "resolve_run",
    "run_entries",
]

_SUFFIX = r"(?:\.([A-Za-z0-9_-]+?))??(?:\.rank(\d+))?"
#: per-producer files: kind -> pattern (group 1: stream, group 2: rank)
_PRODUCER_FILES = {
    "metrics": re.compile(rf"^metrics{_SUFFIX}\.jsonl$"),
    "spans": re.compile(rf"^spans{_SUFFIX}\.jsonl$"),
    "alerts": re.compile(rf"^alerts{_SUFFIX}\.jsonl$"),
    "artifacts": re.compile(rf"^artifacts{_SUFFIX}\.jsonl$"),
    "run_file": re.compile(rf"^run{_SUFFIX}\.json$"),
    "summary": re.compile(rf"^summary{_SUFFIX}\.json$"),
}
_META_RE = re.compile(rf"^metrics{_SUFFIX}\.meta\.json$")
_CONFIG_RE = re.compile(r"^config(?:\.([A-Za-z0-9_-]+))?\.json$")
_FIELDS = ("metrics", "spans", "alerts", "run_file", "summary", "artifacts")


@dataclass(frozen=True)
class Producer:
    """One writer of a run: a (stream, rank) pair and the paths of its files (None when
    absent). ``stream`` None is the main stream; ``rank`` 0.. comes from the ``.rankN``
    file-name suffix. ``qualifier``: the run directory's path (relative to the searched
    root) when another run directory there has the same ``project/name``; it then replaces
    ``project/name`` as :attr:`run_id`. ``real_dir``: the run directory's real path when it
    was discovered: every file of the run is read only if it lies inside it (``root=`` of
    :mod:`expr_tracker.history.untrusted`)."""

    run_dir: Path
    project: str | None
    name: str
    stream: str | None
    rank: int
    metrics: Path | None = None
    spans: Path | None = None
    alerts: Path | None = None
    run_file: Path | None = None
    summary: Path | None = None
    config: Path | None = None
    artifacts: Path | None = None
    qualifier: str | None = None
    real_dir: Path | None = None
    #: why the run directory could not be listed (a colleague's ``0700`` folder): such a
    #: producer has no files; it is reported as an unreadable run, never left out silently
    unlisted: str | None = None

    @property
    def root(self) -> Path:
        """The folder this producer's files must lie in: :attr:`real_dir` (its parent
        folder's real path for a producer made without one)."""
        return self.real_dir if self.real_dir is not None else Path(os.path.realpath(self.run_dir))

    @property
    def run_id(self) -> str:
        """The ``run`` column everywhere: ``"project/name"`` (``name`` without a project), or
        the run directory's path relative to the root when that is ambiguous."""
        if self.qualifier is not None:
            return self.qualifier
        return f"{self.project}/{self.name}" if self.project else self.name


def _str_or_none(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def _read(path: Path, real: Path) -> Any:
    """The JSON in a small file of the run, None when it cannot be read (any reason)."""
    try:
        return untrusted.read_json(path, root=real)
    except (OSError, ValueError):
        return None


def _identity(
    run_dir: Path, files: dict[tuple[str | None, int], dict[str, Path]], real: Path
) -> tuple:
    """``(project, name)`` of a run directory; see the module docstring."""
    keys = sorted(files, key=lambda k: (k[0] or "", k[1]))
    for key in keys:
        rf = files[key].get("run_file")
        if rf is not None:
            info = _read(rf, real)
            info = info if isinstance(info, dict) else {}
            name = _str_or_none(info.get("name"))
            if name is not None:
                return _str_or_none(info.get("project")), name
    for key in keys:
        meta = files[key].get("meta")
        if meta is not None:
            doc = _read(meta, real)
            block = doc.get("run") if isinstance(doc, dict) else None
            if isinstance(block, dict) and _str_or_none(block.get("name")):
                return _str_or_none(block.get("project")), block["name"]
    parent = run_dir.parent.name
    return (parent or None), (run_dir.name or str(run_dir))


def producers_of(run_dir: Path) -> list[Producer]:
    """The producers of one run directory, as :func:`discover` finds them there (before
    two run directories of one ``project/name`` are told apart)."""
    files: dict[tuple[str | None, int], dict[str, Path]] = {}
    configs: dict[str | None, Path] = {}
    try:
        real = Path(os.path.realpath(run_dir))
        entries = sorted(os.listdir(run_dir))
    except OSError:
        return []
    for fname in entries:
        path = run_dir / fname
        m = _META_RE.match(fname)
        if m:
            files.setdefault((m.group(1), int(m.group(2) or 0)), {})["meta"] = path
            continue
        m = _CONFIG_RE.match(fname)
        if m:
            configs[m.group(1)] = path
            continue
        for field, rx in _PRODUCER_FILES.items():
            m = rx.match(fname)
            if m:
                # anything but a folder: a FIFO or a link to elsewhere is listed, and its
                # reader says why it cannot be read
                if not os.path.isdir(path):  # unknown (not searchable): a file, reported
                    files.setdefault((m.group(1), int(m.group(2) or 0)), {})[field] = path
                break
    # a metrics sidecar alone is no producer
    files = {k: v for k, v in files.items() if any(f in v for f in _FIELDS)}
    project, name = _identity(run_dir, files, real)
    return [
        Producer(
            run_dir=run_dir,
            project=project,
            name=name,
            stream=stream,
            rank=rank,
            config=configs.get(stream),
            real_dir=real,
            **{f: fs.get(f) for f in _FIELDS},
        )
        for (stream, rank), fs in files.items()
    ]


def discover(
    root: str | os.PathLike[str],
    *,
    per_dir: Callable[[Path], list[Producer]] | None = None,
    include_unlisted: bool = False,
) -> list[Producer]:
    """Every producer of every run under ``root`` (``root`` itself may be a run directory),
    sorted by ``(project, name, stream or "", rank)`` then by run directory.

    ``per_dir``: what gives the producers of one run directory (default
    :func:`producers_of`; ``et ui`` passes one that reuses what it found before for a
    directory that did not change).

    ``include_unlisted``: also one producer, without files, for each folder below ``root``
    that could not be listed (a colleague's ``0700`` run), named by its parent folder and
    its own name, with :attr:`Producer.unlisted` saying why (``permission denied``): the
    readers that list runs report it as unreadable, as ``et runs`` does.

    Raises ``FileNotFoundError`` when ``root`` is not a directory.
    """
    root = Path(root)
    if root.is_file():
        raise FileNotFoundError(
            f"{str(root)!r} is a file: give a folder of runs or a run directory "
            f"(this file's run: {str(root.parent)!r})"
        )
    if not root.is_dir():
        raise FileNotFoundError(f"no run directory or folder of runs at {str(root)!r}")
    producers: list[Producer] = []
    unlisted: list[tuple[Path, str]] = []
    for run_dir in find_runs(root, unlisted=unlisted):
        producers.extend((per_dir or producers_of)(run_dir))
    if include_unlisted:
        for d, why in unlisted:
            if d == root:
                continue
            producers.append(
                Producer(d, d.parent.name or None, d.name, None, 0, unlisted=why or "unreadable")
            )
    # the same project/name in two run directories: qualify both by their path
    dirs_of: dict[str, set[Path]] = {}
    for p in producers:
        dirs_of.setdefault(p.run_id, set()).add(p.run_dir)
    ambiguous = {rid for rid, dirs in dirs_of.items() if len(dirs) > 1}
    if ambiguous:
        out = []
        for p in producers:
            if p.run_id in ambiguous:
                rel = os.path.relpath(p.run_dir, root)
                q = str(p.run_dir.absolute()) if rel == "." else Path(rel).as_posix()
                p = _replace(p, qualifier=q)
            out.append(p)
        producers = out
        # a relative path that reads like another run's project/name: absolute paths
        dirs_of = {}
        for p in producers:
            dirs_of.setdefault(p.run_id, set()).add(p.run_dir)
        clash = {rid for rid, dirs in dirs_of.items() if len(dirs) > 1}
        if clash:
            producers = [
                _replace(p, qualifier=str(p.run_dir.absolute())) if p.run_id in clash else p
                for p in producers
            ]
    producers.sort(key=lambda p: (p.project or "", p.name, p.stream or "", p.rank, str(p.run_dir)))
    return producers


def _replace(p: Producer, **changes: Any) -> Producer:
    from dataclasses import replace

    return replace(p, **changes)


# --------------------------------------------------------------------------- naming a run


class RunNotFoundError(ExprTrackerError, LookupError):
    """A RUN that names no run, or several (``candidates``: their folders under the root)."""

    def __init__(self, message: str, candidates: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.candidates = candidates


@dataclass(frozen=True)
class RunEntry:
    """One run directory under a root, as a RUN name is matched against it: ``run_id`` (the
    ``run`` column of ``et query``), its ``project``/``name`` identity, ``rel`` (its folder's
    path relative to the root, posix; None outside it) and its ``producers``."""

    path: Path
    project: str | None
    name: str
    run_id: str
    rel: str | None
    producers: tuple[Producer, ...]


@dataclass(frozen=True)
class RunMatch:
    """What a RUN names: ``path`` (RUN itself when it is a path, else the run directory
    found) and ``entry`` (the run found by name; None when RUN is a path)."""

    path: Path
    entry: RunEntry | None


def _rel(path: Path, root: Path) -> str | None:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except (ValueError, OSError):
        return None


def _identity_name(entry: RunEntry) -> str:
    return f"{entry.project}/{entry.name}" if entry.project else entry.name


def run_entries(producers: list[Producer], root: str | os.PathLike[str]) -> list[RunEntry]:
    """``producers`` (as :func:`discover` gives them) grouped by run directory, in order."""
    by_dir: dict[Path, list[Producer]] = {}
    for prod in producers:
        by_dir.setdefault(prod.run_dir, []).append(prod)
    root = Path(root)
    return [
        RunEntry(d, ps[0].project, ps[0].name, ps[0].run_id, _rel(d, root), tuple(ps))
        for d, ps in by_dir.items()
    ]


def match_runs(want: str, entries: list[RunEntry]) -> list[RunEntry]:
    """The runs a RUN name matches, by the one rule (docs/cli.md "Naming a run"): the run
    whose folder under the root is ``want`` wins; else, for a name holding ``/``, the runs
    whose ``project/name`` or id is ``want``; else the runs whose name or id is ``want``."""
    want = want.strip("/")
    exact = [e for e in entries if e.rel == want]
    if exact:
        return exact
    if "/" in want:
        return [e for e in entries if want in (e.run_id, _identity_name(e))]
    return [e for e in entries if want in (e.name, e.run_id)]


def is_path_only(text: str) -> bool:
    """Whether RUN is a path and never a name: absolute, or starting with ``./``, ``../``
    or ``~``."""
    return os.path.isabs(text) or text in (".", "..") or text.startswith(("./", "../", "~"))


def resolve_run(
    given: str | os.PathLike[str],
    root: str | os.PathLike[str],
    entries: list[RunEntry] | None = None,
) -> RunMatch:
    """The run RUN names, for ``et plot``, ``et compare``, ``et history`` and ``et ui``
    (docs/cli.md "Naming a run"): a path that exists is that path (a run directory or one of
    its files; what it holds is the caller's to check), and so is an absolute one or one
    starting with ``./``, ``../`` or ``~`` (:func:`is_path_only`); anything else is a name matched by
    :func:`match_runs` among the runs under ``root`` (``entries``: their
    :func:`run_entries`, found here when None).

    Raises:
        RunNotFoundError: no such path and no run of that name (close matches named), or a
            name that matches several runs (each listed).
    """
    text = os.fspath(given)
    path = Path(text)
    if path.exists():
        return RunMatch(path, None)
    if is_path_only(text):
        raise RunNotFoundError(f"run {text!r} names no run: no such path")
    root = Path(root)
    if entries is None:
        try:
            entries = run_entries(discover(root), root)
        except FileNotFoundError:
            raise RunNotFoundError(
                f"run {text!r} names no run: no such path, and {str(root)!r}, where run "
                "names are looked up, is not a folder"
            ) from None
    hits = match_runs(text, entries)
    if len(hits) == 1:
        return RunMatch(hits[0].path, hits[0])
    if hits:
        cands = tuple(sorted(str(e.rel or e.path) for e in hits))
        raise RunNotFoundError(
            f"run {text!r} is ambiguous under {str(root)!r}: it names {len(hits)} runs "
            f"({', '.join(cands)}); give the run folder's path under it (as listed) or the "
            "run directory's path",
            cands,
        )
    names = sorted({x for e in entries for x in (e.rel, e.run_id, _identity_name(e), e.name) if x})
    close = difflib.get_close_matches(text.strip("/"), names, n=5, cutoff=0.5)
    hint = f"; close matches: {', '.join(close)}" if close else ""
    raise RunNotFoundError(
        f"run {text!r} names no run: no such path, and no run of that name under "
        f"{str(root)!r} ({len(entries)} runs there){hint}"
    )
