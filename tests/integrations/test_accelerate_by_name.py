"""`Accelerator(log_with="expr_tracker")` with no import of the integration module: the name
is registered through Accelerate's public `register_tracker_class` once both `expr_tracker`
and `accelerate` are imported, in either order (expr_tracker/integrations/autoload.py); and
Accelerate's `run_name` convention for a tracker's first argument."""

from __future__ import annotations

import json

import pytest
from helpers import run_py

pytest.importorskip("accelerate")
pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """The in-process test builds Accelerate's process state; leave none behind."""
    yield
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)


TRAIN = """
import json, sys
{imports}
assert "expr_tracker.integrations.accelerate" in sys.modules  # registered it
accelerator = Accelerator(cpu=True, log_with="expr_tracker")
accelerator.init_trackers("byname", config={{"lr": 0.1}},
                          init_kwargs={{"expr_tracker": {{"name": "r", "dir": sys.argv[1]}}}})
for step in range(3):
    accelerator.log({{"loss": 1.0 / (step + 1)}}, step=step)
tracker = accelerator.get_tracker("expr_tracker")
print(json.dumps({{"type": type(tracker).__name__, "run_name": tracker.run_name}}))
accelerator.end_training()
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "imports",
    [
        # expr_tracker first: Accelerate is not loaded yet; its import registers the name
        "import expr_tracker\n"
        "assert 'accelerate' not in sys.modules\n"
        "from accelerate import Accelerator",
        # accelerate first: `import expr_tracker` registers at once
        "from accelerate import Accelerator\nimport expr_tracker",
    ],
    ids=["expr_tracker-first", "accelerate-first"],
)
def test_log_with_the_name_needs_no_integration_import(tmp_path, imports):
    proc = run_py(TRAIN.format(imports=imports), str(tmp_path), timeout=120)
    assert json.loads(proc.stdout.splitlines()[-1]) == {
        "type": "ExprTrackerTracker",
        "run_name": "byname",
    }
    run_dir = tmp_path / "byname" / "r"
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["_step"] for r in rows] == [0, 1, 2]
    assert json.loads((run_dir / "config.json").read_text()) == {"lr": 0.1}
    assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"
    assert "already registered" not in proc.stderr  # registered once


def test_a_failing_registration_never_breaks_accelerates_import():
    proc = run_py(
        """
        import sys
        import expr_tracker
        sys.modules["expr_tracker.integrations.accelerate"] = None  # its import fails
        import accelerate.tracking
        from accelerate.tracking import LOGGER_TYPE_TO_CLASS
        assert "expr_tracker" not in LOGGER_TYPE_TO_CLASS
        print("imported")
        """
    )
    assert proc.stdout.strip() == "imported"
    assert "could not register the Accelerate tracker 'expr_tracker'" in proc.stderr
    assert "log_with=ExprTrackerTracker(...)" in proc.stderr


def test_the_watch_leaves_no_finder_behind_and_imports_nothing():
    run_py(
        """
        import sys
        import expr_tracker
        from expr_tracker.integrations import autoload
        watching = [f for f in sys.meta_path if type(f).__name__ == "_AfterImport"]
        assert len(watching) == 1
        autoload.watch_frameworks()  # again: still one
        assert len([f for f in sys.meta_path if type(f).__name__ == "_AfterImport"]) == 1
        assert not {"accelerate", "torch"} & set(sys.modules)
        import json  # another import passes through untouched
        import accelerate.tracking
        assert not [f for f in sys.meta_path if type(f).__name__ == "_AfterImport"]
        assert "exec_module" not in vars(accelerate.tracking.__spec__.loader)  # restored
        """
    )


def test_run_name_is_accelerates_name_for_the_project(tmp_path):
    from expr_tracker.integrations.accelerate import ExprTrackerTracker

    tracker = ExprTrackerTracker(run_name="demo", name="r", dir=str(tmp_path))
    assert tracker.run_name == "demo"
    tracker.start()
    tracker.store_init_configuration({"lr": 0.1})
    tracker.log({"loss": 1.0}, step=0)
    tracker.finish()
    assert (tmp_path / "demo" / "r" / "metrics.jsonl").is_file()
    assert ExprTrackerTracker("demo", run_name="demo").run_name == "demo"  # the same: fine
    assert ExprTrackerTracker().run_name is None
    with pytest.raises(TypeError, match=r"project='a' and run_name='b'.*run's own name as name="):
        ExprTrackerTracker("a", run_name="b")
