"""zlib (Carlini et al., 2021, "Extracting Training Data from Large Language Models"): the
ratio of the text's log-perplexity to its zlib entropy.

``ratio = loss(x) / zlib(x)`` with ``loss`` the mean negative token log-likelihood and ``zlib``
the length in bytes of ``zlib.compress`` of the UTF-8 text (default level): a member's loss is
low for its compressibility. Score = ``-ratio`` (higher = member).
"""

from __future__ import annotations

import zlib

import numpy as np

from calibdcd.detectors.attacks.loss import loss_score

__all__ = ["zlib_entropy", "zlib_score"]


def zlib_entropy(text: str) -> int:
    """Bytes of the zlib-compressed UTF-8 text."""
    return len(zlib.compress(text.encode("utf-8")))


def zlib_score(logprobs: np.ndarray, text: str) -> float:
    """``-loss / zlib entropy`` = mean log-likelihood / zlib bytes (NaN without tokens)."""
    return loss_score(logprobs) / zlib_entropy(text)
