"""The DPDLLM detector (Zhou et al., Findings of ACL 2024) behind calibdcd's Detector contract.

Pipeline for a split of candidate texts ``S`` and a black-box target:

1. e0(s) = the first ``L/2`` whitespace words of ``s``; one continuation is sampled from the
   target with temperature 0.7 and ``max_new_tokens = L``, every other decoding field (top-k,
   top-p, repetition penalty) inherited from the target's generation config, as the official
   ``pipeline(..., do_sample=True, temperature=0.7, max_new_tokens=L)`` call does. Under a
   CalibDCD view the target receives ``view.apply(e0(s))`` and nothing else changes.
2. g(s) = e0(s) + continuation.
3. A reference LM, fine-tuned without labels on candidate texts (``reference_texts``; default
   ``S`` itself), reads g(s); the L per-position probabilities p_i(y_i) are the feature vector
   (the whole vector is the block CalibDCD corrects). Which texts the experiment runner passes is
   ``reference.arrangement`` (``shared``: the whole subsample for every split; ``per_split``, the
   official arrangement: each split's own texts; see docs/dpdllm.md).
4. Gaussian Naive Bayes on the supervised split, scored by its log-odds (higher = member).
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from calibdcd.detectors.base import Features, ReferenceTrained
from calibdcd.detectors.dpdllm.features import FeatureConfig, compute_features, feature_dim
from calibdcd.detectors.dpdllm.gnb import GaussianNB
from calibdcd.detectors.dpdllm.query import first_words, generate_continuations, join_prompt
from calibdcd.detectors.dpdllm.reference import ReferenceLM, ReferenceLMConfig, reference_key
from calibdcd.targets.base import INHERIT, GenerationParams, generation_record

__all__ = ["DPDLLM", "DPDLLMConfig", "DPDLLMFeatures", "default_length"]

#: DPDLLM's length bucket L per benchmark (detectors.md Q6): WikiMIA 64, the others 128
_LENGTHS = {"wikimia": 64}


def default_length(benchmark: str | None) -> int:
    """L for a benchmark name (case-insensitive): 64 for WikiMIA, 128 otherwise."""
    if benchmark is None:
        return 128
    key = benchmark.lower().replace("-", "").replace("_", "")
    return _LENGTHS.get(key, 128)


@dataclasses.dataclass(frozen=True)
class DPDLLMConfig:
    """DPDLLM settings; the defaults are the official ones with L = 128, except the reference
    arrangement (``reference.arrangement``: ``shared`` by default, ``per_split`` is official).

    Decoding: ``temperature`` 0.7 and ``max_new_tokens`` (None = L) are explicit, as in the
    official call; ``top_k``, ``top_p`` and ``repetition_penalty`` are ``"inherit"`` by default:
    the target's generation config decides them (``hf``: the checkpoint's
    ``generation_config.json``, transformers' defaults top-k 50 / top-p 1.0 / no penalty where it
    is silent; ``openai``: left out of the request, the server decides). A number overrides
    (``top_k: null`` = no top-k). What the target used is in the features' ``generation``.

    ``length`` is L: the prompt has ``length // 2`` words, the target generates up to
    ``max_new_tokens`` (None = L) tokens and the reference LM window is L tokens.
    ``on_failure="gap"`` (default) records a failed or empty generation as a NaN row
    (``valid`` False); ``"raise"`` raises :class:`GenerationGap`. ``allow_empty`` makes an empty
    continuation (the target emitted EOS at once) a valid row with g = the prompt alone.
    ``join`` is how the prompt and the continuation are glued
    (see :func:`~calibdcd.detectors.dpdllm.query.join_prompt`).
    """

    length: int = 128
    temperature: float | str = 0.7
    top_k: int | str | None = INHERIT
    top_p: float | str = INHERIT
    repetition_penalty: float | str = INHERIT
    max_new_tokens: int | None = None
    seed: int = 0
    join: Literal["auto", "exact"] = "auto"
    on_failure: Literal["raise", "gap"] = "gap"
    allow_empty: bool = False
    generation_batch_size: int = 32
    reference: ReferenceLMConfig = dataclasses.field(default_factory=ReferenceLMConfig)
    features: FeatureConfig = dataclasses.field(default_factory=FeatureConfig)
    var_smoothing: float = 1e-9
    progress: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.length, int) or self.length < 4:
            raise ValueError(f"length must be an integer >= 4, got {self.length!r}")
        if self.max_new_tokens is not None and (
            not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1
        ):
            raise ValueError(f"max_new_tokens must be None or >= 1, got {self.max_new_tokens!r}")
        if self.join not in ("auto", "exact"):
            raise ValueError(f"join must be 'auto' or 'exact', got {self.join!r}")
        if self.on_failure not in ("raise", "gap"):
            raise ValueError(f"on_failure must be 'raise' or 'gap', got {self.on_failure!r}")
        if not isinstance(self.reference, ReferenceLMConfig):
            raise ValueError("reference must be a ReferenceLMConfig")
        if not isinstance(self.features, FeatureConfig):
            raise ValueError("features must be a FeatureConfig")
        try:
            self.generation_params()  # validates the decoding fields
        except ValueError as e:
            raise ValueError(f"dpdllm: {e}") from None

    @classmethod
    def for_benchmark(cls, benchmark: str | None, **overrides: Any) -> DPDLLMConfig:
        """The config with L chosen for ``benchmark`` (WikiMIA 64, others 128)."""
        overrides.setdefault("length", default_length(benchmark))
        return cls(**overrides)

    @property
    def prompt_words(self) -> int:
        return self.length // 2

    @property
    def window(self) -> int:
        return self.reference.window or self.length

    def generation_params(self) -> GenerationParams:
        return GenerationParams(
            max_new_tokens=self.max_new_tokens or self.length,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            n=1,
            seed=self.seed,
            repetition_penalty=self.repetition_penalty,
        )


@dataclasses.dataclass(frozen=True)
class DPDLLMFeatures(Features):
    """DPDLLM features plus what produced them.

    ``valid[i]`` is False for a recorded generation gap (row i is NaN). ``generated[i]`` is the
    text g the reference LM read (None for a gap), ``queries[i]`` what the target received.
    ``timings`` holds seconds per step (``generation``, ``reference``, ``features``).
    ``generation`` maps each kind of target query (DPDLLM has one: ``continuation``) to the
    target's :func:`~calibdcd.targets.base.generation_record` of its decoding parameters.
    """

    valid: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=bool))
    generated: tuple[str | None, ...] = ()
    queries: tuple[str, ...] = ()
    reference_path: str | None = None
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    generation: dict[str, Any] = dataclasses.field(default_factory=dict)


def _check_texts(texts: Sequence[str], name: str = "texts") -> list[str]:
    if isinstance(texts, str):
        raise ValueError(f"{name} must be a sequence of strings, not a single string")
    out = list(texts)
    if not out:
        raise ValueError(f"{name} is empty")
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise ValueError(f"{name}[{i}] is {type(t).__name__}, expected str")
        if not t.strip():
            raise ValueError(f"{name}[{i}] is empty or whitespace only")
    return out


def _texts_key(texts: Sequence[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(hashlib.sha256(t.encode("utf-8")).digest())
    return h.hexdigest()


class DPDLLM(ReferenceTrained):
    """DPDLLM implementing :class:`calibdcd.detectors.base.Detector`.

    ``extract(texts, target, view=None, reference_texts=None)`` fine-tunes (or loads from the
    cache) the reference LM on ``reference_texts`` (default: ``texts`` themselves) and returns the
    feature matrix. Pass the same ``reference_texts`` for every subset that must share a
    reference LM: under ``reference.arrangement == "shared"`` every text of the subsample (both
    splits, every view), under ``"per_split"`` the split's own texts
    (:meth:`reference_texts_for` says which).
    """

    name = "dpdllm"
    #: the whole DPDLLM vector is output-derived (paper §4: correction on the complete vector)
    calibration_blocks: tuple[str, ...] | None = None
    #: its cached features' recipe changes only with its config
    cache_version: int | None = None

    def __init__(self, config: DPDLLMConfig | None = None, **overrides: Any) -> None:
        base = config or DPDLLMConfig()
        self.config = dataclasses.replace(base, **overrides) if overrides else base
        self._references: dict[str, ReferenceLM] = {}
        #: saved reference LMs by their training texts (``restore_parts``)
        self._restored: dict[str, ReferenceLM] = {}

    def __repr__(self) -> str:
        return f"DPDLLM({self.config!r})"

    @property
    def generation_kinds(self) -> dict[str, GenerationParams]:
        """The decoding it asks for (its features also carry what the target used)."""
        return {"continuation": self.config.generation_params()}

    @property
    def reference_arrangement(self) -> str:
        """``"shared"`` or ``"per_split"`` (``config.reference.arrangement``)."""
        return self.config.reference.arrangement

    def reference_texts_for(
        self, split_texts: Sequence[str], all_texts: Sequence[str]
    ) -> list[str]:
        """The reference LM's training texts for a split: ``all_texts`` (every candidate of the
        subsample, labels unused) when shared, the split's own ``split_texts`` when per split."""
        return list(all_texts if self.reference_arrangement == "shared" else split_texts)

    # -- query ---------------------------------------------------------------------------------
    def query(self, text: str) -> str:
        """e0(s): the first L/2 whitespace words of ``text``."""
        return first_words(text, self.config.prompt_words)

    def generate(
        self, texts: Sequence[str], target: Any, view: Any | None = None
    ) -> tuple[list[str], list[str | None]]:
        """(queries sent, generated texts g = e0 + continuation; None = gap)."""
        texts = _check_texts(texts)
        prompts = [self.query(t) for t in texts]
        sent = prompts if view is None else [view.apply(p) for p in prompts]
        for i, q in enumerate(sent):
            if not isinstance(q, str):
                raise ValueError(
                    f"view.apply returned {type(q).__name__} for text {i}, expected str"
                )
        conts = generate_continuations(
            target,
            sent,
            self.config.generation_params(),
            on_failure=self.config.on_failure,
            allow_empty=self.config.allow_empty,
            batch_size=self.config.generation_batch_size,
            progress=self.config.progress,
        )
        gen = [
            None if c is None else join_prompt(p, c, self.config.join)
            for p, c in zip(prompts, conts, strict=True)
        ]
        return sent, gen

    # -- reference LM --------------------------------------------------------------------------
    def reference(self, texts: Sequence[str]) -> ReferenceLM:
        """The reference LM fine-tuned on ``texts`` (memory cache, then disk cache, then train)."""
        texts = _check_texts(texts, "reference_texts")
        restored = self._restored.get(_texts_key(texts))
        if restored is not None:
            return restored
        key = reference_key(self.config.reference, self.config.window, texts)
        if key not in self._references:
            self._references[key] = ReferenceLM.fine_tuned(
                self.config.reference, self.config.window, texts, progress=self.config.progress
            )
        return self._references[key]

    def learnt_parts(self, reference_texts: Sequence[str]) -> dict[str, Path]:
        """The directory of the reference LM fine-tuned on ``reference_texts`` (trained now
        when it is not cached)."""
        ref = self.reference(reference_texts)
        if ref.path is None:
            raise ValueError("the reference LM has no directory")
        return {"reference": Path(ref.path)}

    def restore_parts(self, parts: Mapping[str, Path], reference_texts: Sequence[str]) -> None:
        """Use a saved reference LM (:meth:`learnt_parts`) for ``reference_texts``."""
        texts = _check_texts(reference_texts, "reference_texts")
        self._restored[_texts_key(texts)] = ReferenceLM.from_dir(
            parts["reference"], self.config.reference, self.config.window
        )

    # -- features ------------------------------------------------------------------------------
    def featurize(self, generated: Sequence[str | None], reference: ReferenceLM) -> np.ndarray:
        """(n, d) features of generated texts (NaN rows for gaps)."""
        fc = self.config.features
        d = feature_dim(fc, self.config.window)
        out = np.full((len(generated), d), np.nan)
        ok = [i for i, g in enumerate(generated) if g is not None]
        if ok:
            vals = compute_features(
                fc,
                [generated[i] for i in ok],  # type: ignore[misc]
                lambda ts: reference.position_stats(ts, progress=self.config.progress),
            )
            out[ok] = vals
        return out

    def extract(
        self,
        texts: Sequence[str],
        target: Any,
        view: Any | None = None,
        reference_texts: Sequence[str] | None = None,
    ) -> DPDLLMFeatures:
        """phi(e(s), target(e(s))) for each text; ``reference_texts`` defaults to ``texts``."""
        texts = _check_texts(texts)
        ref_texts = (
            texts if reference_texts is None else _check_texts(reference_texts, "reference_texts")
        )
        record = generation_record(target, self.config.generation_params())
        t0 = time.perf_counter()
        sent, gen = self.generate(texts, target, view)
        t1 = time.perf_counter()
        ref = self.reference(ref_texts)
        t2 = time.perf_counter()
        values = self.featurize(gen, ref)
        t3 = time.perf_counter()
        valid = np.array([g is not None for g in gen], dtype=bool)
        return DPDLLMFeatures(
            values=values,
            blocks={self.config.features.block_name: slice(0, values.shape[1])},
            valid=valid,
            generated=tuple(gen),
            queries=tuple(sent),
            reference_path=str(ref.path) if ref.path else None,
            timings={"generation": t1 - t0, "reference": t2 - t1, "features": t3 - t2},
            generation={"continuation": record},
        )

    # -- classifier ----------------------------------------------------------------------------
    def new_classifier(self, seed: int = 0) -> GaussianNB:
        """A fresh Gaussian NB (deterministic: ``seed`` is accepted for the contract only)."""
        return GaussianNB(var_smoothing=self.config.var_smoothing)
