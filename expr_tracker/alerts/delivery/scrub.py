"""Secret scrubbing: nothing a channel holds secret reaches a log, an exception, stats or a
record.

``redact_url(url)`` keeps the scheme and host of a URL and hides the rest;
``scrub(text, secrets)`` removes secrets (and a URL's path, query and credentials) from any
text; ``ambiguous_authority(url)`` tells a URL whose credentials urllib may misread.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, unquote, urlsplit

__all__ = ["ambiguous_authority", "redact_url", "scrub"]


def ambiguous_authority(url: str) -> bool:
    """True when ``urllib`` may take part of ``url``'s credentials for its host, port or path.

    A password holding a raw ``/``, ``?`` or ``#`` ends the authority early: in
    ``https://user:p/a#s?@x@host/path`` urllib reads host ``user``, "port" ``p`` and the rest
    as path and fragment. Suspect: no ``@`` in the authority urllib found, a ``:`` in it, and
    an ``@`` after it (or an authority urllib cannot read at all). Percent-encoding the
    password (``%2F %3F %23 %40``) removes the doubt."""
    text = str(url)
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return True
    if "@" in parts.netloc:
        return False
    rest = text.split("://", 1)[-1][len(parts.netloc) :]
    return ":" in parts.netloc and "@" in rest


def redact_url(url: str | None) -> str:
    """``scheme://host[:port]/***``: a URL with its path, query and credentials hidden
    (webhook URLs carry their token in the path or query). None or "" gives "". A URL whose
    host cannot be told apart from its credentials (``ambiguous_authority``) gives
    ``scheme://***``."""
    if not url:
        return ""
    try:
        parts = urlsplit(str(url))
        scheme = parts.scheme if parts.scheme.isalnum() else ""
        if ambiguous_authority(str(url)):
            return f"{scheme}://***" if scheme else "***"
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "***"
    if not parts.scheme or not host:
        return "***"
    tail = "/***" if (parts.path not in ("", "/") or parts.query or parts.username) else ""
    return f"{parts.scheme}://{host}{port}{tail}"


def _credential_pieces(url: str) -> list[str]:
    """Every text that may be the ``user:password`` of ``url``, or its password, read
    conservatively: the text between ``://`` and each ``@`` after it (so a raw password
    holding ``/ ? # @`` is covered however urllib splits the URL), raw and percent-decoded."""
    if "://" not in url:
        return []
    after = url.split("://", 1)[1]
    pieces: set[str] = set()
    at = after.find("@")
    while at != -1:
        userinfo = after[:at]
        password = userinfo.partition(":")[2]
        pieces.update((userinfo, unquote(userinfo), password, unquote(password)))
        at = after.find("@", at + 1)
    return sorted((p for p in pieces if p), key=len, reverse=True)


def scrub(text: Any, secrets: Iterable[str | None]) -> str:
    """``str(text)`` with every secret (and a URL's path, query and ``user:password@``)
    replaced by ``***``. A secret echoed percent-encoded, and the last word of a header
    value (``Bearer <token>``: the token alone), are removed too."""
    out = str(text)
    for secret in secrets:
        if not secret:
            continue
        secret = str(secret)
        forms = {secret, quote(secret, safe=""), quote(secret, safe="/:")}
        words = secret.split()
        if len(words) > 1 and len(words[-1]) >= 8:
            forms.add(words[-1])
        for form in sorted(forms, key=len, reverse=True):
            if len(form) >= 4 and form in out:
                out = out.replace(form, "***")
        for piece in _credential_pieces(secret):  # before urllib's reading, which may be wrong
            if len(piece) >= 4 and piece in out:
                out = out.replace(piece, "***")
        try:
            parts = urlsplit(secret)
        except ValueError:
            continue
        if parts.scheme and parts.netloc and "@" in parts.netloc:
            userinfo = parts.netloc.rpartition("@")[0]
            user, _, password = userinfo.partition(":")
            for piece in (userinfo + "@", userinfo, unquote(password), password):
                if piece and (len(piece) >= 4 or piece.endswith("@")) and piece in out:
                    out = out.replace(piece, "***@" if piece.endswith("@") else "***")
        if parts.scheme and parts.netloc:
            for piece in (parts.path, parts.query):
                if piece and len(piece) >= 4 and piece not in ("/",) and piece in out:
                    out = out.replace(piece, "/***" if piece.startswith("/") else "***")
            # tokens echoed on their own: any long path segment or query value
            segments = parts.path.split("/") + re.split(r"[&=]", parts.query)
            for segment in sorted(segments, key=len, reverse=True):
                if len(segment) >= 8 and segment in out:
                    out = out.replace(segment, "***")
    return out
