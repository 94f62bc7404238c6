"""Min-K% Prob (Shi et al., ICLR 2024, "Detecting Pretraining Data from Large Language Models").

The mean log-probability of the ``k`` fraction of the text's tokens with the lowest
log-probabilities: ``max(1, int(k * T))`` tokens of the ``T`` scored (the paper's code's count).
A non-member has more outlier tokens of low probability. Paper default: ``k = 20%``.
Score = that mean (higher = member).
"""

from __future__ import annotations

import numpy as np

__all__ = ["DEFAULT_K", "lowest_k_mean", "mink_score"]

#: the paper's default fraction
DEFAULT_K = 0.2


def lowest_k_mean(values: np.ndarray, k: float) -> float:
    """Mean of the ``max(1, int(k * len))`` smallest values (NaN when there are none)."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    if not v.size:
        return float("nan")
    return float(v[: max(1, int(k * v.size))].mean())


def mink_score(logprobs: np.ndarray, k: float = DEFAULT_K) -> float:
    return lowest_k_mean(logprobs, k)
