"""A clean reference LM for DPDLLM on the contamination lab.

DPDLLM's reference model (GPT-2 in the paper) is a general LM that never saw the candidate texts;
DPDLLM then fine-tunes it on the candidates so that the *target's* continuation is the only
membership signal. The lab's own base model is the wrong starting point: it is the pre-trained
target and already memorised the members (its gray-box loss AUC is 1.0), so a reference LM
started from it scores the memorised prompt half of every member and reports membership without
looking at the target's output at all (measured: AUC ~1.0 on every post-trained model, far above
the base model's black-box signal).

:func:`ensure_clean_reference` builds the lab's analogue of GPT-2: the lab's architecture and
tokenizer (the tokenizer is trained on background text only), pre-trained from scratch on the
lab's background texts with every ground-truth candidate removed. It is cached under
``<cache>/dpdllm-lab-reference/<key>`` (key: lab config hash, pool fingerprint, budget, seed).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import time
from pathlib import Path
from typing import Any

from calibdcd.atomic import atomic_directory, file_lock, write_json
from calibdcd.lab.config import CleanReferenceConfig
from calibdcd.paths import cache_root
from calibdcd.provenance import build_environment
from calibdcd.resumable import ResumableTraining, discard_saves_beside

__all__ = [
    "CleanReferenceConfig",
    "clean_reference_dir",
    "ensure_clean_reference",
    "lab_reference_config",
    "reference_model_config",
]


def lab_reference_config(meta: dict[str, Any]) -> CleanReferenceConfig:
    """The clean reference budget a lab's ``lab.json`` records (its ``clean_reference``
    section); the defaults for a lab built before the section existed."""
    return _section(CleanReferenceConfig, meta.get("config", {}).get("clean_reference") or {})


def reference_model_config(lab_model: Any, cfg: CleanReferenceConfig) -> Any:
    """The lab's :class:`~calibdcd.lab.config.ModelConfig` resized to ``cfg``: another width
    keeps the lab's head size and MLP ratio (heads and intermediate size scale with it, the
    intermediate size rounded to a multiple of 64), another depth only adds layers."""
    width = cfg.hidden_size or lab_model.hidden_size
    head = lab_model.hidden_size // lab_model.num_heads
    if width % head:
        raise ValueError(
            f"clean reference hidden_size={width} must be a multiple of the lab's head size "
            f"{head} (hidden_size {lab_model.hidden_size} / {lab_model.num_heads} heads)"
        )
    ratio = lab_model.intermediate_size / lab_model.hidden_size
    return dataclasses.replace(
        lab_model,
        hidden_size=width,
        num_heads=width // head,
        intermediate_size=(
            lab_model.intermediate_size
            if width == lab_model.hidden_size
            else max(64, round(width * ratio / 64) * 64)
        ),
        num_layers=cfg.num_layers or lab_model.num_layers,
    )


def _section(cls: Any, data: dict[str, Any]) -> Any:
    """A lab config dataclass from its lab.json section, ignoring keys this version lacks."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


def _lab_configs(meta: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(model, pool, pretrain) configs recorded in a lab's lab.json."""
    from calibdcd.lab.config import ModelConfig, PoolConfig, PretrainConfig

    c = meta["config"]
    return (
        _section(ModelConfig, c["model"]),
        _section(PoolConfig, c["pool"]),
        _section(PretrainConfig, c["pretrain"]),
    )


def _background_texts(lab_dir: Path, meta: dict[str, Any]) -> list[str]:
    from calibdcd.lab.evaluate import load_ground_truth
    from calibdcd.lab.pool import clean_pool, default_pool, load_pool

    _, pool_cfg, _ = _lab_configs(meta)
    pool_spec = meta["pool"]
    if pool_spec.get("source") == "cpython-docs":
        raw = default_pool(pool_cfg.min_words, pool_cfg.max_words)
    else:
        raw = load_pool(pool_spec["source"], pool_cfg.text_field)
    texts = [t.text for t in clean_pool(raw, pool_cfg)]
    candidates = {item.text for item in load_ground_truth(lab_dir)}
    missing = len(candidates - set(texts))
    if missing:
        raise ValueError(
            f"{missing} ground-truth texts of {lab_dir} are not in the rebuilt pool (other Python "
            "version or pool file?); cannot guarantee the reference LM never saw a candidate"
        )
    return [t for t in texts if t not in candidates]


#: bump when the way the clean reference is built changes, so stale cached ones are not reused (a
#: reference cached by an earlier build of this module moved DPDLLM's lab AUCs by 4-8 points)
CLEAN_REFERENCE_FORMAT = 2


def clean_reference_dir(
    lab_dir: str | Path,
    config: CleanReferenceConfig | None = None,
    *,
    cache_dir: str | Path | None = None,
) -> Path:
    """Where :func:`ensure_clean_reference` keeps the reference of ``lab_dir`` and ``config``
    (None: the lab's own, :func:`lab_reference_config`; built or not: ``reference.json``
    inside it marks a finished build). Computes, trains nothing."""
    meta = json.loads((Path(lab_dir) / "lab.json").read_text())
    return _reference_dir(meta, config or lab_reference_config(meta), cache_dir)


def _reference_dir(
    meta: dict[str, Any], cfg: CleanReferenceConfig, cache_dir: str | Path | None
) -> Path:
    key_src = json.dumps(
        {
            "format": CLEAN_REFERENCE_FORMAT,
            "lab": meta["config_hash"],
            "pool": meta["pool"],
            "cfg": dataclasses.asdict(cfg),
            # torch/transformers versions, device type and CPU threads change the weights
            "build": build_environment(cfg.device),
        },
        sort_keys=True,
    )
    key = hashlib.sha256(key_src.encode()).hexdigest()[:20]
    return cache_root(cache_dir) / "dpdllm-lab-reference" / key


def ensure_clean_reference(
    lab_dir: str | Path,
    config: CleanReferenceConfig | None = None,
    *,
    cache_dir: str | Path | None = None,
    progress: bool = True,
) -> Path:
    """Path of a transformers checkpoint pre-trained on the lab's non-candidate texts only,
    with the budget ``config`` (None: the lab's own, :func:`lab_reference_config`)."""
    lab_dir = Path(lab_dir)
    meta = json.loads((lab_dir / "lab.json").read_text())
    cfg = config or lab_reference_config(meta)
    out = _reference_dir(meta, cfg, cache_dir)
    if (out / "reference.json").exists():
        return out
    waiting = (
        f"DPDLLM clean reference of lab {lab_dir.name}: another process is training {out.name}; "
        "waiting for it to finish (it is trained once per cache root and then shared)"
    )
    with file_lock(out.parent / f".{out.name}.lock", waiting):
        if (out / "reference.json").exists():  # the other process finished it
            return out
        return _train_clean_reference(lab_dir, meta, cfg, out, progress)


def _train_clean_reference(
    lab_dir: Path, meta: dict, cfg: CleanReferenceConfig, out: Path, progress: bool
) -> Path:
    import torch
    from transformers import AutoTokenizer

    from calibdcd.device import torch_device
    from calibdcd.lab.train import build_model, pretrain

    t0 = time.perf_counter()
    model_cfg, _, pt_cfg = _lab_configs(meta)
    texts = _background_texts(lab_dir, meta)
    random.Random(f"dpdllm-clean-reference-{cfg.seed}").shuffle(texts)
    if cfg.n_texts:
        texts = texts[: cfg.n_texts]
    tok = AutoTokenizer.from_pretrained(lab_dir / "base")
    docs = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    model_cfg = reference_model_config(model_cfg, cfg)
    special = {"bos": tok.bos_token_id, "eos": tok.eos_token_id, "pad": tok.pad_token_id}
    vocab = ((len(tok) + 63) // 64) * 64
    model = build_model(model_cfg, vocab, special, cfg.seed)
    pt = dataclasses.replace(pt_cfg, epochs=cfg.epochs)
    device = torch_device(cfg.device)
    # its save sits beside ``out`` (named by the recipe's key) until ``out`` is complete
    resume = ResumableTraining.beside(out, "pretrain", out.name)
    stats = pretrain(
        model, docs, special["eos"], pt, seed=cfg.seed, device=device, progress=progress,
        desc="DPDLLM clean reference", resume=resume,
    )  # fmt: skip
    model.to("cpu")
    info = {
        "lab": lab_dir.name,
        "lab_config_hash": meta["config_hash"],
        "n_texts": len(texts),
        "config": dataclasses.asdict(cfg),
        "train": stats.as_dict(),
        "seconds": time.perf_counter() - t0,
        "torch_threads": torch.get_num_threads(),
        "build_environment": build_environment(cfg.device),
    }
    # published whole (an unfinished earlier attempt, without reference.json, is replaced)
    with atomic_directory(out, replace=True) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        write_json(tmp / "reference.json", info)
    discard_saves_beside(out)
    return out
