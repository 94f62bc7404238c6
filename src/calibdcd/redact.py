"""Secrets never leave memory: one registry of secret values and the redaction applied to every
file and message the toolkit writes.

A value is secret when it came from a ``${VAR}`` whose name contains KEY, TOKEN, SECRET or
PASSWORD (or is listed in the config's ``secrets:``), when it is the password part of a URL
(``scheme://user:pass@host``), or when it sits under a mapping key that names a credential
(``Authorization``, ``api_key``, ``password``, ... in target options or headers).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from typing import Any

__all__ = [
    "MASK",
    "is_secret_key",
    "is_secret_var",
    "quote_answer",
    "redact",
    "redact_tree",
    "redact_url",
    "register_secret",
    "register_secrets",
]

MASK = "***"
_SECRET_VAR = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.I)
# mapping keys (options, headers): whole credential words only (``max_new_tokens`` is not one)
_SECRET_KEY = re.compile(
    r"(^|[_-])(api[_-]?key|password|passwd|secret|token|authorization|cookie|credentials?)$", re.I
)
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<cred>[^/@\s'\"]+)@")
_MIN_LEN = 4  # shorter values would mask ordinary words
_lock = threading.Lock()
_secrets: set[str] = set()


def is_secret_var(name: str) -> bool:
    """Whether an environment variable's value is secret (its name contains KEY, TOKEN, SECRET
    or PASSWORD)."""
    return bool(_SECRET_VAR.search(name))


def is_secret_key(name: str) -> bool:
    """Whether a mapping key (a target option, an HTTP header) names a credential."""
    return bool(_SECRET_KEY.search(name))


def register_secret(value: str | None) -> None:
    """Remember ``value`` as secret: :func:`redact` masks it from now on (in this process)."""
    if isinstance(value, str) and len(value) >= _MIN_LEN:
        with _lock:
            _secrets.add(value)


def register_secrets(values: Iterable[str]) -> None:
    for v in values:
        register_secret(v)


def redact_url(text: str) -> str:
    """``scheme://user:pass@host`` -> ``scheme://***@host`` (every URL in ``text``)."""
    return _URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{MASK}@", text)


def redact(text: str) -> str:
    """``text`` with every registered secret and every URL credential masked."""
    if not isinstance(text, str):
        text = str(text)
    with _lock:
        known = sorted(_secrets, key=len, reverse=True)
    for s in known:
        text = text.replace(s, MASK)
    return redact_url(text)


def redact_tree(obj: Any) -> Any:
    """A copy of a JSON-like tree with secrets masked: strings through :func:`redact`, and the
    whole value under a key that names a credential."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {
            k: (MASK if isinstance(k, str) and is_secret_key(k) and v else redact_tree(v))
            for k, v in obj.items()
        }
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact_tree(v) for v in obj)
    return obj


def quote_answer(text: str, limit: int = 1000) -> str:
    """A server's answer for a message: verbatim up to ``limit`` characters, quoted, every
    known secret masked first (a server may echo the request's Authorization header; masked
    after the cut, a secret cut in two would show its first part)."""
    text = redact(text.strip())
    return repr(text if len(text) <= limit else text[:limit] + "...")
