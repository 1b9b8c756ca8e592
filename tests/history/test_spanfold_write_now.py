"""``PendingSpans.write_now`` when an exception arrives around the sink: a signal
handler's (a ``TimeoutError`` of a signal-based timeout, not only Ctrl-C) delivered just
as the caller's ``done()`` returns leaves the caller's queue as ``done()`` left it, and
the next record is never let go of; one raised by the sink lets go of the record once
(docs/spans.md "Cost")."""

from __future__ import annotations

import logging
import time
from functools import partial
from operator import delitem

import pytest

from expr_tracker._warn import Warner
from expr_tracker.history.spanfold import PendingSpans


def _pending(sink) -> PendingSpans:
    p = PendingSpans(
        None,
        open_seconds=None,
        clock=time.monotonic,
        flusher=None,
        on_due=lambda: None,
        warner=Warner(logging.getLogger("test")),
    )
    p.configure(sink, None, 1 << 20)
    return p


@pytest.mark.parametrize("exc", [TimeoutError, KeyboardInterrupt])
def test_a_handlers_exception_as_done_returns_lets_go_of_one_record(exc):
    taken: list = []
    raw = ["r1", "r2"]

    def done_then_signal() -> None:
        del raw[0]
        raise exc("delivered as done() returns")  # what a handler does between bytecodes

    with pytest.raises(exc):
        _pending(lambda step, records: taken.extend(records)).write_now(3, "r1", done_then_signal)
    assert taken == ["r1"]
    assert raw == ["r2"]  # the next record stays with the caller


def test_a_sink_that_fails_lets_go_of_the_record_and_never_raises():
    raw = ["r1", "r2"]
    _pending(lambda step, records: 1 / 0).write_now(3, "r1", partial(delitem, raw, 0))
    assert raw == ["r2"]


def test_ctrl_c_inside_the_sink_leaves_the_record_with_it():
    raw = ["r1", "r2"]

    def sink(step, records):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _pending(sink).write_now(3, "r1", partial(delitem, raw, 0))
    assert raw == ["r2"]


def test_emit_now_passes_on_a_handlers_exception_raised_after_done():
    """A signal handler's ``TimeoutError`` delivered as ``emit_now``'s ``done()`` returns is
    the caller's to see, not a span sink failure to warn about and swallow."""
    taken: list = []
    raw = ["r1", "r2", "r3"]

    def done_then_signal() -> None:
        del raw[:2]
        raise TimeoutError("delivered as done() returns")

    pending = _pending(lambda step, records: taken.extend(records))
    with pytest.raises(TimeoutError):
        pending.emit_now(3, ["r1", "r2"], done_then_signal)
    assert taken == ["r1", "r2"] and raw == ["r3"]
