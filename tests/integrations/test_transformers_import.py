"""The transformers integration's imports: ``import expr_tracker`` never imports transformers,
and without transformers the integration says what to install (fast: no Trainer runs)."""

from __future__ import annotations

from helpers import run_py


def test_import_expr_tracker_imports_no_framework():
    run_py(
        """
        import sys
        import expr_tracker, expr_tracker.integrations
        loaded = {"transformers", "torch", "lightning", "accelerate"} & set(sys.modules)
        assert not loaded, loaded
        """
    )


def test_without_transformers_the_import_names_the_extra():
    proc = run_py(
        """
        import sys
        sys.modules["transformers"] = None  # as if it were not installed
        try:
            from expr_tracker.integrations.transformers import ExprTrackerCallback
        except ImportError as exc:
            print(exc)
        else:
            raise SystemExit("imported without transformers")
        """
    )
    assert "pip install 'expr-tracker[transformers]'" in proc.stdout
