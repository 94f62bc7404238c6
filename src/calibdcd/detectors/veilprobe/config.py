"""Typed configuration of VeilProbe and its three presets, ``official``, ``paper`` and ``cpu``.

Every behaviour of the official code (STAIR-BUPT/VeilProbe) and every number of CalibDCD's
Appendix table is a named field here, so a run records exactly what it did
(``VeilProbeConfig.as_dict``).

* :meth:`VeilProbeConfig.official`: the official code in every point (constant ``[CLS]`` decoder
  input, mean over all 512 positions with pads, no attention masks in training, pad labels,
  gradient clipping at 1.0, 13 key tokens, 500-episode 5/5 ProtoNet with m = 16, h = 64,
  beta = 1e-3, Euclidean inference distance, no normalisation).
* :meth:`VeilProbeConfig.paper` (= the dataclass defaults): the official feature extraction with
  the observed suffixes teacher-forced through the decoder (so a CalibDCD view can move the
  output-derived block) and CalibDCD's Appendix classifier (400 episodes, 10/10, z-score,
  beta = 0.005, m = 128, squared Euclidean).
* :meth:`VeilProbeConfig.cpu`: the small-model variant that runs in minutes on two CPU cores.

``docs/veilprobe.md`` lists every option of the three presets with its source.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from calibdcd.keys import added_field
from calibdcd.paths import cache_root

__all__ = [
    "PRESETS",
    "AttributionConfig",
    "FeatureConfig",
    "MappingConfig",
    "MaskedLMConfig",
    "PerturbConfig",
    "ProtoNetConfig",
    "SamplingConfig",
    "VeilProbeConfig",
]


#: the VeilProbe presets, see :meth:`VeilProbeConfig.preset`
PRESETS = ("official", "paper", "cpu")

#: the official proxies and masked LM (hub ids), used by the ``official`` and ``paper`` presets
OFFICIAL_PROXIES = ("gpt2", "gpt2-medium", "gpt2-large")
OFFICIAL_MASKED_LM = "bert-base-cased"
OFFICIAL_MAPPING_TOKENIZER = "bert-base-uncased"


def _choice(name: str, value: Any, allowed: tuple[Any, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")


def default_veilprobe_cache() -> Path:
    """VeilProbe's artefacts when its config names no ``cache_dir``: ``<cache root>/veilprobe``
    (:func:`calibdcd.paths.cache_root`)."""
    return cache_root() / "veilprobe"


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
    #: prepend the proxy's BOS token to its input: False (the official ``GPT2Tokenizer(text)``
    #: adds none), True (what the ``cpu`` preset's small proxies were built with) or
    #: ``"tokenizer"``: each proxy as its own tokenizer encodes a text (GPT-2 and SmolLM2 add
    #: none, Gemma-3 adds ``<bos>``), for proxies of several families
    proxy_bos: bool | Literal["tokenizer"] = added_field(False, legacy=True)
    #: OT marginals: "official" (each restricted distribution normalised, then 1e-4 added, as
    #: the official IPOT call does) or "renormalized" (1e-4 added, then renormalised to 1)
    marginals: Literal["official", "renormalized"] = added_field("official", legacy="renormalized")

    def __post_init__(self) -> None:
        if self.method not in ("gilot", "loo"):
            raise ValueError(f"attribution.method must be 'gilot' or 'loo', got {self.method!r}")
        if self.marginals not in ("official", "renormalized"):
            raise ValueError(
                "attribution.marginals must be 'official' or 'renormalized', got "
                f"{self.marginals!r}"
            )
        if not isinstance(self.proxy_bos, bool) and self.proxy_bos != "tokenizer":
            raise ValueError(
                f"attribution.proxy_bos must be true, false or 'tokenizer', got {self.proxy_bos!r}"
            )
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

    ``n_key``: the number of key tokens replaced. The official code fixes it at 13
    (``choose_token_num``), about 10% of a 128-token passage; ``None`` uses ``ceil(gamma * p)``
    instead (p = the first proxy's token count), a length-agnostic reading of the paper's gamma.
    Each proxy keeps its top ``top_k_factor * n_key`` positions before the cross-proxy
    aggregation (official: top 26 per proxy, 13 kept).

    ``proxies``: causal LMs (local paths or hub ids; same family as the target where possible; the
    official code uses GPT-2 S/M/L). Empty = train one tiny causal proxy on the candidate pool
    (:func:`calibdcd.detectors.veilprobe.mlm.train_causal_proxy`; labels are never used).
    ``masked_lm``: a fill-mask model (official ``bert-base-cased``); None = train a tiny one on
    the pool.
    """

    gamma: float = 0.10
    n_key: int | None = 13
    top_k_factor: int = 2
    fill_top_k: int = 5
    proxies: tuple[str, ...] = OFFICIAL_PROXIES
    masked_lm: str | None = OFFICIAL_MASKED_LM
    attribution: AttributionConfig = dataclasses.field(default_factory=AttributionConfig)
    mlm: MaskedLMConfig = dataclasses.field(default_factory=MaskedLMConfig)
    seed: int = 0

    def __post_init__(self) -> None:
        if not (0.0 < self.gamma <= 1.0):
            raise ValueError(f"perturb.gamma must be in (0, 1], got {self.gamma!r}")
        if self.n_key is not None:
            _positive("perturb.n_key", self.n_key)
        _positive("perturb.top_k_factor", self.top_k_factor)
        _positive("perturb.fill_top_k", self.fill_top_k)


@dataclasses.dataclass(frozen=True)
class MappingConfig:
    """Module B: a BERT2BERT encoder-decoder trained from scratch on (text, suffix) pairs.

    Defaults are the official ``mappingmodel.py`` run by the HF ``Trainer``: 6 layers, width 512,
    8 heads, FFN 2048, 512 tokens, 2 epochs, lr 5e-5 with linear decay, weight decay 0.01 (not
    on biases and LayerNorm weights), batch 2, gradient clipping at 1.0, fp32, seed 42, the
    ``bert-base-uncased`` tokenizer. Training options, each an official behaviour:

    * ``train_pad_to_max``: texts and suffixes are padded to ``max_length`` (official) rather
      than to the longest item of the batch.
    * ``train_attend_pads``: no padding masks (official): encoder self-attention, cross-attention
      and decoder self-attention all see the pads. ``False`` passes both padding masks.
    * ``labels_ignore_pad=False``: padded label positions keep the [PAD] id and are trained
      (official); ``True`` sets them to -100.
    * ``target_format="official"``: labels are the tokenised suffix with its specials,
      ``[CLS] suffix [SEP] [PAD]...``, and the decoder reads them shifted right behind the start
      token ``[CLS]``; ``"plain"``: the decoder reads ``[CLS] suffix`` and predicts
      ``suffix [SEP]``.
    * ``max_grad_norm``: gradient-norm clipping (HF Trainer default 1.0; None = off).
    * ``decay_bias_and_norm=False``: weight decay skips biases and LayerNorm weights, as the
      Trainer does; ``True`` decays every parameter.
    * ``shared_model=True``: one mapping model on the union of <s, s_out> and <r, r_out> (Q3: the
      official script loads the same checkpoint for both); ``False``: one model per side, each
      trained on its own pairs (the README's "mapping model and perturbed mapping model").
    * ``tokenizer``: a BERT WordPiece tokenizer (local path or hub id; official
      ``bert-base-uncased``); None = train a lower-cased WordPiece tokenizer of ``vocab_size`` on
      the training pairs.
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
    decay_bias_and_norm: bool = False
    max_grad_norm: float | None = 1.0
    train_pad_to_max: bool = True
    train_attend_pads: bool = True
    labels_ignore_pad: bool = False
    target_format: Literal["official", "plain"] = "official"
    shared_model: bool = True
    tokenizer: str | None = OFFICIAL_MAPPING_TOKENIZER
    device: str | None = None
    bf16: bool = False
    seed: int = 42

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "max_length", "epochs"):
            _positive(f"mapping.{name}", getattr(self, name))
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"mapping.hidden_size ({self.hidden_size}) must be divisible by "
                f"mapping.num_heads ({self.num_heads})"
            )
        _choice("mapping.target_format", self.target_format, ("official", "plain"))
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(
                f"mapping.max_grad_norm must be > 0 or null, got {self.max_grad_norm!r}"
            )

    @property
    def block_width(self) -> int:
        """Width of one pooled block: embeddings + every layer's hidden state, concatenated."""
        return (self.num_layers + 1) * self.hidden_size


@dataclasses.dataclass(frozen=True)
class FeatureConfig:
    """Module B': how f(x) is read from the mapping model.

    * ``decoder_input``: ``"constant"`` is the official behaviour: the decoder reads the
      tokenisation of the literal string ``"[CLS]"`` (``[CLS] [CLS] [SEP]``, then pads) whatever
      the text, so the decoder block depends on the target's output only through the mapping
      model's training and a CalibDCD view cannot move it. ``"suffix"`` teacher-forces each
      observed suffix through the decoder exactly as in training (pooled, then averaged over the
      suffixes), so a view (which changes the suffixes) moves the D blocks. ``paper`` uses
      ``"suffix"``.
    * ``encoder_input``: what the encoder reads under a view. ``"original"``: the query e0(s)
      the mapping model was trained on, whatever the view (views then move D and dD only);
      ``"view"``: the view's query e(s), a literal reading of phi(e(s), Theta(e(s))) (E and dE
      move too).
    * ``pooling``: ``"all"`` pads every sequence to ``max_length`` and averages over all
      positions, pads included (official); ``"masked"`` averages real tokens only.
    * ``attention``: ``"official"``: the encoder gets its padding mask, the decoder's
      self-attention and its cross-attention get none (they see the pads); ``"masked"``: padding
      masks everywhere. Whenever something sees pads, sequences are padded to ``max_length``
      so that a feature never depends on the other texts of its batch.
    * ``prune_p``: the Welch t-test threshold on the delta blocks (official 0.01).
    * ``normalize``: z-score fitted on the supervised split (CalibDCD); the official code has
      none.
    """

    decoder_input: Literal["suffix", "constant"] = "suffix"
    encoder_input: Literal["original", "view"] = "original"
    pooling: Literal["all", "masked"] = "all"
    attention: Literal["official", "masked"] = "official"
    prune_p: float = 0.01
    normalize: bool = True
    batch_size: int = 16

    def __post_init__(self) -> None:
        _choice("features.decoder_input", self.decoder_input, ("suffix", "constant"))
        _choice("features.encoder_input", self.encoder_input, ("original", "view"))
        _choice("features.pooling", self.pooling, ("all", "masked"))
        _choice("features.attention", self.attention, ("official", "masked"))
        if not (0.0 < self.prune_p <= 1.0):
            raise ValueError(f"features.prune_p must be in (0, 1], got {self.prune_p!r}")
        _positive("features.batch_size", self.batch_size)

    @property
    def pad_to_max(self) -> bool:
        """Pad to ``max_length``: pads are pooled or attended, so their number must be fixed."""
        return self.pooling == "all" or self.attention == "official"


@dataclasses.dataclass(frozen=True)
class ProtoNetConfig:
    """Module C: prototypical network with the information bottleneck.

    Defaults are CalibDCD's Appendix table (400 episodes, 10/10, beta = 0.005, m = 128, squared
    Euclidean). The hidden width is stated nowhere for CalibDCD (official: 64); 256 is our
    documented choice. ``distance`` is the inference distance, ``train_distance`` the one in the
    episode loss: the official code trains with squared Euclidean and scores with Euclidean.
    """

    episodes: int = 400
    n_support: int = 10
    n_query: int = 10
    hidden: int = 256
    latent: int = 128
    beta: float = 0.005
    use_ib: bool = True
    distance: Literal["sqeuclidean", "euclidean"] = "sqeuclidean"
    train_distance: Literal["sqeuclidean", "euclidean"] = "sqeuclidean"
    learning_rate: float = 3e-4
    weight_decay: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("episodes", "n_support", "n_query", "hidden", "latent"):
            _positive(f"protonet.{name}", getattr(self, name))
        _choice("protonet.distance", self.distance, ("sqeuclidean", "euclidean"))
        _choice("protonet.train_distance", self.train_distance, ("sqeuclidean", "euclidean"))


@dataclasses.dataclass(frozen=True)
class VeilProbeConfig:
    """The whole VeilProbe configuration; ``VeilProbeConfig()`` is the ``paper`` preset."""

    sampling: SamplingConfig = dataclasses.field(default_factory=SamplingConfig)
    perturb: PerturbConfig = dataclasses.field(default_factory=PerturbConfig)
    mapping: MappingConfig = dataclasses.field(default_factory=MappingConfig)
    features: FeatureConfig = dataclasses.field(default_factory=FeatureConfig)
    protonet: ProtoNetConfig = dataclasses.field(default_factory=ProtoNetConfig)
    cache_dir: str | None = None
    progress: bool = True

    @property
    def cache_path(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else default_veilprobe_cache()

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> VeilProbeConfig:
        """The preset ``name`` (one of :data:`PRESETS`) with whole sub-configs replaced."""
        if name not in PRESETS:
            raise ValueError(f"unknown VeilProbe preset {name!r}; choose one of {PRESETS}")
        return getattr(cls, name)(**overrides)

    @classmethod
    def official(cls, **overrides: Any) -> VeilProbeConfig:
        """The official code in every point (GPU): GiLOT on GPT-2 S/M/L, 13 key tokens replaced
        by bert-base-cased; the mapping model as the official Trainer run trains it; features
        read with the constant ``[CLS]`` decoder input and pooled over all 512 positions; no
        normalisation; the official ProtoNet (500 episodes, 5/5, h = 64, m = 16, beta = 1e-3,
        Euclidean at inference)."""
        base = cls(
            features=FeatureConfig(decoder_input="constant", normalize=False),
            protonet=ProtoNetConfig(
                episodes=500,
                n_support=5,
                n_query=5,
                hidden=64,
                latent=16,
                beta=1e-3,
                distance="euclidean",
                train_distance="sqeuclidean",
            ),
        )
        return dataclasses.replace(base, **overrides)

    @classmethod
    def paper(cls, **overrides: Any) -> VeilProbeConfig:
        """The CalibDCD paper's VeilProbe (GPU): the official feature extraction with the
        observed suffixes teacher-forced through the decoder (``decoder_input="suffix"``, so a
        view moves D and dD), and the Appendix classifier: z-score on the supervised split,
        400 episodes, 10/10, beta = 0.005, m = 128, squared Euclidean."""
        return dataclasses.replace(cls(), **overrides)

    @classmethod
    def cpu(cls, **overrides: Any) -> VeilProbeConfig:
        """Minutes on two CPU cores: 96 new tokens, leave-one-out attribution on a tiny proxy
        trained on the pool, ceil(10% p) key tokens, a 2-layer width-64 mapping model over 128
        tokens with a tokenizer trained on the pool (batch 4, lr 1e-3, padding masks, pads
        ignored in its loss, no clipping), masked pooling; the classifier is ``paper``'s."""
        base = cls(
            sampling=SamplingConfig(max_new_tokens=96),
            perturb=PerturbConfig(
                n_key=None,
                proxies=(),
                masked_lm=None,
                # BOS and renormalised marginals: how the cpu preset was built and measured
                attribution=AttributionConfig(
                    method="loo", max_tokens=192, proxy_bos=True, marginals="renormalized"
                ),
            ),
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
                decay_bias_and_norm=True,
                max_grad_norm=None,
                train_pad_to_max=False,
                train_attend_pads=False,
                labels_ignore_pad=True,
                target_format="plain",
                tokenizer=None,
                bf16=True,
            ),
            features=FeatureConfig(pooling="masked", attention="masked"),
        )
        return dataclasses.replace(base, **overrides)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
