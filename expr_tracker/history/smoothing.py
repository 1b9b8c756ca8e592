"""Smoothing a series for a chart: the debiased exponential moving average and the running
mean, computed on the raw points (before any downsampling: docs/ui.md "Smoothing").

- ``ema:W`` (``0 <= W < 1``), as TensorBoard and wandb smooth: ``s_n = W * s_(n-1) +
  (1 - W) * y_n`` from ``s_0 = 0``, shown as ``s_n / (1 - W**k)`` where ``k`` counts the
  values averaged so far (the debiasing: the first point is the first value, not a
  fraction of it). ``W = 0`` is the raw series; 0.99 is very smooth.
- ``mean:N`` (``N >= 1``): the mean of the last ``N`` values (fewer at the start).

Both go point by point (a step with no value is not a point: the smoothing does not see
gaps between steps). A NaN or ±inf value is not averaged in and stays as it is in the
smoothed series, so the smoothed line breaks where the raw one does and a chart marks it.

:func:`parse_smoothing` reads the text form (``et plot --smooth``, ``et ui``'s
``smooth=``); :func:`smooth` applies it: a plain loop (:func:`ema_reference`,
:func:`mean_reference`: the definitions, and what runs for short series or without numpy)
or numpy for long series (the same numbers to rounding: a test checks one against the
other). Imports nothing of the project.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "KINDS",
    "Smoothing",
    "ema_reference",
    "mean_reference",
    "parse_smoothing",
    "smooth",
]

#: the kinds of smoothing and the form of their parameter
KINDS = {"ema": "ema:W with 0 <= W < 1", "mean": "mean:N with N an integer >= 1"}
#: from this many points on numpy (when installed) does the work
NUMPY_MIN = 2_000
#: the most points a running mean's window may span
MAX_WINDOW = 1_000_000


@dataclass(frozen=True)
class Smoothing:
    """A smoothing: ``kind`` ``ema`` (``param``: the weight W, 0 <= W < 1) or ``mean``
    (``param``: the window N, an int >= 1)."""

    kind: str
    param: float

    @property
    def text(self) -> str:
        """The text form, ``ema:0.9`` or ``mean:20`` (what :func:`parse_smoothing` reads)."""
        if self.kind == "ema":
            return f"ema:{self.param:.15g}"
        return f"mean:{int(self.param)}"

    @property
    def label(self) -> str:
        """A chart's caption: ``EMA 0.9`` or ``mean of 20``."""
        return f"EMA {self.param:g}" if self.kind == "ema" else f"mean of {int(self.param)}"


def parse_smoothing(text: str | None, *, name: str = "smooth") -> Smoothing | None:
    """``ema:W`` or ``mean:N`` as a :class:`Smoothing`; None for no smoothing (None, ``""``,
    ``none``, ``ema:0``).

    Raises:
        ValueError: another text, naming ``name`` (the option or parameter), the value
            and the valid forms.
    """
    if text is None:
        return None
    t = text.strip().lower()
    if t in ("", "none", "off"):
        return None
    kind, sep, arg = t.partition(":")
    valid = f"valid: none, {KINDS['ema']}, {KINDS['mean']}"
    if not sep or kind not in KINDS:
        raise ValueError(f"{name}={text!r} is not a smoothing ({valid})")
    if kind == "ema":
        try:
            w = float(arg)
        except ValueError:
            w = math.nan
        if not 0 <= w < 1:
            raise ValueError(f"{name}={text!r}: the EMA weight must be 0 <= W < 1 ({valid})")
        return None if w == 0 else Smoothing("ema", w)
    try:
        n = int(arg)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_WINDOW:
        raise ValueError(
            f"{name}={text!r}: the window must be an integer 1..{MAX_WINDOW} ({valid})"
        )
    return Smoothing("mean", n)


def smooth(values: Sequence[Any] | Any, how: Smoothing, *, use_numpy: bool | None = None) -> Any:
    """``values`` smoothed as ``how`` says, one number per value (a list, or a numpy array
    when numpy did the work); NaN and ±inf stay where they are and are not averaged in.

    ``use_numpy``: force (True) or forbid (False) numpy; None: numpy for long series when
    it is installed.
    """
    n = len(values)
    if use_numpy is None:
        use_numpy = n >= NUMPY_MIN and _numpy() is not None
    if how.kind == "ema":
        return _ema_numpy(values, how.param) if use_numpy else ema_reference(values, how.param)
    window = int(how.param)
    return _mean_numpy(values, window) if use_numpy else mean_reference(values, window)


def ema_reference(values: Sequence[Any], weight: float) -> list[float]:
    """The debiased EMA of ``values`` with ``weight`` (see the module), a plain loop."""
    out: list[float] = []
    s = 0.0
    wk = 1.0  # weight ** k
    for y in values:
        y = float(y)
        if not math.isfinite(y):
            out.append(y)
            continue
        s = weight * s + (1.0 - weight) * y
        wk *= weight
        out.append(s / (1.0 - wk))
    return out


def mean_reference(values: Sequence[Any], window: int) -> list[float]:
    """The mean of the last ``window`` finite values at each point (see the module), a
    plain loop."""
    out: list[float] = []
    last: list[float] = []
    for y in values:
        y = float(y)
        if not math.isfinite(y):
            out.append(y)
            continue
        last.append(y)
        if len(last) > window:
            last.pop(0)
        out.append(math.fsum(last) / len(last))
    return out


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def _ema_numpy(values: Any, weight: float) -> Any:
    """:func:`ema_reference` with numpy: the finite values are taken out, scaled to at most
    1 in size, and the recurrence solved block by block in closed form (within a block of
    ``L`` values, ``s_j = W**(j+1) * carry + (1 - W) * W**j * cumsum(y_i * W**-i)``, ``L``
    small enough that ``W**-L`` stays far from overflowing); a weight whose memory is
    short (``W**64 < 1e-16``) by a convolution with the kernel ``(1 - W) * W**i``."""
    return _on_finite(values, lambda np, v: _ema_finite(np, v, weight))


def _on_finite(values: Any, smooth: Any) -> Any:
    """``values`` as float64 with ``smooth(np, finite_values)`` in place of its finite
    entries (NaN and ±inf stay where they are, left out of every average)."""
    np = _numpy()
    y = np.array(values, dtype=np.float64)
    fin = np.isfinite(y)
    if fin.any():
        y[fin] = smooth(np, y[fin])
    return y


def _ema_finite(np: Any, v: Any, weight: float) -> Any:
    n = v.size
    scale = float(np.max(np.abs(v))) or 1.0
    v = v / scale
    w = float(weight)
    out = np.empty(n)
    lnw = math.log(w) if w > 0 else -math.inf
    taps = math.ceil(37.0 / -lnw)  # W**taps < 1e-16: older values no longer count
    if taps <= 64:  # a short memory: a convolution with the truncated kernel
        kernel = (1.0 - w) * np.exp(np.arange(taps) * lnw) if w > 0 else np.ones(1)
        out[:] = np.convolve(v, kernel)[:n]
        if w > 0:
            out /= _debias(np, n, lnw)
    else:
        block = max(1, min(n, int(500.0 / -lnw)))  # W**-block <= e**500
        j = np.arange(block, dtype=np.float64)
        up = np.exp(-j * lnw)  # W**-j
        down = np.exp(j * lnw)  # W**j
        carry = 0.0
        for start in range(0, n, block):
            blk = v[start : start + block]
            k = blk.size
            acc = np.cumsum(blk * up[:k])
            acc *= down[:k]
            acc *= 1.0 - w
            acc += (down[:k] * w) * carry
            out[start : start + k] = acc
            carry = float(acc[-1])
        out /= _debias(np, n, lnw)
    return out * scale


def _debias(np: Any, n: int, lnw: float) -> Any:
    """``1 - W**k`` for k = 1..n (``ln W`` given); 1 once ``W**k`` is below 1e-300 (no
    slow underflow to subnormal numbers)."""
    return -np.expm1(np.maximum(np.arange(1, n + 1, dtype=np.float64) * lnw, -700.0))


def _mean_numpy(values: Any, window: int) -> Any:
    """:func:`mean_reference` with numpy: differences of a cumulative sum of the finite
    values (taken about their mean, which keeps the sum's rounding small)."""

    def mean(np: Any, v: Any) -> Any:
        mid = float(np.mean(v)) if np.isfinite(np.mean(v)) else 0.0
        c = np.concatenate(([0.0], np.cumsum(v - mid)))
        hi = np.arange(1, v.size + 1)
        lo = np.maximum(hi - window, 0)
        return (c[hi] - c[lo]) / (hi - lo) + mid

    return _on_finite(values, mean)
