"""Secrets out of every text a person or a log sees: descriptions, banners, errors.

Store URLs carry credentials in their userinfo (``redis://user:pw@host``, ``amqp://:pw@host``,
``nats://TOKEN@host``) or in query parameters (``?password=``, ``?token=``), and client
errors repeat them. ``redact_url()`` hides them in one URL (or several, comma-separated);
``redact_text()`` in any text that may hold URLs or ``password=...`` pairs, such as
``repr(exc)``. Neither ever raises: a banner must not fail over a strange setting.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus, urlsplit

__all__ = [
    "MASK", "describe_backend", "is_secret_name", "redact_text", "redact_url", "redact_value",
]

MASK = "***"

#: Parameter and keyword names whose values are secrets (searched, case-insensitive):
#: ``password``, ``sslpassword``, ``auth_token``, ``client_secret``, ``api_key``, ``key``...
#: but not ``key_prefix``.
_SECRET_NAME = re.compile(
    r"pass|pwd|token|secret|auth|credential|signature|jwt|seed|keys?$", re.I
)
_SCHEME = r"[A-Za-z][A-Za-z0-9+.\-]*://"
#: A comma that starts another URL: ``nats://a:4222,nats://b:4222``.
_NEXT_URL = re.compile(r"(,\s*)(?=" + _SCHEME + ")")
_URL_IN_TEXT = re.compile(_SCHEME + r"[^\s'\"<>]+")
#: ``password=x`` and ``password='x'`` (kwargs), ``'password': 'x'`` (dict reprs, JSON),
#: outside URLs. A bare ``name:`` is prose ("AuthenticationError: ..."), not a pair.
_VALUE = r"""(?P<value>'[^']*'|"[^"]*"|[^\s'",&;)}\]]+)"""
_PAIRS_IN_TEXT = (
    re.compile(r"(?P<name>\b[A-Za-z_][\w-]*)(?P<sep>\s*=\s*)" + _VALUE),
    re.compile(r"""(?P<q>['"])(?P<name>[\w-]+)(?P=q)(?P<sep>\s*:\s*)""" + _VALUE),
)
#: Last resort for text urlsplit refuses: ``//user:pw@`` and ``//token@``.
_USERINFO_IN_TEXT = re.compile(r"//(?P<info>[^/?#@\s]*)@")


def is_secret_name(name: str) -> bool:
    """Whether a parameter or option called ``name`` holds a secret (``password``, ``api_key``)."""
    return bool(_SECRET_NAME.search(name))


def _userinfo(info: str) -> str:
    """``user:***`` for a user and password, ``:***`` without a user, ``***`` for a token."""
    user, colon, _ = info.partition(":")
    return f"{user}:{MASK}" if colon else MASK


def _params(text: str) -> str:
    """A query string (or fragment) with the values of secret-named parameters masked."""
    pieces = []
    for piece in re.split(r"([&;])", text):
        name, equals, _ = piece.partition("=")
        pieces.append(f"{name}={MASK}" if equals and is_secret_name(unquote_plus(name)) else piece)
    return "".join(pieces)


def _fallback(text: str) -> str:
    """Userinfo and secret pairs masked by pattern, for text ``urlsplit`` cannot parse."""
    text = _USERINFO_IN_TEXT.sub(lambda m: f"//{_userinfo(m['info'])}@", text)
    return re.sub(r"([?&;#])([^=&;#\s]*)=([^&;#\s]*)",
                  lambda m: f"{m[1]}{m[2]}={MASK}" if is_secret_name(m[2]) else m[0], text)


def _redact_one(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return _fallback(url)
    netloc, path = parts.netloc, parts.path
    if netloc and "@" not in netloc and "@" in path:
        # An unescaped "/" in a password ends the netloc early: up to the "@" is userinfo.
        info, _, after = (netloc + path).rpartition("@")
        host, slash, tail = after.partition("/")
        netloc, path = f"{info}@{host}", slash + tail
    info, at, hosts = netloc.rpartition("@")
    if at:
        netloc = f"{_userinfo(info)}@{hosts}"
    rest = url.strip()[len(parts.scheme) + 1:] if parts.scheme else url.strip()
    out = f"{parts.scheme}:" if parts.scheme else ""
    if netloc or rest.startswith("//"):
        out += f"//{netloc}"
    out += path
    if parts.query:
        out += f"?{_params(parts.query)}"
    if parts.fragment:
        out += f"#{_params(parts.fragment)}"
    return out


def redact_url(url: object) -> str:
    """``url`` without its secrets: the password or token of its userinfo, and the values of
    secret-named query parameters, for any scheme; several comma-separated URLs each.

    ``redis://app:pw@h:6379/0?password=x`` gives ``redis://app:***@h:6379/0?password=***``,
    ``nats://TOKEN@h`` gives ``nats://***@h``. Anything that is not a string is shown as
    its ``repr()``, redacted as text.
    """
    if not isinstance(url, str):
        return redact_text(repr(url))
    try:
        pieces = _NEXT_URL.split(url)  # URL, separator, URL, ...
        return "".join(p if i % 2 else _redact_one(p) for i, p in enumerate(pieces))
    except Exception:  # a description must never fail; mask by pattern instead
        return _fallback(url)


def _pair(match: re.Match[str]) -> str:
    if not is_secret_name(match["name"]):
        return match[0]
    value = match["value"]
    quote = value[0] if value[:1] in ("'", '"') else ""
    start = match.start("value") - match.start()
    return f"{match[0][:start]}{quote}{MASK}{quote}"


def _pairs(text: str) -> str:
    for pattern in _PAIRS_IN_TEXT:
        text = pattern.sub(_pair, text)
    return text


def redact_text(text: object) -> str:
    """``text`` (e.g. ``repr(exc)``) with every URL in it redacted as by ``redact_url()``,
    and the values of ``password=...``-like pairs outside URLs masked."""
    text = text if isinstance(text, str) else str(text)
    try:
        pieces = []
        last = 0
        for match in _URL_IN_TEXT.finditer(text):
            pieces.append(_pairs(text[last:match.start()]))
            pieces.append(redact_url(match[0]))
            last = match.end()
        pieces.append(_pairs(text[last:]))
        return "".join(pieces)
    except Exception:  # never fail over a strange text: mask what the patterns find
        return _fallback(text)


def redact_value(value: object) -> object:
    """A setting's value fit for an error message: numbers and ``None`` as they are, strings
    and the items of lists and dicts redacted (a dict's secret-named keys masked), anything
    else as its redacted ``repr()``."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, (list, tuple)):
        return type(value)(redact_value(item) for item in value)
    if isinstance(value, dict):
        return {
            key: MASK if is_secret_name(str(key)) else redact_value(item)
            for key, item in value.items()
        }
    return redact_text(repr(value))


def describe_backend(backend: object) -> str:
    """A backend's one-line description for banners, pages and errors, secret-free.

    Backends describe themselves (``describe()``, already redacted); for anything else
    its name or ``str()`` is redacted here.
    """
    describe = getattr(backend, "describe", None)
    if callable(describe):
        return redact_text(describe())
    return redact_text(str(getattr(backend, "name", backend)))
