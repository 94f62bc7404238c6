"""Typed configuration of the contamination lab and its presets.

A lab is fully determined by ``(LabConfig, seed, pool)``; :func:`config_hash` keys the cache on
exactly these. Presets:

``micro``
    Test fixture: a 2.1M-parameter Llama (d192, 3 layers), 150 members x 16 repeats, 3 epochs at
    2 x 256 tokens per step (48 exposures per member; the measured cliff is at ~24-32), 200
    background texts, three short chat SFTs. Built in ~3 min on 2 CPU cores.
``demo``
    ``make demo``'s lab: micro with one chat style (Qwen) instead of three. Its base and its
    ``chat-qwen`` are micro's, bit for bit (the same pre-training config, so a build reuses or
    leaves micro's base in ``<cache>/lab-base``, and the same SFT seed); it skips the two other
    SFTs (about 90 s of the cold demo's lab build on 2 CPU cores).
``small``
    Demo: a 4.3M-parameter Llama (d256, 4 layers), 250 members x 16 repeats, 3 epochs (48
    exposures), 800 background texts. ~10 min on 2 CPU cores.
``v2``
    Lab v2 candidate (docs/lab.md, being measured): micro's model and SFT, 500 members x 24
    repeats x 3 epochs (72 exposures) in a 1,000-text pool, 600 background texts, and a
    384-wide, 6-layer clean reference LM for DPDLLM.
``base``
    For a GPU: a 30M-parameter Llama (d512, 8 layers), 1000 members, vocab 8192; the same
    recipe (small optimiser batch is what makes verbatim memorisation happen).

Measured on 2 CPU cores (seed 0, default pool, fp32; ``lab check`` on all members/non-members):

======  ==========  ==========  =============================  ==========================
preset  build (s)   peak RSS    base raw ROUGE-L / prefix AUC  post-trained raw ROUGE-L AUC
======  ==========  ==========  =============================  ==========================
micro   173 (+44)   1.18 GB     0.987 / 0.996                  0.90-0.96 (3 styles)
small   486 (+110)  1.66 GB     0.951 / 0.977                  0.64-0.70 (3 styles)
======  ==========  ==========  =============================  ==========================

(``+`` = the check.) The gray-box loss AUC is 1.000 for every model; the chat-template probe
is at chance (0.47-0.58) because these tiny post-trained models do not follow the "Continue
the text" instruction (they answer with another post-training task), not because they forgot.
On ``small`` the post-training shift barely depends on its length (640 / 960 / 1600 examples
gave 0.72 / 0.70 / 0.68 for the Qwen style); a learning rate of 1e-3 collapses it further.

The measurements behind the recipe are in ``research/lab-blackbox.md``: the optimiser batch
(2 sequences of 256 tokens) and >= 32 exposures per member are what make the black-box
(greedy-continuation) signal strong; model size matters much less.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

__all__ = [
    "PRESETS",
    "CleanReferenceConfig",
    "EvalConfig",
    "LabConfig",
    "ModelConfig",
    "PoolConfig",
    "PretrainConfig",
    "SFTConfig",
    "config_hash",
    "lab_models",
    "preset_models",
    "pretrain_hash",
    "replace_settings",
    "resolve_config",
]

#: bump when a code change alters what a given config builds (invalidates cached labs)
LAB_FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A tiny Llama with tied embeddings and a byte-level BPE vocabulary."""

    hidden_size: int = 192
    num_layers: int = 3
    num_heads: int = 3
    intermediate_size: int = 512
    vocab_size: int = 4096
    max_position_embeddings: int = 512


@dataclasses.dataclass(frozen=True)
class PoolConfig:
    """How the text pool is cleaned and split.

    Texts are whitespace-normalised, de-duplicated on their first and last ``dedup_words``
    lowercase words, dropped when shorter than ``min_words`` and cut to at most ``max_words``
    (at a sentence end when there is one after ``min_words``).
    """

    min_words: int = 40
    max_words: int = 120
    dedup_words: int = 10
    text_field: str | None = None  # jsonl/csv column; None = auto ("text", "input", ...)


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
    """Pre-training with known members.

    Each member appears ``repeats`` times per epoch; each background text once per epoch. Every
    epoch reshuffles the documents and repacks them (so copies land at different offsets).
    Documents are separated by ``<|endoftext|>``.
    """

    n_members: int = 150
    repeats: int = 16
    n_background: int = 200
    epochs: int = 3
    batch_size: int = 2
    seq_len: int = 256
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 40
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """Post-training (supervised chat fine-tuning) of the base into each chat style.

    The loss is on assistant turns only. ``replay_fraction`` of the examples are plain
    background documents trained as language modelling (a data-mix knob that keeps more of the
    base model). The default strength is chosen so the black-box membership signal drops
    measurably but stays clearly above chance (see ``lab check``).
    """

    n_examples: int = 960
    epochs: int = 1
    batch_size: int = 16
    lr: float = 5e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 5
    weight_decay: float = 0.0
    max_len: int = 320
    replay_fraction: float = 0.0
    grad_clip: float = 1.0


@dataclasses.dataclass(frozen=True)
class CleanReferenceConfig:
    """DPDLLM's clean reference LM for this lab (the lab's stand-in for the official GPT-2,
    :mod:`calibdcd.lab.clean_reference`): ``n_texts`` background texts that are no candidate
    (seeded sample; 0 = all), ``epochs`` passes, the lab's pre-training optimiser settings
    otherwise. ``hidden_size`` / ``num_layers`` None = the lab's model size; another width keeps
    the lab's head size and MLP ratio. Part of the lab because it stands for what the detector
    is given (a public pre-trained LM), not a detector setting."""

    n_texts: int = 600
    epochs: int = 2
    seed: int = 0
    hidden_size: int | None = None
    num_layers: int | None = None
    device: str = "auto"

    def __post_init__(self) -> None:
        if self.n_texts < 0 or self.epochs < 1:
            raise ValueError(f"n_texts must be >= 0 and epochs >= 1, got {self}")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """The ``lab check`` protocol (greedy decoding, explicit; see :mod:`calibdcd.lab.evaluate`)."""

    max_ref_words: int = 48
    new_tokens_per_word: float = 1.7
    max_new_tokens: int = 96
    batch_size: int = 32
    continue_instruction: str = "Continue the text:"
    #: extra new tokens a reasoning-style model gets in chat mode for its <think> block
    reasoning_extra_tokens: int = 48
    n_per_class: int | None = None  # evaluate at most this many members and non-members


@dataclasses.dataclass(frozen=True)
class LabConfig:
    preset: str = "micro"
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    pool: PoolConfig = dataclasses.field(default_factory=PoolConfig)
    pretrain: PretrainConfig = dataclasses.field(default_factory=PretrainConfig)
    sft: SFTConfig = dataclasses.field(default_factory=SFTConfig)
    evaluation: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    #: DPDLLM's clean reference LM (built on first use by a detector that names
    #: ``lab-clean-reference:<preset>``; it changes no model of the lab itself)
    clean_reference: CleanReferenceConfig = dataclasses.field(default_factory=CleanReferenceConfig)
    #: chat styles to post-train ("qwen2.5", "llama3.1", "deepseek-r1-distill-qwen")
    styles: tuple[str, ...] = ("qwen2.5", "llama3.1", "deepseek-r1-distill-qwen")
    #: run ``lab check`` at the end of the build and store it in lab.json
    check: bool = True
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:1" | "mps"
    num_threads: int = 2  # CPU threads for torch (0 = leave torch's default)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


PRESETS: dict[str, LabConfig] = {
    "micro": LabConfig(preset="micro"),
    # the demo's lab: micro with only the first chat style (styles keep micro's order, so
    # chat-qwen gets micro's SFT seed and is micro's chat-qwen)
    "demo": LabConfig(preset="demo", styles=("qwen2.5",)),
    "small": LabConfig(
        preset="small",
        model=ModelConfig(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=704),
        pretrain=PretrainConfig(n_members=250, n_background=800, epochs=3),
        sft=SFTConfig(n_examples=1600),
    ),
    # lab v2 candidate (docs/lab.md, recipe R4): R3a's pre-training (micro's model, a
    # 1,000-text pool, 72 exposures per member) and micro's SFT, with a clean reference for
    # DPDLLM large enough to fit the 1,000 candidates as the official GPT-2 would (R2 base, one
    # split: the lab's own size ends at training perplexity 41 and DPDLLM 55; 384 x 6 at 15 and
    # 67; 576 x 8 at 40 and 60, too slow to fit in DPDLLM's 15 epochs at lr 1e-3)
    "v2": LabConfig(
        preset="v2",
        pretrain=PretrainConfig(n_members=500, repeats=24, n_background=600, epochs=3),
        clean_reference=CleanReferenceConfig(hidden_size=384, num_layers=6),
    ),
    "base": LabConfig(
        preset="base",
        model=ModelConfig(
            hidden_size=512, num_layers=8, num_heads=8, intermediate_size=1408, vocab_size=8192
        ),
        pretrain=PretrainConfig(n_members=1000, n_background=4000, epochs=3),
        sft=SFTConfig(n_examples=4000),
        num_threads=0,
    ),
}


def lab_models(cfg: LabConfig) -> tuple[str, ...]:
    """The checkpoint directories a lab built with ``cfg`` holds: ``base`` and one per chat
    style (``chat-qwen``, ``chat-llama``, ``chat-reasoning``)."""
    from calibdcd.lab.chat import get_style

    return ("base", *(get_style(s).dirname for s in cfg.styles))


def preset_models(preset: str) -> tuple[str, ...] | None:
    """:func:`lab_models` of the synthetic preset ``preset``; None for any other name (a
    real-model lab's models are known only once it is built)."""
    return lab_models(PRESETS[preset]) if preset in PRESETS else None


_SECTIONS = ("model", "pool", "pretrain", "sft", "evaluation", "clean_reference")


def replace_settings(obj: Any, changes: dict[str, Any], where: str) -> Any:
    """``dataclasses.replace(obj, **changes)`` for a config dataclass, refusing a name that is
    not one of its fields (the ValueError names ``where``, e.g. the section, and the valid ones).
    """
    names = {f.name for f in dataclasses.fields(obj)}
    bad = sorted(set(changes) - names)
    if bad:
        raise ValueError(f"unknown {where} setting(s) {bad}; valid: {sorted(names)}")
    return dataclasses.replace(obj, **changes)


def resolve_config(preset: str, **overrides: Any) -> LabConfig:
    """The preset's config with ``overrides`` applied.

    An override is a top-level field (``check=False``, ``styles=("qwen2.5",)``), a section
    given as a dict (``sft={"lr": 1e-4}``) or a section field spelled ``section__field``
    (``pretrain__epochs=1``).
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    cfg = PRESETS[preset]
    section_changes: dict[str, dict[str, Any]] = {}
    top: dict[str, Any] = {}
    for key, value in overrides.items():
        if "__" in key:
            section, field = key.split("__", 1)
            if section not in _SECTIONS:
                raise ValueError(f"unknown config section {section!r} in override {key!r}")
            section_changes.setdefault(section, {})[field] = value
        elif key in _SECTIONS and isinstance(value, dict):
            section_changes.setdefault(key, {}).update(value)
        else:
            top[key] = value
    for section, changes in section_changes.items():
        top[section] = replace_settings(getattr(cfg, section), changes, section)
    if "styles" in top:
        top["styles"] = tuple(top["styles"])
    return replace_settings(cfg, top, "lab")


def _content_hash(cfg: LabConfig, seed: int, pool_fingerprint: str, drop: tuple[str, ...]) -> str:
    """A short stable hash of ``cfg`` without the fields ``drop``, the seed, the pool and the
    build environment (shared by :func:`config_hash` and :func:`pretrain_hash`)."""
    from calibdcd.provenance import build_environment

    config = cfg.to_dict()
    for key in drop:
        config.pop(key, None)
    if config.get("clean_reference") == dataclasses.asdict(CleanReferenceConfig()):
        # the default leaves the key of every lab built before the section existed unchanged
        config.pop("clean_reference")
    payload = {
        "format": LAB_FORMAT_VERSION,
        "config": config,
        "seed": seed,
        # the pool's content (with the default pool it depends on the Python version, whose
        # standard library it reads; lab.json records that version)
        "pool": pool_fingerprint,
        # what changes the trained weights' bytes besides the config: torch, transformers and
        # tokenizers versions, the device type (fp32 on CPU; autocast on CUDA) and on CPU the
        # thread count (3 threads train different bytes than 1, 2 or 4: docs/reproducibility.md)
        "build": build_environment(cfg.device, cfg.num_threads),
    }
    blob = json.dumps(payload, sort_keys=True, default=list).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def config_hash(cfg: LabConfig, seed: int, pool_fingerprint: str) -> str:
    """A short stable hash of everything that determines a built lab."""
    # ``check`` only adds a measurement to lab.json: keep it out of the key (a lab built without
    # its check is the same lab; ``calibdcd lab check`` measures it later); device and threads
    # enter through the build environment
    return _content_hash(cfg, seed, pool_fingerprint, ("device", "num_threads", "check"))


def pretrain_hash(cfg: LabConfig, seed: int, pool_fingerprint: str) -> str:
    """A short stable hash of everything that determines a lab's *base* model: the config
    without its post-training, chat styles and evaluation. Labs that differ only there (SFT
    strength, replay, styles) share one pre-trained base (:func:`calibdcd.lab.build.build_lab`
    reuses it from ``<cache>/lab-base``), so tuning the post-training costs minutes, not a new
    pre-training."""
    drop = (
        "preset", "sft", "styles", "evaluation", "clean_reference", "device", "num_threads",
        "check",
    )  # fmt: skip
    return _content_hash(cfg, seed, pool_fingerprint, drop)
