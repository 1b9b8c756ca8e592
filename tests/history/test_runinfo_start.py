"""run.json's machine fields without the processes the standard library would start
(docs/architecture.md "Cold start"): git runs only inside a repository, the platform
string is platform.platform()'s, the host name socket's."""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess

import pytest

from expr_tracker.history.paths import hostname
from expr_tracker.history.runinfo import git_info, platform_name


def test_no_repository_no_git_info(tmp_path, monkeypatch):
    monkeypatch.delenv("GIT_DIR", raising=False)
    if any((p / ".git").exists() for p in (tmp_path, *tmp_path.parents)):
        pytest.skip("the temporary folder is inside a repository")
    assert git_info(str(tmp_path)) is None


@pytest.mark.skipif(shutil.which("git") is None, reason="no git")
def test_git_info_in_a_repository_and_below_it(tmp_path):
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@localhost")
    env.update(GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@localhost")

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=tmp_path, env=env, check=True, capture_output=True, text=True
        ).stdout.strip()

    git("init", "-q")
    (tmp_path / "a.txt").write_text("a")
    git("add", "a.txt")
    git("commit", "-q", "-m", "first")
    head = git("rev-parse", "HEAD")
    (tmp_path / "sub").mkdir()
    assert git_info(str(tmp_path)) == {"commit": head, "dirty": False}
    assert git_info(str(tmp_path / "sub")) == {"commit": head, "dirty": False}
    (tmp_path / "a.txt").write_text("b")
    assert git_info(str(tmp_path / "sub")) == {"commit": head, "dirty": True}


def test_platform_and_host_are_the_standard_librarys():
    uname = platform.uname()
    if uname.processor not in ("", uname.machine):  # the one field platform_name leaves out
        pytest.skip(f"uname -p gives {uname.processor!r} here")
    assert platform_name() == platform.platform()
    assert hostname() == socket.gethostname()
