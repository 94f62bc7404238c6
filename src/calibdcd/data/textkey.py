"""The form texts are compared on to find near-duplicates: one rule for every place that asks
whether two texts are "the same text" (a suspect file's repeats, a suspect text that was part of
the fit, a held-out text with a copy in the fit's other parts).

:func:`text_key`: Unicode NFC, every run of whitespace (spaces, tabs, newlines, Unicode spaces)
collapsed to one space, leading and trailing whitespace dropped; case kept (a text in another
case is another text to a language model). Texts themselves are never changed: the key is only
compared, so generations stay keyed by the text as read.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence

__all__ = ["first_occurrences", "keys", "text_key"]


def text_key(text: str) -> str:
    """``text`` in the form near-duplicates are compared on (NFC, whitespace collapsed)."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def first_occurrences(texts: Sequence[str]) -> list[int | None]:
    """For each text, the index of an earlier text with the same :func:`text_key` (its first
    occurrence), or None when it is the first of its key."""
    seen: dict[str, int] = {}
    out: list[int | None] = []
    for i, t in enumerate(texts):
        k = text_key(t)
        out.append(seen.get(k))
        seen.setdefault(k, i)
    return out


def keys(texts: Iterable[str]) -> set[str]:
    """The set of :func:`text_key` of ``texts``."""
    return {text_key(t) for t in texts}
