"""Test support for the VeilProbe tests: a real local transformers causal LM behind the Target
protocol (used until/unless ``calibdcd.targets.hf.HFTarget`` is available), and the lab loader."""

from __future__ import annotations

import json
import os
from pathlib import Path

from calibdcd.targets.base import GenerationParams, validate_prompts


class LocalCausalTarget:
    """Completion-style generation with a local causal LM (left-padded batches, seeded per
    sample index so the j-th completion of a prompt does not depend on the batch)."""

    family = "lab"

    def __init__(
        self, model_dir: str | Path, batch_size: int = 32, add_special_tokens: bool = False
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(min(2, torch.get_num_threads()))
        self.path = Path(model_dir)
        self.name = f"local:{self.path.resolve()}"
        self.tok = AutoTokenizer.from_pretrained(str(self.path))
        self.tok.padding_side = "left"
        if self.tok.pad_token_id is None:
            self.tok.pad_token = self.tok.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(str(self.path)).eval()
        self.batch_size = batch_size
        self.add_special_tokens = add_special_tokens

    def generate(self, prompts, params: GenerationParams) -> list[list[str]]:
        import torch

        prompts = validate_prompts(prompts)
        out: list[list[str]] = [[] for _ in prompts]
        for j in range(params.n):
            for k in range(0, len(prompts), self.batch_size):
                chunk = prompts[k : k + self.batch_size]
                if not self.add_special_tokens and self.tok.bos_token:
                    # a document start, as in pre-training (documents are EOS/BOS-separated)
                    chunk = [self.tok.bos_token + p for p in chunk]
                enc = self.tok(
                    chunk,
                    return_tensors="pt",
                    padding=True,
                    add_special_tokens=self.add_special_tokens,
                )
                torch.manual_seed(params.seed * 1_000_003 + j * 7919 + k)
                with torch.no_grad():
                    gen = self.model.generate(
                        **enc,
                        max_new_tokens=params.max_new_tokens,
                        do_sample=not params.greedy,
                        temperature=params.temperature if not params.greedy else None,
                        top_p=params.top_p,
                        top_k=params.top_k or 0,
                        pad_token_id=self.tok.pad_token_id,
                    )
                new = gen[:, enc["input_ids"].shape[1] :]
                for i, row in enumerate(new):
                    out[k + i].append(self.tok.decode(row, skip_special_tokens=True))
        return out


def lab_dir() -> Path | None:
    """The prebuilt lab (``CALIBDCD_LAB`` or /work/cache/lab-micro) when present."""
    for cand in (os.environ.get("CALIBDCD_LAB"), "/work/cache/lab-micro"):
        if cand and (Path(cand) / "ground_truth.jsonl").exists():
            return Path(cand)
    return None


def ground_truth(lab: Path) -> tuple[list[str], list[int]]:
    texts, labels = [], []
    with (lab / "ground_truth.jsonl").open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                texts.append(row["text"])
                labels.append(int(row["label"]))
    return texts, labels


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
        PerturbConfig,
        SamplingConfig,
        VeilProbeConfig,
    )

    cpu = VeilProbeConfig.cpu()
    return VeilProbeConfig.cpu(
        sampling=SamplingConfig(max_new_tokens=32, n_suffixes=2),
        perturb=PerturbConfig(
            attribution=AttributionConfig(method="loo", max_tokens=128),
            mlm=MaskedLMConfig(hidden_size=64, intermediate_size=128, epochs=12),
        ),
        mapping=dataclasses.replace(cpu.mapping, max_length=96),
        cache_dir=str(cache_dir),
        progress=False,
    )


def make_target(model_dir: str | Path):
    """The project's transformers backend when it is available, else :class:`LocalCausalTarget`."""
    try:
        from calibdcd.targets.hf import HFTarget
    except ImportError:
        return LocalCausalTarget(model_dir)
    return HFTarget(str(model_dir))


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
