"""Test support for the VeilProbe tests: the lab's texts and models, a small test config."""

from __future__ import annotations

import os
from pathlib import Path


def lab_override() -> Path | None:
    """A prebuilt lab named by ``$CALIBDCD_LAB`` (else the ``lab_micro`` fixture is used)."""
    cand = os.environ.get("CALIBDCD_LAB")
    if cand and (Path(cand) / "ground_truth.jsonl").exists():
        return Path(cand)
    return None


def ground_truth(lab: Path) -> tuple[list[str], list[int]]:
    from calibdcd.lab import load_ground_truth

    items = load_ground_truth(lab)
    return [x.text for x in items], [x.label for x in items]


class PrefixView:
    """A minimal controlled view (``calibdcd.views.View`` has the same ``code``/``apply``)."""

    def __init__(self, code: str, prefix: str = "", suffix: str = ""):
        self.code, self.prefix, self.suffix = code, prefix, suffix

    def apply(self, query: str) -> str:
        return self.prefix + query + self.suffix


def fast_config(cache_dir: str | Path):
    """A VeilProbe configuration small enough for the default test suite."""

    import dataclasses

    from calibdcd.detectors.veilprobe import (
        AttributionConfig,
        MaskedLMConfig,
        SamplingConfig,
        VeilProbeConfig,
    )

    cpu = VeilProbeConfig.cpu()
    return VeilProbeConfig.cpu(
        # the lab's texts are whole documents that the model ends with EOS when prompted with
        # all of them, so the tests prompt with the first half (an extension of VeilProbe)
        sampling=SamplingConfig(max_new_tokens=64, n_suffixes=3, prompt_fraction=0.5),
        perturb=dataclasses.replace(
            cpu.perturb,
            attribution=AttributionConfig(method="loo", max_tokens=128),
            mlm=MaskedLMConfig(hidden_size=64, intermediate_size=128, epochs=12),
        ),
        mapping=cpu.mapping,
        cache_dir=str(cache_dir),
        progress=False,
    )


def make_target(model_dir: str | Path):
    """The project's transformers backend on a lab checkpoint (CPU, float32)."""
    from calibdcd.targets.hf import HFTarget

    return HFTarget(str(model_dir), device="cpu", batch_size=32)


def balanced_subset(labels, per_class: int, seed: int = 0):
    """Indices of up to ``per_class`` members and ``per_class`` non-members (seeded)."""
    import numpy as np

    y = np.asarray(labels)
    rng = np.random.default_rng(seed)
    out = []
    for c in (1, 0):
        idx = np.flatnonzero(y == c)
        out.append(rng.permutation(idx)[:per_class])
    return np.concatenate(out)


def split_supervised(labels, per_class: int, seed: int = 0):
    """(train, eval) index arrays: ``per_class`` of each label for training, the rest for eval."""
    import numpy as np

    y = np.asarray(labels)
    rng = np.random.default_rng(seed)
    train = []
    for c in (1, 0):
        idx = rng.permutation(np.flatnonzero(y == c))
        if idx.size <= per_class:
            raise ValueError(f"label {c} has {idx.size} items; need more than {per_class}")
        train.append(idx[:per_class])
    train = np.sort(np.concatenate(train))
    return train, np.setdiff1d(np.arange(len(y)), train)


# -- local stand-ins for the official models (no hub) ---------------------------------------------

STANDIN_CORPUS = [
    "The river flows past the old mill and into the quiet valley below the hills.",
    "A small library opened in the village square, lending books to every family.",
    "Engineers tested the bridge with heavy trucks before it opened to traffic.",
    "The committee approved the budget after a long debate about school funding.",
    "Every morning the baker lit the oven and the smell of bread filled the street.",
    "Storm clouds gathered over the harbour while fishermen pulled their boats ashore.",
    "She wrote letters to her brother every week during the long winter abroad.",
    "The old clock in the hall had stopped at midnight many years ago.",
]


def tiny_bert_tokenizer(
    out_dir: str | Path, *, lowercase: bool = True, extra: list[str] | None = None
) -> Path:
    """A BERT-style WordPiece tokenizer directory (``[CLS] text [SEP]``, [PAD] = 0) trained on
    :data:`STANDIN_CORPUS` (+ ``extra`` texts): the local stand-in for ``bert-base-uncased`` /
    ``-cased``."""
    from calibdcd.detectors.veilprobe.tokenization import train_wordpiece

    out = Path(out_dir)
    if not (out / "tokenizer.json").exists():
        corpus = STANDIN_CORPUS * 4 + list(extra or [])
        train_wordpiece(corpus, vocab_size=400, lowercase=lowercase).save_pretrained(str(out))
    return out


def tiny_bert_mlm(out_dir: str | Path, seed: int = 0) -> Path:
    """A randomly initialised tiny BERT fill-mask model with a cased stand-in tokenizer: the
    local stand-in for ``bert-base-cased`` (replacements are arbitrary but well-formed)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    out = tiny_bert_tokenizer(out_dir, lowercase=False)
    tok = AutoTokenizer.from_pretrained(str(out))
    torch.manual_seed(seed)
    model = BertForMaskedLM(
        BertConfig(
            vocab_size=len(tok),
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=256,
            pad_token_id=tok.pad_token_id,
        )
    )
    model.save_pretrained(str(out))
    return out


def tiny_gpt2_proxy(out_dir: str | Path, seed: int, n_layer: int = 1) -> Path:
    """A randomly initialised tiny GPT-2 (byte-level BPE with the ``Ġ`` space marker, from
    :func:`calibdcd.targets.tiny.cached_tiny_lm`): a local stand-in for one of the official
    proxies ``gpt2`` / ``gpt2-medium`` / ``gpt2-large``."""
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    from calibdcd.targets.tiny import cached_tiny_lm

    out = Path(out_dir)
    tok = AutoTokenizer.from_pretrained(str(cached_tiny_lm()))
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=len(tok),
            n_embd=32,
            n_layer=n_layer,
            n_head=2,
            n_positions=256,
            bos_token_id=tok.eos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
    )
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out
