"""Token log-probabilities of a given text: a declared target capability (gray-box attacks).

A target that can score a text (not only continue it) implements :class:`TokenLogprobs`::

    rows = target.token_logprobs(texts, prefixes=None, top_k=0)

``rows[i]`` is a :class:`TextLogprobs`: for every scored token ``x_t`` of ``texts[i]`` (read after
``prefixes[i]``, "" by default) its log-probability ``log p(x_t | prefix, x_<t)``; with
``top_k > 0`` also the mean and variance of ``log p(z | prefix, x_<t)`` for ``z`` drawn from the
model's next-token distribution at that position (Min-K%++'s ``mu`` and ``sigma^2``).

Which tokens are scored (the same rule for every backend): the prompt ``prefix + text`` is
tokenised as one string (the tokenizer's special tokens added, as for generation), and a token is
the text's when it starts at or after the text's first character; the prompt's first token is
never scored (it has no context). A token straddling the prefix/text boundary is the prefix's.

Backends:

* ``hf`` (:func:`causal_lm_logprobs`): teacher forcing, batched, on the model's device and dtype
  (log-softmax in float32); the moments are exact (the whole vocabulary).
* OpenAI-compatible servers (:class:`LogprobQuery`, :func:`echo_logprobs`): one completions request
  per prompt with ``echo: true``, ``max_tokens: 0`` and ``logprobs: top_k`` (vLLM's "echo without
  generation"), answered in the legacy ``logprobs`` format (``tokens``, ``token_logprobs``,
  ``top_logprobs``); the text's tokens are found from the end of the prompt by the lengths of the
  decoded tokens. The moments are approximated from the ``top_k`` listed alternatives
  (:func:`topk_moments`; docs/interpretations.md).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from calibdcd.targets.base import GenerationParams

__all__ = [
    "LogprobQuery",
    "TextLogprobs",
    "TokenLogprobs",
    "causal_lm_logprobs",
    "check_logprob_inputs",
    "echo_logprobs",
    "topk_moments",
]


@dataclasses.dataclass(frozen=True)
class TextLogprobs:
    """The scored tokens of one text: ``logprobs`` (T,), and with moments ``mean``/``var`` (T,)
    of the log-probability under the model's next-token distribution (``exact``: over the whole
    vocabulary; otherwise from the top-k alternatives a server listed)."""

    logprobs: np.ndarray
    mean: np.ndarray | None = None
    var: np.ndarray | None = None
    exact: bool = True

    def as_json(self) -> dict[str, Any]:
        def arr(a: np.ndarray | None) -> list[float] | None:
            return None if a is None else [float(x) for x in a]

        return {
            "logprobs": arr(self.logprobs),
            "mean": arr(self.mean),
            "var": arr(self.var),
            "exact": self.exact,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TextLogprobs:
        def arr(v: Any) -> np.ndarray | None:
            return None if v is None else np.asarray(v, dtype=np.float64)

        lp = arr(d["logprobs"])
        assert lp is not None
        return cls(lp, arr(d.get("mean")), arr(d.get("var")), bool(d.get("exact", True)))


@runtime_checkable
class TokenLogprobs(Protocol):
    """A target that returns the log-probability of every token of a given text."""

    def token_logprobs(
        self, texts: Sequence[str], prefixes: Sequence[str] | None = None, top_k: int = 0
    ) -> list[TextLogprobs]: ...


def check_logprob_inputs(
    texts: Sequence[str], prefixes: Sequence[str] | None, top_k: int
) -> list[tuple[str, str]]:
    """(prefix, text) pairs of a ``token_logprobs`` call; ValueError names the bad argument."""
    if isinstance(texts, str) or not list(texts):
        raise ValueError("texts must be a non-empty sequence of strings")
    texts = list(texts)
    pre = [""] * len(texts) if prefixes is None else list(prefixes)
    if isinstance(prefixes, str) or len(pre) != len(texts):
        raise ValueError(f"prefixes must hold one string per text ({len(texts)}), got {prefixes!r}")
    for name, seq in (("texts", texts), ("prefixes", pre)):
        for i, s in enumerate(seq):
            if not isinstance(s, str):
                raise ValueError(f"{name}[{i}] is {type(s).__name__}, expected str")
    for i, t in enumerate(texts):
        if not t:
            raise ValueError(f"texts[{i}] is empty: nothing to score")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be an integer >= 0, got {top_k!r}")
    return list(zip(pre, texts, strict=True))


def _text_positions(offsets: Sequence[tuple[int, int]], prefix_chars: int) -> list[int]:
    """Token positions (>= 1) of the text after a prefix of ``prefix_chars`` characters, from
    the tokenizer's character offsets (zero-width special tokens are never the text's)."""
    return [j for j, (a, b) in enumerate(offsets) if j >= 1 and b > a and a >= prefix_chars]


def causal_lm_logprobs(
    model: Any,
    tokenizer: Any,
    pairs: Sequence[tuple[str, str]],
    *,
    batch_size: int,
    moments: bool,
    progress: bool = False,
) -> list[TextLogprobs]:
    """Teacher-forced log-probabilities of each (prefix, text) pair under a transformers causal
    LM (right padding, ``batch_size`` prompts a forward pass, log-softmax in float32)."""
    import torch

    from calibdcd.progress import inner_bar

    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            "token_logprobs needs a fast tokenizer (character offsets); this model's is slow"
        )
    prompts = [p + t for p, t in pairs]
    enc = tokenizer(prompts, add_special_tokens=True, return_offsets_mapping=True)
    ids, offs = enc["input_ids"], enc["offset_mapping"]
    keep = [_text_positions(o, len(p)) for o, (p, _) in zip(offs, pairs, strict=True)]
    dev = model.device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    order = sorted(range(len(prompts)), key=lambda i: -len(ids[i]))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    # only the positions that predict a scored token go through the LM head (transformers'
    # ``logits_to_keep`` as a boolean mask): a text scored after a long prefix (ReCaLL's) would
    # otherwise project every prefix position onto the vocabulary, (batch x length x vocab)
    # floats (6 GB for 64 x 500 tokens of SmolLM2), to keep a fifth of them
    sliced = "logits_to_keep" in inspect.signature(model.forward).parameters
    out: dict[int, TextLogprobs] = {}
    with torch.inference_mode():
        for batch in inner_bar(batches, desc="logprobs", unit="batch", enabled=progress):
            width = max(len(ids[i]) for i in batch)
            x = torch.full((len(batch), width), pad, dtype=torch.long)
            attn = torch.zeros((len(batch), width), dtype=torch.long)
            want = torch.zeros((len(batch), width), dtype=torch.bool)
            for r, i in enumerate(batch):
                x[r, : len(ids[i])] = torch.tensor(ids[i])
                attn[r, : len(ids[i])] = 1
                want[r, [p - 1 for p in keep[i]]] = True
            kwargs = {"logits_to_keep": want.to(dev)} if sliced and want.any() else {}
            logits = model(input_ids=x.to(dev), attention_mask=attn.to(dev), **kwargs).logits
            start = 0
            for r, i in enumerate(batch):
                pos = torch.tensor(keep[i], dtype=torch.long)
                if kwargs:  # the kept positions, row after row, in order
                    at = logits.reshape(-1, logits.shape[-1])[start : start + len(keep[i])]
                    start += len(keep[i])
                else:
                    at = logits[r][pos.to(logits.device) - 1]
                out[i] = _row_logprobs(at, x[r][pos].to(at.device), moments)
    return [out[i] for i in range(len(prompts))]


def _row_logprobs(logits: Any, targets: Any, moments: bool) -> TextLogprobs:
    """Log-probabilities of the scored tokens ``targets`` from the logits that predict them
    (one text: ``(n, vocab)`` and ``(n,)``)."""
    import torch

    if len(targets) == 0:
        empty = np.zeros(0)
        return TextLogprobs(empty, empty if moments else None, empty if moments else None)
    lsm = torch.log_softmax(logits.float(), dim=-1)
    lp = lsm.gather(-1, targets[:, None]).squeeze(-1)
    if not moments:
        return TextLogprobs(lp.double().cpu().numpy())
    p = lsm.exp()
    mean = (p * lsm).sum(-1)
    var = (p * (lsm - mean[:, None]) ** 2).sum(-1)
    to_np = [t.double().cpu().numpy() for t in (lp, mean, var)]
    return TextLogprobs(to_np[0], to_np[1], to_np[2], exact=True)


def topk_moments(alternatives: Sequence[float]) -> tuple[float, float]:
    """(mean, variance) of the next-token log-probability from the log-probabilities of the
    listed alternatives: the listed tokens with their own probabilities, the unlisted mass
    ``1 - sum p`` lumped at the smallest listed log-probability (every unlisted token is at most
    that likely). Exact when the alternatives cover the vocabulary."""
    lps = np.asarray([a for a in alternatives if a is not None and math.isfinite(a)], float)
    if lps.size == 0:
        return math.nan, math.nan
    ps = np.exp(lps)
    tail = max(0.0, 1.0 - float(ps.sum()))
    vals = np.append(lps, lps.min())
    ws = np.append(ps, tail)
    ws = ws / ws.sum()
    mean = float((ws * vals).sum())
    return mean, float((ws * (vals - mean) ** 2).sum())


def echo_logprobs(logprobs: Any, text: str, moments: bool) -> TextLogprobs:
    """The text's tokens from a completions answer's legacy ``logprobs`` object of an echoed
    prompt ending with ``text`` (``max_tokens: 0``): walking back from the prompt's last token
    while the decoded tokens still fit in ``text``. ValueError when it is not such an object."""
    if not isinstance(logprobs, Mapping):
        raise ValueError("the answer has no `logprobs` object: the server did not echo them")
    tokens, lps = logprobs.get("tokens"), logprobs.get("token_logprobs")
    tops = logprobs.get("top_logprobs")
    if not isinstance(tokens, list) or not isinstance(lps, list) or len(tokens) != len(lps):
        raise ValueError("`logprobs` lacks matching `tokens` and `token_logprobs` lists")
    if moments and (not isinstance(tops, list) or len(tops) != len(tokens)):
        raise ValueError("`logprobs` lacks `top_logprobs` (one per token) for the moments")
    used, first = 0, len(tokens)
    for j in range(len(tokens) - 1, 0, -1):  # the prompt's first token is never scored
        used += len(str(tokens[j]))
        if used > len(text):
            break
        first = j
    pos = [j for j in range(first, len(tokens)) if tokens[j]]
    if any(lps[j] is None for j in pos):
        raise ValueError("`token_logprobs` has null entries inside the text")
    lp = np.asarray([float(lps[j]) for j in pos])
    if not moments:
        return TextLogprobs(lp, exact=False)
    mv = [topk_moments(list((tops[j] or {}).values())) for j in pos]
    mean = np.asarray([m for m, _ in mv])
    var = np.asarray([v for _, v in mv])
    return TextLogprobs(lp, mean, var, exact=False)


@dataclasses.dataclass(frozen=True)
class LogprobQuery(GenerationParams):
    """A completions request that scores its prompt instead of continuing it (echo, no new
    tokens, ``top_k`` alternatives per position). Passes through a server target's one request
    path (retries, replicas) as a greedy one-token query; its answer is the ``logprobs`` object
    as JSON text."""

    max_new_tokens: int = 1
    temperature: float | str = 0.0
    alternatives: int = 0

    def body(self, model: str, prompt: str) -> dict[str, Any]:
        """The request body: vLLM's echo without generation (``max_tokens: 0``)."""
        return {
            "model": model,
            "prompt": prompt,
            "max_tokens": 0,
            "echo": True,
            "logprobs": int(self.alternatives),
            "temperature": 0.0,
        }
