"""Small pure scoring functions used by ``lab check``: words, ROUGE-L, exact-prefix length, AUC.

``auc`` defers to the project's :func:`calibdcd.metrics.auc` when that module exists.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

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


def _auc_mann_whitney(labels: Sequence[int], scores: Sequence[float]) -> float:
    pairs = sorted(zip(scores, labels, strict=False), key=lambda t: t[0])
    ranks = [0.0] * len(pairs)
    i = 0
    while i < len(pairs):
        j = i
        while j + 1 < len(pairs) and pairs[j + 1][0] == pairs[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1  # average rank of a tie group (1-based)
        i = j + 1
    n_pos = sum(1 for _, y in pairs if y == 1)
    n_neg = len(pairs) - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError("auc needs at least one member (label 1) and one non-member (label 0)")
    rank_sum = sum(r for r, (_, y) in zip(ranks, pairs, strict=False) if y == 1)
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def auc(labels: Sequence[int], scores: Sequence[float]) -> float:
    """ROC AUC (Mann-Whitney U with tied scores counted 1/2); labels 1 = member."""
    labels = [int(y) for y in labels]
    scores = [float(s) for s in scores]
    if len(labels) != len(scores):
        raise ValueError(f"labels ({len(labels)}) and scores ({len(scores)}) differ in length")
    if any(y not in (0, 1) for y in labels):
        raise ValueError("labels must be 0 or 1")
    try:
        from calibdcd.metrics import auc as project_auc  # type: ignore[attr-defined]
    except ImportError:
        return _auc_mann_whitney(labels, scores)
    return float(project_auc(labels, scores))
