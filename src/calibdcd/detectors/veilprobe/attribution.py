"""Key-token attribution on a local proxy causal LM: GiLOT (official) and leave-one-out (cheap).

Both mask one input position at a time the way GiLOT does (token id -> pad id, attention bit -> 0)
and measure how much the proxy's predicted continuation distribution moves:

* GiLOT: for the text and for each masked copy, beam search (``num_beams`` beams, all returned,
  ``beam_tokens`` new tokens, greedy); each beam b contributes its next-token distribution after
  the beam, q_b, weighted by its sequence probability P_b (tokens after an end-of-sequence count as
  probability 1); pi = sum_b P_b q_b / sum_b P_b. Importance of position a = OT distance between
  pi and pi^(a) on the union of their top-p supports, with cost 1 - cos of the proxy's input
  embeddings, solved by IPOT (:mod:`.ot`).
* Leave-one-out: no beams; pi is the next-token distribution right after the text, one batched
  forward for all masked copies; distance KL(pi || pi^(a)) (or the same OT distance).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from .config import AttributionConfig
from .ot import cosine_cost, ot_distance, ot_distances, top_p_support

__all__ = ["Proxy", "TokenScore", "attribute", "kl_divergence", "load_proxy", "tokenizer_adds_bos"]


@dataclasses.dataclass(frozen=True)
class TokenScore:
    """Importance of one proxy token: its position, its character span in the text, its text."""

    position: int
    start: int
    end: int
    token: str
    score: float


@dataclasses.dataclass
class Proxy:
    path: str
    tokenizer: object
    model: object
    embeddings: np.ndarray  # (vocab, h) input embeddings, float32
    bos_id: int | None
    eos_id: int | None
    mask_id: int
    #: whether the proxy's tokenizer starts an encoded text with its BOS token
    #: (``proxy_bos="tokenizer"``)
    adds_bos: bool = False


def load_proxy(path: str | Path, device=None) -> Proxy:
    """Load a causal LM (a local directory or a hub id in the local hub cache) as an
    attribution proxy (eval mode)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from calibdcd.device import torch_device
    from calibdcd.model_refs import resolve_model

    p = resolve_model(path).path
    if not p.is_dir():
        raise ValueError(f"proxy model path {str(p)!r} is not a directory")
    tok = AutoTokenizer.from_pretrained(str(p))
    if not getattr(tok, "is_fast", False):
        raise ValueError(f"proxy tokenizer at {str(p)!r} is not a fast tokenizer (offsets needed)")
    dev = torch_device(device)
    model = AutoModelForCausalLM.from_pretrained(str(p)).to(dev).eval()
    emb = model.get_input_embeddings().weight.detach().float().cpu().numpy()
    cfg = model.config
    bos = getattr(cfg, "bos_token_id", None)
    eos = getattr(cfg, "eos_token_id", None)
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    if bos is None:  # a config without one: the tokenizer's (what it would prepend)
        bos = tok.bos_token_id
    return Proxy(str(p), tok, model, emb, bos, eos, int(pad), tokenizer_adds_bos(tok, bos))


def tokenizer_adds_bos(tokenizer, bos_id: int | None) -> bool:
    """Whether ``tokenizer``, encoding a text as it does by default, starts it with ``bos_id``
    (Gemma-3's does; GPT-2's and SmolLM2's do not)."""
    ids = tokenizer("a")["input_ids"]
    return bos_id is not None and len(ids) > 0 and ids[0] == bos_id


def kl_divergence(p: np.ndarray, q: np.ndarray, eps: float = 1e-12) -> float:
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    return float(np.sum(p * (np.log(p + eps) - np.log(q + eps))))


def _encode(proxy: Proxy, text: str, max_tokens: int):
    enc = proxy.tokenizer(
        text,
        add_special_tokens=False,
        return_offsets_mapping=True,
        truncation=True,
        max_length=max_tokens,
    )
    ids = list(enc["input_ids"])
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    return ids, offsets


def _variants(proxy: Proxy, ids: list[int], bos: bool = True):
    """(p + 1, L) ids and attention masks: row 0 the text, row 1 + a masks text position a."""
    import torch

    prefix = [proxy.bos_id] if proxy.bos_id is not None and bos else []
    base = torch.tensor([*prefix, *ids], dtype=torch.long)
    p, off = len(ids), len(prefix)
    input_ids = base.repeat(p + 1, 1)
    mask = torch.ones_like(input_ids)
    rows = torch.arange(1, p + 1)
    input_ids[rows, rows - 1 + off] = proxy.mask_id
    mask[rows, rows - 1 + off] = 0
    return input_ids, mask


def _forward_last(model, input_ids, attention_mask):
    """Logits at the last position only (``logits_to_keep=1`` avoids a (batch, L, vocab)
    tensor; models without that argument fall back to the full forward)."""
    try:
        out = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=1)
    except TypeError:
        out = model(input_ids=input_ids, attention_mask=attention_mask)
    return out.logits[:, -1, :]


def _last_distributions(proxy: Proxy, input_ids, mask, batch_size: int) -> np.ndarray:
    import torch

    dev = next(proxy.model.parameters()).device
    out = []
    with torch.no_grad():
        for k in range(0, input_ids.shape[0], batch_size):
            logits = _forward_last(
                proxy.model,
                input_ids[k : k + batch_size].to(dev),
                mask[k : k + batch_size].to(dev),
            )
            out.append(torch.softmax(logits.float(), dim=-1).cpu().numpy())
    return np.concatenate(out, axis=0)


def _beam_distributions(proxy: Proxy, input_ids, mask, cfg: AttributionConfig) -> np.ndarray:
    """pi for every row: beam-probability-weighted next-token distributions after the beams."""
    import torch

    dev = next(proxy.model.parameters()).device
    nb, width = cfg.num_beams, input_ids.shape[1]
    per_call = max(1, cfg.batch_size // nb)
    out = []
    with torch.no_grad():
        for k in range(0, input_ids.shape[0], per_call):
            ids = input_ids[k : k + per_call].to(dev)
            am = mask[k : k + per_call].to(dev)
            gen = proxy.model.generate(
                input_ids=ids,
                attention_mask=am,
                num_beams=nb,
                num_return_sequences=nb,
                max_new_tokens=cfg.beam_tokens,
                min_new_tokens=cfg.beam_tokens if proxy.eos_id is None else 0,
                do_sample=False,
                pad_token_id=proxy.mask_id,
                eos_token_id=proxy.eos_id,
            )
            new = gen[:, width:]
            # sequences after EOS are padded; those tokens count as probability 1
            alive = torch.ones_like(new, dtype=torch.bool)
            if proxy.eos_id is not None and new.shape[1] > 1:
                ended = (new == proxy.eos_id).long().cumsum(dim=1)
                alive[:, 1:] = ended[:, :-1] == 0
            full_mask = torch.cat([am.repeat_interleave(nb, dim=0), alive.long()], dim=1)
            logits = proxy.model(input_ids=gen, attention_mask=full_mask).logits.float()
            logp = torch.log_softmax(logits, dim=-1)
            step_lp = logp[:, width - 1 : -1, :].gather(-1, new.unsqueeze(-1)).squeeze(-1)
            seq_lp = (step_lp * alive).sum(dim=1)  # log P_b
            # next-token distribution after each beam: at its last alive position
            last = width - 1 + alive.long().sum(dim=1)
            q = torch.softmax(logits[torch.arange(gen.shape[0]), last], dim=-1)
            w = torch.softmax(seq_lp.view(-1, nb), dim=1)  # P_b / sum_b P_b
            pi = (w.unsqueeze(-1) * q.view(-1, nb, q.shape[-1])).sum(dim=1)
            out.append(pi.cpu().numpy())
    return np.concatenate(out, axis=0)


def _ot_settings(cfg: AttributionConfig) -> dict:
    """The IPOT settings of ``cfg``, as both solvers take them."""
    return {
        "beta": cfg.ipot_beta,
        "iterations": cfg.ipot_iterations,
        "inner": cfg.ipot_inner,
        "eps": cfg.marginal_eps,
        "marginals": cfg.marginals,
    }


def attribute(proxy: Proxy, text: str, cfg: AttributionConfig) -> list[TokenScore]:
    """Importance of every proxy token of ``text`` (in token order)."""
    ids, offsets = _encode(proxy, text, cfg.max_tokens)
    if not ids:
        return []
    bos = proxy.adds_bos if cfg.proxy_bos == "tokenizer" else bool(cfg.proxy_bos)
    input_ids, mask = _variants(proxy, ids, bos)
    if cfg.method == "gilot":
        dists = _beam_distributions(proxy, input_ids, mask, cfg)
    else:
        dists = _last_distributions(proxy, input_ids, mask, cfg.batch_size)
    pi = dists[0]
    if cfg.method == "loo" and cfg.loo_distance == "kl":
        values = [kl_divergence(pi, dists[a + 1]) for a in range(len(ids))]
    else:
        values = _ot_all(pi, dists[1:], proxy, cfg)
    scores = []
    for a, s in enumerate(values):
        start, end = offsets[a]
        scores.append(TokenScore(a, int(start), int(end), text[start:end], float(s)))
    return scores


#: device types whose proxies solve a text's OT distances in batches there: CUDA (float64; MPS
#: has none); on the CPU the batch is 1.34x numpy's speed (4 positions of 1,000 bins, 2 threads:
#: benchmarks/results/ipot_batched_cpu_zen3.json), not worth numpy's bit-for-bit results
BATCHED_OT_DEVICES: tuple[str, ...] = ("cuda",)


def _ot_all(pi: np.ndarray, masked: np.ndarray, proxy: Proxy, cfg: AttributionConfig) -> list:
    """The OT distance from ``pi`` to each masked copy's distribution: on a CUDA proxy a text's
    positions in batches of at most 2 GiB on its GPU (:func:`~.ot.ot_distances`, float64, equal
    to the numpy solver to 1e-12 where tested: on the CPU, and in tests/test_gpu.py), else one
    numpy IPOT a position (the reference, bit for bit as before)."""
    pairs = []
    for pa in masked:
        support = top_p_support(pi, pa, top_p=cfg.top_p_support, cap=cfg.max_support)
        pairs.append((pi[support], pa[support], support))
    dev = next(proxy.model.parameters()).device
    if dev.type in BATCHED_OT_DEVICES:
        return list(ot_distances(pairs, proxy.embeddings, device=dev, **_ot_settings(cfg)))
    emb = proxy.embeddings
    return [ot_distance(p, q, cosine_cost(emb[s]), **_ot_settings(cfg)) for p, q, s in pairs]
