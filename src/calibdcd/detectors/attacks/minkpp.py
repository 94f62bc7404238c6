"""Min-K%++ (Zhang et al., ICLR 2025, "Min-K%++: Improved Baseline for Detecting Pre-Training
Data from Large Language Models").

Each token is scored against the model's own next-token distribution at its position:
``(log p(x_t | x_<t) - mu_t) / sigma_t`` with ``mu_t = E_{z~p(.|x_<t)} log p(z | x_<t)`` and
``sigma_t^2`` the variance of that log-probability; the score is the mean of the lowest ``k``
fraction of these (as Min-K%). Training texts sit at local maxima of the likelihood: their
tokens score high relative to the distribution. Paper default: ``k = 20%``. On ``hf`` the
moments are exact; through a server they come from the top-k alternatives
(:func:`calibdcd.targets.logprobs.topk_moments`, docs/interpretations.md).
"""

from __future__ import annotations

import numpy as np

from calibdcd.detectors.attacks.mink import lowest_k_mean

__all__ = ["DEFAULT_K", "minkpp_score", "minkpp_token_scores"]

DEFAULT_K = 0.2
#: floor of sigma_t (a one-hot next-token distribution has none)
_SIGMA_FLOOR = 1e-6


def minkpp_token_scores(logprobs: np.ndarray, mean: np.ndarray, var: np.ndarray) -> np.ndarray:
    """``(log p - mu) / sigma`` per token."""
    lp, mu = np.asarray(logprobs, np.float64), np.asarray(mean, np.float64)
    sigma = np.sqrt(np.maximum(np.asarray(var, np.float64), 0.0))
    return (lp - mu) / np.maximum(sigma, _SIGMA_FLOOR)


def minkpp_score(
    logprobs: np.ndarray, mean: np.ndarray, var: np.ndarray, k: float = DEFAULT_K
) -> float:
    return lowest_k_mean(minkpp_token_scores(logprobs, mean, var), k)
