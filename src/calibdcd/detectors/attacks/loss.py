"""LOSS (Yeom et al., 2018; Carlini et al., 2021): the text's mean token log-likelihood.

A member is fitted better, so its loss ``-mean_t log p(x_t | x_<t)`` is lower: the score is
``mean_t log p(x_t | x_<t)`` (= minus the loss; higher = member).
"""

from __future__ import annotations

import numpy as np

__all__ = ["loss_score"]


def loss_score(logprobs: np.ndarray) -> float:
    """Mean log-likelihood of the scored tokens (NaN when none)."""
    lp = np.asarray(logprobs, dtype=np.float64)
    return float(lp.mean()) if lp.size else float("nan")
