"""history/untrusted.py: the one way readers open and decode files from anyone."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from expr_tracker.history import untrusted


def test_regular_file_is_read(tmp_path):
    p = tmp_path / "run.json"
    p.write_bytes(b'{"status": "finished", "loss": NaN}')
    out = untrusted.read_json(p, root=tmp_path)
    assert out["status"] == "finished"
    assert out["loss"] != out["loss"]


def test_fifo_is_refused_without_blocking(tmp_path):
    p = tmp_path / "config.json"
    os.mkfifo(p)
    done = threading.Event()
    err: list[BaseException] = []

    def read():
        try:
            untrusted.read_json(p)
        except BaseException as exc:  # noqa: BLE001
            err.append(exc)
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(5), "reading a FIFO blocked"
    assert isinstance(err[0], untrusted.UnsafeFileError)
    assert "FIFO" in err[0].reason


def test_socket_and_directory_are_refused(tmp_path):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(tmp_path / "summary.json"))
        with pytest.raises(untrusted.UnsafeFileError, match="socket"):
            untrusted.read_regular(tmp_path / "summary.json")
    finally:
        s.close()
    (tmp_path / "d.json").mkdir()
    with pytest.raises(untrusted.UnsafeFileError, match="directory"):
        untrusted.read_regular(tmp_path / "d.json")


def test_symlink_out_of_root_is_refused(tmp_path):
    secret = tmp_path / "home" / "secret.json"
    secret.parent.mkdir()
    secret.write_text('{"token": "x"}')
    root = tmp_path / "runs"
    root.mkdir()
    (root / "config.json").symlink_to(secret)
    with pytest.raises(untrusted.UnsafeFileError, match="outside"):
        untrusted.read_json(root / "config.json", root=root)
    # a link that stays inside the root is fine; without a root, links are followed
    (root / "real.json").write_text("{}")
    (root / "alias.json").symlink_to(root / "real.json")
    assert untrusted.read_json(root / "alias.json", root=root) == {}
    assert untrusted.read_json(root / "config.json") == {"token": "x"}


def test_parent_folder_swapped_for_a_link_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "run.json").write_text("{}")
    root = tmp_path / "runs"
    root.mkdir()
    (root / "r1").symlink_to(outside)
    with pytest.raises(untrusted.UnsafeFileError):
        untrusted.read_regular(root / "r1" / "run.json", root=root)


def test_size_bound(tmp_path):
    p = tmp_path / "summary.json"
    p.write_bytes(b" " * 1000 + b"{}")
    with pytest.raises(untrusted.UnsafeFileError, match="larger"):
        untrusted.read_json(p, max_bytes=100)
    assert untrusted.read_json(p, max_bytes=None) == {}


@pytest.mark.parametrize(
    "doc",
    [
        b"[" * 20000 + b"]" * 20000,
        b'{"a": NaN, "b": ' + b"[" * 20000 + b"]" * 20000 + b"}",
        b'"\\ud800"',
        b'{"a": NaN, "b": "\\udc00"}',
        b"\xff\xfe{}",
        b'{"a": 1',
    ],
    ids=["deep", "deep-with-nan", "lone-surrogate", "lone-surrogate-with-nan", "not-utf8", "torn"],
)
def test_hostile_json_is_a_value_error(doc):
    with pytest.raises(ValueError):
        untrusted.load_json_bytes(doc)


def test_paired_surrogates_and_non_finite_values_decode():
    assert untrusted.load_json_bytes(b'{"e": "\\ud83d\\ude00", "x": -Infinity}') == {
        "e": "\U0001f600",
        "x": float("-inf"),
    }
