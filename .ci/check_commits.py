#!/usr/bin/env python3
"""Commit messages: a subject of at most 72 characters (what `git log --oneline`, GitHub and
mail clients show whole) and, on every commit but a merge, a body saying why.

Checks the commits in BASE..HEAD (or the revision range given as the one argument), merges
included. BASE is main as it was when this check was added: older commits are what they are.
In a shallow clone without BASE, only HEAD is checked. Exit status 1 names each bad commit.
"""

from __future__ import annotations

import subprocess
import sys

BASE = "555cc97df047dc00a86ecf2c4050d2ab6a80f06d"
MAX_SUBJECT = 72


def git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], capture_output=True, text=True, encoding="utf-8")


def problems(message: str, merge: bool) -> list[str]:
    """What is wrong with one commit message (none when it is fine)."""
    lines = message.strip("\n").split("\n")
    subject = lines[0]
    body = [line for line in lines[1:] if line.strip() and not line.startswith("#")]
    found = []
    if len(subject) > MAX_SUBJECT:
        found.append(f"subject is {len(subject)} characters (at most {MAX_SUBJECT})")
    if not subject.strip():
        found.append("empty subject")
    if len(lines) > 1 and lines[1].strip():
        found.append("no blank line after the subject")
    if not merge and not body:
        found.append("no body: say why in the lines after the subject")
    return found


def main(argv: list[str]) -> int:
    if git("rev-parse", "--verify", "-q", "HEAD").returncode != 0:
        print("check_commits: not a git clone with commits; nothing to check")
        return 0
    if argv:
        revs = argv[0]
    elif git("cat-file", "-e", f"{BASE}^{{commit}}").returncode == 0:
        revs = f"{BASE}..HEAD"
    else:
        print(f"check_commits: {BASE[:12]} is not in this clone (shallow?); checking HEAD only")
        revs = "-1"
    # NUL-separated records: hash, parents, raw message
    out = git("log", "-z", "--format=%H%x1f%P%x1f%B", revs)
    if out.returncode != 0:
        print(f"check_commits: git log {revs} failed: {out.stderr.strip()}", file=sys.stderr)
        return 2
    bad = 0
    count = 0
    for record in filter(None, out.stdout.split("\0")):
        sha, parents, message = record.lstrip("\n").split("\x1f", 2)
        count += 1
        for problem in problems(message, merge=len(parents.split()) > 1):
            bad += 1
            subject = (message.splitlines() or [""])[0]
            print(f"{sha[:10]} {subject[:60]!r}: {problem}")
    if bad:
        print(f"check_commits: {bad} problem(s) in {count} commit(s) of {revs}", file=sys.stderr)
        return 1
    print(f"check_commits: {count} commit(s) of {revs} fine")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
