"""The runs table's columns, order and filter: one parser and one evaluation for ``et runs
--columns/--sort/--where`` and the dashboard's runs table (docs/runs.md "Columns, order
and filter").

A run here is a plain dict (a line of ``et runs`` or of ``/api/runs``) with its config and
summary flattened to dotted keys under ``"config"`` and ``"summary"``. A column is named:

- by one of the run's own fields (:data:`BUILTIN`): ``run``, ``name``, ``project``,
  ``status``, ``steps``, ``started``, ``duration``, ``active``, ``tags``, ``group``,
  ``archived``;
- by ``config.KEY`` or ``summary.KEY`` (``KEY`` dotted: ``config.model.depth``);
- by a bare ``KEY``: a built-in field, else the config key of that name when some listed
  run has it, else the summary key (:meth:`Columns.resolve`). A name in backquotes is
  taken as it is (`` `not` ``).

The filter (:func:`parse_where`) is the small language of ``runfilter.lark``: comparisons
``KEY OP VALUE`` (``=``/``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=``, ``~`` a glob) joined
by ``and``, ``or``, ``not`` and parentheses. A value in quotes is text; a bare one is a
number when it reads as one (``1e-3``), ``true``/``false``/``null``, else text. It is
evaluated here in Python over the values, never pasted into SQL. A run without the key
matches no comparison but ``= null`` (and ``!= null`` matches the runs that have it);
numbers compare as numbers, text as text, a number with text never (but ``=`` compares a
text cell with the value as it was written); ``tags = t`` is true when ``t`` is one of
the run's tags.

The order (:func:`parse_sort`): comma-separated columns, ``-`` before one (or ``:desc``
after it) for descending;
runs without the value come last either way; within a column booleans, then numbers, then
NaN, then text.

Without ``columns``, the config keys whose values differ between the listed runs are
shown (:func:`differing_config`, at most :data:`DEFAULT_COLUMNS`).
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import functools
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "BUILTIN",
    "DEFAULT_COLUMNS",
    "AllOf",
    "AnyOf",
    "Columns",
    "Comparison",
    "Negate",
    "RunFilterError",
    "Selection",
    "SortKey",
    "builtin_value",
    "differing_config",
    "parse_column_list",
    "parse_sort",
    "parse_where",
    "select_runs",
]

#: the run's own fields a column may name (``started``: the first start, epoch seconds;
#: ``duration``: the wall duration and ``active`` the active time, seconds)
BUILTIN = (
    "run",
    "name",
    "project",
    "status",
    "steps",
    "started",
    "duration",
    "active",
    "tags",
    "group",
    "archived",
)
#: the most config columns shown by default (the keys that differ between the runs)
DEFAULT_COLUMNS = 8
OPS = ("=", "==", "!=", "<", "<=", ">", ">=", "~")


class RunFilterError(ValueError):
    """A filter, order or column list that cannot be used: ``field`` (``where``, ``sort``,
    ``columns``), the text given and what is valid; ``column`` (1-based) where the text goes
    wrong, when known."""

    def __init__(self, field: str, text: str, why: str, column: int | None = None) -> None:
        self.field, self.text, self.why, self.column = field, text, why, column
        where = f" at column {column}" if column is not None else ""
        caret = f"\n  {text}\n  {' ' * (column - 1)}^" if column is not None else ""
        super().__init__(f"{field} {text!r}{where}: {why}{caret}")


# --------------------------------------------------------------------------- the filter


@dataclasses.dataclass(frozen=True)
class Comparison:
    """``key op value`` (``text``: the value as written, for comparing text cells)."""

    key: str
    op: str
    value: Any
    text: str


@dataclasses.dataclass(frozen=True)
class AllOf:
    parts: tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class AnyOf:
    parts: tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class Negate:
    part: Any


def _bare_value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none"):
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        body = text[1:-1]
        out = []
        i = 0
        while i < len(body):
            c = body[i]
            if c == "\\" and i + 1 < len(body):
                i += 1
                c = body[i]
            out.append(c)
            i += 1
        return "".join(out)
    return text


def _key(text: str) -> str:
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] == "`" else text


def _transformer():
    from lark import Transformer

    class ToNodes(Transformer):
        """One method per word of ``runfilter.lark`` (its ``-> alias`` names)."""

        def compare(self, items: list[Any]) -> Comparison:
            key, op, value = (str(t) for t in items)
            quoted = value[:1] in ("'", '"')
            text = _unquote(value)
            return Comparison(
                _key(key), "=" if op == "==" else op, text if quoted else _bare_value(text), text
            )

        def all_of(self, items: list[Any]) -> AllOf:
            a, b = items
            return AllOf((*(a.parts if isinstance(a, AllOf) else (a,)), b))

        def any_of(self, items: list[Any]) -> AnyOf:
            a, b = items
            return AnyOf((*(a.parts if isinstance(a, AnyOf) else (a,)), b))

        def negate(self, items: list[Any]) -> Negate:
            return Negate(items[0])

    return ToNodes()


@functools.cache
def _parser():
    from lark import Lark

    grammar = Path(__file__).with_name("runfilter.lark").read_text(encoding="utf-8")
    try:
        return Lark(grammar, parser="lalr", transformer=_transformer(), cache=True)
    except Exception:  # an unwritable cache directory must not stop the parser
        return Lark(grammar, parser="lalr", transformer=_transformer())


#: a filter written as it should be, for the error messages
EXAMPLE = "lr > 1e-3 and status = failed"


def parse_where(text: str | None) -> Any:
    """The filter ``text`` as a tree of :class:`Comparison`, :class:`AllOf`, :class:`AnyOf`,
    :class:`Negate`; None for None or blank text.

    Raises:
        RunFilterError: ``text`` is not a filter (the column where it goes wrong, what was
            expected there, an example).
    """
    if text is None or not text.strip():
        return None
    from lark.exceptions import (
        UnexpectedCharacters,
        UnexpectedEOF,
        UnexpectedInput,
        UnexpectedToken,
    )

    try:
        return _parser().parse(text)
    except UnexpectedEOF:
        raise RunFilterError(
            "where", text, f"it ends too early (each comparison is KEY OP VALUE, as in {EXAMPLE!r})"
        ) from None
    except UnexpectedToken as exc:
        tok = exc.token
        if tok.type == "$END":
            raise RunFilterError(
                "where",
                text,
                f"it ends too early (each comparison is KEY OP VALUE, as in {EXAMPLE!r})",
            ) from None
        want = _expected(exc.expected)
        raise RunFilterError(
            "where", text, f"{str(tok)!r} where {want} was expected (as in {EXAMPLE!r})", exc.column
        ) from None
    except UnexpectedCharacters as exc:
        want = _expected(exc.allowed or set())
        raise RunFilterError(
            "where",
            text,
            f"{text[exc.pos_in_stream or 0]!r} where {want} was expected (as in {EXAMPLE!r})",
            exc.column,
        ) from None
    except UnexpectedInput as exc:  # pragma: no cover - the kinds above are every kind
        raise RunFilterError("where", text, str(exc).splitlines()[0]) from None


_WORDS = {
    "KEY": "a column",
    "OP": f"an operator ({', '.join(OPS)})",
    "VALUE": "a value",
    "LPAR": "'('",
    "RPAR": "')'",
    "_AND": "'and'",
    "_OR": "'or'",
    "_NOT": "'not'",
    "$END": "the end",
}


def _expected(names: Iterable[str]) -> str:
    words = sorted({_WORDS.get(n, n) for n in names})
    return " or ".join(words) if words else "something else"


def _kind(v: Any) -> int:
    """0 bool, 1 number, 2 NaN, 3 text, 4 anything else (lists, objects)."""
    if isinstance(v, bool):
        return 0
    if isinstance(v, (int, float)):
        return 2 if isinstance(v, float) and math.isnan(v) else 1
    if isinstance(v, str):
        return 3
    return 4


def _compare(cell: Any, node: Comparison, present: bool) -> bool:
    op, want = node.op, node.value
    if want is None and op in ("=", "!="):
        return (cell is None) == (op == "=")
    if not present or cell is None:
        return False
    if isinstance(cell, list):  # tags: one of them is (``!=``: none of them is)
        if op == "!=":
            return not any(_compare(c, dataclasses.replace(node, op="="), True) for c in cell)
        return any(_compare(c, node, True) for c in cell)
    if op == "~":
        return fnmatch.fnmatchcase(cell if isinstance(cell, str) else json.dumps(cell), node.text)
    kc, kw = _kind(cell), _kind(want)
    if op in ("=", "!="):
        if kc == kw == 1 or kc == kw == 0 or kc == kw == 3:
            same = cell == want
        elif kc == 3:
            same = cell == node.text
        else:
            same = False
        return same if op == "=" else not same
    if not ((kc == kw == 1) or (kc == kw == 3)):
        return False
    if op == "<":
        return cell < want
    if op == "<=":
        return cell <= want
    if op == ">":
        return cell > want
    return cell >= want


# --------------------------------------------------------------------------- columns


def builtin_value(run: dict[str, Any], key: str) -> Any:
    """A built-in field of ``run`` (a line of ``et runs`` or ``/api/runs``): ``started`` its
    first start, ``duration`` its wall duration, ``active`` its active time (the latest
    attempt's where the whole life is not known), ``name`` its name."""
    if key == "started":
        v = run.get("first_started_at")
        return v if v is not None else run.get("started_at")
    if key == "duration":
        v = run.get("wall_duration_s")
        return v if v is not None else run.get("duration_s")
    if key == "active":
        return run.get("active_duration_s")
    if key == "tags":
        return list(run.get("tags") or [])
    if key == "archived":
        return bool(run.get("archived"))
    if key == "name":
        return run.get("name") or str(run.get("run", "")).rsplit("/", 1)[-1]
    return run.get(key)


class Columns:
    """The columns the listed ``runs`` can be asked for, and how a name resolves (see the
    module doc)."""

    def __init__(self, runs: Sequence[dict[str, Any]]) -> None:
        self.runs = runs
        cfg: dict[str, None] = {}
        summ: dict[str, None] = {}
        for r in runs:
            cfg.update(dict.fromkeys(r.get("config") or {}))
            summ.update(dict.fromkeys(r.get("summary") or {}))
        self.config_keys = list(cfg)
        self.summary_keys = list(summ)
        self._config = set(cfg)
        self._summary = set(summ)

    def available(self) -> list[str]:
        """Every column name: the built-in fields, then ``config.*`` and ``summary.*``
        (each once, sorted)."""
        return [
            *BUILTIN,
            *(f"config.{k}" for k in sorted(self.config_keys)),
            *(f"summary.{k}" for k in sorted(self.summary_keys)),
        ]

    def resolve(self, name: str, field: str = "columns") -> str:
        """``name`` as its full column name (``run``, ``config.lr``, ``summary.loss``).

        Raises:
            RunFilterError: no listed run has such a column (close names suggested); none
                when no run is listed.
        """
        name = _key(name.strip())
        if name in BUILTIN:
            return name
        for prefix, keys in (("config.", self._config), ("summary.", self._summary)):
            if name.startswith(prefix) and (name[len(prefix) :] in keys or not self.runs):
                return name
        if name in self._config:
            return f"config.{name}"
        if name in self._summary:
            return f"summary.{name}"
        if not self.runs:
            return name if name.startswith(("config.", "summary.")) else f"config.{name}"
        names = [*BUILTIN, *self.config_keys, *(f"config.{k}" for k in self.config_keys)]
        names += [*self.summary_keys, *(f"summary.{k}" for k in self.summary_keys)]
        close = difflib.get_close_matches(name, names, n=4, cutoff=0.5)
        hint = f"; close: {', '.join(close)}" if close else ""
        raise RunFilterError(
            field,
            name,
            "no listed run has this column (a built-in field, config.KEY or summary.KEY, "
            f"or a key of either){hint}",
        )

    def label(self, column: str) -> str:
        """The shortest name that resolves to ``column`` (``lr`` for ``config.lr`` unless a
        built-in field is named so)."""
        for prefix in ("config.", "summary."):
            if column.startswith(prefix):
                bare = column[len(prefix) :]
                if bare not in BUILTIN and (prefix == "config." or bare not in self._config):
                    return bare
        return column

    @staticmethod
    def value(run: dict[str, Any], column: str) -> tuple[bool, Any]:
        """(whether ``run`` has ``column``, its value)."""
        for prefix in ("config", "summary"):
            if column.startswith(prefix + "."):
                d = run.get(prefix) or {}
                key = column[len(prefix) + 1 :]
                return (key in d, d.get(key))
        v = builtin_value(run, column)
        return (v is not None, v)


def differing_config(runs: Sequence[dict[str, Any]], limit: int = DEFAULT_COLUMNS) -> list[str]:
    """The ``config.*`` columns whose values are not the same in every run of ``runs`` (a
    run without the key differs from one with it), in the order the keys first appear, at
    most ``limit``; none for fewer than two runs."""
    if len(runs) < 2:
        return []
    seen: dict[str, set[Any]] = {}
    count: dict[str, int] = {}
    for r in runs:
        for k, v in (r.get("config") or {}).items():
            seen.setdefault(k, set()).add(_same_key(v))
            count[k] = count.get(k, 0) + 1
    out = []
    for k, values in seen.items():
        if len(values) > 1 or count[k] < len(runs):  # a run without the key differs
            out.append(f"config.{k}")
            if len(out) >= limit:
                break
    return out


def _same_key(v: Any) -> Any:
    """A hashable stand-in equal for equal values only (1, 1.0 and True kept apart; every
    NaN one value; lists and objects by their JSON)."""
    if v is None or isinstance(v, (str, bool, int)):
        return (type(v).__name__, v)
    if isinstance(v, float):
        return ("nan",) if v != v else ("float", v)
    return ("json", json.dumps(v, sort_keys=True, default=str))


# --------------------------------------------------------------------------- order


@dataclasses.dataclass(frozen=True)
class SortKey:
    column: str
    descending: bool = False


def parse_column_list(text: str | Sequence[str] | None) -> list[str] | None:
    """``"a,b"`` (or a list of such texts) -> ``["a", "b"]``; None for None."""
    if text is None:
        return None
    parts = [text] if isinstance(text, str) else list(text)
    return [c.strip() for p in parts for c in p.split(",") if c.strip()]


def parse_sort(text: str | Sequence[str] | None) -> list[SortKey]:
    """``"-summary.acc,lr"`` -> descending ``summary.acc``, then ascending ``lr`` (names
    resolved later, :meth:`Columns.resolve`); ``name:desc`` is descending too (a shell
    argument need not start with ``-``), ``+name`` and ``name:asc`` ascending.

    Raises:
        RunFilterError: an empty name (``"-"``).
    """
    keys = []
    for item in parse_column_list(text) or []:
        desc = item.startswith("-")
        name = item[1:].strip() if item[:1] in "+-" else item
        for suffix, down in ((":desc", True), (":asc", False)):
            if name.lower().endswith(suffix):
                name, desc = name[: -len(suffix)].strip(), down
        if not name:
            raise RunFilterError(
                "sort", item, "a column is missing after the sign (as in '-summary.acc,lr')"
            )
        keys.append(SortKey(name, desc))
    return keys


def _order(v: Any) -> tuple[int, Any]:
    k = _kind(v)
    if k == 4:
        return (k, json.dumps(v, sort_keys=True, default=str))
    if k == 2:
        return (k, 0)
    return (k, v)


# --------------------------------------------------------------------------- all together


@dataclasses.dataclass
class Selection:
    """What :func:`select_runs` chose: the ``runs`` kept, in order, the ``columns`` shown
    (full names) and their ``labels``, and every column the runs have (``available``)."""

    runs: list[dict[str, Any]]
    columns: list[str]
    labels: list[str]
    available: list[str]

    def values(self, run: dict[str, Any]) -> dict[str, Any]:
        """The shown columns' values of ``run`` (by full name; a missing one left out)."""
        out = {}
        for c in self.columns:
            has, v = Columns.value(run, c)
            if has:
                out[c] = v
        return out


def _keep(node: Any, run: dict[str, Any], cols: Columns) -> bool:
    if isinstance(node, Comparison):
        has, v = cols.value(run, node.key)
        return _compare(v, node, has)
    if isinstance(node, AllOf):
        return all(_keep(p, run, cols) for p in node.parts)
    if isinstance(node, AnyOf):
        return any(_keep(p, run, cols) for p in node.parts)
    return not _keep(node.part, run, cols)


def _resolved(node: Any, cols: Columns) -> Any:
    if isinstance(node, Comparison):
        return dataclasses.replace(node, key=cols.resolve(node.key, "where"))
    if isinstance(node, (AllOf, AnyOf)):
        return type(node)(tuple(_resolved(p, cols) for p in node.parts))
    return Negate(_resolved(node.part, cols))


def select_runs(
    runs: Sequence[dict[str, Any]],
    *,
    columns: Sequence[str] | None = None,
    sort: Sequence[SortKey] | str | None = None,
    where: Any = None,
    limit: int = DEFAULT_COLUMNS,
) -> Selection:
    """The runs ``where`` keeps (a filter text or a :func:`parse_where` tree), ordered by
    ``sort`` (keys or their text; the runs' order kept between equal ones), and the columns
    shown: ``columns`` (names, resolved), or, when None, the config keys that differ between
    the kept runs (:func:`differing_config`, at most ``limit``).

    Raises:
        RunFilterError: a filter that does not parse, or a column no run has (``field``
            says which argument).
    """
    cols = Columns(runs)
    tree = parse_where(where) if isinstance(where, str) or where is None else where
    keys = parse_sort(sort) if isinstance(sort, str) or sort is None else list(sort)
    kept = list(runs)
    if tree is not None:
        tree = _resolved(tree, cols)
        kept = [r for r in kept if _keep(tree, r, cols)]
    for key in reversed(keys):
        column = cols.resolve(key.column, "sort")
        present: list[tuple[Any, Any]] = []
        missing: list[tuple[Any, Any]] = []
        for r in kept:
            has, v = cols.value(r, column)
            (present if has and v is not None else missing).append((r, v))
        present.sort(key=lambda rv: _order(rv[1]), reverse=key.descending)
        kept = [r for r, _ in present] + [r for r, _ in missing]
    if columns is None:
        shown = differing_config(kept, limit)
    else:
        shown = list(dict.fromkeys(cols.resolve(c) for c in columns))
    return Selection(kept, shown, [cols.label(c) for c in shown], cols.available())
