"""Statistics over groups of runs: which runs form a group, and one line with a band per group.

Pure functions over plain values (numpy, imported inside them): nothing here reads a file.
``et plot --group-by``, ``et compare --group-by`` and the dashboard's grouped charts
(``query/groups.py`` reads the runs) call them, so the three agree. The rules are in
docs/compare.md "Groups of runs":

- **Grouping** (:func:`group_runs`): runs with the same values of the chosen config keys
  form a group. ``"auto"`` groups by every config key except the seed-like ones
  (:func:`is_seed_key`: ``seed``, ``*_seed``, ``rng``); a key a run lacks is its own value,
  distinct from ``null``; values are compared as JSON (``1`` and ``1.0`` differ).
- **Alignment** (:func:`group_band`): runs are aligned on the x values they logged; nothing
  is interpolated. At each x, the statistics use the runs with a finite value at exactly that
  x; ``n`` says how many there were. The centre line is drawn where n >= 1, the band only
  where n >= 2. NaN and ±inf are not averaged in; they are counted per x (``nonfinite``).
- **Bands**: ``minmax``, ``std`` (± the sample standard deviation, ddof 1), ``sem`` (± the
  standard error, std / sqrt(n)), ``ci`` (a 95 % bootstrap confidence interval of the
  centre: the expanded percentile interval, see :func:`ci_alpha`), ``none``.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AGGREGATES",
    "BANDS",
    "Band",
    "Group",
    "GroupError",
    "ci_alpha",
    "group_band",
    "group_keys",
    "group_runs",
    "is_seed_key",
    "summarize",
    "t_quantile_975",
]

#: centre lines
AGGREGATES = ("mean", "median")
#: bands around the centre line
BANDS = ("minmax", "std", "sem", "ci", "none")
#: the bootstrap's confidence level (the ``ci`` band)
CI_LEVEL = 0.95
#: bootstrap resamples (the ``ci`` band)
RESAMPLES = 1000
#: a config key part (after the last dot) that names a seed
_SEED = re.compile(r"(?:seed|.*_seed|rng)", re.IGNORECASE)
#: the value of a key a run does not have (never equal to a JSON value)
MISSING = "(missing)"

# t quantiles at 0.975 for 1..30 degrees of freedom (beyond: the Cornish-Fisher expansion)
_T975 = (
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
    2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
    2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
)  # fmt: skip
_Z975 = 1.959963984540054


class GroupError(ValueError):
    """A bad grouping or statistics option (names the field, the value and what is valid)."""


def is_seed_key(key: str) -> bool:
    """True when the last part of a dotted config key names a seed: ``seed``, ``*_seed``
    (``data_seed``) or ``rng``, in any case (``trainer.seed``, ``Seed``)."""
    return bool(_SEED.fullmatch(key.rsplit(".", 1)[-1]))


def _text(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=repr)


def group_keys(configs: Sequence[Mapping[str, Any]], group_by: str | Sequence[str]) -> list[str]:
    """The config keys (dotted, flattened) that split ``configs`` into groups.

    ``group_by``: ``"auto"`` — every key whose values differ between the runs, except the
    seed-like keys (:func:`is_seed_key`); or key names (a list, or ``"a,b"``), kept as given
    (a key no run has is an error).

    Raises:
        GroupError: empty ``group_by``, or a key no run has (the keys there are listed).
    """
    if isinstance(group_by, str):
        if group_by.strip() == "auto":
            return _differing(configs, lambda k: not is_seed_key(k))
        group_by = [k.strip() for k in group_by.split(",")]
    keys = [k for k in group_by if k]
    if not keys:
        raise GroupError("group_by: empty; give config keys (lr,model.depth) or 'auto'")
    known: dict[str, None] = {}
    for c in configs:
        known.update(dict.fromkeys(c))
    unknown = [k for k in keys if k not in known]
    if unknown:
        names = ", ".join(sorted(known)[:30]) or "none"
        raise GroupError(
            f"group_by: {', '.join(repr(k) for k in unknown)} is no config key of these runs "
            f"(keys: {names}); or give 'auto' (everything but seed-like keys)"
        )
    return list(dict.fromkeys(keys))


def _differing(configs: Sequence[Mapping[str, Any]], keep: Any) -> list[str]:
    keys: dict[str, None] = {}
    for c in configs:
        keys.update(dict.fromkeys(c))
    out = []
    for k in keys:
        if not keep(k):
            continue
        texts = {_text(c[k]) if k in c else MISSING for c in configs}
        if len(texts) > 1:
            out.append(k)
    return out


@dataclass(frozen=True)
class Group:
    """Runs that share the values of the group keys: ``values`` (key -> value; a key the
    runs lack has :data:`MISSING`), ``members`` (indexes into the runs given), ``label``
    (``lr=0.1 depth=4``; ``all`` when there are no group keys)."""

    values: dict[str, Any]
    members: tuple[int, ...]
    label: str


def group_runs(
    configs: Sequence[Mapping[str, Any]], group_by: str | Sequence[str]
) -> tuple[list[str], list[Group]]:
    """Split runs into groups by their flattened configs (``{"model.depth": 4}``).

    Returns:
        (the group keys, the groups in order of their first run); every run is in exactly
        one group.

    Raises:
        GroupError: as :func:`group_keys`.
    """
    keys = group_keys(configs, group_by)
    order: dict[tuple[str, ...], list[int]] = {}
    values: dict[tuple[str, ...], dict[str, Any]] = {}
    for i, c in enumerate(configs):
        sig = tuple(_text(c[k]) if k in c else MISSING for k in keys)
        order.setdefault(sig, []).append(i)
        values.setdefault(sig, {k: c.get(k, MISSING) if k in c else MISSING for k in keys})
    groups = []
    for sig, members in order.items():
        vals = values[sig]
        label = " ".join(
            f"{k}={v if v is MISSING else _text(v) if not isinstance(v, str) else v}"
            for k, v in vals.items()
        )
        groups.append(Group(vals, tuple(members), label or "all"))
    return keys, groups


# --------------------------------------------------------------------------- statistics


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` >= 1 degrees of freedom (a table to 30,
    the Cornish-Fisher expansion beyond: within 1e-4)."""
    if df < 1:
        raise GroupError(f"df: {df} is not valid: degrees of freedom >= 1")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


def ci_alpha(n: int) -> float:
    """The two-sided tail probability the bootstrap percentiles use for a 95 % interval from
    ``n`` >= 2 values: the expanded percentile interval (Hesterberg 2015),
    ``alpha' = 2 Phi(-sqrt(n / (n - 1)) t_{0.975, n-1})``. The plain percentile interval
    (alpha' = 0.05) is too narrow for few seeds (it covers the mean about 88 % of the time
    at n = 5); the expansion widens it to the t interval's width, which covers 95 % for
    normal data at any n."""
    if n < 2:
        raise GroupError(f"n: {n} is not valid: a confidence interval needs n >= 2 values")
    q = math.sqrt(n / (n - 1)) * t_quantile_975(n - 1)
    return 2 * 0.5 * math.erfc(q / math.sqrt(2))


@dataclass
class Band:
    """One group's line and band, per x (numpy arrays of equal length, x ascending):
    ``x``; ``center`` (mean or median of the finite values there; NaN where n = 0);
    ``lo``/``hi`` (the band; NaN where n < 2, or for ``band="none"``); ``n`` (runs with a
    finite value at x); ``nonfinite`` (runs with NaN or ±inf at x, left out)."""

    x: Any
    center: Any
    lo: Any
    hi: Any
    n: Any
    nonfinite: Any
    agg: str
    band: str


def _check(agg: str, band: str, resamples: int) -> None:
    if agg not in AGGREGATES:
        raise GroupError(f"agg: {agg!r} is not valid: one of {', '.join(AGGREGATES)}")
    if band not in BANDS:
        raise GroupError(f"band: {band!r} is not valid: one of {', '.join(BANDS)}")
    if type(resamples) is not int or resamples < 100:
        raise GroupError(f"resamples: {resamples!r} is not valid: an int >= 100")


def _matrix(series: Sequence[tuple[Any, Any]]) -> tuple[Any, Any]:
    """(the sorted distinct x of all series, a matrix x by run: the run's value at that x,
    NaN where it has none; a run with several points at one x keeps its last)."""
    import numpy as np

    xs = [np.asarray(x, dtype=np.float64).ravel() for x, _ in series]
    ys = [np.asarray(y, dtype=np.float64).ravel() for _, y in series]
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        if len(x) != len(y):
            raise GroupError(f"series {i}: {len(x)} x values but {len(y)} y values")
        if np.isnan(x).any():
            raise GroupError(f"series {i}: an x value is NaN (x must be numbers)")
    allx = np.concatenate(xs) if xs else np.zeros(0)
    grid, inverse = np.unique(allx, return_inverse=True)
    m = np.full((len(grid), len(series)), np.nan)
    filled = np.zeros((len(grid), len(series)), dtype=bool)
    start = 0
    for j, y in enumerate(ys):
        rows = inverse[start : start + len(y)]
        start += len(y)
        m[rows, j] = y  # numpy assigns in order: the last of repeated rows wins
        filled[rows, j] = True
    return grid, (m, filled)


def group_band(
    series: Sequence[tuple[Any, Any]],
    *,
    agg: str = "mean",
    band: str = "std",
    seed: int = 0,
    resamples: int = RESAMPLES,
) -> Band:
    """One group's centre line and band from its runs' series.

    Args:
        series: per run, ``(x, y)``: equal-length sequences of numbers (x: the step or a
            step metric's value; y: the metric; NaN/±inf allowed in y).
        agg: ``mean`` or ``median``: the centre line.
        band: ``minmax``, ``std``, ``sem`` (around the centre), ``ci`` (a 95 % bootstrap
            interval of the centre), ``none``.
        seed: the bootstrap's random seed (the same inputs give the same band).
        resamples: bootstrap resamples (>= 100).

    Returns:
        A :class:`Band` over the distinct x values of all runs (none invented).

    Raises:
        GroupError: a bad ``agg``/``band``/``resamples``, x and y of different lengths, or
        a NaN x.
    """
    import numpy as np

    _check(agg, band, resamples)
    grid, (m, filled) = _matrix(series)
    finite = np.isfinite(m)
    n = finite.sum(axis=1)
    nonfinite = (filled & ~finite).sum(axis=1)
    vals = np.where(finite, m, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows: NaN, said by n = 0
        if agg == "mean":
            center = np.where(
                n > 0, np.where(finite, m, 0.0).sum(axis=1) / np.maximum(n, 1), np.nan
            )
        else:
            center = np.nanmedian(vals, axis=1) if vals.size else np.zeros(0)
        lo = np.full(len(grid), np.nan)
        hi = np.full(len(grid), np.nan)
        two = n >= 2
        if band == "minmax":
            lo = np.where(two, np.where(finite, m, np.inf).min(axis=1, initial=np.inf), np.nan)
            hi = np.where(two, np.where(finite, m, -np.inf).max(axis=1, initial=-np.inf), np.nan)
        elif band in ("std", "sem"):
            std = np.where(two, np.nanstd(vals, axis=1, ddof=1), np.nan)
            half = std if band == "std" else std / np.sqrt(np.maximum(n, 1))
            lo, hi = center - half, center + half
        elif band == "ci":
            lo, hi = _bootstrap(vals, finite, n, agg, seed, resamples)
    return Band(grid, center, lo, hi, n, nonfinite, agg, band)


def _bootstrap(vals: Any, finite: Any, n: Any, agg: str, seed: int, resamples: int) -> Any:
    """The expanded percentile bootstrap interval of the mean or median at each row with
    n >= 2 finite values (NaN elsewhere). Rows with the same n share their resamples (one
    draw of indexes per n), so the work is a matrix product for the mean."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = len(n)
    lo = np.full(rows, np.nan)
    hi = np.full(rows, np.nan)
    # each row's finite values first (sorted: the order of iid values does not matter)
    packed = np.sort(np.where(finite, vals, np.inf), axis=1)
    for k in np.unique(n):
        k = int(k)
        if k < 2:
            continue
        at = np.flatnonzero(n == k)
        v = packed[at, :k]  # (m, k)
        a = ci_alpha(k)
        qs = (a / 2, 1 - a / 2)
        if agg == "mean":
            w = rng.multinomial(k, np.full(k, 1.0 / k), size=resamples).astype(np.float64)
            boots = v @ w.T / k  # (m, resamples)
            q = _quantiles(boots, qs)
        else:
            # each row is sorted, so a resample's sorted values are the row's values
            # repeated by the resample's counts: its median's position depends on the
            # counts alone, the same for every row with k values (a gather, no sort)
            counts = rng.multinomial(k, np.full(k, 1.0 / k), size=resamples)
            cum = np.cumsum(counts, axis=1)
            lower = (cum <= (k - 1) // 2).sum(axis=1)  # index of the value at that rank
            upper = (cum <= k // 2).sum(axis=1)
            q = _quantiles((v[:, lower] + v[:, upper]) / 2, qs)
        lo[at], hi[at] = q[0], q[1]
    return lo, hi


def _quantiles(a: Any, qs: tuple[float, float]) -> Any:
    """``np.quantile(a, qs, axis=1)`` (linear interpolation) by partial sorts (O(n) per
    row, not a full sort): shape (2, rows)."""
    import numpy as np

    m = a.shape[1]
    pos = [q * (m - 1) for q in qs]
    kth = sorted({min(int(p) + d, m - 1) for p in pos for d in (0, 1)})
    part = np.partition(a, kth, axis=1)
    out = np.empty((len(qs), a.shape[0]))
    for i, p in enumerate(pos):
        j = int(p)
        frac = p - j
        upper = part[:, min(j + 1, m - 1)]
        out[i] = part[:, j] + frac * (upper - part[:, j]) if frac else part[:, j]
    return out


def summarize(
    values: Sequence[Any], *, seed: int = 0, resamples: int = RESAMPLES
) -> dict[str, Any]:
    """Statistics of one number per run (a final or best value), for ``et compare
    --group-by``: ``n`` (finite values), ``nonfinite`` (NaN/±inf left out), ``mean``,
    ``std`` (ddof 1; None for n < 2), ``median``, ``min``, ``max``, and ``ci`` ([lo, hi]:
    the 95 % bootstrap interval of the mean, as the ``ci`` band; None for n < 2). Values
    that are not numbers (None, text) are counted in ``missing``."""
    import numpy as np

    nums = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    missing = len(values) - len(nums)
    arr = np.asarray(nums, dtype=np.float64)
    fin = arr[np.isfinite(arr)]
    out: dict[str, Any] = {
        "n": int(len(fin)),
        "nonfinite": int(len(arr) - len(fin)),
        "missing": missing,
        "mean": None,
        "std": None,
        "median": None,
        "min": None,
        "max": None,
        "ci": None,
    }
    if len(fin):
        out.update(
            mean=float(fin.mean()),
            median=float(np.median(fin)),
            min=float(fin.min()),
            max=float(fin.max()),
        )
    if len(fin) >= 2:
        out["std"] = float(fin.std(ddof=1))
        _check("mean", "ci", resamples)
        row = fin.reshape(1, -1)
        lo, hi = _bootstrap(
            row, np.ones_like(row, dtype=bool), np.array([len(fin)]), "mean", seed, resamples
        )
        out["ci"] = [float(lo[0]), float(hi[0])]
    return out
