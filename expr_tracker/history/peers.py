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
from collections import deque
from collections.abc import Sequence

from expr_tracker.history.peerfiles import PeerFiles

__all__ = ["PeerFiles", "RankSkew", "rank_skew"]  # PeerFiles: from peerfiles.py

log = logging.getLogger("expr_tracker")

#: steps kept waiting per metric and rank: past it the oldest are skipped (a rank that
#: stopped writing the metric; rank 0 far behind its peers)
MAX_PENDING = 4096
#: a peer's table size that makes it pruned (amortised: a few per MAX_PENDING steps)
_LIMIT = MAX_PENDING + 256


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
    """One metric's values across ranks, until each step is judged: rank 0's own values in
    step order, and per peer its values by step and the highest step it wrote."""

    __slots__ = ("key", "own", "own_top", "peers", "top", "judged", "last", "at", "at_answer")

    def __init__(self, name: str, world: int) -> None:
        self.key = ('"' + name + '"').encode()
        self.own: deque[tuple[int, float]] = deque()  # rank 0's (step, value), not judged
        self.own_top = -1  # rank 0's newest step seen
        self.peers: list[dict[int, float]] = [{} for _ in range(world - 1)]  # rank r at r-1
        self.top = [-1] * (world - 1)  # each peer's highest step holding the metric
        self.judged = -1  # the newest step judged
        self.last: tuple[int, float, int] | None = None  # (step, skew, slowest rank)
        self.at: int | None = None  # the rank-0 step of the last call
        self.at_answer: tuple[float, int] | None = None  # and its answer


class RankSkew:
    """``skew(m)`` on rank 0: each step judged once, when every rank has written it.

    ``skew(name, at, step, value)`` is called by the rule at rank 0's step ``at`` with rank
    0's own latest ``value`` of ``name`` (recorded at ``step``); it polls the peers' files
    and returns ``(skew, slowest rank)`` of the oldest step not judged yet that every rank
    has reached, or None (UNKNOWN) when no step became complete since the last judgement
    (a rank that has not written the step yet is missing; a step a rank passed over without
    writing the metric is never complete and is skipped). Each rank writes its steps in
    order, so the oldest of rank 0's waiting steps is the only candidate. Calls for the
    same rank-0 step return the same answer (two rules, or the ``{expr}`` rendering, never
    judge a second step). ``last(name)``: the last judgement, ``(step, skew, rank)``, for
    ``{rank}`` in messages.

    Cost per call: a few dict and deque operations, a clock read, and, once per
    ``interval``, one ``read`` per peer file and one scan of the bytes read per name.
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
            m = self._metrics[name] = _Metric(name, self.world)
            self._keys = {**self._keys, m.key: name}
        if at is None or step is None:
            return None
        if m.at == at:
            return m.at_answer
        m.at = at
        own = m.own
        if value is not None:
            if step > m.own_top:
                m.own_top = step
                own.append((step, value))
                if len(own) > MAX_PENDING:  # a rank stopped writing the metric
                    own.popleft()
            elif own and own[-1][0] == step:
                own[-1] = (step, value)
        files = self.peers
        if files.clock() >= files.next_poll:  # the clock check without the call
            polled = files.poll(self._keys)
            if polled:
                self._take(polled)
        answer: tuple[float, int] | None = None
        peers = m.peers
        top = m.top
        while own:
            s, v0 = own[0]
            if len(peers) == 1:  # two ranks: the common case
                v1 = peers[0].pop(s, None)
                if v1 is None:
                    if top[0] > s:  # rank 1 passed over this step
                        own.popleft()
                        continue
                    break  # rank 1 has not reached it yet
                own.popleft()
                m.judged = s
                self.judgements += 1
                answer = rank_skew((v0, v1))
                if answer is not None:
                    m.last = (s, answer[0], answer[1])
                break
            vals = [v0]
            state = 0  # 0: every rank wrote it, 1: a rank has not reached it, 2: passed over
            for i, d in enumerate(peers):
                v = d.get(s)
                if v is not None:
                    vals.append(v)
                elif top[i] > s:
                    state = 2
                    break
                else:
                    state = 1
            if state == 2:
                own.popleft()
                continue
            if state == 1:
                break
            own.popleft()
            for d in peers:
                del d[s]
            m.judged = s
            self.judgements += 1
            answer = rank_skew(vals)
            if answer is not None:
                m.last = (s, answer[0], answer[1])
            break
        m.at_answer = answer
        return answer

    def _take(self, polled: list[tuple[int, str, list[int], list[float]]]) -> None:
        """Store the peers' new values (a later line of a step replaces an earlier one)."""
        metrics = self._metrics
        for rank, name, steps, values in polled:
            if not steps:
                continue
            m = metrics[name]
            d = m.peers[rank - 1]
            d.update(zip(steps, values, strict=True))
            hi = max(steps)
            if hi > m.top[rank - 1]:
                m.top[rank - 1] = hi
            if len(d) > _LIMIT:
                self._prune(m, d)

    @staticmethod
    def _prune(m: _Metric, d: dict[int, float]) -> None:
        """Drop a peer's values that can no longer be judged (steps rank 0 is past without
        them waiting) and, past ``MAX_PENDING``, the oldest (rank 0 stopped writing the
        metric, or is far behind)."""
        floor = m.own[0][0] if m.own else m.own_top + 1
        for old in [x for x in d if x < floor]:
            del d[old]
        if len(d) > MAX_PENDING:
            for old in sorted(d)[: len(d) - MAX_PENDING]:
                del d[old]

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
