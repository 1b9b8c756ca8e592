"""The ``et`` command line: one module per command group, wired in :mod:`expr_tracker.cli.main`."""
