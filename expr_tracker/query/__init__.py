"""SQL across runs: DuckDB views over the run directories, a per-run columnar cache, export.

Reads files only, through :mod:`expr_tracker.history`'s readers; never imports the write
path. Needs the ``[query]`` extra (``duckdb``, ``pyarrow``).
"""
