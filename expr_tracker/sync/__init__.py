"""Team use through object storage: ``et sync`` to S3 (or a shared folder) and ``et gc``
(docs/team.md). Needs the ``team`` extra for ``s3://`` (boto3) and pyarrow for Parquet parts.

- :mod:`expr_tracker.sync.store`: the object stores (S3, a folder) and conditional writes;
- :mod:`expr_tracker.sync.layout`: object keys and the manifest, checked when read back;
- :mod:`expr_tracker.sync.upload`: :func:`sync_dir`, the incremental upload;
- :mod:`expr_tracker.sync.collect`: :func:`collect`, removing what no manifest references.
"""
