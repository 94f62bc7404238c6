"""Continuation overlap: a cheap black-box feature-based detector (a baseline, not from the paper).

Idea (the extraction signal behind SaMIA and DPDLLM's prompting, without a reference model): show
the target the first half of a text and compare its continuation with the true second half. A
memorised text tends to be continued with its own words, position by position.

* Query e0(s): the first ``ceil(prompt_fraction * W)`` whitespace words of s (W = its word
  count, at most ``max_words``), sent raw (no template). A CalibDCD view wraps this query.
* Generation: ``n_samples`` completions of ``max_new_tokens`` (greedy by default).
* Features phi (all derived from the output, so CalibDCD may correct the whole vector):
  - block ``match`` (``positions`` dims): for word position i = 1..positions of the true
    continuation, the fraction of samples whose i-th word equals it (words are lower-cased
    ``[a-z0-9']+`` runs, punctuation dropped);
  - block ``overlap`` (6 dims): ROUGE-1 recall and precision against the true continuation
    (clipped unigram counts), ROUGE-2 recall, the exact-prefix match length / positions, the
    longest common word substring / positions, and the continuation's word count / positions
    (capped at 2); each averaged over samples.
* Classifier: z-score standardisation fitted on the training features (std floored at 1e-6) and
  an L2-regularised logistic regression fitted by Newton's method; the score is the logit
  (higher = member). ``transform`` exposes the standardised space and ``score_transformed`` the
  score in it, so CalibDCD can calibrate in the space the classifier consumes.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from calibdcd.detectors.base import (
    Features,
    NormalizedClassifier,
    PersistableClassifier,
)
from calibdcd.targets.base import GenerationParams

__all__ = ["ContinuationOverlap", "LogisticClassifier", "OverlapConfig", "overlap_features"]

_WORD = re.compile(r"[a-z0-9']+")
N_SUMMARY = 6


@dataclasses.dataclass(frozen=True)
class OverlapConfig:
    prompt_fraction: float = 0.5
    max_words: int = 128
    positions: int = 16
    max_new_tokens: int = 32
    temperature: float = 0.0
    top_p: float = 1.0
    n_samples: int = 1
    seed: int = 0
    l2: float = 1.0

    def __post_init__(self) -> None:
        if not (0.0 < self.prompt_fraction < 1.0):
            raise ValueError(f"prompt_fraction must lie in (0, 1), got {self.prompt_fraction!r}")
        for name in ("max_words", "positions", "max_new_tokens", "n_samples"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not self.l2 > 0:
            raise ValueError(f"l2 must be > 0, got {self.l2!r}")

    def generation_params(self) -> GenerationParams:
        return GenerationParams(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            n=self.n_samples,
            seed=self.seed,
        )


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _split(text: str, cfg: OverlapConfig) -> tuple[str, list[str]]:
    """(prompt, normalised words of the true continuation)."""
    words = text.split()[: cfg.max_words]
    k = max(1, math.ceil(cfg.prompt_fraction * len(words)))
    if k >= len(words) and len(words) > 1:
        k = len(words) - 1
    return " ".join(words[:k]), _words(" ".join(words[k:]))


def _ngrams(ws: list[str], n: int) -> Counter[tuple[str, ...]]:
    return Counter(tuple(ws[i : i + n]) for i in range(len(ws) - n + 1))


def _longest_common_run(a: list[str], b: list[str]) -> int:
    best = 0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0] * (len(b) + 1)
        for j, y in enumerate(b, start=1):
            if x == y:
                cur[j] = prev[j - 1] + 1
                best = max(best, cur[j])
        prev = cur
    return best


def overlap_features(candidate: str, reference: list[str], positions: int) -> np.ndarray:
    """phi for one completion: ``positions`` match indicators then the 6 summary values."""
    cand = _words(candidate)[: 2 * positions]
    ref = reference[:positions]
    out = np.zeros(positions + N_SUMMARY)
    for i in range(min(len(cand), len(ref))):
        out[i] = float(cand[i] == ref[i])
    if ref:
        c1, r1 = _ngrams(cand, 1), _ngrams(ref, 1)
        hit1 = sum((c1 & r1).values())
        out[positions + 0] = hit1 / len(ref)
        out[positions + 1] = hit1 / len(cand) if cand else 0.0
        r2 = _ngrams(ref, 2)
        out[positions + 2] = sum((_ngrams(cand, 2) & r2).values()) / max(1, sum(r2.values()))
        prefix = 0
        for x, y in zip(cand, ref):  # noqa: B905 - stops at the shorter on purpose
            if x != y:
                break
            prefix += 1
        out[positions + 3] = prefix / positions
        out[positions + 4] = _longest_common_run(cand[:positions], ref) / positions
    out[positions + 5] = min(len(cand) / positions, 2.0)
    return out


class LogisticClassifier(NormalizedClassifier, PersistableClassifier):
    """Standardisation + L2 logistic regression (Newton). ``score`` = logit, higher = member."""

    def __init__(self, l2: float = 1.0, max_iter: int = 50):
        self.l2 = l2
        self.max_iter = max_iter
        self.mean: np.ndarray | None = None
        self.std: np.ndarray | None = None
        self.coef: np.ndarray | None = None
        self.intercept = 0.0

    def fit(self, z: np.ndarray, labels: np.ndarray) -> LogisticClassifier:
        z = np.asarray(z, dtype=np.float64)
        y = np.asarray(labels, dtype=np.float64)
        if z.ndim != 2 or y.shape != (z.shape[0],):
            raise ValueError(f"z must be (n, d) with one label per row, got {z.shape} / {y.shape}")
        if not np.isin(y, (0.0, 1.0)).all() or y.min() == y.max():
            raise ValueError("labels must be 0/1 and contain both classes")
        self.mean = z.mean(axis=0)
        self.std = np.maximum(z.std(axis=0), 1e-6)
        x = np.c_[self.transform(z), np.ones(len(y))]
        w = np.zeros(x.shape[1])
        reg = np.full(x.shape[1], self.l2)
        reg[-1] = 0.0  # no penalty on the intercept
        for _ in range(self.max_iter):
            p = 1.0 / (1.0 + np.exp(-np.clip(x @ w, -50, 50)))
            grad = x.T @ (p - y) + reg * w
            hess = (x * (p * (1 - p))[:, None]).T @ x + np.diag(reg + 1e-9)
            step = np.linalg.solve(hess, grad)
            w -= step
            if np.max(np.abs(step)) < 1e-8:
                break
        self.coef, self.intercept = w[:-1], float(w[-1])
        return self

    def _check(self) -> None:
        if self.coef is None:
            raise ValueError("the classifier is not fitted: call fit first")

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Arrays + JSON-able meta of the fitted model (no pickle; see ``from_state``)."""
        self._check()
        assert self.mean is not None and self.std is not None and self.coef is not None
        arrays = {"mean": self.mean, "std": self.std, "coef": self.coef}
        return arrays, {"l2": self.l2, "max_iter": self.max_iter, "intercept": self.intercept}

    @classmethod
    def from_state(
        cls, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]
    ) -> LogisticClassifier:
        m = cls(l2=float(meta["l2"]), max_iter=int(meta["max_iter"]))
        m.mean, m.std, m.coef = (
            np.asarray(arrays[k], dtype=np.float64) for k in ("mean", "std", "coef")
        )
        m.intercept = float(meta["intercept"])
        if not (m.mean.shape == m.std.shape == m.coef.shape):
            raise ValueError("inconsistent LogisticClassifier state")
        return m

    def transform(self, z: np.ndarray) -> np.ndarray:
        if self.mean is None or self.std is None:
            raise ValueError("the classifier is not fitted: call fit first")
        return (np.asarray(z, dtype=np.float64) - self.mean) / self.std

    def score_transformed(self, zt: np.ndarray) -> np.ndarray:
        self._check()
        return np.asarray(zt, dtype=np.float64) @ self.coef + self.intercept

    def score(self, z: np.ndarray) -> np.ndarray:
        return self.score_transformed(self.transform(z))


class ContinuationOverlap:
    """The continuation-overlap detector (see the module docstring)."""

    name = "overlap"
    calibration_blocks: tuple[str, ...] | None = None
    #: its cached features' recipe changes only with its config
    cache_version: int | None = None

    def __init__(self, config: OverlapConfig | None = None):
        self.config = config or OverlapConfig()

    def query(self, text: str) -> str:
        return _split(text, self.config)[0]

    @property
    def blocks(self) -> dict[str, slice]:
        p = self.config.positions
        return {"match": slice(0, p), "overlap": slice(p, p + N_SUMMARY)}

    @property
    def generation_kinds(self) -> dict[str, GenerationParams]:
        """The decoding of each kind of target query (a run records what the target used)."""
        return {"continuation": self.config.generation_params()}

    def extract(self, texts: Sequence[str], target: Any, view: Any | None = None) -> Features:
        if isinstance(texts, str) or not texts:
            raise ValueError("texts must be a non-empty sequence of strings")
        cfg = self.config
        prompts = [_split(t, cfg)[0] for t in texts]
        if view is not None:
            prompts = [view.apply(p) for p in prompts]
        completions = target.generate(prompts, cfg.generation_params())
        if len(completions) != len(prompts):
            raise ValueError(f"target returned {len(completions)} rows for {len(prompts)} prompts")
        rows = []
        for text, comps in zip(texts, completions, strict=True):
            ref = _split(text, cfg)[1]  # one text's words at a time (all at once: 4 KB a text)
            feats = [overlap_features(c, ref, cfg.positions) for c in comps] or [
                overlap_features("", ref, cfg.positions)
            ]
            rows.append(np.mean(feats, axis=0))
        return Features(np.asarray(rows), self.blocks)

    def new_classifier(self, seed: int = 0) -> LogisticClassifier:
        return LogisticClassifier(l2=self.config.l2)
