"""DPDLLM's query e0 and the generation step (no torch here).

The official ``generate_by_llm.py`` prompts the target with the first ``L // 2`` space-separated
words of the text, samples one continuation (``pipeline(prompt, do_sample=True, temperature=0.7,
max_new_tokens=L)``: every other decoding field comes from the checkpoint's generation config,
transformers' top-k 50 / top-p 1.0 for the Llama and Pythia checkpoints it ran; top-k 20,
top-p 0.8, repetition penalty 1.05 for Qwen2.5-Instruct) and stores ``prompt + continuation``.
On a generation error it stores the *original text* instead; that leaks the answer into the
features, so here a failure is either an error or a recorded gap (``None``), never a substitution.

Under a CalibDCD view only the query sent to the target changes (``view.apply(e0)``); the text
handed to the features is always the unmodified e0 prompt plus the continuation.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Literal

from calibdcd.progress import inner_bar
from calibdcd.targets.base import GenerationParams

__all__ = ["GenerationGap", "first_words", "generate_continuations", "join_prompt"]

_WORD = re.compile(r"\S+")


class GenerationGap(RuntimeError):
    """Raised when the target fails or returns an empty continuation and gaps are not allowed."""


def first_words(text: str, n_words: int) -> str:
    """The prefix of ``text`` that ends with its ``n_words``-th whitespace-delimited word.

    The original whitespace inside the prefix (newlines, double spaces) is kept, so the prompt is
    a verbatim prefix of the text, as the reference LM memorised it. The official code splits on
    single spaces, which counts the same words for normally spaced text. A text with fewer words
    is returned whole (without trailing whitespace), as the official slice does.
    """
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    if n_words < 1:
        raise ValueError(f"n_words must be >= 1, got {n_words!r}")
    end = None
    for i, m in enumerate(_WORD.finditer(text)):
        end = m.end()
        if i + 1 == n_words:
            break
    if end is None:
        raise ValueError("text has no words (empty or whitespace only)")
    return text[:end]


def join_prompt(prompt: str, continuation: str, mode: Literal["auto", "exact"] = "auto") -> str:
    """The generated text ``g`` = prompt + continuation.

    ``exact`` concatenates as the official pipeline (``return_full_text=True``). ``auto`` (the
    default) adds one space when the prompt ends in a non-space and the continuation starts with a
    letter or digit: backends that decode only the new tokens (SentencePiece models such as Llama)
    drop the first token's leading space, which would otherwise glue two words together. Prompts
    end at a word boundary, so the rare model that continues the last word mid-word is the only
    case this changes wrongly.
    """
    if mode == "exact":
        return prompt + continuation
    if mode != "auto":
        raise ValueError(f"join must be 'auto' or 'exact', got {mode!r}")
    if prompt and continuation and not prompt[-1].isspace() and continuation[0].isalnum():
        return prompt + " " + continuation
    return prompt + continuation


def _call(target: Any, prompts: list[str], params: GenerationParams) -> list[str]:
    out = target.generate(prompts, params)
    if not isinstance(out, list) or len(out) != len(prompts):
        raise GenerationGap(
            f"target {getattr(target, 'name', target)!r} returned {type(out).__name__} "
            f"instead of a list of {len(prompts)} completion lists"
        )
    res: list[str] = []
    for i, comps in enumerate(out):
        if not comps or not isinstance(comps[0], str):
            raise GenerationGap(f"target returned no completion for prompt {i}")
        res.append(comps[0])
    return res


def generate_continuations(
    target: Any,
    queries: Sequence[str],
    params: GenerationParams,
    *,
    on_failure: Literal["raise", "gap"] = "raise",
    allow_empty: bool = False,
    batch_size: int = 32,
    progress: bool = True,
) -> list[str | None]:
    """One sampled continuation per query; ``None`` marks a gap (only with ``on_failure='gap'``).

    Queries are sent in batches of ``batch_size`` (a progress bar per batch). A batch whose call
    raises is retried one query at a time in gap mode, so one bad prompt costs only its own row.
    A continuation that is empty or whitespace only counts as a failure unless ``allow_empty``
    (then it is a valid, empty continuation: the target stopped at once).
    """
    if on_failure not in ("raise", "gap"):
        raise ValueError(f"on_failure must be 'raise' or 'gap', got {on_failure!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")

    qs = list(queries)
    results: list[str | None] = []
    bar = inner_bar(total=len(qs), desc="DPDLLM generate", unit="text", enabled=progress)
    try:
        for start in range(0, len(qs), batch_size):
            chunk = qs[start : start + batch_size]
            try:
                outs: list[str | None] = list(_call(target, chunk, params))
            except Exception as exc:
                if on_failure == "raise":
                    raise GenerationGap(
                        f"generation failed for queries {start}..{start + len(chunk) - 1}: {exc}"
                    ) from exc
                outs = []
                for q in chunk:
                    try:
                        outs.append(_call(target, [q], params)[0])
                    except Exception:
                        outs.append(None)
            for j, o in enumerate(outs):
                if o is not None and not o.strip() and not allow_empty:
                    if on_failure == "raise":
                        raise GenerationGap(
                            f"the target returned an empty continuation for query {start + j}"
                        )
                    outs[j] = None
            results.extend(outs)
            bar.update(len(chunk))
    finally:
        bar.close()
    return results
