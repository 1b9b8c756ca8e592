"""The segmented row cache against a plain list model: random appends (runs of consecutive
steps, repeats, gaps, backward steps), evictions and small limits, then every read the
store makes; and ``history()`` of random typed rows equals the rows as committed."""

from __future__ import annotations

import math
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from expr_tracker.history import HistoryStore
from expr_tracker.history.cache import RowCache, decode_lines
from expr_tracker.history.codec import encode_row

value = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**63), 2**63 - 1),
    st.booleans(),
    st.none(),
    st.text(max_size=12),
    st.lists(st.integers(0, 9), max_size=3),
)
row = st.dictionaries(st.sampled_from(["loss", "acc", "n", "tag", "x/y"]), value, max_size=4)
# how the next step relates to the last: the next one, the same (a patch line), a gap, back
step_move = st.sampled_from(["next", "next", "next", "same", "gap", "back"])
op = st.one_of(
    st.tuples(st.just("append"), row, step_move, st.integers(0, 300)),
    st.tuples(st.just("evict"), st.just({}), st.just(""), st.integers(0, 100)),
)


def same(a: object, b: object) -> bool:
    """Equality where NaN equals NaN and 1 is not True (the cache must keep types)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or a == b  # type: ignore[arg-type]
    if isinstance(a, list):
        return len(a) == len(b) and all(map(same, a, b))  # type: ignore[arg-type]
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)  # type: ignore[attr-defined]
    return a == b


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(op, max_size=40),
    max_rows=st.integers(1, 40),
    max_bytes=st.sampled_from([64, 600, 1 << 20]),
    first=st.integers(0, 5),
)
def test_cache_reads_equal_a_list_model(ops, max_rows, max_bytes, first):
    cache = RowCache(max_bytes, max_rows, first_ordinal=first)
    model: list[tuple[int, bytes, int]] = []  # (ordinal, line, step), oldest cached first
    ordinal, step, flushed = first, 0, first
    appended: list[int] = []  # every step appended, evicted or not
    for kind, r, move, arg in ops:
        if kind == "append":
            if model:
                step = {"next": step + 1, "same": step, "gap": step + 2 + arg}.get(
                    move, max(0, step - 1 - arg % 5)
                )
            line = encode_row({**r, "_step": step})
            cache.append(line, step)
            model.append((ordinal, line, step))
            appended.append(step)
            ordinal += 1
        else:
            flushed = min(ordinal, flushed + arg)
            dropped = cache.evict(flushed)
            while dropped:  # whole segments from the front, only rows on disk
                assert model[0][0] < flushed
                model.pop(0)
                dropped -= 1
        assert cache.next_ordinal == ordinal
        assert cache.first_ordinal == (model[0][0] if model else ordinal)
        assert cache.nrows == len(model)
        assert cache.nbytes == sum(len(x[1]) for x in model)
    steps = [s for _, _, s in model]
    assert cache.first_step() == (steps[0] if steps else None)
    assert cache.sorted == all(a <= b for a, b in pairwise(appended))
    lo = cache.first_ordinal
    for a in range(lo, ordinal + 1, 3):
        for b in (a, a + 1, a + 7, ordinal):
            want = [x[1] for x in model[a - lo : b - lo]]
            got = cache.lines(a, b)
            assert got == want
            assert all(map(same, decode_lines(got), decode_lines(want)))
    for s0 in {0, *steps, max(steps, default=0) + 1}:
        for s1 in (s0, s0 + 1, s0 + 3):
            assert cache.ordinals_in(s0, s1) == [o for o, _, s in model if s0 <= s < s1]
        if cache.sorted:
            assert cache.ordinal_of_step(s0) == next((o for o, _, s in model if s >= s0), ordinal)
    for nsteps in (0, 1, 3, 50):
        start, complete, simple = cache.tail_start(nsteps)
        window = steps[start - lo :]
        if complete:  # the newest nsteps + 1 distinct steps, and the row before is older
            assert len(set(window)) == nsteps + 1
            assert steps[start - lo - 1] not in window
        else:  # the cache ran out first
            assert start == lo and len(set(window)) <= nsteps + 1
        assert simple == all(a < b for a, b in pairwise(window))


@settings(max_examples=40, deadline=None)
@given(
    calls=st.lists(
        st.tuples(row, st.sampled_from([None, None, True, False]), st.sampled_from([None, 0, 2])),
        max_size=40,
    )
)
def test_history_of_typed_rows_equals_the_rows_committed(calls):
    """Ints stay ints, bools bools, NaN NaN; commit=False merges and explicit steps
    (patch lines when a step repeats under "allow") read back as committed."""
    store = HistoryStore(None, max_open_seconds=None, step_policy="allow")
    committed: list[dict] = []
    store.on_commit = lambda r: committed.append(decode_lines([encode_row(dict(r))])[0])
    for metrics, commit, jump in calls:
        step = None if jump is None else store.open_step + jump
        store.ingest(dict(metrics), step=step, commit=commit)
    store.commit()
    merged: dict[int, dict] = {}
    for r in committed:  # rows of one step merge, later lines win per key
        merged.setdefault(r["_step"], {}).update(r)
    want = [merged[s] for s in sorted(merged)]
    got = store.tail(None, include_open=False)
    assert len(got) == len(want)
    assert all(map(same, got, want))
