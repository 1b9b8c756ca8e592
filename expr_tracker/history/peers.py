"""The other ranks of a run, as rank 0 sees them while it trains: their metrics files read
incrementally, and the skew of a metric across ranks (docs/streams.md "Straggler ranks").

:func:`rank_skew` is the one definition of skew, shared by the DSL's ``skew(m)`` and by
``et ranks``: the largest value across ranks divided by their median, and the rank holding
it. :class:`PeerFiles` tails ``metrics[.S].rankN.jsonl`` of ranks 1..N-1 (O(new bytes) per
poll, non-blocking, at most one poll per ``interval``) and :class:`RankSkew` judges each
step once, when every rank has written it.

Nothing here raises into the training loop: a peer file that cannot be read is a rank whose
values are missing (UNKNOWN), with one warning per file.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from heapq import heapify, heappop, heappush, nlargest
from typing import Any

from expr_tracker.history.peerfiles import PeerFiles

__all__ = ["PeerFiles", "RankSkew", "rank_skew"]  # PeerFiles: from peerfiles.py

log = logging.getLogger("expr_tracker")

#: complete-but-unjudged steps kept per metric: past it the oldest are skipped (rank 0
#: evaluates less often than peers complete steps); also bounds steps no rank 0 row reached
MAX_PENDING = 4096
_READ = 1 << 20


def rank_skew(values: Sequence[float]) -> tuple[float, int] | None:
    """``(max / median, index of the max)`` of one step's values across ranks.

    ``values``: one float per rank (at least two). None (UNKNOWN) for fewer than two
    values, a NaN, a non-positive median or an infinite one. Ties name the lowest rank.
    """
    n = len(values)
    if n == 2:  # the common case, without sorting
        a, b = values
        if a != a or b != b:
            return None
        med = (a + b) / 2.0
        if not 0.0 < med < float("inf"):
            return None
        return (b / med, 1) if b > a else (a / med, 0)
    if n < 2:
        return None
    top = 0
    hi = values[0]
    for i in range(n):
        v = values[i]
        if v != v:
            return None
        if v > hi:
            hi = v
            top = i
    s = sorted(values)
    h = n // 2
    med = s[h] if n % 2 else (s[h - 1] + s[h]) / 2.0
    if not 0.0 < med < float("inf"):
        return None
    return hi / med, top


class _Metric:
    """One metric's per-step values across ranks, until each step is judged."""

    __slots__ = ("key", "steps", "ready", "judged", "last", "at", "at_answer", "limit")

    def __init__(self, name: str) -> None:
        self.key = ('"' + name + '"').encode()
        # step -> [ranks still missing, value of rank 0, of rank 1, ...]
        self.steps: dict[int, list[Any]] = {}
        self.ready: list[int] = []  # a heap of the steps every rank has written
        self.judged = -1  # the newest step judged
        self.limit = 128  # the table's size that makes _prune run
        self.last: tuple[int, float, int] | None = None  # (step, skew, slowest rank)
        self.at: int | None = None  # the rank-0 step of the last call
        self.at_answer: tuple[float, int] | None = None  # and its answer


class RankSkew:
    """``skew(m)`` on rank 0: each step judged once, when every rank has written it.

    ``skew(name, at, step, value)`` is called by the rule at rank 0's step ``at`` with rank
    0's own latest ``value`` of ``name`` (recorded at ``step``); it polls the peers' files and returns ``(skew, slowest rank)`` of
    the oldest step not judged yet that every rank has reached, or None (UNKNOWN) when no
    step became complete since the last judgement (a rank that has not written the step
    yet is missing). Calls for the same rank-0 step return the same answer (two rules, or
    the ``{expr}`` rendering, never judge a second step). ``last(name)``: the last
    judgement, ``(step, skew, rank)``, for ``{rank}`` in messages.

    Cost per call: a dict lookup, a clock read, and, once per ``interval``, one ``read``
    per peer file plus decoding the new lines that hold a tracked name.
    """

    def __init__(self, peers: PeerFiles) -> None:
        self.peers = peers
        self.world = len(peers.ranks) + 1
        self._metrics: dict[str, _Metric] = {}
        self._keys: dict[bytes, str] = {}
        self.judgements = 0

    def skew(
        self, name: str, at: int | None, step: int | None, value: float | None
    ) -> tuple[float, int] | None:
        """The judgement of ``name`` at rank 0's step ``at``, given rank 0's latest value
        ``value`` of it (recorded at ``step``): ``(skew, slowest rank)`` or None."""
        m = self._metrics.get(name)
        if m is None:
            m = self._metrics[name] = _Metric(name)
            self._keys = {**self._keys, m.key: name}
        if at is None or step is None:
            return None
        if m.at == at:
            return m.at_answer
        m.at = at
        m.at_answer = answer = self._judge(m, step, value)
        return answer

    def _judge(self, m: _Metric, step: int, value: float | None) -> tuple[float, int] | None:
        if value is not None:
            self._put(m, step, 0, value)
        metrics = self._metrics
        for rank, s, name, v in self.peers.poll(self._keys):
            self._put(metrics[name], s, rank, v)
        steps = m.steps
        if len(steps) > m.limit:  # amortised: at most every doubling of the table
            self._prune(m)
        ready = m.ready
        if not ready:
            return None
        s = heappop(ready)
        if len(ready) > MAX_PENDING:  # rank 0 judges slower than steps complete: skip the
            keep = nlargest(MAX_PENDING // 2, ready)  # oldest half (amortised)
            for old in ready:
                if old < keep[-1]:
                    steps.pop(old, None)
            ready[:] = keep
            heapify(ready)
        judged = steps.pop(s)
        m.judged = s
        self.judgements += 1
        res = rank_skew(judged[1:])  # complete: no None left
        if res is not None:
            m.last = (s, res[0], res[1])
        return res

    @staticmethod
    def _prune(m: _Metric) -> None:
        """Drop the steps that can no longer be judged (older than the last judged one: a
        rank never wrote them) and, past ``MAX_PENDING`` waiting, the oldest (a rank that
        stopped writing the metric); then wait for the table to double again."""
        steps = m.steps
        for old in [x for x in steps if x <= m.judged]:
            del steps[old]
        if len(steps) > MAX_PENDING:
            waiting = sorted(steps)
            for old in waiting[: len(waiting) - MAX_PENDING]:
                del steps[old]
            ready = set(m.ready)
            if ready - steps.keys():
                m.ready = [x for x in m.ready if x in steps]
                heapify(m.ready)
        m.limit = max(2 * len(steps), 128)

    def _put(self, m: _Metric, step: int, rank: int, value: float) -> None:
        if step <= m.judged:
            return
        vals = m.steps.get(step)
        if vals is None:
            vals = m.steps[step] = [self.world] + [None] * self.world
        if vals[rank + 1] is None:
            vals[0] -= 1
            if vals[0] == 0:
                heappush(m.ready, step)
        vals[rank + 1] = value

    def last(self, name: str) -> tuple[int, float, int] | None:
        """The last judgement of ``name`` (``.`` read as ``/`` too): (step, skew, rank)."""
        m = self._metrics.get(name) or self._metrics.get(name.replace(".", "/"))
        return None if m is None else m.last

    def stats(self) -> dict[str, int]:
        """``{"ranks", "judgements", "polls", "bytes_read", "lines"}``."""
        p = self.peers
        return {
            "ranks": self.world,
            "judgements": self.judgements,
            "polls": p.polls,
            "bytes_read": p.bytes_read,
            "lines": p.lines,
        }

    def close(self) -> None:
        self.peers.close()
