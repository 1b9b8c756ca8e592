"""et.start_span: a context manager too, and a failed use never leaves a span open that
later spans would nest under (issue 10)."""

from __future__ import annotations

import asyncio
import json

import pytest

import expr_tracker as et
from expr_tracker.spans import current_span, span, start_span


def test_with_start_span_works_and_ends_the_span():
    with et.start_span("x") as s:
        assert current_span() is s and s.running
    assert not s.running and current_span() is None
    with span("y") as y:
        pass
    assert y.path == "y"  # not "x/y" (base code: RuntimeError, and "x" left open)


def test_async_with_start_span():
    async def main():
        async with start_span("a") as s:
            assert current_span() is s
        return s

    s = asyncio.run(main())
    assert not s.running


def test_entering_twice_or_after_end_raises_before_registering():
    s = start_span("x")
    with s:
        with pytest.raises(RuntimeError, match="already started"):
            with s:
                pass
        assert current_span() is s
    assert current_span() is None
    with pytest.raises(RuntimeError, match="already started"):
        with s:
            pass
    assert current_span() is None
    t = start_span("t")
    t.end()
    with pytest.raises(RuntimeError):
        with t:
            pass
    assert current_span() is None


def test_start_span_as_decorator_raises_and_leaves_nothing_open():
    with pytest.raises(TypeError, match=r"et\.span\('x'\)"):

        @et.start_span("x")
        def f():  # pragma: no cover - never defined
            pass

    assert current_span() is None
    with span("later") as later:
        pass
    assert later.path == "later"


def test_bad_arguments_raise_before_anything_is_registered():
    with pytest.raises(ValueError):
        start_span("")
    with pytest.raises(TypeError):
        start_span("x", plugins=5)
    assert current_span() is None


def test_with_start_span_in_a_run_is_recorded_once(tmp_path):
    run = et.init(project="p", name="r", dir=str(tmp_path))
    with et.start_span("outer"):
        with et.span("inner"):
            pass
    et.log({})
    et.finish()
    names = [json.loads(x)["name"] for x in (run.dir / "spans.jsonl").read_text().splitlines()]
    assert names == ["outer/inner", "outer"]
    row = et.read_history(run.dir)[0]
    assert "time_ms/outer" in row and "time_ms/outer/inner" in row
