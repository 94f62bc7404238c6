"""VeilProbe module A: sample the target's suffixes for each text (whole text as the prompt)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...targets.base import GenerationParams
from .config import SamplingConfig

__all__ = ["generation_params", "sample_suffixes", "strip_echo"]


def generation_params(cfg: SamplingConfig) -> GenerationParams:
    return GenerationParams(
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        n=cfg.n_suffixes,
        seed=cfg.seed,
    )


def strip_echo(prompt: str, completion: str) -> str:
    """Drop an echoed prompt from the start of a completion (``str.removeprefix``, as official)."""
    return completion.removeprefix(prompt)


def sample_suffixes(
    texts: Sequence[str], target: Any, cfg: SamplingConfig, view: Any | None = None
) -> list[list[str]]:
    """``cfg.n_suffixes`` completions of ``view.apply(text)`` (or the raw text) for every text.

    A view wraps the query only; the returned suffixes are what the target produced after it.
    """
    if isinstance(texts, str):
        raise ValueError("texts must be a sequence of strings, not a single string")
    prompts = [view.apply(t) if view is not None else t for t in texts]
    if not prompts:
        return []
    out = target.generate(prompts, generation_params(cfg))
    if len(out) != len(prompts):
        raise ValueError(f"target returned {len(out)} completion lists for {len(prompts)} prompts")
    result = []
    for i, (p, comps) in enumerate(zip(prompts, out, strict=True)):
        if len(comps) != cfg.n_suffixes:
            raise ValueError(
                f"target returned {len(comps)} completions for prompt {i}, expected "
                f"{cfg.n_suffixes}"
            )
        result.append([strip_echo(p, c) for c in comps])
    return result
