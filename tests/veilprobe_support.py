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

    from calibdcd.detectors.veilprobe import (
        AttributionConfig,
        MaskedLMConfig,
        PerturbConfig,
        SamplingConfig,
        VeilProbeConfig,
    )

    cpu = VeilProbeConfig.cpu()
    return VeilProbeConfig.cpu(
        # the lab's texts are whole documents that the model ends with EOS when prompted with
        # all of them, so the tests prompt with the first half (an extension of VeilProbe)
        sampling=SamplingConfig(max_new_tokens=64, n_suffixes=3, prompt_fraction=0.5),
        perturb=PerturbConfig(
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
