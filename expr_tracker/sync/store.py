"""Object stores ``et sync`` writes to: S3 (and compatible stores) and a shared folder.

Both offer the few operations a sync needs (docs/team.md "How a sync commits"):

- ``get(key)`` -> ``(bytes, etag)`` or None when there is no such object;
- ``put(key, data, if_match=None, if_none_match=False)`` -> the new ETag; with
  ``if_none_match`` the write happens only when no object has the key, with ``if_match``
  only when the object's ETag is still that one; otherwise :class:`PreconditionFailed`;
- ``exists(key)``, ``delete(key)``, ``list(prefix)`` -> ``(key, size, mtime)`` triples;
  ``tags(prefix)`` -> ``(key, tag)`` pairs, the tag changing whenever the object is
  rewritten (S3: the ETag, from the same listing; a folder: size, mtime and inode), so a
  reader tells from one listing which manifests changed since it last read them.

Keys are ``/``-separated and relative to the URL's prefix.

:class:`S3Store` uses boto3 with the standard AWS credential chain (environment,
``AWS_PROFILE``, instance roles) and the endpoint from ``endpoint_url=`` (the spec's
``sync.endpoint_url``) or the standard ``AWS_ENDPOINT_URL`` variable, which boto3 reads
itself. Nothing here writes a credential anywhere: errors name the operation, the key and
the store's error code, never a header or a secret.

:class:`FileStore` (``file:///mnt/team/runs``) serves a shared file system: objects are
files below the folder, written to a temporary name and renamed; a conditional write holds
an exclusive ``flock`` on a lock file under ``_locks/`` and compares the ETag (the SHA-256
of the content). ``flock`` across hosts needs a file system that supports it (NFSv4 does);
where it does not, two hosts committing one producer at the same moment are not serialized.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

from expr_tracker.errors import ExprTrackerError
from expr_tracker.history import untrusted

__all__ = [
    "FileStore",
    "ObjectStore",
    "PreconditionFailed",
    "S3Store",
    "StoreError",
    "open_store",
    "valid_key",
]

#: the largest object read whole (a manifest, a small run file): 64 MiB
MAX_OBJECT_BYTES = 64 << 20
_MAKING = threading.Lock()


class StoreError(ExprTrackerError):
    """An object store could not be reached or refused an operation (the message names the
    operation, the key and the store's reason; never a credential)."""


class PreconditionFailed(StoreError):
    """A conditional write lost: another writer changed (or created) the object first."""


class ObjectStore(Protocol):
    url: str

    def get(self, key: str, max_bytes: int = MAX_OBJECT_BYTES) -> tuple[bytes, str] | None: ...

    def put(
        self, key: str, data: bytes, *, if_match: str | None = None, if_none_match: bool = False
    ) -> str: ...

    def exists(self, key: str) -> bool: ...

    def delete(self, key: str) -> None: ...

    def list(self, prefix: str) -> Iterator[tuple[str, int, float]]: ...

    def tags(self, prefix: str) -> Iterator[tuple[str, str]]: ...


def valid_key(key: str) -> bool:
    """True for a key a store accepts: relative, ``/``-separated, no empty, ``.`` or ``..``
    segment, no backslash or NUL, at most 1,024 bytes."""
    if not isinstance(key, str) or not key or len(key.encode("utf-8", "replace")) > 1024:
        return False
    if "\\" in key or "\x00" in key or key.startswith("/"):
        return False
    return all(seg not in ("", ".", "..") for seg in key.split("/"))


def _check_key(key: str) -> None:
    if not valid_key(key):
        raise StoreError(f"object key {key[:200]!r} is not valid (a relative path without '..')")


def open_store(url: str, *, endpoint_url: str | None = None) -> ObjectStore:
    """The store a URL names: ``s3://bucket[/prefix]`` or ``file:///path`` (a plain path is
    read as a folder too).

    Raises ``ValueError`` naming the URL and what is valid, and :class:`StoreError` when
    the S3 client (the ``team`` extra) is missing.
    """
    if not isinstance(url, str) or not url:
        raise ValueError(f"sync URL {url!r} is not valid: use s3://bucket/prefix or file:///path")
    parts = urlsplit(url)
    if parts.scheme == "s3":
        bucket = parts.netloc
        if not bucket or parts.query or parts.fragment or "@" in bucket:
            raise ValueError(
                f"sync URL {url!r} is not valid: use s3://bucket/prefix (no credentials, "
                "query or fragment in the URL)"
            )
        prefix = parts.path.strip("/")
        if prefix and not valid_key(prefix):
            raise ValueError(
                f"sync URL {url!r} is not valid: its prefix holds an empty or '..' part"
            )
        return S3Store(bucket, prefix, endpoint_url=endpoint_url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"sync URL {url!r} is not valid: file:// takes a local path")
        return FileStore(unquote(parts.path))
    if parts.scheme == "" and not url.startswith("//"):
        return FileStore(url)
    raise ValueError(
        f"sync URL {url!r} is not valid: the scheme {parts.scheme!r} is not supported "
        "(use s3://bucket/prefix or file:///path)"
    )


#: botocore's loader of its service models, shared by every client of this process: each
#: new session would read and parse the same JSON again (0.1-0.2 s a client; a reader of a
#: project's URL opens up to three stores, sync/mirror.py ``mirror_url``)
_LOADER: list[Any] = []


def _session(boto3: Any) -> Any:
    """A new boto3 session (credentials and endpoint read from the environment again, as
    each store needs) sharing the process's model loader."""
    import botocore.session

    core = botocore.session.get_session()
    if _LOADER:
        core.register_component("data_loader", _LOADER[0])
    else:
        _LOADER.append(core.get_component("data_loader"))
    return boto3.session.Session(botocore_session=core)


class S3Store:
    """An S3 bucket (or an S3-compatible store) under a key prefix, through boto3."""

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None):
        import importlib.util

        if importlib.util.find_spec("boto3") is None:
            raise StoreError("s3:// needs boto3: pip install 'expr-tracker[team]'")
        self.bucket = bucket
        self.prefix = prefix
        self.url = f"s3://{bucket}/{prefix}".rstrip("/")
        self._endpoint_url = endpoint_url
        self._made: Any = None
        self._errors: tuple[type[BaseException], ...] = ()

    @property
    def _client(self) -> Any:
        """The boto3 client, made on first use (a sync with nothing to do imports no boto3)."""
        if self._made is None:
            with _MAKING:  # one client, however many threads ask first (sync/mirror.py)
                return self._make()
        return self._made

    def _make(self) -> Any:
        if self._made is None:
            import boto3
            from botocore.config import Config
            from botocore.exceptions import BotoCoreError, ClientError

            cfg = Config(
                retries={"max_attempts": 5, "mode": "standard"},
                connect_timeout=10,
                read_timeout=60,
                max_pool_connections=16,
            )
            kwargs: dict[str, Any] = {"config": cfg}
            if self._endpoint_url:
                kwargs["endpoint_url"] = self._endpoint_url
            self._errors = (ClientError, BotoCoreError)
            self._made = _session(boto3).client("s3", **kwargs)
        return self._made

    def _key(self, key: str) -> str:
        _check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _fail(self, op: str, key: str, exc: BaseException) -> StoreError:
        code = ""
        status = None
        resp = getattr(exc, "response", None)
        if isinstance(resp, dict):
            code = str(resp.get("Error", {}).get("Code", ""))
            status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("PreconditionFailed", "ConditionalRequestConflict") or status == 412:
            return PreconditionFailed(f"{op} {self.url}/{key}: changed by another writer")
        what = code or type(exc).__name__
        return StoreError(
            f"{op} {self.url}/{key}: {what} (HTTP {status})"
            if status
            else f"{op} {self.url}/{key}: {what}"
        )

    def get(self, key: str, max_bytes: int = MAX_OBJECT_BYTES) -> tuple[bytes, str] | None:
        full = self._key(key)
        try:
            r = self._client.get_object(Bucket=self.bucket, Key=full)
            size = int(r.get("ContentLength") or 0)
            if size > max_bytes:
                raise StoreError(f"get {self.url}/{key}: {size:,} bytes, larger than read whole")
            body = r["Body"].read(max_bytes + 1)
            if len(body) > max_bytes:
                raise StoreError(f"get {self.url}/{key}: larger than read whole")
            return body, str(r["ETag"])
        except self._errors as exc:
            code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
            if code in ("NoSuchKey", "404", "NotFound"):
                return None
            raise self._fail("get", key, exc) from None

    def put(
        self, key: str, data: bytes, *, if_match: str | None = None, if_none_match: bool = False
    ) -> str:
        full = self._key(key)
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": full, "Body": data}
        if if_match is not None:
            kwargs["IfMatch"] = if_match
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        try:
            return str(self._client.put_object(**kwargs)["ETag"])
        except self._errors as exc:
            raise self._fail("put", key, exc) from None

    def exists(self, key: str) -> bool:
        full = self._key(key)
        try:
            self._client.head_object(Bucket=self.bucket, Key=full)
            return True
        except self._errors as exc:
            status = getattr(exc, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status == 404:
                return False
            raise self._fail("head", key, exc) from None

    def delete(self, key: str) -> None:
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except self._errors as exc:
            raise self._fail("delete", key, exc) from None

    def _objects(self, prefix: str) -> Iterator[tuple[str, dict[str, Any]]]:
        full = f"{self.prefix}/{prefix}" if self.prefix else prefix
        cut = len(self.prefix) + 1 if self.prefix else 0
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=full
            )
            for page in pages:
                for obj in page.get("Contents", ()):
                    yield str(obj["Key"])[cut:], obj
        except self._errors as exc:
            raise self._fail("list", prefix, exc) from None

    def list(self, prefix: str) -> Iterator[tuple[str, int, float]]:
        for key, obj in self._objects(prefix):
            yield key, int(obj.get("Size", 0)), obj["LastModified"].timestamp()

    def tags(self, prefix: str) -> Iterator[tuple[str, str]]:
        for key, obj in self._objects(prefix):
            yield key, str(obj.get("ETag", ""))


class FileStore:
    """A folder on a (shared) file system holding objects as files."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(os.path.abspath(root))
        self.url = f"file://{self.root}"

    def _path(self, key: str) -> Path:
        _check_key(key)
        return self.root / key

    @staticmethod
    def _etag(data: bytes) -> str:
        return '"' + hashlib.sha256(data).hexdigest() + '"'

    def get(self, key: str, max_bytes: int = MAX_OBJECT_BYTES) -> tuple[bytes, str] | None:
        path = self._path(key)
        try:
            data = untrusted.read_regular(path, root=self.root, max_bytes=max_bytes)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise StoreError(f"get {self.url}/{key}: {exc.strerror or exc}") from None
        return data, self._etag(data)

    def _write(self, path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".tmp-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def put(
        self, key: str, data: bytes, *, if_match: str | None = None, if_none_match: bool = False
    ) -> str:
        path = self._path(key)
        try:
            if if_match is None and not if_none_match:
                self._write(path, data)
                return self._etag(data)
            lock_dir = self.root / "_locks"
            lock_dir.mkdir(parents=True, exist_ok=True)
            lock = lock_dir / hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                current = self.get(key)
                if if_none_match and current is not None:
                    raise PreconditionFailed(f"put {self.url}/{key}: created by another writer")
                if if_match is not None and (current is None or current[1] != if_match):
                    raise PreconditionFailed(f"put {self.url}/{key}: changed by another writer")
                self._write(path, data)
            finally:
                os.close(fd)
            return self._etag(data)
        except StoreError:
            raise
        except OSError as exc:
            raise StoreError(f"put {self.url}/{key}: {exc.strerror or exc}") from None

    def exists(self, key: str) -> bool:
        return untrusted.present(self._path(key))

    def delete(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StoreError(f"delete {self.url}/{key}: {exc.strerror or exc}") from None

    def list(self, prefix: str) -> Iterator[tuple[str, int, float]]:
        for key, st in self._stats(prefix):
            yield key, st.st_size, st.st_mtime

    def tags(self, prefix: str) -> Iterator[tuple[str, str]]:
        for key, st in self._stats(prefix):
            yield key, f"{st.st_size}-{st.st_mtime_ns}-{st.st_ino}"

    def _stats(self, prefix: str) -> Iterator[tuple[str, os.stat_result]]:
        base = self.root
        # walk only below the prefix's folder part (a listing of _manifests/ never walks
        # the parts)
        head = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        if head and not valid_key(head):
            return
        top = base / head if head else base
        if not top.is_dir() or top.is_symlink():
            return
        for dirpath, dirnames, filenames in os.walk(top):
            rel_dir = os.path.relpath(dirpath, base)
            if rel_dir == "_locks":
                dirnames[:] = []
                continue
            dirnames.sort()
            for name in sorted(filenames):
                if name.startswith(".tmp-"):
                    continue
                key = name if rel_dir == "." else f"{rel_dir}/{name}".replace(os.sep, "/")
                if not key.startswith(prefix):
                    continue
                try:
                    st = os.lstat(os.path.join(dirpath, name))
                except OSError as exc:
                    if exc.errno == errno.ENOENT:
                        continue
                    raise StoreError(f"list {self.url}/{key}: {exc.strerror}") from None
                yield key, st
