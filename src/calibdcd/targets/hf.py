"""The transformers backend: a local causal LM as a black-box Target.

Generation uses calibdcd's own decoding loop (KV cache, left padding, EOS stop) instead of
``model.generate`` so that **a sampled completion depends only on (prompt, parameters, seed, sample
index)**: every row draws its randomness from a counter-based stream,
``u_t = blake2b(blake2b(seed, sample index, prompt), t)`` mapped to [0, 1), one uniform per decoding
step, used for inverse-CDF sampling over the temperature/top-k/top-p filtered distribution
(sorted by probability; in vocabulary order when neither top-k nor top-p truncates). Nothing
depends on the batch, its order, ``n``, the device's RNG or torch's RNG state. The only remaining
source of batch dependence is floating-point: a row's logits can differ in the last bits between
batch compositions (padding, kernel blocking). That flips a token only when ``u`` lands within
about that rounding error of a CDF boundary: never observed in the tests on CPU fp32, nor in
fp32 on an H100; in bf16 on that H100, 2 of 24 prompts' sampled completions differed between
batch 32 and batch 1 (docs/scaling.md). The generation cache
makes results stable anyway: the first stored completion is the one every later run gets.

Other choices:
* ``repetition_penalty`` p != 1 is applied to the raw logits before temperature, top-k and
  top-p, exactly as transformers' ``RepetitionPenaltyLogitsProcessor`` (in float32): every token
  id present in the row's prompt (its BOS included) or its completion so far has its logit
  divided by p when positive, multiplied by p when negative, also under greedy decoding. Only the
  row's own tokens count, never left padding (``model.generate`` on a left-padded batch also
  penalises the pad id, which makes its output depend on the batch), so batch invariance holds.
* Decoding fields a caller leaves as ``"inherit"`` are filled from the checkpoint's
  ``generation_config`` (``generation_config.json``; transformers' defaults where it is silent:
  top-k 50, top-p 1.0, repetition penalty 1.0, and greedy when ``do_sample`` is false), as a
  ``pipeline``/``generate`` call that sets only some fields would. ``resolve_params`` does it and
  ``generation_record`` reports it (with any sampling field of the checkpoint this loop does not
  implement, e.g. ``min_p``, under ``not_applied``).
* Greedy decoding (``temperature == 0``) takes the first arg-max; its ``n`` samples are identical
  and are computed once.
* Prompts are encoded with ``add_special_tokens=True`` (the tokenizer adds its BOS, as vLLM and
  SGLang do for ``/v1/completions``); completions are decoded relative to the prompt
  (``decode(prompt + new)[len(decode(prompt)):]``) with ``skip_special_tokens=True`` by default; the
  EOS token that stops a row is not part of its completion.
* ``name`` = ``hf:<model dir or GGUF file name>@<content hash of weights, config and tokenizer
  files>/<dtype>``. It is path-independent (a copied checkpoint keeps its cache) and changes when
  the weights change. The hash is computed once per file (memoised by path, size and mtime).
* GGUF checkpoints (a ``.gguf`` path, or a directory holding one GGUF and no ``config.json``) are
  dequantised once and saved as a plain safetensors checkpoint in the cache directory
  (``save_pretrained`` refuses GGUF-loaded models, so the model is rebuilt from its config first).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from calibdcd.atomic import atomic_directory
from calibdcd.device import resolve_device, resolve_dtype
from calibdcd.model_refs import checkpoint_identity, resolve_model
from calibdcd.paths import cache_root
from calibdcd.progress import inner_bar
from calibdcd.targets.base import (
    GenerationParams,
    register_backend,
    resolve_params,
    validate_prompts,
)
from calibdcd.targets.logprobs import TextLogprobs, causal_lm_logprobs, check_logprob_inputs

__all__ = [
    "HFTarget",
    "apply_repetition_penalty",
    "checkpoint_decoding",
    "convert_gguf",
    "detect_family",
    "row_uniform",
]

log = logging.getLogger(__name__)

# --- GGUF ----------------------------------------------------------------------------------------


def convert_gguf(gguf_path: str | Path, cache_dir: str | Path | None = None) -> Path:
    """Dequantise a GGUF file once into a plain transformers checkpoint (safetensors + tokenizer)
    under ``<cache_dir>/gguf/<stem>-<hash>``; later calls return the cached copy."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = Path(gguf_path).resolve()
    fp = checkpoint_identity(src, cache_dir)[:16]
    root = cache_root(cache_dir) / "gguf"
    final = root / f"{src.stem}-{fp}"
    if (final / "config.json").exists():
        return final
    with atomic_directory(final) as tmp:  # converted concurrently by another process: theirs
        tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        loaded = AutoModelForCausalLM.from_pretrained(
            str(src.parent), gguf_file=src.name, dtype=torch.float32
        )
        cfg = loaded.config.to_dict()
        cfg.pop("quantization_config", None)
        plain = AutoModelForCausalLM.from_config(type(loaded.config).from_dict(cfg))
        missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
        if unexpected or [k for k in missing if "lm_head" not in k]:
            raise ValueError(
                f"model: GGUF conversion of {str(src)!r} lost weights "
                f"(missing={missing}, unexpected={unexpected})"
            )
        if loaded.generation_config is not None:
            plain.generation_config = loaded.generation_config
        plain.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "calibdcd-source.json").write_text(json.dumps({"gguf": str(src)}))
    return final


# --- family --------------------------------------------------------------------------------------


def detect_family(model_dir: str | Path, config: Any = None, tokenizer: Any = None) -> str | None:
    """The chat family used to pick boundary views: ``calibdcd.json`` (``{"family": ...}``, as the
    lab writes it) wins; else inferred from the config's ``model_type``, the chat template and the
    directory name; ``None`` when unknown (views then come from the tokenizer's chat template)."""
    d = Path(model_dir)
    meta = d / "calibdcd.json"
    if meta.is_file():
        try:
            fam = json.loads(meta.read_text()).get("family")
        except (json.JSONDecodeError, AttributeError) as e:
            raise ValueError(f"{meta}: not a JSON object with a 'family' field ({e})") from e
        if fam:
            return str(fam)
    name = d.name.lower()
    mt = str(getattr(config, "model_type", "") or "").lower()
    tmpl = str(getattr(tokenizer, "chat_template", "") or "")
    if "deepseek-r1-distill-qwen" in name or ("<｜Assistant｜>" in tmpl and mt == "qwen2"):
        return "deepseek-r1-distill-qwen"
    if re.search(r"llama-?3\.1", name) or (mt == "llama" and "<|start_header_id|>" in tmpl):
        return "llama3.1"
    if re.search(r"qwen2\.5", name) or (mt == "qwen2" and "<|im_start|>" in tmpl):
        return "qwen2.5"
    return None


# --- randomness ----------------------------------------------------------------------------------


def _row_key(prompt: str, seed: int, sample: int) -> bytes:
    h = hashlib.blake2b(f"{seed}\0{sample}\0".encode(), digest_size=16)
    h.update(prompt.encode("utf-8", "surrogatepass"))
    return h.digest()


def row_uniform(key: bytes, step: int) -> float:
    """The uniform in [0, 1) that decoding step ``step`` of a row uses (counter-based stream)."""
    d = hashlib.blake2b(key + step.to_bytes(8, "little"), digest_size=8).digest()
    return int.from_bytes(d, "little") / 2.0**64


# --- decoding parameters -------------------------------------------------------------------------

#: sampling fields of a generation_config that this backend's loop does not implement, with the
#: values that make them a no-op
_NOT_APPLIED = {
    "min_p": (None, 0.0),
    "typical_p": (None, 1.0),
    "epsilon_cutoff": (None, 0.0),
    "eta_cutoff": (None, 0.0),
    "no_repeat_ngram_size": (None, 0),
    "top_h": (None, 1.0),
}


def checkpoint_decoding(generation_config: Any) -> dict[str, Any]:
    """The decoding a checkpoint's ``generation_config`` asks for, as :class:`GenerationParams`
    fields (transformers' global defaults where a field is unset: top-k 50, top-p 1.0,
    temperature 1.0, repetition penalty 1.0, ``do_sample`` False = greedy = temperature 0), plus
    ``not_applied``: its sampling fields this backend does not implement, where not a no-op."""

    def get(name: str, default: Any) -> Any:
        v = getattr(generation_config, name, None) if generation_config is not None else None
        return default if v is None else v

    do_sample = bool(get("do_sample", False))
    top_k = int(get("top_k", 50))
    return {
        "temperature": float(get("temperature", 1.0)) if do_sample else 0.0,
        "top_k": top_k if top_k > 0 else None,
        "top_p": float(get("top_p", 1.0)),
        "repetition_penalty": float(get("repetition_penalty", 1.0)),
        "not_applied": {
            k: get(k, None) for k, noop in _NOT_APPLIED.items() if get(k, None) not in noop
        },
    }


def apply_repetition_penalty(logits: Any, seen: Any, penalty: float) -> Any:
    """transformers' ``RepetitionPenaltyLogitsProcessor`` with the already-seen token ids given
    as a (batch, vocab) boolean mask: seen logits are divided by ``penalty`` when positive (or
    zero), multiplied by it when negative; the others are unchanged."""
    import torch

    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalised, logits)


# --- the target ----------------------------------------------------------------------------------


def check_options(*, device: str = "auto", dtype: Any = "auto", batch_size: int = 16) -> None:
    """Raise ValueError for option values :class:`HFTarget` would reject, without loading
    anything (the dry run calls it: a run must not fail on them after other targets' work)."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    resolve_dtype(dtype, resolve_device(device))


def _check_backend_options(model: str, options: Mapping[str, Any]) -> None:
    """The ``hf`` backend's option check for the contract (:func:`check_options` on the values
    it can judge without loading ``model``)."""
    check_options(**{k: options[k] for k in ("device", "dtype", "batch_size") if k in options})


@register_backend("hf", check_options=_check_backend_options, hub_models=True)
class HFTarget:
    """A local transformers causal LM (checkpoint directory, hub id available offline, or GGUF).

    ``batch_size`` counts generated sequences (prompt x sample) per forward pass.
    ``model_kwargs`` go to ``from_pretrained`` (e.g. ``attn_implementation``, ``device_map``).
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        device: str = "auto",
        dtype: Any = "auto",
        batch_size: int = 16,
        family: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        skip_special_tokens: bool = True,
        progress: bool = False,
        model_kwargs: dict[str, Any] | None = None,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        check_options(device=device, dtype=dtype, batch_size=batch_size)
        if not isinstance(model, (str, os.PathLike)) or not str(model):
            raise ValueError(f"model must be a path (str or PathLike), got {model!r}")
        self.cache_dir = cache_root(cache_dir)
        resolved = resolve_model(str(model))  # a MissingModelError (ValueError) names the model
        self.hub_model = resolved if resolved.is_hub else None
        source = resolved.path
        load_dir = self._load_dir(source)
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.batch_size = batch_size
        self.skip_special_tokens = skip_special_tokens
        self.progress = progress
        self.tokenizer = AutoTokenizer.from_pretrained(str(load_dir))
        kwargs = dict(model_kwargs or {})
        self.model = AutoModelForCausalLM.from_pretrained(str(load_dir), dtype=self.dtype, **kwargs)
        if "device_map" not in kwargs:
            self.model.to(self.device)
        self.model.eval()
        self.model_dir = load_dir
        self.eos_ids = self._eos_ids()
        if not self.eos_ids:
            raise ValueError(f"model: {str(model)!r} defines no EOS token (config or tokenizer)")
        self.pad_id = next(
            i
            for i in (self.tokenizer.pad_token_id, *sorted(self.eos_ids), 0)
            if i is not None and i >= 0
        )
        if self.hub_model is not None:  # a hub id resolved to a snapshot dir
            label = self.hub_model.repo_id
        else:
            label = source.name if source.is_file() else source.resolve().name
        fp = checkpoint_identity(source, self.cache_dir)[:16]
        dname = str(self.dtype).replace("torch.", "")
        self.name = f"hf:{label}@{fp}/{dname}" + ("" if skip_special_tokens else "/raw-special")
        fam_dir = source if source.is_dir() else load_dir
        self.family = family or detect_family(fam_dir, self.model.config, self.tokenizer)
        if family is None and self.family is None and self.hub_model is not None:
            self.family = detect_family(
                Path(str(self.hub_model.repo_id).split("/")[-1]), self.model.config, self.tokenizer
            )  # name-based only: a snapshot directory is named by its commit
        if family is None and self.family is None and source.is_file():
            self.family = detect_family(
                Path(source.stem), self.model.config, self.tokenizer
            )  # name-based only
        self._torch = torch
        self._logits_to_keep = True
        self._can_prune = True

    # -- loading helpers --

    def _load_dir(self, source: Path) -> Path:
        if source.is_file():
            if source.suffix.lower() != ".gguf":
                raise ValueError(
                    f"model: {str(source)!r} is a file but not a .gguf; pass a checkpoint directory"
                )
            return convert_gguf(source, self.cache_dir)
        if (source / "config.json").is_file():
            return source
        ggufs = sorted(source.glob("*.gguf"))
        if len(ggufs) == 1:
            return convert_gguf(ggufs[0], self.cache_dir)
        raise ValueError(
            f"model: {str(source)!r} has no config.json and not exactly one .gguf file "
            f"(found {len(ggufs)})"
        )

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for src in (self.model.generation_config, self.model.config):
            e = getattr(src, "eos_token_id", None) if src is not None else None
            if isinstance(e, int):
                ids.add(e)
            elif isinstance(e, (list, tuple)):
                ids.update(int(x) for x in e)
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return ids

    def __repr__(self) -> str:
        return f"HFTarget(name={self.name!r}, family={self.family!r}, device={self.device!r})"

    # -- decoding parameters --

    def _checkpoint_decoding(self) -> dict[str, Any]:
        return checkpoint_decoding(getattr(self.model, "generation_config", None))

    def resolve_params(self, params: GenerationParams) -> GenerationParams:
        """``params`` with each ``"inherit"`` field from the checkpoint's generation config."""
        _check_params(params)
        inherited = params.inherited()
        if not inherited:
            return params
        ckpt = self._checkpoint_decoding()
        return dataclasses.replace(params, **{f: ckpt[f] for f in inherited})

    def generation_record(self, params: GenerationParams) -> dict[str, Any]:
        """What decoding ``params`` uses here: ``requested``, ``used`` (resolved), ``inherited``
        (the fields taken from the checkpoint), ``source`` and ``not_applied``."""
        ckpt = self._checkpoint_decoding()
        inherited = list(params.inherited())
        if inherited and ckpt["not_applied"]:
            log.warning(
                "%s: generation_config sets %s, which the hf backend does not apply",
                self.name,
                ckpt["not_applied"],
            )
        has_file = (Path(self.model_dir) / "generation_config.json").is_file()
        return {
            "backend": "hf",
            "requested": params.as_dict(),
            "used": self.resolve_params(params).as_dict(),
            "inherited": inherited,
            "source": "generation_config.json" if has_file else "transformers defaults",
            "not_applied": ckpt["not_applied"],
        }

    # -- the Target API --

    def generate(self, prompts: Sequence[str], params: GenerationParams) -> list[list[str]]:
        """``params.n`` completions per prompt; sample i of a prompt is reproducible on its own."""
        prompts = validate_prompts(prompts)
        params = resolve_params(self, params)
        rows = [(p, i) for p in prompts for i in range(params.n)]
        flat = self._generate_rows(rows, params)
        return [flat[k * params.n : (k + 1) * params.n] for k in range(len(prompts))]

    def generate_indexed(
        self, prompts: Sequence[str], sample_indices: Sequence[int], params: GenerationParams
    ) -> list[str]:
        """One completion per (prompt, sample index) pair: exactly sample ``sample_indices[j]``
        of ``generate([prompts[j]], params)`` (``params.n`` is ignored). Used by the cache to
        generate only the missing samples."""
        prompts = validate_prompts(prompts)
        params = resolve_params(self, params)
        idx = list(sample_indices)
        if len(idx) != len(prompts) or any(not isinstance(i, int) or i < 0 for i in idx):
            raise ValueError("sample_indices must hold one integer >= 0 per prompt")
        return self._generate_rows(list(zip(prompts, idx, strict=True)), params)

    # -- decoding --

    def _generate_rows(self, rows: list[tuple[str, int]], params: GenerationParams) -> list[str]:

        torch = self._torch
        if params.greedy:  # identical samples: one row per prompt
            rows_eff = [(p, 0) for p, _ in rows]
        else:
            rows_eff = rows
        unique = list(dict.fromkeys(rows_eff))
        prompt_list = list(dict.fromkeys(p for p, _ in unique))
        enc = self.tokenizer(prompt_list, add_special_tokens=True)["input_ids"]
        ids_of = dict(zip(prompt_list, enc, strict=True))
        for k, p in enumerate(prompt_list):
            if not ids_of[p]:
                raise ValueError(
                    f"prompts: prompt #{k} ({p[:40]!r}) encodes to no tokens and the tokenizer "
                    "adds no BOS; give a non-empty prompt"
                )
        # longest first: similar lengths share a batch, little padding
        order = sorted(range(len(unique)), key=lambda r: -len(ids_of[unique[r][0]]))
        results: dict[tuple[str, int], str] = {}
        batches = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        with torch.inference_mode():
            for batch in inner_bar(batches, desc="generate", unit="batch", enabled=self.progress):
                items = [unique[r] for r in batch]
                texts = self._decode_batch(
                    [ids_of[p] for p, _ in items],
                    [_row_key(p, params.seed, i) for p, i in items],
                    params,
                )
                results.update(zip(items, texts, strict=True))
        return [results[r] for r in rows_eff]

    def _decode_batch(
        self, ids: list[list[int]], keys: list[bytes], params: GenerationParams
    ) -> list[str]:
        torch = self._torch
        dev = self.model.device if hasattr(self.model, "device") else self.device
        b, width = len(ids), max(len(x) for x in ids)
        input_ids = torch.full((b, width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((b, width), dtype=torch.long)
        for r, x in enumerate(ids):
            input_ids[r, width - len(x) :] = torch.tensor(x)
            attn[r, width - len(x) :] = 1
        input_ids, attn = input_ids.to(dev), attn.to(dev)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        kwargs: dict[str, Any] = {"logits_to_keep": 1} if self._logits_to_keep else {}
        try:
            out = self.model(
                input_ids=input_ids, attention_mask=attn, position_ids=pos, use_cache=True, **kwargs
            )
        except TypeError:  # an architecture without `logits_to_keep`
            if not kwargs:
                raise
            self._logits_to_keep = False
            out = self.model(
                input_ids=input_ids, attention_mask=attn, position_ids=pos, use_cache=True
            )
        past = out.past_key_values
        logits = out.logits[:, -1, :]
        pos = pos[:, -1:]
        seen = None  # (rows, vocab) token ids of prompt + completion, for the repetition penalty
        if params.repetition_penalty != 1.0:
            seen = torch.zeros((b, logits.shape[-1]), dtype=torch.bool, device=logits.device)
            for r, x in enumerate(ids):
                seen[r, torch.tensor(x, device=logits.device)] = True
        in_batch = list(range(b))  # original row of each batch position
        done: set[int] = set()
        new: list[list[int]] = [[] for _ in range(b)]
        for step in range(params.max_new_tokens):
            tok = self._pick(logits, [keys[r] for r in in_batch], step, params, seen)
            if seen is not None:
                seen[torch.arange(len(in_batch), device=seen.device), tok] = True
            for r, t in zip(in_batch, tok.tolist(), strict=True):
                if r in done:
                    continue  # kept in the batch only when the cache cannot drop rows
                if t in self.eos_ids:
                    done.add(r)
                else:
                    new[r].append(t)
            if len(done) == b or step == params.max_new_tokens - 1:
                break
            keep = [j for j, r in enumerate(in_batch) if r not in done]
            if len(keep) < len(in_batch) and self._can_prune:
                # drop finished rows from the batch and the KV cache
                sel = torch.tensor(keep, device=attn.device)
                try:
                    past.batch_select_indices(sel)
                except (AttributeError, NotImplementedError):
                    self._can_prune = False
                else:
                    attn, pos, tok = attn[sel], pos[sel], tok[sel]
                    if seen is not None:
                        seen = seen[sel.to(seen.device)]
                    in_batch = [in_batch[j] for j in keep]
            attn = torch.cat([attn, attn.new_ones((len(in_batch), 1))], dim=1)
            pos = pos + 1
            out = self.model(
                input_ids=tok[:, None],
                attention_mask=attn,
                position_ids=pos,
                past_key_values=past,
                use_cache=True,
            )
            past = out.past_key_values
            logits = out.logits[:, -1, :]
        return [self._detok(ids[r], new[r]) for r in range(b)]

    def _pick(
        self,
        logits: Any,
        keys: list[bytes],
        step: int,
        params: GenerationParams,
        seen: Any | None = None,
    ) -> Any:
        torch = self._torch
        if seen is not None:
            logits = apply_repetition_penalty(logits.float(), seen, params.repetition_penalty)
        if params.greedy:
            return logits.argmax(dim=-1)
        wide = torch.float32 if logits.device.type == "mps" else torch.float64
        x = logits.to(wide) / params.temperature
        if params.top_k is not None and params.top_k < x.shape[-1]:
            vals, idx = torch.topk(x, params.top_k, dim=-1, sorted=True)
        elif params.top_p < 1.0:
            vals, idx = torch.sort(x, dim=-1, descending=True, stable=True)
        else:  # no truncation: inverse CDF in vocabulary order, no sort needed
            vals = x
            idx = torch.arange(x.shape[-1], device=x.device).expand_as(x)
        probs = torch.softmax(vals, dim=-1)
        if params.top_p < 1.0:
            before = torch.cumsum(probs, dim=-1) - probs  # mass strictly before each token
            probs = probs * (before < params.top_p)
        cdf = torch.cumsum(probs, dim=-1)
        u = torch.tensor([row_uniform(k, step) for k in keys], dtype=wide, device=x.device)
        j = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)
        j = j.clamp(max=cdf.shape[-1] - 1)
        return idx.gather(-1, j).squeeze(-1)

    def _detok(self, prompt_ids: list[int], new_ids: list[int]) -> str:
        if not new_ids:
            return ""
        skip = self.skip_special_tokens
        head = self.tokenizer.decode(prompt_ids, skip_special_tokens=skip)
        full = self.tokenizer.decode(prompt_ids + new_ids, skip_special_tokens=skip)
        if full.startswith(head):
            return full[len(head) :]
        return self.tokenizer.decode(new_ids, skip_special_tokens=skip)

    # -- token log-probabilities (calibdcd.targets.logprobs.TokenLogprobs) --

    def token_logprobs(
        self, texts: Sequence[str], prefixes: Sequence[str] | None = None, top_k: int = 0
    ) -> list[TextLogprobs]:
        """The log-probability of every token of each text after its prefix (teacher forcing,
        ``batch_size`` texts a forward pass); with ``top_k > 0`` the exact per-position mean and
        variance of the next-token log-probability too (:mod:`calibdcd.targets.logprobs`)."""
        pairs = check_logprob_inputs(texts, prefixes, top_k)
        return causal_lm_logprobs(
            self.model,
            self.tokenizer,
            pairs,
            batch_size=self.batch_size,
            moments=top_k > 0,
            progress=self.progress,
        )


def _check_params(params: GenerationParams) -> None:
    if not isinstance(params, GenerationParams):
        raise ValueError(f"params must be a GenerationParams, got {type(params).__name__}")
