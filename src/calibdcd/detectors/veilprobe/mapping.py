"""VeilProbe module B/B': the mapping model and the pooled features read from it.

The mapping model is a BERT2BERT ``EncoderDecoderModel`` trained from scratch to map an input text
to the target LLM's suffixes for it (teacher-forced cross-entropy of the suffix given the text),
over all candidate texts and their perturbed copies together (one shared model: Q3; trained
transductively without labels: Q4). How it is trained is set by :class:`MappingConfig` (every
official ``Trainer`` behaviour is an option: padding to 512, no attention masks, pad labels,
``[CLS] suffix [SEP]`` labels shifted behind ``[CLS]``, clipping at 1.0, no decay on biases and
LayerNorm weights); :func:`training_inputs` builds exactly what the model receives.

Features (:func:`pooled_features`): for a text x, E(x) concatenates the encoder's embedding output
and every layer's hidden states and averages over positions; D(x) does the same for the decoder.
The decoder reads either the constant official input (:func:`constant_decoder_batch`) or each
observed suffix, teacher-forced as in training (:func:`decoder_batch`), then averaged over the
suffixes. See :class:`FeatureConfig` for pooling and attention masks.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from calibdcd.atomic import file_lock
from calibdcd.device import autocast, torch_device
from calibdcd.progress import inner_bar
from calibdcd.provenance import build_environment, library_versions
from calibdcd.resumable import ResumableTraining
from calibdcd.tiny_lm import bert_config

from .cache import atomic_write_text, build_once, content_key
from .config import FeatureConfig, MappingConfig
from .tokenization import train_wordpiece
from .torchutil import seed_everything

__all__ = [
    "MappingModel",
    "TrainStep",
    "constant_decoder_batch",
    "decoder_batch",
    "load_mapping_model",
    "pooled_features",
    "train_mapping_model",
    "training_inputs",
]


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
    from transformers import EncoderDecoderConfig, EncoderDecoderModel

    common = dict(
        vocab_size=len(tok),
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        intermediate_size=cfg.intermediate_size,
        max_positions=cfg.max_length,
        pad_id=tok.pad_token_id,
        dropout=cfg.dropout,
    )
    enc = bert_config(**common)
    dec = bert_config(**common, is_decoder=True, add_cross_attention=True)
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

    if cfg.tokenizer:  # a local directory or a hub id in the local hub cache
        from calibdcd.model_refs import resolve_model

        return AutoTokenizer.from_pretrained(
            str(resolve_model(cfg.tokenizer, need="tokenizer").path)
        )
    key = content_key("maptok", cfg.vocab_size, corpus, library_versions(("tokenizers",)))
    path = build_once(
        cache_dir / "mapping-tokenizer" / key,
        "tokenizer.json",
        lambda tmp: train_wordpiece(
            corpus, vocab_size=cfg.vocab_size, lowercase=True
        ).save_pretrained(str(tmp)),
    )
    return AutoTokenizer.from_pretrained(str(path))


def decoder_batch(
    tok, suffixes: Sequence[str], max_length: int, pad_to_max: bool, target_format: str
):
    """Teacher-forced decoder ``(input_ids, mask, labels)`` for ``suffixes``.

    ``target_format="official"``: labels are ``tok(suffix)`` with its specials,
    ``[CLS] suffix [SEP]``, and the decoder input is the labels shifted right behind the start
    token ``[CLS]`` (``[CLS] [CLS] suffix [SEP]`` with pads behind, as HF's
    ``shift_tokens_right``); ``"plain"``: input ``[CLS] suffix``, labels ``suffix [SEP]``.
    Width: ``max_length`` when ``pad_to_max``, else the longest decoder input.
    ``mask`` marks the positions that carry a real label; every other label is the [PAD] id.
    """
    import torch

    official = target_format == "official"
    if official:
        labs = tok(list(suffixes), truncation=True, max_length=max_length)["input_ids"]
    else:
        body = tok(
            list(suffixes), add_special_tokens=False, truncation=True, max_length=max_length - 1
        )["input_ids"]
        labs = [[*s, tok.sep_token_id] for s in body]
    inputs = [[tok.cls_token_id, *(lab if official else lab[:-1])] for lab in labs]
    width = max_length if pad_to_max else min(max_length, max(len(x) for x in inputs))
    ids = torch.full((len(labs), width), tok.pad_token_id, dtype=torch.long)
    labels = torch.full((len(labs), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(labs), width), dtype=torch.long)
    for i, (lab, inp) in enumerate(zip(labs, inputs, strict=True)):
        labels[i, : len(lab)] = torch.tensor(lab)
        mask[i, : len(lab)] = 1
        ids[i, : min(len(inp), width)] = torch.tensor(inp[:width])
    return ids, mask, labels


def constant_decoder_batch(tok, n: int, max_length: int, pad_to_max: bool):
    """The official constant decoder input for ``n`` texts: the tokenisation of the literal
    string ``"[CLS]"`` with its specials (``[CLS] [CLS] [SEP]``), padded to ``max_length`` when
    ``pad_to_max``. Returns ``(input_ids, attention_mask)``."""
    enc = tok(
        [tok.cls_token] * n,
        padding="max_length" if pad_to_max else True,
        truncation=True,
        max_length=max_length,
        return_tensors="pt",
    )
    return enc["input_ids"], enc["attention_mask"]


def training_inputs(tok, batch: Sequence[tuple[str, str]], cfg: MappingConfig):
    """``(model_kwargs, labels)`` of one training batch of (text, suffix) pairs, as ``cfg``
    says: padding (``train_pad_to_max``), attention masks (none when ``train_attend_pads``,
    as in the official run, so every attention sees the pads), label format and pad labels."""
    enc = tok(
        [t for t, _ in batch],
        padding="max_length" if cfg.train_pad_to_max else True,
        truncation=True,
        max_length=cfg.max_length,
        return_tensors="pt",
    )
    dec_ids, dec_mask, labels = decoder_batch(
        tok, [s for _, s in batch], cfg.max_length, cfg.train_pad_to_max, cfg.target_format
    )
    kwargs = {"input_ids": enc["input_ids"], "decoder_input_ids": dec_ids}
    if not cfg.train_attend_pads:
        kwargs["attention_mask"] = enc["attention_mask"]
        kwargs["decoder_attention_mask"] = dec_mask
    if cfg.labels_ignore_pad:
        labels[dec_mask == 0] = -100
    return kwargs, labels


def _optimizer(model, cfg: MappingConfig):
    """AdamW; without ``decay_bias_and_norm`` biases and LayerNorm weights are not decayed
    (what the HF Trainer does)."""
    import torch

    if cfg.decay_bias_and_norm:
        groups = [{"params": list(model.parameters()), "weight_decay": cfg.weight_decay}]
    else:
        norm = {
            id(p)
            for m in model.modules()
            if isinstance(m, torch.nn.LayerNorm)
            for p in m.parameters()
        }
        decay, rest = [], []
        for name, p in model.named_parameters():
            (rest if "bias" in name or id(p) in norm else decay).append(p)
        groups = [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": rest, "weight_decay": 0.0},
        ]
    return torch.optim.AdamW(groups, lr=cfg.learning_rate)


@dataclasses.dataclass
class TrainStep:
    """What one optimisation step saw, for ``train_mapping_model(on_step=...)``: the model's
    inputs and labels, the loss, the gradient norm before clipping; called after clipping and
    before the optimiser step (the model's ``.grad`` are the clipped gradients)."""

    step: int
    inputs: dict
    labels: object
    loss: float
    grad_norm: float
    model: object


def train_mapping_model(
    texts: Sequence[str],
    suffixes: Sequence[Sequence[str]],
    cfg: MappingConfig,
    cache_dir: str | Path,
    *,
    progress: bool = True,
    on_step: Callable[[TrainStep], None] | None = None,
    save_every: float | None = None,
) -> MappingModel:
    """Train (or load from ``<cache>/mapping/<key>``) the mapping model on every (text, suffix).
    ``on_step`` (tests, diagnostics) is called at every step of a training that runs.

    A training that runs saves its whole state every ``save_every`` seconds (None:
    :func:`calibdcd.resumable.save_every`, 10 minutes unless ``$CALIBDCD_SAVE_EVERY`` says) to
    ``<cache>/mapping/.<key>.training.resume.pt``; a later call with the same inputs resumes
    from it and ends with the bytes an unbroken training gives (:mod:`calibdcd.resumable`). Two
    processes asking for one model train it once: the second waits for the first's lock, then
    loads."""
    cache_dir = Path(cache_dir)
    pairs = _pairs(texts, suffixes)
    if not pairs:
        raise ValueError("no (text, suffix) pairs to train the mapping model on")
    device = torch_device(cfg.device)
    cfg_key = dataclasses.asdict(cfg)
    cfg_key.pop("device")
    # library versions, device type and CPU threads change the trained bytes
    key = content_key("mapping", cfg_key, pairs, build_environment(device.type))
    path = cache_dir / "mapping" / key
    if (path / "done.json").exists():
        return load_mapping_model(path, cfg)
    waiting = f"mapping model {key}: another process is training it; waiting for it to finish"
    with file_lock(cache_dir / "mapping" / f"{key}.lock", waiting=waiting):
        if (path / "done.json").exists():  # trained by the process we waited for
            return load_mapping_model(path, cfg)
        return _train(pairs, cfg, cfg_key, cache_dir, path, device, progress, on_step, save_every)


def _train(pairs, cfg, cfg_key, cache_dir, path, device, progress, on_step, save_every):
    """The training of :func:`train_mapping_model` (under its lock), resumed when saved."""
    import torch

    t0 = time.perf_counter()
    seed_everything(cfg.seed)
    corpus = list(dict.fromkeys([t for t, _ in pairs] + [s for _, s in pairs if s]))
    tok = _tokenizer(cfg, corpus, cache_dir)
    model = _build(cfg, tok).to(device).train()
    gen = torch.Generator().manual_seed(cfg.seed)
    per_epoch = math.ceil(len(pairs) / cfg.batch_size)
    steps = per_epoch * cfg.epochs
    opt = _optimizer(model, cfg)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1.0 - s / steps))
    resume = ResumableTraining.beside(
        path, "training", f"{path.name}-{steps}", every_seconds=save_every
    )
    # the data order is drawn from ``gen`` once an epoch; a resumed epoch keeps the saved one
    saved = resume.restore(model, opt, sched, generators={"order": gen})
    step = saved["step"] if saved else 0
    before = saved["seconds"] if saved else 0.0
    order = saved["order"] if saved else None
    bar = inner_bar(total=steps, desc="mapping model", unit="step", enabled=progress)
    bar.update(step)
    while step < steps:
        b = step % per_epoch
        if b == 0:
            order = torch.randperm(len(pairs), generator=gen).tolist()
        k = b * cfg.batch_size
        batch = [pairs[i] for i in order[k : k + cfg.batch_size]]
        inputs, labels = training_inputs(tok, batch, cfg)
        with autocast(device, cfg.bf16):
            out = model(**{n: v.to(device) for n, v in inputs.items()})
            logits = out.logits.float()
        loss = torch.nn.functional.cross_entropy(
            logits.view(-1, logits.shape[-1]), labels.to(device).view(-1), ignore_index=-100
        )
        opt.zero_grad()
        loss.backward()
        if cfg.max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        elif on_step is not None:
            norm = torch.nn.utils.get_total_norm(
                [p.grad for p in model.parameters() if p.grad is not None]
            )
        if on_step is not None:
            on_step(TrainStep(step, inputs, labels, loss.item(), float(norm), model))
        opt.step()
        sched.step()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if step < steps:
            progress_now = {
                "step": step,
                "order": order,
                "seconds": before + time.perf_counter() - t0,
            }
            resume.maybe_save(progress_now, model, opt, sched, generators={"order": gen})
    bar.close()
    model.eval()
    seconds = before + time.perf_counter() - t0
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    atomic_write_text(
        path / "done.json",
        json.dumps(
            {
                "config": cfg_key,
                "pairs": len(pairs),
                "train_seconds": seconds,
                "resumed": resume.restored,
            }
        ),
    )
    resume.discard()
    return MappingModel(path, tok, model, cfg, seconds)


def load_mapping_model(path: str | Path, cfg: MappingConfig) -> MappingModel:
    """A trained mapping model from its directory (``save_pretrained`` files + ``done.json``)."""
    from transformers import AutoTokenizer, EncoderDecoderModel

    path = Path(path)
    if not (path / "done.json").is_file():
        raise FileNotFoundError(f"{path}: not a trained mapping model (no done.json)")
    info = json.loads((path / "done.json").read_text())
    device = torch_device(cfg.device)
    tok = AutoTokenizer.from_pretrained(str(path))
    model = EncoderDecoderModel.from_pretrained(str(path)).to(device).eval()
    return MappingModel(path, tok, model, cfg, float(info.get("train_seconds", 0.0)))


def _pool(hidden: tuple, mask, all_positions: bool) -> np.ndarray:
    import torch

    h = torch.cat([x.float() for x in hidden], dim=-1)
    if all_positions:
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
    """(E, D): the pooled encoder block and decoder block of every text, each (n, block_width).

    The encoder always gets its padding mask (as the official ``model.encoder(**inputs)``);
    with ``attention="official"`` the decoder's self-attention and cross-attention get none.
    ``suffixes`` are needed (one non-empty list per text) for ``decoder_input="suffix"`` only.
    """
    import torch

    all_positions = fcfg.pooling == "all"
    masked = fcfg.attention == "masked"
    pad = fcfg.pad_to_max
    if fcfg.decoder_input == "suffix":
        if suffixes is None or len(suffixes) != len(texts):
            raise ValueError("decoder_input='suffix' needs one suffix list per text")
        if any(len(s) == 0 for s in suffixes):
            raise ValueError("every text needs at least one suffix for decoder_input='suffix'")
    tok, model, cfg, device = mm.tokenizer, mm.model, mm.config, mm.device
    E, D = [], []
    with torch.no_grad():
        batches = range(0, len(texts), fcfg.batch_size)
        for k in inner_bar(batches, desc="VeilProbe features", unit="batch", enabled=progress):
            batch = list(texts[k : k + fcfg.batch_size])
            enc = tok(
                batch,
                padding="max_length" if pad else True,
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
            E.append(_pool(eo.hidden_states, enc["attention_mask"], all_positions))
            states = eo.last_hidden_state
            if fcfg.decoder_input == "constant":
                owners = list(range(len(batch)))
                dec_ids, dec_mask = constant_decoder_batch(tok, len(batch), cfg.max_length, pad)
            else:
                owners = [i for i, ss in enumerate(suffixes[k : k + len(batch)]) for _ in ss]
                flat = [s for ss in suffixes[k : k + len(batch)] for s in ss]
                dec_ids, dec_mask, _ = decoder_batch(
                    tok, flat, cfg.max_length, pad, cfg.target_format
                )
            dec_ids, dec_mask = dec_ids.to(device), dec_mask.to(device)
            idx = torch.tensor(owners, device=device)
            with autocast(device, cfg.bf16):
                do = model.decoder(
                    input_ids=dec_ids,
                    attention_mask=dec_mask if masked else None,
                    encoder_hidden_states=states.index_select(0, idx),
                    encoder_attention_mask=enc["attention_mask"].index_select(0, idx)
                    if masked
                    else None,
                    output_hidden_states=True,
                )
            pooled = _pool(do.hidden_states, dec_mask, all_positions)
            sums = np.zeros((len(batch), pooled.shape[1]))
            counts = np.zeros(len(batch))
            np.add.at(sums, owners, pooled)
            np.add.at(counts, owners, 1)
            D.append(sums / counts[:, None])
    return np.concatenate(E).astype(np.float32), np.concatenate(D).astype(np.float32)
