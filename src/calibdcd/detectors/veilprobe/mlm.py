"""Tiny local language models trained offline on a text pool, cached on disk.

* :func:`train_masked_lm` - a small BERT-style fill-mask model (the official code uses
  ``bert-base-cased``; any local fill-mask model can replace it).
* :func:`train_causal_proxy` - a small causal LM used as the GiLOT / leave-one-out proxy when no
  local proxy (e.g. a Qwen2.5-0.5B for a Qwen target) is given.
* :func:`fill_mask` - top-k predictions for one ``[MASK]`` position.

Both models share one cased WordPiece tokenizer trained on the pool. Training uses the texts
only (never labels), like the official mapping model. Artefacts live in
``<cache>/mlm/<key>`` and ``<cache>/proxy/<key>``, keyed by the texts and the config.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path

from calibdcd.device import torch_device
from calibdcd.progress import inner_bar
from calibdcd.provenance import build_environment, library_versions
from calibdcd.tiny_lm import bert_config, llama_config

from .cache import atomic_write_text, build_once, content_key
from .config import MaskedLMConfig
from .tokenization import train_wordpiece
from .torchutil import seed_everything

__all__ = ["fill_mask", "load_masked_lm", "train_causal_proxy", "train_masked_lm"]


def _texts(texts: Sequence[str]) -> list[str]:
    out = [t for t in texts if isinstance(t, str) and t.strip()]
    if not out:
        raise ValueError("texts is empty: nothing to train the local model on")
    return out


def _chunks(tokenizer, texts: list[str], max_length: int) -> list[list[int]]:
    """Token id windows of at most ``max_length`` (with [CLS]/[SEP]) covering every text."""
    body = max_length - 2
    out: list[list[int]] = []
    for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        for start in range(0, max(len(ids), 1), body):
            piece = ids[start : start + body]
            out.append([tokenizer.cls_token_id, *piece, tokenizer.sep_token_id])
    return out


def _pad(batch: list[list[int]], pad_id: int):
    import torch

    width = max(len(x) for x in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, x in enumerate(batch):
        ids[i, : len(x)] = torch.tensor(x)
        mask[i, : len(x)] = 1
    return ids, mask


def _shape(tok, cfg: MaskedLMConfig) -> dict[str, int]:
    """The tiny model's shape (:mod:`calibdcd.tiny_lm`) for the pool's tokenizer ``tok``."""
    return {
        "vocab_size": len(tok),
        "hidden_size": cfg.hidden_size,
        "num_layers": cfg.num_layers,
        "num_heads": cfg.num_heads,
        "intermediate_size": cfg.intermediate_size,
        "max_positions": cfg.max_length,
    }


def _train_loop(model, chunks, cfg: MaskedLMConfig, make_batch, desc: str, progress: bool):
    import torch

    device = torch_device(None)
    model.to(device).train()
    gen = torch.Generator().manual_seed(cfg.seed)
    steps_per_epoch = math.ceil(len(chunks) / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, total // 20)) * max(0.0, 1 - s / total)
    )
    bar = inner_bar(total=total, desc=desc, unit="step", enabled=progress)
    for _ in range(cfg.epochs):
        order = torch.randperm(len(chunks), generator=gen).tolist()
        for k in range(0, len(order), cfg.batch_size):
            batch = [chunks[i] for i in order[k : k + cfg.batch_size]]
            inputs = {key: v.to(device) for key, v in make_batch(batch, gen).items()}
            loss = model(**inputs).loss
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
    bar.close()
    model.eval()
    return model


def _model_path(kind: str, texts: list[str], cfg: MaskedLMConfig, cache_dir: Path) -> Path:
    """Where the ``kind`` model trained on ``texts`` with ``cfg`` is cached (complete when it
    holds ``done.json``, which :func:`build_once` checks)."""
    # library versions, device type and CPU threads change the trained bytes
    key = content_key(kind, dataclasses.asdict(cfg), texts, build_environment(None))
    return Path(cache_dir) / kind / key


def _tokenizer_for(texts: list[str], cfg: MaskedLMConfig, cache_dir: Path):
    from transformers import AutoTokenizer

    key = content_key("tok", cfg.vocab_size, texts, library_versions(("tokenizers",)))
    path = build_once(
        Path(cache_dir) / "tokenizer" / key,
        "tokenizer.json",
        lambda tmp: train_wordpiece(
            texts, vocab_size=cfg.vocab_size, lowercase=False
        ).save_pretrained(str(tmp)),
    )
    return AutoTokenizer.from_pretrained(str(path))


def _train_cached(
    kind: str,
    texts: Sequence[str],
    cache_dir: str | Path,
    config: MaskedLMConfig | None,
    build,
    desc: str,
    progress: bool,
) -> Path:
    """The cached tiny-model recipe shared by the masked LM and the proxy.

    Reuse ``<cache_dir>/<kind>/<key>`` when complete; else seed, train the pool's tokenizer,
    build the model with ``build(tok, cfg) -> (model, make_batch)``, train it and save it with
    its tokenizer."""
    cfg = config or MaskedLMConfig()
    pool = _texts(texts)
    path = _model_path(kind, pool, cfg, Path(cache_dir))

    def train_into(tmp: Path) -> None:  # under the lock: a second process waits, then reuses
        seed_everything(cfg.seed)
        tok = _tokenizer_for(pool, cfg, Path(cache_dir))
        model, make_batch = build(tok, cfg)
        _train_loop(model, _chunks(tok, pool, cfg.max_length), cfg, make_batch, desc, progress)
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        atomic_write_text(tmp / "done.json", json.dumps({"config": dataclasses.asdict(cfg)}))

    waiting = f"waiting for another process training VeilProbe's {desc} ({path})"
    return build_once(path, "done.json", train_into, waiting=waiting)


def train_masked_lm(
    texts: Sequence[str],
    cache_dir: str | Path,
    config: MaskedLMConfig | None = None,
    *,
    progress: bool = True,
) -> Path:
    """Train (or reuse from the cache) a tiny BERT fill-mask model on ``texts``; returns its dir."""

    def build(tok, cfg: MaskedLMConfig):
        import torch
        from transformers import BertForMaskedLM

        model = BertForMaskedLM(bert_config(pad_id=tok.pad_token_id, **_shape(tok, cfg)))
        special = torch.tensor(sorted(set(tok.all_special_ids)))

        def make_batch(batch, gen):
            ids, mask = _pad(batch, tok.pad_token_id)
            labels = ids.clone()
            prob = torch.full(ids.shape, cfg.mask_probability)
            prob[torch.isin(ids, special)] = 0.0
            chosen = torch.bernoulli(prob, generator=gen).bool()
            labels[~chosen] = -100
            roll = torch.rand(ids.shape, generator=gen)
            ids = ids.clone()
            ids[chosen & (roll < 0.8)] = tok.mask_token_id
            rand_pos = chosen & (roll >= 0.8) & (roll < 0.9)
            ids[rand_pos] = torch.randint(len(tok), ids.shape, generator=gen)[rand_pos]
            return {"input_ids": ids, "attention_mask": mask, "labels": labels}

        return model, make_batch

    return _train_cached("mlm", texts, cache_dir, config, build, "masked LM", progress)


def train_causal_proxy(
    texts: Sequence[str],
    cache_dir: str | Path,
    config: MaskedLMConfig | None = None,
    *,
    progress: bool = True,
) -> Path:
    """Train (or reuse) a tiny Llama-style causal LM on ``texts`` as an attribution proxy."""

    def build(tok, cfg: MaskedLMConfig):
        from transformers import LlamaForCausalLM

        model = LlamaForCausalLM(
            llama_config(
                pad_id=tok.pad_token_id,
                bos_id=tok.cls_token_id,
                eos_id=tok.sep_token_id,
                **_shape(tok, cfg),
            )
        )
        model.generation_config.pad_token_id = tok.pad_token_id
        model.generation_config.eos_token_id = tok.sep_token_id
        model.generation_config.bos_token_id = tok.cls_token_id

        def make_batch(batch, gen):
            ids, mask = _pad(batch, tok.pad_token_id)
            labels = ids.clone()
            labels[mask == 0] = -100
            return {"input_ids": ids, "attention_mask": mask, "labels": labels}

        return model, make_batch

    return _train_cached("proxy", texts, cache_dir, config, build, "proxy LM", progress)


def load_masked_lm(path: str | Path):
    """(tokenizer, model) of a fill-mask model (a local directory or a hub id in the local hub
    cache), in eval mode."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from calibdcd.model_refs import resolve_model

    p = resolve_model(path).path
    if not p.is_dir():
        raise ValueError(f"masked LM path {str(p)!r} is not a directory")
    tok = AutoTokenizer.from_pretrained(str(p))
    if tok.mask_token is None:
        raise ValueError(f"tokenizer at {str(p)!r} has no mask token: not a fill-mask model")
    model = AutoModelForMaskedLM.from_pretrained(str(p)).eval()
    return tok, model


def fill_mask(tokenizer, model, masked_texts: Sequence[str], top_k: int = 5) -> list[list[str]]:
    """For each text holding exactly one mask token, the ``top_k`` predicted token strings
    (decoded, stripped), best first - what the HF fill-mask pipeline returns as ``token_str``."""
    import torch

    if not masked_texts:
        return []
    limit = min(512, int(getattr(model.config, "max_position_embeddings", 512)))
    enc = tokenizer(
        list(masked_texts), padding=True, truncation=True, return_tensors="pt", max_length=limit
    )
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(**{k: v.to(device) for k, v in enc.items()}).logits
    out: list[list[str]] = []
    for i in range(len(masked_texts)):
        pos = (enc["input_ids"][i] == tokenizer.mask_token_id).nonzero()
        if len(pos) == 0:  # the mask was truncated away
            out.append([])
            continue
        top = torch.topk(logits[i, int(pos[0, 0])].float(), top_k).indices.tolist()
        out.append([tokenizer.decode([t]).strip() for t in top])
    return out
