"""expr_tracker.process_exit owns the hooks that end the process (docs/architecture.md
"Locks and their order", the interrupts paragraph); the leaf ``_current`` holds no exit hook.

What the hooks do to a run is tested end to end in tests/assemble (test_interrupts*.py,
test_run_lifecycle.py) and tests/backends/test_mirror_at_exit.py; here, the seams."""

from __future__ import annotations

import types

import expr_tracker  # noqa: F401 - api registers its functions in _current at import
from expr_tracker import _current, process_exit

#: what api registers in the leaf so that a module below it can call up (import direction)
REGISTERED = {"new_run", "end_run", "check_stream", "standalone_dispatcher"}


def test_current_holds_only_the_registrations_that_keep_the_import_direction():
    functions = {
        name
        for name, value in vars(_current).items()
        if not name.startswith("_") and isinstance(value, types.FunctionType)
    }
    assert functions - {"fork_generation"} == REGISTERED


def test_a_signal_cuts_the_wait_for_mirrors_and_then_ends_the_process(monkeypatch):
    # the handler's flag -> the mirror's wait polls it -> the wait gives the mirrors up and
    # reports it -> the exit hook ends the process by that signal
    monkeypatch.setattr(process_exit, "_cut", 0)
    monkeypatch.setattr(process_exit, "_cut_ended", 0)
    monkeypatch.setattr(process_exit, "_give_up", False)
    assert not process_exit.mirror_wait_cut() and not process_exit.skip_mirror_wait()
    process_exit._cut_mirror_wait(15)
    assert process_exit.mirror_wait_cut() and process_exit.skip_mirror_wait()
    process_exit.mirrors_given_up()
    assert process_exit._cut_ended == 15 and not process_exit.mirror_wait_cut()


def test_an_interrupted_wait_is_not_waited_for_again_at_exit(monkeypatch):
    monkeypatch.setattr(process_exit, "_wait_interrupted", False)
    monkeypatch.setattr(process_exit, "_give_up", False)
    monkeypatch.setattr(process_exit, "_cut", 0)
    process_exit.mirror_wait_interrupted()  # this test runs on the main thread
    assert process_exit._wait_interrupted and not process_exit.skip_mirror_wait()
    monkeypatch.setattr(process_exit, "_finish_at_exit", lambda: None)
    monkeypatch.setattr(process_exit, "_exiting", False)
    process_exit._at_exit()
    assert process_exit.skip_mirror_wait()
