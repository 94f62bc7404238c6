"""DPDLLM feature vectors from per-position reference-LM statistics (numpy only).

Official (``run_detection.py`` + ``predict_result.py``): for each generated text ``g`` the
reference LM reads the packed ``L``-token window and records, at every one of the ``L`` positions
(padding included), ``p_i(y_i)`` (``cond_prob``) and ``max_v p_i(v)`` (``max_prob``), plus the
perplexity over all ``L`` positions, the lowercase ratio ``ppl(lower(g)) / ppl(g)`` and the zlib
ratio ``ppl(g) / len(zlib(g))``. A vector metric is then used whole (``original``, the DPDLLM
default), averaged (``average``), reduced to the mean ``-log p`` of its ``floor(kL/100)`` lowest
entries (``mintopk``), or cut to the non-overlapping window of ``floor(kL/100)`` positions with
the lowest mean (``minsubstr``).

Short texts. The generated text is normally longer than the window (the prompt alone is about
0.65 L tokens and the continuation adds up to L), so padding appears only when a generation
stops early. ``short_text="official"`` keeps the official behaviour: padded positions contribute
the probability the model gives to the padding id (0, ``!`` for GPT-2) and the perplexity covers
all L positions. ``short_text="mask"`` sets padded positions of the vector to 0 and computes the
perplexity over the real target tokens only.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np

__all__ = [
    "AGGREGATIONS",
    "METRICS",
    "FeatureConfig",
    "aggregate",
    "feature_dim",
    "minsubstr",
    "mintopk",
    "perplexity",
    "zlib_ratio",
]

METRICS = ("cond_prob", "max_prob", "ppl", "lowercase_ppl", "zlib")
AGGREGATIONS = ("original", "average", "mintopk", "minsubstr")


@dataclasses.dataclass(frozen=True)
class FeatureConfig:
    """Which DPDLLM feature to compute (defaults = the official default ``cond_prob/original``).

    ``aggregation`` applies to the vector metrics ``cond_prob`` and ``max_prob`` only; ``k`` is
    the percentage used by ``mintopk`` and ``minsubstr`` (official 20).
    """

    metric: Literal["cond_prob", "max_prob", "ppl", "lowercase_ppl", "zlib"] = "cond_prob"
    aggregation: Literal["original", "average", "mintopk", "minsubstr"] = "original"
    k: int = 20
    short_text: Literal["official", "mask"] = "official"

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"features.metric must be one of {METRICS}, got {self.metric!r}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(
                f"features.aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}"
            )
        if not isinstance(self.k, int) or not 0 < self.k <= 100:
            raise ValueError(
                f"features.k must be an integer percentage in (0, 100], got {self.k!r}"
            )
        if self.short_text not in ("official", "mask"):
            raise ValueError(
                f"features.short_text must be 'official' or 'mask', got {self.short_text!r}"
            )

    @property
    def vector(self) -> bool:
        return self.metric in ("cond_prob", "max_prob")

    @property
    def block_name(self) -> str:
        if self.vector and self.aggregation != "original":
            return f"{self.metric}_{self.aggregation}"
        return self.metric


def _k_len(length: int, k: int) -> int:
    m = int(length * (k / 100))
    if m < 1:
        raise ValueError(f"k={k}% of a length-{length} vector selects no position; raise k")
    return m


def mintopk(probs: np.ndarray, k: int = 20) -> np.ndarray:
    """(n,) mean ``-log p`` over each row's ``floor(k L / 100)`` smallest probabilities."""
    p = np.asarray(probs, dtype=np.float64)
    m = _k_len(p.shape[1], k)
    low = np.sort(p, axis=1)[:, :m]
    with np.errstate(divide="ignore"):
        return np.mean(-np.log(low), axis=1)


def minsubstr(probs: np.ndarray, k: int = 20) -> np.ndarray:
    """(n, m) the non-overlapping length-``m = floor(k L / 100)`` window with the lowest mean
    (windows start at 0, m, 2m, ...; the first one wins ties, as in the official loop)."""
    p = np.asarray(probs, dtype=np.float64)
    m = _k_len(p.shape[1], k)
    n_win = p.shape[1] // m
    wins = p[:, : n_win * m].reshape(p.shape[0], n_win, m)
    best = np.argmin(wins.mean(axis=2), axis=1)
    return wins[np.arange(p.shape[0]), best]


def aggregate(probs: np.ndarray, aggregation: str, k: int = 20) -> np.ndarray:
    """Reduce an (n, L) per-position matrix to the (n, d) feature matrix."""
    p = np.asarray(probs, dtype=np.float64)
    if aggregation == "original":
        return p
    if aggregation == "average":
        return p.mean(axis=1, keepdims=True)
    if aggregation == "mintopk":
        return mintopk(p, k)[:, None]
    if aggregation == "minsubstr":
        return minsubstr(p, k)
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")


def feature_dim(config: FeatureConfig, length: int) -> int:
    if not config.vector or config.aggregation in ("average", "mintopk"):
        return 1
    if config.aggregation == "minsubstr":
        return _k_len(length, config.k)
    return length


def perplexity(cond_prob: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """(n,) ``exp(mean(-log p_i(y_i)))`` over all positions, or over ``mask`` positions."""
    with np.errstate(divide="ignore"):
        nll = -np.log(np.asarray(cond_prob, dtype=np.float64))
    if mask is None:
        return np.exp(nll.mean(axis=1))
    m = np.asarray(mask, dtype=bool)
    counts = m.sum(axis=1)
    if np.any(counts == 0):
        raise ValueError("a text has no real target token to compute a perplexity over")
    return np.exp(np.where(m, nll, 0.0).sum(axis=1) / counts)


def zlib_ratio(ppl: np.ndarray, texts: Sequence[str]) -> np.ndarray:
    """(n,) ``ppl / len(zlib.compress(utf8(text)))`` (official orientation)."""
    sizes = np.array([len(zlib.compress(t.encode("utf-8"))) for t in texts], dtype=np.float64)
    return np.asarray(ppl, dtype=np.float64) / sizes


StatsFn = Callable[[Sequence[str]], dict[str, np.ndarray]]


def compute_features(config: FeatureConfig, texts: Sequence[str], stats: StatsFn) -> np.ndarray:
    """The (n, d) feature matrix of ``texts``; ``stats`` maps texts to the reference LM's
    per-position ``cond_prob``, ``max_prob`` and ``target_mask`` (see ``ReferenceLM``)."""
    st = stats(texts)
    mask = st["target_mask"] if config.short_text == "mask" else None
    if config.vector:
        vec = st[config.metric]
        if mask is not None:
            vec = np.where(mask, vec, 0.0)
        return aggregate(vec, config.aggregation, config.k)
    ppl = perplexity(st["cond_prob"], mask)
    if config.metric == "ppl":
        return ppl[:, None]
    if config.metric == "zlib":
        return zlib_ratio(ppl, texts)[:, None]
    low = stats([t.lower() for t in texts])
    low_mask = low["target_mask"] if config.short_text == "mask" else None
    return (perplexity(low["cond_prob"], low_mask) / ppl)[:, None]
