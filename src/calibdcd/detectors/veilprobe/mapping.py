"""VeilProbe module B/B': the mapping model and the pooled features read from it.

The mapping model is a BERT2BERT ``EncoderDecoderModel`` trained from scratch to map an input text
to the target LLM's suffixes for it (teacher-forced cross-entropy of the suffix given the text),
over all candidate texts and their perturbed copies together (one shared model: Q3; trained
transductively without labels: Q4).

Target-side convention (a deliberate simplification of the official quirk): the decoder reads
``[CLS] + suffix`` and predicts ``suffix + [SEP]`` (official labels are the tokenizer output
``[CLS] suffix [SEP] [PAD]...``, shifted right behind another ``[CLS]``). ``labels_ignore_pad``
chooses whether the padded label positions (id of [PAD]) are trained as in the official code.

Features (:func:`pooled_features`): for a text x and its suffixes, E(x) concatenates the encoder's
embedding output and every layer's hidden states and averages over positions; D(x) does the same
for the decoder. With ``decoder_input="suffix"`` the decoder is teacher-forced on each observed
suffix (pooled over its positions, then averaged over the suffixes); ``"dummy"`` is the official
``"[CLS]"``-string decoder input. ``pooling="official"`` pads to ``max_length`` and averages over
every position with no encoder/decoder masks; ``"masked"`` averages real tokens only.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from calibdcd.provenance import build_environment, library_versions

from .cache import atomic_write_text, content_key
from .config import FeatureConfig, MappingConfig
from .tokenization import train_wordpiece
from .torchutil import autocast, pick_device, seed_everything

__all__ = ["MappingModel", "pooled_features", "train_mapping_model"]


@dataclasses.dataclass
class MappingModel:
    path: Path
    tokenizer: object
    model: object
    config: MappingConfig
    train_seconds: float = 0.0

    @property
    def key(self) -> str:
        return self.path.name

    @property
    def device(self):
        return next(self.model.parameters()).device


def _build(cfg: MappingConfig, tok):
    from transformers import BertConfig, EncoderDecoderConfig, EncoderDecoderModel

    common = dict(
        vocab_size=len(tok),
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_length,
        hidden_dropout_prob=cfg.dropout,
        attention_probs_dropout_prob=cfg.dropout,
        pad_token_id=tok.pad_token_id,
    )
    enc = BertConfig(**common)
    dec = BertConfig(**common, is_decoder=True, add_cross_attention=True)
    conf = EncoderDecoderConfig.from_encoder_decoder_configs(enc, dec)
    conf.decoder_start_token_id = tok.cls_token_id
    conf.pad_token_id = tok.pad_token_id
    return EncoderDecoderModel(config=conf)


def _pairs(texts: Sequence[str], suffixes: Sequence[Sequence[str]]) -> list[tuple[str, str]]:
    if len(texts) != len(suffixes):
        raise ValueError(f"got {len(texts)} texts but {len(suffixes)} suffix lists")
    return [(t, s) for t, ss in zip(texts, suffixes, strict=True) for s in ss]


def _tokenizer(cfg: MappingConfig, corpus: list[str], cache_dir: Path):
    from transformers import AutoTokenizer

    if cfg.tokenizer:
        return AutoTokenizer.from_pretrained(cfg.tokenizer)
    key = content_key("maptok", cfg.vocab_size, corpus, library_versions(("tokenizers",)))
    path = cache_dir / "mapping-tokenizer" / key
    if not (path / "tokenizer.json").exists():
        train_wordpiece(corpus, vocab_size=cfg.vocab_size, lowercase=True).save_pretrained(
            str(path)
        )
    return AutoTokenizer.from_pretrained(str(path))


def _decoder_batch(tok, suffixes: Sequence[str], max_length: int, pad_to_max: bool):
    """Decoder inputs ``[CLS] + suffix`` and labels ``suffix + [SEP]`` (pads: label = pad id)."""
    import torch

    body = tok(list(suffixes), add_special_tokens=False, truncation=True, max_length=max_length - 1)
    seqs = body["input_ids"]
    width = max_length if pad_to_max else max(len(s) for s in seqs) + 1
    ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
    labels = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s) + 1] = torch.tensor([tok.cls_token_id, *s])
        labels[i, : len(s) + 1] = torch.tensor([*s, tok.sep_token_id])
        mask[i, : len(s) + 1] = 1
    return ids, mask, labels


def train_mapping_model(
    texts: Sequence[str],
    suffixes: Sequence[Sequence[str]],
    cfg: MappingConfig,
    cache_dir: str | Path,
    *,
    progress: bool = True,
) -> MappingModel:
    """Train (or load from ``<cache>/mapping/<key>``) the mapping model on every (text, suffix)."""
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoTokenizer, EncoderDecoderModel

    cache_dir = Path(cache_dir)
    pairs = _pairs(texts, suffixes)
    if not pairs:
        raise ValueError("no (text, suffix) pairs to train the mapping model on")
    device = pick_device(cfg.device)
    cfg_key = dataclasses.asdict(cfg)
    cfg_key.pop("device")
    # library versions, device type and CPU threads change the trained bytes
    key = content_key("mapping", cfg_key, pairs, build_environment(device.type))
    path = cache_dir / "mapping" / key
    if (path / "done.json").exists():
        info = json.loads((path / "done.json").read_text())
        tok = AutoTokenizer.from_pretrained(str(path))
        model = EncoderDecoderModel.from_pretrained(str(path)).to(device).eval()
        return MappingModel(path, tok, model, cfg, float(info.get("train_seconds", 0.0)))

    t0 = time.perf_counter()
    seed_everything(cfg.seed)
    corpus = list(dict.fromkeys([t for t, _ in pairs] + [s for _, s in pairs if s]))
    tok = _tokenizer(cfg, corpus, cache_dir)
    model = _build(cfg, tok).to(device).train()
    gen = torch.Generator().manual_seed(cfg.seed)
    steps = math.ceil(len(pairs) / cfg.batch_size) * cfg.epochs
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1.0 - s / steps))
    bar = tqdm(total=steps, desc="mapping model", disable=not progress)
    for _ in range(cfg.epochs):
        order = torch.randperm(len(pairs), generator=gen).tolist()
        for k in range(0, len(order), cfg.batch_size):
            batch = [pairs[i] for i in order[k : k + cfg.batch_size]]
            enc = tok(
                [t for t, _ in batch],
                padding=True,
                truncation=True,
                max_length=cfg.max_length,
                return_tensors="pt",
            )
            dec_ids, dec_mask, labels = _decoder_batch(
                tok, [s for _, s in batch], cfg.max_length, pad_to_max=not cfg.labels_ignore_pad
            )
            if cfg.labels_ignore_pad:
                labels[dec_mask == 0] = -100
            with autocast(device, cfg.bf16):
                out = model(
                    input_ids=enc["input_ids"].to(device),
                    attention_mask=enc["attention_mask"].to(device),
                    decoder_input_ids=dec_ids.to(device),
                    decoder_attention_mask=dec_mask.to(device),
                )
                logits = out.logits.float()
            loss = torch.nn.functional.cross_entropy(
                logits.view(-1, logits.shape[-1]), labels.to(device).view(-1), ignore_index=-100
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
    bar.close()
    model.eval()
    seconds = time.perf_counter() - t0
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    atomic_write_text(
        path / "done.json",
        json.dumps({"config": cfg_key, "pairs": len(pairs), "train_seconds": seconds}),
    )
    return MappingModel(path, tok, model, cfg, seconds)


def _pool(hidden: tuple, mask, official: bool) -> np.ndarray:
    import torch

    h = torch.cat([x.float() for x in hidden], dim=-1)
    if official:
        return h.mean(dim=1).cpu().numpy()
    m = mask.unsqueeze(-1).to(h.dtype)
    return ((h * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)).cpu().numpy()


def pooled_features(
    mm: MappingModel,
    texts: Sequence[str],
    suffixes: Sequence[Sequence[str]] | None,
    fcfg: FeatureConfig,
    *,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(E, D): the pooled encoder block and decoder block of every text, each (n, block_width)."""
    import torch
    from tqdm.auto import tqdm

    official = fcfg.pooling == "official"
    if fcfg.decoder_input == "suffix":
        if suffixes is None or len(suffixes) != len(texts):
            raise ValueError("decoder_input='suffix' needs one suffix list per text")
        if any(len(s) == 0 for s in suffixes):
            raise ValueError("every text needs at least one suffix for decoder_input='suffix'")
    tok, model, cfg, device = mm.tokenizer, mm.model, mm.config, mm.device
    E, D = [], []
    with torch.no_grad():
        for k in tqdm(range(0, len(texts), fcfg.batch_size), desc="features", disable=not progress):
            batch = list(texts[k : k + fcfg.batch_size])
            enc = tok(
                batch,
                padding="max_length" if official else True,
                truncation=True,
                max_length=cfg.max_length,
                return_tensors="pt",
            ).to(device)
            with autocast(device, cfg.bf16):
                eo = model.encoder(
                    input_ids=enc["input_ids"],
                    attention_mask=enc["attention_mask"],
                    output_hidden_states=True,
                )
            E.append(_pool(eo.hidden_states, enc["attention_mask"], official))
            states = eo.last_hidden_state
            if fcfg.decoder_input == "dummy":
                owners = list(range(len(batch)))
                dummy = tok(
                    ["[CLS]"] * len(batch),
                    padding="max_length" if official else True,
                    max_length=cfg.max_length,
                    return_tensors="pt",
                ).to(device)
                dec_ids, dec_mask = dummy["input_ids"], dummy["attention_mask"]
            else:
                owners = [i for i, ss in enumerate(suffixes[k : k + len(batch)]) for _ in ss]
                flat = [s for ss in suffixes[k : k + len(batch)] for s in ss]
                dec_ids, dec_mask, _ = _decoder_batch(tok, flat, cfg.max_length, official)
                dec_ids, dec_mask = dec_ids.to(device), dec_mask.to(device)
            idx = torch.tensor(owners, device=device)
            with autocast(device, cfg.bf16):
                do = model.decoder(
                    input_ids=dec_ids,
                    attention_mask=None if official else dec_mask,
                    encoder_hidden_states=states.index_select(0, idx),
                    encoder_attention_mask=None
                    if official
                    else enc["attention_mask"].index_select(0, idx),
                    output_hidden_states=True,
                )
            pooled = _pool(do.hidden_states, dec_mask, official)
            sums = np.zeros((len(batch), pooled.shape[1]))
            counts = np.zeros(len(batch))
            np.add.at(sums, owners, pooled)
            np.add.at(counts, owners, 1)
            D.append(sums / counts[:, None])
    return np.concatenate(E).astype(np.float32), np.concatenate(D).astype(np.float32)
