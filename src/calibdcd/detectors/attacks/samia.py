"""SaMIA (Kaneko et al., 2024, "Sampling-based Pseudo-Likelihood for Membership Inference
Attacks"): black-box, from sampled continuations only.

The target continues the text's first half ``n_samples`` times (sampled, temperature 1); the
score is the mean over samples of ROUGE-1 between the continuation and the text's true second
half (unigram recall: the share of the true continuation's words, clipped counts, that the
sample reproduces). A memorised text is continued with its own words.

Relation to the overlap baseline (:mod:`calibdcd.detectors.overlap`): SaMIA is exactly one of
its features - block ``overlap``'s first column, ROUGE-1 recall, averaged over samples - under
sampled decoding, used as a score without a learnt classifier. The query, the split of a text
into prompt and true continuation, the word normalisation and the ROUGE-1 count are the overlap
detector's own (this module runs it); its ``positions`` is set to ``max_words`` so the true
continuation is never cut. A view wraps the prompt, as for the overlap detector.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from calibdcd.detectors.attacks.common import ScoreClassifier
from calibdcd.detectors.base import Features
from calibdcd.detectors.overlap import ContinuationOverlap, OverlapConfig
from calibdcd.targets.base import GenerationParams

__all__ = ["SaMIA", "SamiaConfig"]


@dataclasses.dataclass(frozen=True)
class SamiaConfig:
    """SaMIA's parameters (paper: the first half as prompt, 10 samples at temperature 1)."""

    prompt_fraction: float = 0.5
    max_words: int = 128
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    n_samples: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 (SaMIA samples), got {self.temperature!r}")
        self.overlap_config()  # the overlap detector checks the rest

    def overlap_config(self) -> OverlapConfig:
        return OverlapConfig(
            prompt_fraction=self.prompt_fraction,
            max_words=self.max_words,
            positions=self.max_words,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            n_samples=self.n_samples,
            seed=self.seed,
        )


class SaMIA:
    """SaMIA as a score-only detector (see the module docstring)."""

    name = "samia"
    calibration_blocks: tuple[str, ...] | None = None
    cache_version: int | None = None

    def __init__(self, config: SamiaConfig | None = None) -> None:
        self.config = config or SamiaConfig()
        self._overlap = ContinuationOverlap(self.config.overlap_config())

    @property
    def blocks(self) -> dict[str, slice]:
        return {"rouge1": slice(0, 1)}

    @property
    def generation_kinds(self) -> dict[str, GenerationParams]:
        return self._overlap.generation_kinds

    def query(self, text: str) -> str:
        return self._overlap.query(text)

    def extract(self, texts: Sequence[str], target: Any, view: Any | None = None) -> Features:
        feats = self._overlap.extract(texts, target, view)
        rouge1 = feats.blocks["overlap"].start  # ROUGE-1 recall, averaged over samples
        return Features(np.asarray(feats.values)[:, rouge1 : rouge1 + 1], self.blocks)

    def new_classifier(self, seed: int = 0) -> ScoreClassifier:
        return ScoreClassifier()
