"""Build a contamination lab: pool split, tokenizer, pre-training, post-training, ground truth.

:func:`build_lab` always builds (into a temporary sibling directory, renamed into place only
when complete). :func:`ensure_lab` builds into a cache directory keyed by preset, seed and a
hash of the resolved config and pool, at most once across concurrent processes (file lock), and
returns the cached lab afterwards.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import platform
import random
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from calibdcd.atomic import atomic_directory, file_lock
from calibdcd.lab.chat import ENDOFTEXT, PAD, SPECIAL_TOKENS, get_style
from calibdcd.lab.config import LabConfig, PoolConfig, config_hash, pretrain_hash, resolve_config
from calibdcd.lab.evaluate import CHECK_SKIPPED
from calibdcd.lab.pool import (
    PoolText,
    Split,
    clean_pool,
    default_pool,
    load_pool,
    pool_fingerprint,
    split_pool,
)
from calibdcd.paths import cache_root
from calibdcd.provenance import build_record
from calibdcd.resumable import ResumableTraining, discard_saves_beside

__all__ = ["build_lab", "ensure_lab", "is_complete_lab", "prepare_split"]


def is_complete_lab(path: str | Path) -> bool:
    meta = Path(path) / "lab.json"
    if not meta.is_file():
        return False
    try:
        return bool(json.loads(meta.read_text()).get("complete"))
    except (json.JSONDecodeError, OSError):
        return False


@functools.lru_cache(maxsize=8)
def _clean_default_pool(pool: PoolConfig) -> tuple[tuple[PoolText, ...], int, str]:
    """The default pool cleaned under ``pool`` (texts, raw count, fingerprint), once per
    process: a run's plan asks for a lab's directory per target, detector option and setting,
    and cleaning the pool each time cost ~50 ms per ask (seconds per lab run resolved)."""
    raw = default_pool(pool.min_words, pool.max_words)
    texts = clean_pool(raw, pool)
    return tuple(texts), len(raw), pool_fingerprint(texts)


def _load_texts(pool: str | Path | None, cfg: LabConfig) -> tuple[list[PoolText], dict[str, Any]]:
    if pool is None:
        cleaned, n_raw, sha = _clean_default_pool(cfg.pool)
        texts = list(cleaned)
        spec = {"source": "cpython-docs", "python": platform.python_version()}
        spec.update({"raw_texts": n_raw, "clean_texts": len(texts), "sha": sha})
        return texts, spec
    raw = load_pool(pool, cfg.pool.text_field)
    spec = {"source": Path(pool).name}  # its content is in ``sha``; no machine path
    texts = clean_pool(raw, cfg.pool)
    spec.update({"raw_texts": len(raw), "clean_texts": len(texts), "sha": pool_fingerprint(texts)})
    return texts, spec


def prepare_split(
    preset: str = "micro", *, seed: int = 0, pool: str | Path | None = None, **overrides: Any
) -> tuple[LabConfig, Split, dict[str, Any]]:
    """The resolved config, the member/non-member/background split and the pool description."""
    cfg = resolve_config(preset, **overrides)
    texts, spec = _load_texts(pool, cfg)
    return cfg, split_pool(texts, cfg.pretrain.n_members, seed), spec


def _peak_rss_mb() -> float:
    try:
        import resource
    except ImportError:  # not on Windows
        return float("nan")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(rss / (1024 * 1024 if sys.platform == "darwin" else 1024), 1)


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _save_model(model, tok, out: Path, style_name: str | None, meta: dict[str, Any]) -> None:
    from transformers import GenerationConfig

    from calibdcd.lab.tokenizer import style_tokenizer

    out.mkdir(parents=True)
    stok = style_tokenizer(tok, style_name)
    style = get_style(style_name or "qwen2.5")
    stop = [stok.convert_tokens_to_ids(t) for t in style.stop_tokens]
    if style_name is None:
        stop = [stok.convert_tokens_to_ids(ENDOFTEXT)]
    # do_sample=True so OpenAI-compatible servers honour temperature/top_p/seed per request;
    # the lab's own evaluation always passes an explicit greedy config.
    model.generation_config = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        bos_token_id=stok.convert_tokens_to_ids(stok.bos_token),
        eos_token_id=stop,
        pad_token_id=stok.convert_tokens_to_ids(PAD),
    )
    model.config.bos_token_id = stok.convert_tokens_to_ids(stok.bos_token)
    model.config.eos_token_id = stop[0]
    model.save_pretrained(out)
    stok.save_pretrained(out)
    info = {
        "family": "lab" if style_name is None else style.lab_family,
        "role": "base" if style_name is None else "post-trained",
        "chat_style": style.name,
        "target_family": "lab" if style_name is None else style.name,
        "stop_tokens": list(style.stop_tokens) if style_name else [ENDOFTEXT],
        "parameters": sum(p.numel() for p in model.parameters()),
        **meta,
    }
    (out / "calibdcd.json").write_text(json.dumps(info, indent=2) + "\n")


def _load_base(store: Path, tmp: Path):
    """Copy a stored pre-trained base into the lab being built and load it (fp32, exact)."""
    import torch
    from transformers import LlamaForCausalLM

    shutil.copytree(store, tmp / "base")
    model = LlamaForCausalLM.from_pretrained(tmp / "base", dtype=torch.float32)
    model.eval()
    return model, json.loads((store / "calibdcd.json").read_text())["training"]


def _pretrained_base(
    tmp: Path,
    cfg: LabConfig,
    tok,
    docs: list[list[int]],
    special: dict[str, int],
    seed: int,
    device,
    progress: bool,
    base_store: Path | None,
    resume: ResumableTraining | None = None,
) -> tuple[Any, dict[str, Any], bool]:
    """The pre-trained base saved as ``tmp/base`` (copied from ``base_store`` when a build with
    the same pre-training config left it there, else trained and stored there): the model,
    its training stats and whether it was reused. ``resume``: the pre-training's save."""
    from calibdcd.lab.train import build_model, pretrain

    if base_store is not None and (base_store / "calibdcd.json").is_file():
        model, stats = _load_base(base_store, tmp)
        return model, stats, True
    vocab_padded = ((len(tok) + 63) // 64) * 64
    model = build_model(cfg.model, vocab_padded, special, seed)
    st = pretrain(
        model, docs, special["eos"], cfg.pretrain, seed=seed, device=device, progress=progress,
        resume=resume,
    )  # fmt: skip
    stats = st.as_dict()
    model.to("cpu")
    _save_model(model, tok, tmp / "base", None, {"training": stats})
    if base_store is not None:
        with atomic_directory(base_store) as store_tmp:
            shutil.copytree(tmp / "base", store_tmp, dirs_exist_ok=True)
    return model, stats, False


def _post_train(
    tmp: Path,
    cfg: LabConfig,
    model,
    tok,
    bg: list[PoolText],
    pad_id: int,
    seed: int,
    device,
    progress: bool,
    resume_at: Callable[[str], ResumableTraining | None] = lambda what: None,
) -> tuple[dict[str, Any], dict[str, float], dict[str, float]]:
    """One chat model per style of ``cfg.styles``, each post-trained from a copy of the base
    and saved as ``tmp/<style dir>``: their training stats, seconds and peak memory.
    ``resume_at(what)``: the save of the training ``what`` (``sft-<style dir>``)."""
    from calibdcd.lab.sftdata import make_conversations, tokenize_conversations
    from calibdcd.lab.train import init_new_token_embeddings, sft

    stats: dict[str, Any] = {}
    timings: dict[str, float] = {}
    peak: dict[str, float] = {}
    convs_all = make_conversations(bg, cfg.sft.n_examples, seed)
    replay = bg[: round(cfg.sft.replay_fraction * cfg.sft.n_examples)]
    # chat tokens never occur in pre-training (padding rows of the vocabulary are never used)
    new_token_ids = [
        tok.convert_tokens_to_ids(t)
        for t in (*SPECIAL_TOKENS, "<think>", "</think>")
        if t not in (ENDOFTEXT, PAD)
    ]
    for i, style_name in enumerate(cfg.styles):
        style = get_style(style_name)
        examples = tokenize_conversations(convs_all, replay, style, tok, cfg.sft.max_len)
        chat_model = copy.deepcopy(model)
        init_new_token_embeddings(chat_model, new_token_ids, seed + 1000 * (i + 1))
        st = sft(
            chat_model,
            examples,
            pad_id,
            cfg.sft,
            seed=seed + 1000 * (i + 1),
            device=device,
            progress=progress,
            desc=f"sft {style.dirname}",
            resume=resume_at(f"sft-{style.dirname}"),
        )
        stats[style.dirname] = {**st.as_dict(), "examples": len(examples)}
        timings[f"sft_{style.dirname}"] = st.seconds
        chat_model.to("cpu")
        _save_model(
            chat_model,
            tok,
            tmp / style.dirname,
            style_name,
            {"training": stats[style.dirname], "post_trained_from": "base"},
        )
        del chat_model
        peak[f"sft_{style.dirname}"] = _peak_rss_mb()
    return stats, timings, peak


def _write_ground_truth(path: Path, split: Split, repeats: int) -> None:
    """The lab's candidates with their labels: members (``m0000``...) then non-members."""
    with path.open("w", encoding="utf-8") as fh:
        rows = [(x, 1, repeats) for x in split.members] + [(x, 0, 0) for x in split.nonmembers]
        for k, (x, label, reps) in enumerate(rows):
            rec = {
                "id": f"{'m' if label else 'n'}{k if label else k - len(split.members):04d}",
                "text": x.text,
                "label": label,
                "repeats": reps,
                "source": x.source,
            }
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")


def _build_into(
    tmp: Path,
    cfg: LabConfig,
    split: Split,
    pool_spec: dict[str, Any],
    seed: int,
    progress: bool,
    base_store: Path | None = None,
    resume_at: Callable[[str], ResumableTraining | None] = lambda what: None,
) -> dict[str, Any]:
    """Build the lab's models and ground truth into ``tmp``; ``resume_at(what)``: the save of
    the training ``what`` (``pretrain``, ``sft-<style dir>``), None for none."""
    import torch

    from calibdcd.device import torch_device
    from calibdcd.lab.tokenizer import train_tokenizer

    timings: dict[str, float] = {}
    t_all = time.perf_counter()
    if cfg.num_threads > 0:
        torch.set_num_threads(cfg.num_threads)
    device = torch_device(cfg.device)
    pt = cfg.pretrain

    t = time.perf_counter()
    tok = train_tokenizer([x.text for x in split.background], cfg.model.vocab_size)
    timings["tokenizer"] = time.perf_counter() - t
    peak: dict[str, float] = {"tokenizer": _peak_rss_mb()}

    rng = random.Random(f"calibdcd-lab-background-{seed}")
    bg = list(split.background)
    rng.shuffle(bg)
    pre_bg = bg[: pt.n_background]
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    member_ids = [enc(x.text) for x in split.members]
    docs = [ids for ids in member_ids for _ in range(pt.repeats)] + [enc(x.text) for x in pre_bg]

    special = {
        "bos": tok.convert_tokens_to_ids(ENDOFTEXT),
        "eos": tok.convert_tokens_to_ids(ENDOFTEXT),
        "pad": tok.convert_tokens_to_ids(PAD),
    }
    model, base_stats, reused = _pretrained_base(
        tmp, cfg, tok, docs, special, seed, device, progress, base_store, resume_at("pretrain")
    )
    timings["pretrain"] = 0.0 if reused else base_stats["seconds"]
    peak["pretrain"] = _peak_rss_mb()
    chat_stats, chat_timings, chat_peak = _post_train(
        tmp, cfg, model, tok, bg, special["pad"], seed, device, progress, resume_at
    )
    timings.update(chat_timings)
    peak.update(chat_peak)
    _write_ground_truth(tmp / "ground_truth.jsonl", split, pt.repeats)
    timings["build"] = time.perf_counter() - t_all
    return {
        "stats": {"base": base_stats, **chat_stats},
        "timings": {k: round(v, 2) for k, v in timings.items()},
        "device": str(device),
        # a base pre-trained by an earlier build with the same pre-training config (its
        # training time is in stats.base.seconds; timings.pretrain is 0 here)
        "base_reused": reused,
        "peak_rss_mb": peak,
        "corpus": {
            "members": len(split.members),
            "nonmembers": len(split.nonmembers),
            "background_available": len(split.background),
            "background_pretrain": len(pre_bg),
            "pretrain_tokens_per_epoch": sum(len(d) + 1 for d in docs),
            "sft_examples": cfg.sft.n_examples,
            "sft_replay_documents": round(cfg.sft.replay_fraction * cfg.sft.n_examples),
            "vocab_size": len(tok),
        },
    }


def build_lab(
    preset: str,
    out_dir: str | Path,
    *,
    seed: int = 0,
    pool: str | Path | None = None,
    progress: bool = True,
    reuse_base: bool = True,
    cache: str | Path | None = None,
    **overrides: Any,
) -> Path:
    """Build a lab into ``out_dir`` and return its path.

    ``overrides`` change the preset's config (see :func:`calibdcd.lab.config.resolve_config`).
    With ``reuse_base`` the pre-trained base is kept in ``<cache>/lab-base/`` (``cache``: the
    cache root, :func:`calibdcd.paths.cache_root` by default) under
    :func:`calibdcd.lab.config.pretrain_hash`, and a later build whose config differs only in
    post-training, styles or evaluation copies it instead of pre-training again (the saved fp32
    weights are exact, so the lab is the same as one built from scratch).
    The lab is assembled in a temporary sibling directory and renamed into place when complete;
    an existing complete lab at ``out_dir`` is replaced, any other non-empty directory is an
    error.
    """
    out_dir = Path(out_dir)
    if not progress:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    from calibdcd.lab.real import REAL_PRESETS, build_real_lab

    if preset in REAL_PRESETS:  # the real-model lab (calibdcd.lab.real) has its own recipe
        if pool is not None:  # its pool is WikiMIA-24's 2024 texts (the recipe's `pool`)
            raise ValueError(
                f"pool: the real-model lab {preset!r} takes its texts from its recipe, not from "
                "a pool file; leave pool unset"
            )
        # its injected base is stored and reused as the synthetic lab's pre-trained base
        return build_real_lab(
            preset, out_dir, seed=seed, progress=progress, cache=cache, reuse_base=reuse_base,
            **overrides,
        )  # fmt: skip
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / "lab.json").exists():
        raise ValueError(f"out_dir {out_dir} exists, is not empty and is not a lab; refusing")
    cfg, split, pool_spec = prepare_split(preset, seed=seed, pool=pool, **overrides)
    key = config_hash(cfg, seed, pool_spec["sha"])
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    phash = pretrain_hash(cfg, seed, pool_spec["sha"])

    def resume_at(what: str) -> ResumableTraining:
        # the recipe's hash goes with the save: one of another recipe here is not resumed
        return ResumableTraining.beside(out_dir, what, phash if what == "pretrain" else key)

    # built in a temporary sibling, renamed into place only when complete; the trainings'
    # saves sit beside out_dir until then, so a build stopped part-way resumes
    with atomic_directory(out_dir, replace=True) as tmp:
        t0 = time.perf_counter()
        store = None
        if reuse_base:
            store = cache_root(cache) / "lab-base" / f"s{seed}-{phash}"
        info = _build_into(tmp, cfg, split, pool_spec, seed, progress, store, resume_at)
        meta: dict[str, Any] = {
            "complete": False,
            "preset": preset,
            "seed": seed,
            "config_hash": key,
            "config": cfg.to_dict(),
            "overrides": {k: v for k, v in overrides.items()},
            "pool": pool_spec,
            "seeds": {
                "split": f"calibdcd-lab-split-{seed}",
                "model_init": seed,
                "pretrain_packing": f"calibdcd-lab-pack-{seed}",
                "sft_data": f"calibdcd-lab-sftdata-{seed}",
            },
            **build_record(cfg.device, cfg.num_threads),
            **info,
        }
        if cfg.check:
            from calibdcd.lab.evaluate import check_lab

            t = time.perf_counter()
            meta["check"] = check_lab(tmp, cfg.evaluation, device=cfg.device, progress=progress)
            meta["timings"]["check"] = round(time.perf_counter() - t, 2)
            meta["peak_rss_mb"]["check"] = _peak_rss_mb()
        else:
            meta["check"] = {"skipped": CHECK_SKIPPED}
        meta["timings"]["total"] = round(time.perf_counter() - t0, 2)
        meta["sizes"] = {p.name: _dir_size(p) for p in sorted(tmp.iterdir()) if p.is_dir()}
        meta["sizes"]["total"] = _dir_size(tmp)
        meta["complete"] = True
        (tmp / "lab.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    discard_saves_beside(out_dir)
    return out_dir


def lab_cache_dir(
    preset: str,
    *,
    seed: int = 0,
    root: str | Path | None = None,
    pool: str | Path | None = None,
    **overrides: Any,
) -> Path:
    """Where :func:`ensure_lab` keeps this lab: ``<root>/lab/<preset>-s<seed>-<hash>``."""
    from calibdcd.lab.real import REAL_PRESETS, real_lab_key

    if preset in REAL_PRESETS:
        return cache_root(root) / "lab" / real_lab_key(preset, seed, **overrides)
    cfg = resolve_config(preset, **overrides)
    _, spec = _load_texts(pool, cfg)
    base = cache_root(root)
    return base / "lab" / f"{preset}-s{seed}-{config_hash(cfg, seed, spec['sha'])}"


def ensure_lab(
    preset: str,
    *,
    seed: int = 0,
    root: str | Path | None = None,
    pool: str | Path | None = None,
    progress: bool = True,
    **overrides: Any,
) -> Path:
    """The cached lab for ``(preset, seed, config)`` under the cache root ``root``
    (:func:`calibdcd.paths.cache_root`); built once if missing. Process-safe: every run using the
    same root shares the lab, and a process that finds another one building it waits (and says
    so) instead of building it again."""
    target = lab_cache_dir(preset, seed=seed, root=root, pool=pool, **overrides)
    if is_complete_lab(target):
        return target
    waiting = (
        f"lab {preset}: another process is building {target}; waiting for it to finish "
        "(the lab is shared, not built twice)"
    )
    with file_lock(target.parent / f".{target.name}.lock", waiting):
        if is_complete_lab(target):
            return target
        if target.exists():  # an incomplete leftover (should not happen: builds are atomic)
            shutil.rmtree(target)
        build_lab(preset, target, seed=seed, pool=pool, progress=progress, cache=root, **overrides)
    return target


def config_of(lab_dir: str | Path) -> LabConfig:
    """The resolved config a lab was built with (from its lab.json)."""
    from calibdcd.lab.config import (
        CleanReferenceConfig,
        EvalConfig,
        ModelConfig,
        PoolConfig,
        PretrainConfig,
        SFTConfig,
    )

    data = json.loads((Path(lab_dir) / "lab.json").read_text())["config"]
    kinds = {
        "model": ModelConfig,
        "pool": PoolConfig,
        "pretrain": PretrainConfig,
        "sft": SFTConfig,
        "evaluation": EvalConfig,
        "clean_reference": CleanReferenceConfig,
    }
    fields = {f.name for f in dataclasses.fields(LabConfig)}
    kw = {k: (kinds[k](**v) if k in kinds else v) for k, v in data.items() if k in fields}
    kw["styles"] = tuple(kw.get("styles", ()))
    return LabConfig(**kw)
