"""Typed configuration of VeilProbe, with the ``paper`` (GPU) and ``cpu`` presets.

Every number the official code or CalibDCD's Table 9 fixes is a field here, so a run records
exactly what it did (``VeilProbeConfig.as_dict``). Defaults of each dataclass are the paper /
official values; :meth:`VeilProbeConfig.cpu` shrinks what must shrink to run in minutes on two
CPU cores.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "AttributionConfig",
    "FeatureConfig",
    "MappingConfig",
    "MaskedLMConfig",
    "PerturbConfig",
    "ProtoNetConfig",
    "SamplingConfig",
    "VeilProbeConfig",
    "default_cache_dir",
]


def default_cache_dir() -> Path:
    """``$CALIBDCD_CACHE/veilprobe`` or ``~/.cache/calibdcd/veilprobe``."""
    root = os.environ.get("CALIBDCD_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "calibdcd"
    return base / "veilprobe"


def _positive(name: str, value: Any) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """Module A: the whole text is the prompt (no prefix/suffix split), T = 0.2, 512 new tokens,
    3 suffixes per text (the official reader expects ``Generate1..3``).

    ``prompt_fraction < 1`` is an extension, not VeilProbe: the query is then the first
    ``ceil(fraction * words)`` whitespace words of the text (like DPDLLM/SaMIA), and everything
    downstream (perturbation, mapping-model input, features) uses that query. It helps when the
    texts are complete documents that a model simply ends (e.g. the contamination lab).
    """

    max_new_tokens: int = 512
    temperature: float = 0.2
    top_p: float = 1.0
    n_suffixes: int = 3
    prompt_fraction: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        _positive("sampling.max_new_tokens", self.max_new_tokens)
        _positive("sampling.n_suffixes", self.n_suffixes)
        if not (0.0 < self.prompt_fraction <= 1.0):
            raise ValueError(
                f"sampling.prompt_fraction must be in (0, 1], got {self.prompt_fraction!r}"
            )


@dataclasses.dataclass(frozen=True)
class AttributionConfig:
    """How key tokens are scored on each proxy causal LM.

    ``method="gilot"``: the official GiLOT optimal-transport attribution (beam search with
    ``num_beams`` beams of ``beam_tokens`` new tokens for the text and for every single-token-masked
    copy; the beam-probability-weighted next-token distributions are compared by a cosine-cost OT
    distance solved with IPOT). Cost: p + 1 beam searches per proxy for a p-token text.

    ``method="loo"``: the cheap leave-one-out variant for CPU-scale runs. Each position is masked in
    turn (attention bit 0, as GiLOT does) and only the next-token distribution at the last position
    is read from one forward pass (no beams); importance = ``loo_distance`` between the masked and
    unmasked distributions (``"kl"``: KL(pi || pi_a); ``"ot"``: the same IPOT distance as GiLOT).
    All p masked copies run as one batch, so a text costs one batched forward per proxy.
    """

    method: Literal["gilot", "loo"] = "gilot"
    num_beams: int = 10
    beam_tokens: int = 10
    top_p_support: float = 0.9999
    max_support: int = 1000
    ipot_beta: float = 2.0
    ipot_iterations: int = 1000
    ipot_inner: int = 1
    marginal_eps: float = 1e-4
    loo_distance: Literal["kl", "ot"] = "kl"
    batch_size: int = 64
    max_tokens: int = 512

    def __post_init__(self) -> None:
        if self.method not in ("gilot", "loo"):
            raise ValueError(f"attribution.method must be 'gilot' or 'loo', got {self.method!r}")
        if self.loo_distance not in ("kl", "ot"):
            raise ValueError(
                f"attribution.loo_distance must be 'kl' or 'ot', got {self.loo_distance!r}"
            )
        for name in ("num_beams", "beam_tokens", "max_support", "ipot_iterations", "ipot_inner"):
            _positive(f"attribution.{name}", getattr(self, name))
        _positive("attribution.batch_size", self.batch_size)


@dataclasses.dataclass(frozen=True)
class MaskedLMConfig:
    """The tiny fill-mask model trained offline when no local masked LM is given
    (:func:`calibdcd.detectors.veilprobe.mlm.train_masked_lm`)."""

    vocab_size: int = 4000
    hidden_size: int = 96
    num_layers: int = 2
    num_heads: int = 2
    intermediate_size: int = 256
    max_length: int = 160
    epochs: int = 20
    batch_size: int = 16
    learning_rate: float = 1e-3
    mask_probability: float = 0.15
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class PerturbConfig:
    """Module A': key-token selection over proxies and masked-LM replacement.

    ``gamma`` is the fraction of tokens replaced (the official code fixes 13 tokens, about 10% of a
    128-token passage); the number of key tokens is ``ceil(gamma * p)`` and each proxy keeps its
    top ``top_k_factor * n_key`` positions before the cross-proxy aggregation (official: 26 / 13).

    ``proxies``: local paths of causal LMs (same family as the target where possible; the official
    code uses GPT-2 S/M/L). Empty = train one tiny causal proxy on the candidate pool
    (:func:`calibdcd.detectors.veilprobe.mlm.train_causal_proxy`; labels are never used).
    ``masked_lm``: local path of a fill-mask model; None = train a tiny one on the pool.
    """

    gamma: float = 0.10
    top_k_factor: int = 2
    fill_top_k: int = 5
    proxies: tuple[str, ...] = ()
    masked_lm: str | None = None
    attribution: AttributionConfig = dataclasses.field(default_factory=AttributionConfig)
    mlm: MaskedLMConfig = dataclasses.field(default_factory=MaskedLMConfig)
    seed: int = 0

    def __post_init__(self) -> None:
        if not (0.0 < self.gamma <= 1.0):
            raise ValueError(f"perturb.gamma must be in (0, 1], got {self.gamma!r}")
        _positive("perturb.top_k_factor", self.top_k_factor)
        _positive("perturb.fill_top_k", self.fill_top_k)


@dataclasses.dataclass(frozen=True)
class MappingConfig:
    """Module B: a BERT2BERT encoder-decoder trained from scratch on (text, suffix) pairs.

    Defaults are the official ``mappingmodel.py`` (6 layers, width 512, 8 heads, FFN 2048, 512
    tokens, 2 epochs, lr 5e-5, weight decay 0.01, batch 2, seed 42). The official tokenizer is
    ``bert-base-uncased``; nothing can be downloaded here, so by default a lower-cased WordPiece
    tokenizer of ``vocab_size`` is trained on the training pairs (or give ``tokenizer`` = a local
    path). ``labels_ignore_pad=False`` reproduces the official quirk of training on [PAD] labels.
    """

    vocab_size: int = 30522
    hidden_size: int = 512
    num_layers: int = 6
    num_heads: int = 8
    intermediate_size: int = 2048
    max_length: int = 512
    dropout: float = 0.1
    epochs: int = 2
    batch_size: int = 2
    learning_rate: float = 5e-5
    weight_decay: float = 0.01
    labels_ignore_pad: bool = False
    shared_model: bool = True
    tokenizer: str | None = None
    device: str | None = None
    bf16: bool = True
    seed: int = 42

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "max_length", "epochs"):
            _positive(f"mapping.{name}", getattr(self, name))
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"mapping.hidden_size ({self.hidden_size}) must be divisible by "
                f"mapping.num_heads ({self.num_heads})"
            )

    @property
    def block_width(self) -> int:
        """Width of one pooled block: embeddings + every layer's hidden state, concatenated."""
        return (self.num_layers + 1) * self.hidden_size


@dataclasses.dataclass(frozen=True)
class FeatureConfig:
    """Module B': how f(x) is read from the mapping model.

    ``decoder_input="suffix"`` (default, needed by CalibDCD): the observed suffixes are
    teacher-forced through the decoder and its states are pooled over the suffix positions, then
    averaged over the suffixes, so a view (which changes the suffixes) moves the D blocks only.
    ``"dummy"`` is the official behaviour: the decoder reads the string ``"[CLS]"`` padded to
    ``max_length`` and ignores the observed output (views then change nothing).
    ``pooling="masked"`` averages real tokens only; ``"official"`` pads to ``max_length`` and
    averages over every position, pads included, with no encoder/decoder attention masks.
    ``prune_p`` is the Welch t-test threshold on the delta blocks (official 0.01).
    """

    decoder_input: Literal["suffix", "dummy"] = "suffix"
    pooling: Literal["masked", "official"] = "masked"
    prune_p: float = 0.01
    normalize: bool = True
    batch_size: int = 16

    def __post_init__(self) -> None:
        if self.decoder_input not in ("suffix", "dummy"):
            raise ValueError(
                f"features.decoder_input must be 'suffix' or 'dummy', got {self.decoder_input!r}"
            )
        if self.pooling not in ("masked", "official"):
            raise ValueError(
                f"features.pooling must be 'masked' or 'official', got {self.pooling!r}"
            )
        if not (0.0 < self.prune_p <= 1.0):
            raise ValueError(f"features.prune_p must be in (0, 1], got {self.prune_p!r}")


@dataclasses.dataclass(frozen=True)
class ProtoNetConfig:
    """Module C: prototypical network with the information bottleneck (CalibDCD Table 9).

    The hidden width is not stated anywhere (official: 64); 256 is our documented choice.
    ``distance="euclidean"`` reproduces the official inference distance.
    """

    episodes: int = 400
    n_support: int = 10
    n_query: int = 10
    hidden: int = 256
    latent: int = 128
    beta: float = 0.005
    use_ib: bool = True
    distance: Literal["sqeuclidean", "euclidean"] = "sqeuclidean"
    learning_rate: float = 3e-4
    weight_decay: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("episodes", "n_support", "n_query", "hidden", "latent"):
            _positive(f"protonet.{name}", getattr(self, name))
        if self.distance not in ("sqeuclidean", "euclidean"):
            raise ValueError(
                f"protonet.distance must be 'sqeuclidean' or 'euclidean', got {self.distance!r}"
            )


@dataclasses.dataclass(frozen=True)
class VeilProbeConfig:
    sampling: SamplingConfig = dataclasses.field(default_factory=SamplingConfig)
    perturb: PerturbConfig = dataclasses.field(default_factory=PerturbConfig)
    mapping: MappingConfig = dataclasses.field(default_factory=MappingConfig)
    features: FeatureConfig = dataclasses.field(default_factory=FeatureConfig)
    protonet: ProtoNetConfig = dataclasses.field(default_factory=ProtoNetConfig)
    cache_dir: str | None = None
    progress: bool = True

    @property
    def cache_path(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else default_cache_dir()

    @classmethod
    def paper(cls, **overrides: Any) -> VeilProbeConfig:
        """The official/CalibDCD setting, meant for a GPU: GiLOT on the given proxies, the 6-layer
        width-512 mapping model over 512 tokens for 2 epochs, 400-episode ProtoNet-IB."""
        return dataclasses.replace(cls(), **overrides)

    @classmethod
    def cpu(cls, **overrides: Any) -> VeilProbeConfig:
        """Minutes on two CPU cores: 96 new tokens, leave-one-out attribution, a 2-layer width-64
        mapping model over 128 tokens (batch 4, lr 1e-3, pads ignored in its loss); the
        classifier is unchanged."""
        base = cls(
            sampling=SamplingConfig(max_new_tokens=96),
            perturb=PerturbConfig(attribution=AttributionConfig(method="loo", max_tokens=192)),
            mapping=MappingConfig(
                vocab_size=4000,
                hidden_size=64,
                num_layers=2,
                num_heads=2,
                intermediate_size=128,
                max_length=128,
                epochs=2,
                batch_size=4,
                learning_rate=1e-3,
                labels_ignore_pad=True,
            ),
        )
        return dataclasses.replace(base, **overrides)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
