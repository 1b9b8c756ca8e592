"""``.ci/check_commits.py``, run by CI: what it says of a commit message."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from helpers import ROOT

_spec = importlib.util.spec_from_file_location("check_commits", ROOT / ".ci" / "check_commits.py")
check_commits = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_commits)
problems = check_commits.problems


def test_a_short_subject_and_a_body_are_fine():
    assert problems("tests: warnings are errors\n\nSo that a leak fails here.\n", merge=False) == []


def test_a_subject_over_72_characters_is_named_with_its_length():
    subject = "x" * 73
    assert problems(f"{subject}\n\nwhy\n", merge=False) == ["subject is 73 characters (at most 72)"]
    assert problems("y" * 72 + "\n\nwhy\n", merge=False) == []


def test_a_commit_needs_a_body_but_a_merge_does_not():
    assert problems("fix the thing\n", merge=False) == [
        "no body: say why in the lines after the subject"
    ]
    assert problems("merge i22-tests: warnings are errors\n", merge=True) == []


def test_the_subject_is_one_line():
    assert "no blank line after the subject" in problems("one\ntwo\n\nwhy\n", merge=False)


def test_characters_not_bytes_are_counted():
    assert problems("≤" * 72 + "\n\nwhy\n", merge=False) == []


def test_the_script_names_each_bad_commit_of_a_real_repository(tmp_path):
    def git(*args):
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
            cwd=tmp_path,
            check=True,
            capture_output=True,
        )

    git("init", "-q")
    git("commit", "-q", "--allow-empty", "-m", "first\n\nwhy it came")
    git("commit", "-q", "--allow-empty", "-m", "z" * 80)
    script = ROOT / ".ci" / "check_commits.py"
    p = subprocess.run(
        [sys.executable, str(script), "HEAD~1..HEAD"], cwd=tmp_path, capture_output=True, text=True
    )
    assert p.returncode == 1
    assert "subject is 80 characters" in p.stdout and "no body" in p.stdout
    p = subprocess.run(
        [sys.executable, str(script), "HEAD~1"], cwd=tmp_path, capture_output=True, text=True
    )
    assert p.returncode == 0, p.stdout
