"""Redaction: secrets never reach a message, a file or a repr.

Values under keys that look secret (url, token, password, secret, webhook, api_key),
``SecretStr`` values and strings holding ``://`` show as ``***`` (``display_value``,
``redact_options``); the user's ``config`` keeps its hyper-parameters and hides credentials
(``redact_config``); ``scrub_argv`` hides them on a command line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from expr_tracker.spec.plain import is_model, is_secret

__all__ = [
    "SECRET_KEY_PATTERN",
    "display_value",
    "is_credential_key",
    "is_secret_key",
    "is_webhook_url",
    "mask_url_credentials",
    "redact_config",
    "redact_options",
    "scrub_argv",
]

#: Keys whose values are redacted wherever they appear in free-form mappings and errors.
SECRET_KEY_PATTERN = re.compile(
    r"password|passwd|token|secret|webhook|url|api[_-]?key|auth|cookie|credential|"
    r"private[_-]?key|signature",
    re.IGNORECASE,
)


def is_secret_key(key: Any) -> bool:
    """True when a mapping key names a secret (password, token, secret, webhook, url, api key,
    auth..., cookie, credential, private key, signature)."""
    return isinstance(key, str) and SECRET_KEY_PATTERN.search(key) is not None


def _redact(value: Any, depth: int = 0) -> Any:
    if is_secret(value):
        return "***"
    if isinstance(value, str):
        return "***" if "://" in value else value
    if is_model(value):
        value = value.model_dump()
    if isinstance(value, Mapping):
        if depth > 6:
            return "{...}"
        return {k: "***" if is_secret_key(k) else _redact(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if depth > 6:
            return "[...]"
        return [_redact(v, depth + 1) for v in value]
    return value


def redact_options(value: Any, depth: int = 0) -> Any:
    """A free-form mapping of the tracker's own (channel or plugin ``options``, ``backends``)
    as ``spec.json`` shows it: values under secret-looking keys (``is_secret_key``) and every
    value of a ``headers`` mapping are ``***``; ``SecretStr`` values too. Other values are
    kept as they are (objects are not converted)."""
    if is_secret(value):
        return "***"
    if depth > 64:
        return value
    if isinstance(value, Mapping):
        return {
            k: {h: "***" if v is not None else None for h, v in child.items()}
            if str(k).lower() == "headers" and isinstance(child, Mapping)
            else "***"
            if is_secret_key(k) and child is not None
            else redact_options(child, depth + 1)
            for k, child in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [redact_options(v, depth + 1) for v in value]
    return value


#: words of a config key that name a credential (``hf_token``, ``smtpPassword``, ``api-key``)
_CREDENTIAL_WORDS = frozenset(
    "password passwd pwd passphrase secret token apikey credential credentials cookie "
    "authorization auth signature privatekey webhook".split()
)
_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^\s]*)@")


def is_credential_key(key: Any) -> bool:
    """True when a key of the user's own config names a credential: one of its words (split
    at ``_ - .`` and camelCase) is password, secret, token, api key, auth, cookie,
    credential, signature, private key or webhook. Narrower than ``is_secret_key`` so that
    ``max_tokens`` or ``tokenizer`` stay readable in ``config.json``."""
    if not isinstance(key, str):
        return False
    words = [w.lower() for w in _WORD.findall(key)]
    pairs = {a + b for a, b in zip(words, words[1:], strict=False)}
    return bool(_CREDENTIAL_WORDS.intersection(words) or _CREDENTIAL_WORDS.intersection(pairs))


def mask_url_credentials(text: str) -> str:
    """``text`` with the ``user:password@`` of every URL in it replaced by ``***@``, read
    conservatively: up to the last ``@`` of the URL, so a raw password holding ``/ ? # @``
    is covered; a string that is a webhook URL (``is_webhook_url``) keeps only its scheme
    and host (``https://hooks.slack.com/***``)."""
    if "://" not in text:
        return text
    if "@" in text:
        text = _URL_CREDENTIALS.sub(lambda m: f"{m.group('scheme')}***@", text)
    if is_webhook_url(text):
        from urllib.parse import urlsplit

        try:
            host = urlsplit(text).hostname or ""
        except ValueError:
            host = ""
        return f"{text.split('://', 1)[0]}://{host or '***'}/***"
    return text


#: an override or option ``[+~-]key=value`` (Hydra: ``+a.b=v``, ``~a``, ``++a=v``; argparse
#: ``--key=value``)
_ARG_ASSIGN = re.compile(r"^(?P<key>[+~\-]*[^=\s{}\[\]'\"]+)=(?P<value>.*)$", re.DOTALL)
#: a flag whose value is the next argument (``--token VALUE``)
_ARG_FLAG = re.compile(r"^--?[A-Za-z][\w\-.]*$")
#: ``key: value`` or ``key=value`` inside a Hydra dict/list literal (``{url:"...",n:1}``)
_ARG_PAIR = re.compile(
    r"(?P<key>[A-Za-z_][\w\-]*)(?P<sep>\s*[:=]\s*)(?P<value>\"[^\"]*\"|'[^']*'|[^,}\]\s]+)"
)


def _argv_secret_key(key: str) -> bool:
    """A command-line key naming a secret: the last dotted part is a credential key
    (``is_credential_key``: password, token, secret, api key ...) or ends in url/uri/dsn
    (``alerts.channels.w.url``, ``db_url``); ``max_tokens`` or ``url_count`` do not."""
    last = key.lstrip("+~-").rsplit(".", 1)[-1]
    words = [w.lower() for w in _WORD.findall(last)]
    return is_credential_key(last) or bool(words and words[-1] in ("url", "uri", "dsn"))


def scrub_argv(argv: Iterable[str]) -> list[str]:
    """``argv`` as ``run.json`` records it, credentials hidden: the value of an override or
    option whose key names a secret (``db.password=x``, ``--api-key=x``, ``--token x``) and
    of such a key inside a Hydra dict literal (``+a={url:"..."}``) is ``***``, and the
    ``user:password@`` of every URL is ``***@`` (``mask_url_credentials``). Everything else
    is kept as given."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        arg = str(arg)
        if hide_next:
            hide_next = False
            if not arg.startswith("-"):
                out.append("***")
                continue
        m = _ARG_ASSIGN.match(arg)
        if m and _argv_secret_key(m.group("key")):
            out.append(f"{m.group('key')}=***")
            continue
        if m is None and _ARG_FLAG.match(arg) and _argv_secret_key(arg):
            hide_next = True
        if m is not None:
            value = _ARG_PAIR.sub(
                lambda p: (
                    f"{p.group('key')}{p.group('sep')}***"
                    if _argv_secret_key(p.group("key"))
                    else p.group(0)
                ),
                m.group("value"),
            )
            arg = f"{m.group('key')}={value}"
        out.append(mask_url_credentials(arg))
    return out


_HOOK_WORDS = ("hook", "/bot", "robot", "/services/", "/webhooks/")


def is_webhook_url(text: str) -> bool:
    """True when ``text`` is one http(s) URL that looks like a webhook (its token in the
    path or query): ``hook``, ``bot``, ``robot`` or ``/services/`` in its host or path, or a
    query parameter named like a credential (``access_token``, ``key``, ``sign``...)."""
    from urllib.parse import parse_qsl, urlsplit

    if not text.startswith(("http://", "https://")) or any(c.isspace() for c in text):
        return False
    try:
        parts = urlsplit(text)
    except ValueError:
        return True  # unreadable: treat as secret
    where = (parts.netloc + parts.path).lower()
    if any(word in where for word in _HOOK_WORDS):
        return True
    names = [k for k, _ in parse_qsl(parts.query, keep_blank_values=True)]
    return any(is_credential_key(k) or k.lower() in ("key", "sig", "sign") for k in names)


def redact_config(value: Any, path: tuple[Any, ...] = (), depth: int = 0) -> Any:
    """The user's ``config`` (``config.json``, the ``config`` of ``spec.json``-like views)
    with credentials hidden and everything else kept, so hyper-parameters stay readable:

    - a string under a credential key (``is_credential_key``) is ``***``;
    - every value of a ``headers`` mapping is ``***``;
    - a tracker channel carried inside the config (a Hydra app passing its whole ``cfg``,
      ``tracker.alerts.channels.<name>``) shows ``url`` and ``secret`` as ``***`` and its
      ``options`` as ``spec.json`` does (``redact_options``);
    - the ``user:password@`` of a URL in any string is ``***@``, and a string that is a
      webhook URL (``is_webhook_url``: ``slack_url: https://hooks.slack.com/services/...``)
      keeps only its scheme and host.

    ``value`` is plain data (mappings, lists, scalars); the result is a new structure."""
    if depth > 64:
        return value
    if is_secret(value):
        return "***"
    if isinstance(value, str):
        return mask_url_credentials(value)
    in_channel = len(path) >= 3 and path[-3] == "alerts" and path[-2] == "channels"
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        for k, child in value.items():
            key = str(k).lower()
            if child is None:
                out[k] = None
            elif in_channel and key in ("url", "secret"):
                out[k] = "***"
            elif in_channel and key == "options":
                out[k] = redact_options(child)
            elif key == "headers" and isinstance(child, Mapping):
                out[k] = {h: "***" if v is not None else None for h, v in child.items()}
            elif is_credential_key(k) and (isinstance(child, str) or is_secret(child)):
                out[k] = "***"
            else:
                out[k] = redact_config(child, (*path, k), depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [redact_config(v, (*path, i), depth + 1) for i, v in enumerate(value)]
    return value


def display_value(path: str, value: Any, limit: int = 80) -> str:
    """A short repr of ``value`` for an error message, secrets replaced by ``***``."""
    last = path.rsplit(".", 1)[-1]
    if path.split(".")[-2:] in (["sync", "url"], ["sync", "endpoint_url"]) and isinstance(
        value, str
    ):
        # a bucket's URL holds no secret but its user:password@ (refused) or a query
        # (refused): those are masked, the rest says which URL is wrong (docs/team.md)
        text = mask_url_credentials(value)
        for mark in "?#":
            if mark in text:
                text = text.split(mark, 1)[0] + mark + "***"
        text = repr(text)
        return text if len(text) <= limit else text[: limit - 3] + "..."
    shown = "***" if is_secret_key(last) and value is not None else _redact(value)
    # `is`/isinstance, never ==: a value may overload == (the alert builder's M expressions)
    text = shown if isinstance(shown, str) and shown == "***" else repr(shown)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text
