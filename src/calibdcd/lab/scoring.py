"""Small pure scoring functions used by ``lab check``: words, ROUGE-L, exact-prefix length, AUC.

``auc`` is the project's :func:`calibdcd.metrics.auc` (re-exported for ``lab check``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from calibdcd.metrics import auc

__all__ = ["auc", "prefix_match", "rouge_l", "words"]

_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    """Lower-case ``\\w+`` tokens."""
    return _WORD.findall(text.lower())


def _lcs(a: Sequence[str], b: Sequence[str]) -> int:
    if not a or not b:
        return 0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0] * (len(b) + 1)
        for j, y in enumerate(b, 1):
            cur[j] = prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1])
        prev = cur
    return prev[-1]


def rouge_l(candidate: Sequence[str], reference: Sequence[str]) -> float:
    """ROUGE-L F1 (beta = 1) between two word sequences; 0 when either is empty."""
    lcs = _lcs(candidate, reference)
    if lcs == 0:
        return 0.0
    p, r = lcs / len(candidate), lcs / len(reference)
    return 2 * p * r / (p + r)


def prefix_match(candidate: Sequence[str], reference: Sequence[str]) -> int:
    """Number of leading words on which ``candidate`` equals ``reference``."""
    n = 0
    for x, y in zip(candidate, reference, strict=False):
        if x != y:
            break
        n += 1
    return n
