"""Validation of everything that becomes a path or a key in the artifact store.

An artifact name, an alias and a type are one directory-safe word; a file name inside an
artifact is a relative POSIX path whose parts are ordinary names. Whatever could escape the
store (``..``, ``/``, an absolute path, NUL), hide from a listing (a leading dot), collide with
the store's own files or exceed a file-system limit is refused with
:class:`~expr_tracker.artifacts.errors.ArtifactNameError`, naming the field, the value and
what is valid.
"""

from __future__ import annotations

import re
from typing import Any

from expr_tracker.artifacts.errors import ArtifactNameError

#: artifact names, aliases and types: a letter, digit or ``_`` first, then also ``.`` and ``-``
WORD_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")  # \Z: "$" takes a final "\n"
MAX_NAME = 128
MAX_TYPE = 64
#: a file name inside an artifact: at most this many characters in all, 255 bytes a part
MAX_PATH = 1024
MAX_PART_BYTES = 255
#: names the store uses itself, at the level of artifact directories
RESERVED_NAMES = frozenset({"index.jsonl"})
#: ``v3``: a version, never an alias
VERSION_RE = re.compile(r"^v([0-9]+)\Z")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

WORD_RULE = "letters, digits, '_', '.' and '-', starting with a letter, digit or '_'"


def _bad(field: str, value: Any, why: str, valid: str) -> ArtifactNameError:
    return ArtifactNameError(f"{field} {value!r} is not valid: {why}; valid: {valid}")


def _word(value: Any, field: str, limit: int) -> str:
    valid = f"{WORD_RULE}, at most {limit} characters"
    if not isinstance(value, str):
        raise _bad(field, value, f"a {type(value).__name__}, not a string", valid)
    if not value:
        raise _bad(field, value, "empty", valid)
    if len(value) > limit:
        raise _bad(field, value, f"{len(value)} characters long", valid)
    if not WORD_RE.match(value):
        if value.startswith("."):
            why = "starts with '.' (hidden, or '..' leaving the directory)"
        elif "/" in value or "\\" in value:
            why = "holds a path separator"
        elif ":" in value:
            why = "holds ':' (it separates the name from the version: 'name:v3')"
        else:
            why = "holds a character outside the allowed set"
        raise _bad(field, value, why, valid)
    return value


def validate_name(value: Any, field: str = "artifact name") -> str:
    """An artifact name (one directory of the store); returns it.

    Raises:
        ArtifactNameError: not a string, empty, longer than 128 characters, a character
            other than letters, digits, ``_ . -``, a leading ``.``, or a reserved name.
    """
    name = _word(value, field, MAX_NAME)
    if name in RESERVED_NAMES:
        raise _bad(field, value, "reserved by the store", f"any other name ({WORD_RULE})")
    return name


def validate_type(value: Any, field: str = "artifact type") -> str:
    """An artifact type (``dataset``, ``model`` ...); the same characters as a name."""
    return _word(value, field, MAX_TYPE)


def validate_alias(value: Any, field: str = "alias") -> str:
    """A user alias (``best``, ``prod``); not ``latest`` (always the newest version) and
    not ``v<N>`` (a version number)."""
    alias = _word(value, field, MAX_NAME)
    if alias == "latest":
        raise _bad(field, value, "'latest' always names the newest version", "another alias")
    if VERSION_RE.match(alias):
        raise _bad(field, value, "it reads as a version number", "an alias not of the form v<N>")
    return alias


def validate_aliases(values: Any, field: str = "aliases") -> list[str]:
    """A list of aliases (a single string is one alias); ``latest`` is accepted and ignored
    (it is always the newest version); duplicates are dropped."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, (list, tuple, set, frozenset)):
        raise _bad(field, values, f"a {type(values).__name__}", "a list of alias strings")
    out: list[str] = []
    for i, v in enumerate(values):
        if v == "latest":
            continue
        alias = validate_alias(v, f"{field}[{i}]")
        if alias not in out:
            out.append(alias)
    return out


def validate_entry_name(value: Any, field: str = "file name") -> str:
    """A file name inside an artifact: a relative POSIX path (``data/train.csv``); returns it.

    Raises:
        ArtifactNameError: not a string, empty, absolute, ``.``/``..``/empty parts, a
            backslash, a control character (NUL, newline), a part over 255 bytes, or over
            1024 characters in all.
    """
    valid = (
        "a relative path with '/' between parts, no empty, '.' or '..' part, no '\\' or "
        f"control character, at most {MAX_PATH} characters"
    )
    if not isinstance(value, str):
        raise _bad(field, value, f"a {type(value).__name__}, not a string", valid)
    if not value:
        raise _bad(field, value, "empty", valid)
    if len(value) > MAX_PATH:
        raise _bad(field, value, f"{len(value)} characters long", valid)
    if _CONTROL.search(value):
        raise _bad(field, value, "holds a control character", valid)
    if "\\" in value:
        raise _bad(field, value, "holds '\\'", valid)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a file named in another encoding, read by os.walk
        raise _bad(field, value, "not valid UTF-8 (rename the file)", valid) from None
    if value.startswith("/"):
        raise _bad(field, value, "an absolute path", valid)
    for part in value.split("/"):
        if part in ("", ".", ".."):
            raise _bad(field, value, f"has the part {part!r}", valid)
        if len(part.encode("utf-8")) > MAX_PART_BYTES:
            raise _bad(field, value, f"a part is over {MAX_PART_BYTES} bytes", valid)
    return value


def validate_uri(value: Any, field: str = "reference uri") -> str:
    """A reference's URI (``s3://bucket/key``, ``https://host/path``, ``/data/x``): any
    non-empty string without a control character below U+0020 or a lone surrogate;
    returns it.

    Raises:
        ArtifactNameError: anything else.
    """
    if (
        not isinstance(value, str)
        or not value
        or any(ord(c) < 32 or 0xD800 <= ord(c) <= 0xDFFF for c in value)
    ):
        raise ArtifactNameError(
            f"{field} {value!r} is not valid: use a non-empty string without control "
            "characters or lone surrogates (s3://bucket/key, https://host/path, /data/x)"
        )
    return value


def parse_ref(ref: Any, field: str = "artifact") -> tuple[str, str]:
    """``"name"`` / ``"name:latest"`` / ``"name:v3"`` / ``"name:<alias>"`` -> (name, selector);
    the selector is ``latest``, ``v<N>`` or an alias.

    Raises:
        ArtifactNameError: a bad name or selector (another project's ``a/b`` is not a name).
    """
    if not isinstance(ref, str):
        raise _bad(field, ref, f"a {type(ref).__name__}", "'name', 'name:latest', 'name:v3'")
    name, sep, selector = ref.partition(":")
    validate_name(name, f"{field} name")
    if not sep:
        return name, "latest"
    if selector == "latest" or VERSION_RE.match(selector):
        return name, selector
    return name, _word(selector, f"{field} version or alias", MAX_NAME)
