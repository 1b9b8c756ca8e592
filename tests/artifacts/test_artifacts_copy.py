"""``copy_hashed``, the one file copy of the store (docs/artifacts.md "Link or copy"): a
reflink clone where the file system has one, else ``copy_file_range`` per data region, else
a plain read and write; the same bytes, hash, holes and permission bits whichever path ran,
and the hash is always of what the copy holds."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

import expr_tracker as et
from expr_tracker.artifacts import ArtifactStore, files

HAS_COPY_RANGE = hasattr(os, "copy_file_range")


def _sparse(path: Path, size: int = 24 << 20) -> str:
    """A sparse file: a hole, 9 MiB of data (over one COPY_CHUNK, not a multiple of it),
    a hole, a short tail; returns its sha256."""
    block = hashlib.sha256(b"seed").digest() * (1 << 15)  # 1 MiB, not all zeros
    with open(path, "wb") as f:
        f.truncate(size)
        f.seek(1 << 20)
        for _ in range(9):
            f.write(block)
        f.write(b"odd")
        f.seek(size - 5000)
        f.write(b"tail" * 1250)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _keeps_holes(path: Path) -> bool:
    return os.stat(path).st_blocks * 512 < 16 << 20


@pytest.fixture
def no_clone(monkeypatch):
    """Take the clone away (a reflink file system would otherwise never reach the copy)."""
    monkeypatch.setattr(files, "_clone", lambda fin, fout: False)


@pytest.fixture
def copy_range_calls(monkeypatch):
    calls: list[int] = []
    if HAS_COPY_RANGE:
        real = os.copy_file_range

        def spy(fin, fout, count, offset_src=None, offset_dst=None):
            n = real(fin, fout, count, offset_src, offset_dst)
            calls.append(n)
            return n

        monkeypatch.setattr(os, "copy_file_range", spy)
    return calls


def _check_copy(src: Path, dst: Path, sha: str, got: tuple[int, str]) -> None:
    assert got == (os.stat(src).st_size, sha)
    assert hashlib.sha256(dst.read_bytes()).hexdigest() == sha
    if _keeps_holes(src):
        assert _keeps_holes(dst)  # the holes were not written


@pytest.mark.skipif(not HAS_COPY_RANGE, reason="no os.copy_file_range here")
def test_the_copy_is_made_by_copy_file_range_per_data_region(tmp_path, no_clone, copy_range_calls):
    src = tmp_path / "ckpt.pt"
    sha = _sparse(src)
    os.chmod(src, 0o640)
    got = files.copy_hashed(src, tmp_path / "copy")
    _check_copy(src, tmp_path / "copy", sha, got)
    # in the kernel, when this file system lets it (a plain copy otherwise: same result)
    if copy_range_calls and _keeps_holes(src):  # the data regions only, never the holes
        assert 9 << 20 < sum(copy_range_calls) < 11 << 20
    assert stat.S_IMODE(os.stat(tmp_path / "copy").st_mode) == 0o440 & ~_umask()


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


@pytest.mark.parametrize(
    "how",
    ["EXDEV", "ENOSYS", "EPERM", "EOPNOTSUPP", "fails-half-way", "copies-nothing", "missing"],
)
def test_without_copy_file_range_a_plain_copy_gives_the_same_file(
    tmp_path, no_clone, monkeypatch, how
):
    # another file system on an older kernel (EXDEV), an old kernel (ENOSYS), a sandbox
    # (EPERM), a file system that copies nothing (0 bytes, as some pseudo files do), or no
    # copy_file_range at all: read and write instead, from where the kernel stopped
    src = tmp_path / "src.bin"
    sha = _sparse(src)
    real = getattr(os, "copy_file_range", None)
    calls = []

    def fake(fin, fout, count, offset_src=None, offset_dst=None):
        calls.append(count)
        if how == "fails-half-way" and len(calls) == 1:
            return real(fin, fout, min(count, 3 << 20), offset_src, offset_dst)
        if how == "copies-nothing":
            return 0
        code = errno.EXDEV if how == "fails-half-way" else getattr(errno, how)
        raise OSError(code, os.strerror(code))

    if how == "missing":
        monkeypatch.delattr(os, "copy_file_range", raising=False)
    elif real is None:
        pytest.skip("no os.copy_file_range here")
    else:
        monkeypatch.setattr(os, "copy_file_range", fake)
    got = files.copy_hashed(src, tmp_path / "copy")
    _check_copy(src, tmp_path / "copy", sha, got)
    if how != "missing":
        assert len(calls) == (2 if how == "fails-half-way" else 1)  # then never again


@pytest.mark.skipif(not HAS_COPY_RANGE, reason="no os.copy_file_range here")
def test_a_real_error_of_copy_file_range_is_raised_and_nothing_is_left(
    tmp_path, no_clone, monkeypatch
):
    src = tmp_path / "src.bin"
    src.write_bytes(b"x" * 4096)

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "copy_file_range", full)
    with pytest.raises(OSError, match="No space left"):
        files.copy_hashed(src, tmp_path / "copy")
    assert not (tmp_path / "copy").exists()


def test_a_clone_that_fails_leaves_an_empty_file_to_the_copy(tmp_path, monkeypatch):
    # a clone refused half-way must not leave shared extents under the copy
    src = tmp_path / "src.bin"
    sha = _sparse(src, 4 << 20 | 12345)

    def refused(fd, request, arg=0):
        assert request == files.FICLONE
        os.pwrite(fd, b"junk" * 100_000, 0)  # what a half clone could leave
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    if files.FICLONE is None:
        pytest.skip("no FICLONE on this platform")
    monkeypatch.setattr(files.fcntl, "ioctl", refused)
    got = files.copy_hashed(src, tmp_path / "copy")
    _check_copy(src, tmp_path / "copy", sha, got)


# ------------------------------------------------------------------ reflink file systems


def _reflink_dir(tmp_path: Path) -> Path | None:
    """A new folder on a file system with reflink clones, below ``ET_TEST_REFLINK_DIR`` (an
    XFS or Btrfs mount) or pytest's own folder when that happens to be one; else None."""
    if files.FICLONE is None:
        return None
    for top in (os.environ.get("ET_TEST_REFLINK_DIR"), str(tmp_path)):
        if not top or not os.path.isdir(top):
            continue
        d = Path(tempfile.mkdtemp(prefix="et-reflink-", dir=top))
        (d / "a").write_bytes(b"x" * 4096)
        fin = os.open(d / "a", os.O_RDONLY)
        fout = os.open(d / "b", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            files.fcntl.ioctl(fout, files.FICLONE, fin)
            return d
        except OSError:
            shutil.rmtree(d)
        finally:
            os.close(fin)
            os.close(fout)
    return None


@pytest.fixture
def reflink_dir(tmp_path):
    d = _reflink_dir(tmp_path)
    if d is None:
        pytest.skip("no reflink file system (set ET_TEST_REFLINK_DIR to an XFS or Btrfs folder)")
    yield d
    shutil.rmtree(d)


def test_on_a_reflink_file_system_the_copy_is_a_clone(reflink_dir, monkeypatch):
    clones = []
    real = files._clone
    monkeypatch.setattr(files, "_clone", lambda a, b: clones.append(real(a, b)) or clones[-1])
    src = reflink_dir / "ckpt.pt"
    sha = _sparse(src)
    os.chmod(src, 0o600)
    got = files.copy_hashed(src, reflink_dir / "copy")
    assert clones == [True]
    _check_copy(src, reflink_dir / "copy", sha, got)
    assert stat.S_IMODE(os.stat(reflink_dir / "copy").st_mode) == 0o400  # private stays
    with open(src, "r+b") as f:  # rewritten in place: copy-on-write keeps the clone
        f.seek(1 << 20)
        f.write(b"new weights" * 1000)
    assert hashlib.sha256((reflink_dir / "copy").read_bytes()).hexdigest() == sha


def test_on_a_reflink_file_system_a_logged_version_survives_a_rewrite(reflink_dir):
    store = ArtifactStore(reflink_dir / "artifacts")  # the default mode: copy
    src = reflink_dir / "ckpt.pt"
    _sparse(src)
    a = et.Artifact("ckpt", type="model")
    a.add_file(src)
    v, _ = store.log(a)
    with open(src, "r+b") as f:
        f.seek(1 << 20)
        f.write(b"epoch-2" * 1000)
    assert v.verify() and store.get("ckpt", "v0").digest == v.digest
