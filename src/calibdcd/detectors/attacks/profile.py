"""Log-probability profile ("logprofile"): a gray-box feature-based detector of ours, beyond the
paper and not a published method (issue 49 item 4).

The score-only attacks (LOSS, zlib, Min-K%, Min-K%++) each reduce a text's token
log-probabilities to one statistic, so CalibDCD has one column to correct. This detector keeps
several views of the same profile as a feature vector and learns how to weigh them; a
post-training shift (a chat model scoring a raw text) moves exactly these features, and CalibDCD
can remove the directions along which its controlled views move them.

* Query e0(s): the text's first ``max_words`` whitespace words (as the score-only attacks), scored
  by the target with teacher forcing (one request a text, ``top_k = 0`` unless ``minkpp``). Under a
  view the text is scored after the view's prefix; the suffix cannot change a causal LM's
  log-probabilities of the text and is not sent (as :mod:`~calibdcd.detectors.attacks.common`).
* Features phi, for the ``T`` scored tokens' log-probabilities ``l_1..l_T`` (all from the target's
  output, so CalibDCD may correct the whole vector), in named blocks:

  - ``mink`` (``len(ks)``): Min-K% (:func:`~calibdcd.detectors.attacks.mink.mink_score`) at each k;
  - ``moments`` (2): the mean (LOSS, :func:`~calibdcd.detectors.attacks.loss.loss_score`) and the
    standard deviation (ddof 0) of the ``l_t``;
  - ``zlib`` (1): zlib's score, mean log-likelihood over the zlib bytes of the scored text
    (:func:`~calibdcd.detectors.attacks.zlib_ratio.zlib_score`);
  - ``positions`` (``segments``): the mean ``l_t`` over each of ``segments`` consecutive runs of the
    tokens, run i = tokens ``[floor(i T / S), max(floor(i T / S) + 1, floor((i + 1) T / S)))``
    (equal runs; with fewer tokens than runs, a run holds one token and neighbours may share it);
  - ``minkpp`` (1, only with ``minkpp: true``): Min-K%++ at ``minkpp_k``
    (:func:`~calibdcd.detectors.attacks.minkpp.minkpp_score`; needs ``top_k`` alternatives).

  A text with no scored token has every feature NaN (a fit drops it).
* Classifier: the overlap detector's standardisation + L2 logistic regression
  (:class:`~calibdcd.detectors.overlap.LogisticClassifier`); the score is the logit (higher =
  member), and its standardised space is exposed (``calibration_space: normalized``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from calibdcd.detectors.attacks.common import GrayBoxDetector
from calibdcd.detectors.attacks.loss import loss_score
from calibdcd.detectors.attacks.mink import mink_score
from calibdcd.detectors.attacks.minkpp import minkpp_score
from calibdcd.detectors.attacks.zlib_ratio import zlib_score
from calibdcd.detectors.overlap import LogisticClassifier
from calibdcd.targets.logprobs import TextLogprobs

__all__ = ["LogProfile", "ProfileConfig", "profile_features", "segment_means"]


def _fraction(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and 0.0 < float(v) <= 1.0


@dataclasses.dataclass(frozen=True)
class ProfileConfig:
    """The log-probability profile's parameters (the features they fix: :meth:`feature_names`).

    * ``max_words``: the text is scored on its first ``max_words`` whitespace words;
    * ``ks``: the Min-K% fractions, increasing (one column each);
    * ``segments``: the runs of tokens whose mean log-probability is a column each (quarters);
    * ``minkpp``: add Min-K%++ at ``minkpp_k`` (asks ``top_k`` alternatives per position; off by
      default, so a server is asked for the tokens' own log-probabilities only);
    * ``l2``: the logistic regression's penalty on the standardised coefficients.
    """

    max_words: int = 256
    ks: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.5)
    segments: int = 4
    minkpp: bool = False
    minkpp_k: float = 0.2
    top_k: int = 20
    l2: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.ks, (str, bytes)) or not isinstance(self.ks, Sequence):
            raise ValueError(f"ks must be a sequence of fractions, got {self.ks!r}")
        object.__setattr__(self, "ks", tuple(self.ks))
        if not self.ks or not all(_fraction(k) for k in self.ks):
            raise ValueError(f"ks must be a non-empty list of fractions in (0, 1], got {self.ks!r}")
        if any(b <= a for a, b in itertools.pairwise(self.ks)):
            raise ValueError(f"ks must be strictly increasing, got {self.ks!r}")
        for name in ("max_words", "segments", "top_k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not isinstance(self.minkpp, bool):
            raise ValueError(f"minkpp must be true or false, got {self.minkpp!r}")
        if not _fraction(self.minkpp_k):
            raise ValueError(f"minkpp_k must lie in (0, 1], got {self.minkpp_k!r}")
        if isinstance(self.l2, bool) or not isinstance(self.l2, (int, float)) or not self.l2 > 0:
            raise ValueError(f"l2 must be > 0, got {self.l2!r}")

    @property
    def alternatives(self) -> int:
        """The top-k alternatives requested per position (Min-K%++ only)."""
        return self.top_k if self.minkpp else 0

    @property
    def blocks(self) -> dict[str, slice]:
        """The named feature blocks, in column order."""
        sizes = {"mink": len(self.ks), "moments": 2, "zlib": 1, "positions": self.segments}
        if self.minkpp:
            sizes["minkpp"] = 1
        out, start = {}, 0
        for name, size in sizes.items():
            out[name] = slice(start, start + size)
            start += size
        return out

    def feature_names(self) -> list[str]:
        """One name a column, in order."""
        names = [f"mink@{k:g}" for k in self.ks] + ["mean", "std", "zlib"]
        names += [f"segment{i + 1}/{self.segments}" for i in range(self.segments)]
        return names + ([f"minkpp@{self.minkpp_k:g}"] if self.minkpp else [])


def segment_means(logprobs: np.ndarray, segments: int) -> np.ndarray:
    """The mean log-probability of each of ``segments`` consecutive runs of the tokens (the
    module doc's runs); NaN for every run when there is no token."""
    lp = np.asarray(logprobs, dtype=np.float64)
    t = lp.size
    if not t:
        return np.full(segments, math.nan)
    out = np.empty(segments)
    for i in range(segments):
        start = (i * t) // segments
        stop = max(start + 1, ((i + 1) * t) // segments)
        out[i] = lp[start:stop].mean()
    return out


def profile_features(row: TextLogprobs, text: str, config: ProfileConfig) -> np.ndarray:
    """phi of one text (``text`` as scored) from its token log-probabilities ``row``."""
    dim = config.blocks[next(reversed(config.blocks))].stop
    lp = np.asarray(row.logprobs, dtype=np.float64)
    if not lp.size:
        return np.full(dim, math.nan)
    feats = [mink_score(lp, k) for k in config.ks]
    feats += [loss_score(lp), float(lp.std()), zlib_score(lp, text)]
    feats += list(segment_means(lp, config.segments))
    if config.minkpp:
        if row.mean is None or row.var is None:
            raise ValueError("Min-K%++ needs the per-position mean and variance (top_k > 0)")
        feats.append(minkpp_score(lp, row.mean, row.var, config.minkpp_k))
    return np.asarray(feats, dtype=np.float64)


class LogProfile(GrayBoxDetector):
    """The log-probability profile detector (see the module docstring); every feature is
    derived from the target's output, so CalibDCD may correct them all."""

    name = "logprofile"

    def __init__(self, config: ProfileConfig | None = None) -> None:
        self.config = config or ProfileConfig()

    @property
    def blocks(self) -> dict[str, slice]:
        return self.config.blocks

    def new_classifier(self, seed: int = 0) -> LogisticClassifier:
        return LogisticClassifier(l2=float(self.config.l2))

    def row_features(self, rows: Sequence[TextLogprobs], scored: Sequence[str]) -> np.ndarray:
        return np.vstack(
            [profile_features(r, t, self.config) for r, t in zip(rows, scored, strict=True)]
        )
