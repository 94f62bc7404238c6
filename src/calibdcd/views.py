"""The original query and CalibDCD's fixed bank of controlled views (paper, Appendix
"Fixed controlled views").

A view maps a query string ``q`` (the detector's original query ``e0(s)``) to a variant
``prefix + q + suffix``; the text itself is never changed, so its membership status is preserved.

* Eight **universal views** U1..U8 prepend a response-role cue (``"Assistant:"`` + blank line, ...),
  exactly as the paper's table lists them.
* Two **model-specific views** per family vary the chat-template boundary between the user input
  and the assistant generation. The query is placed in the user turn of the family's official chat
  template (prefix = everything the template renders before the user content, suffix = everything
  after it up to and including the assistant-generation boundary):

  =========================  ====  ==========================================================
  family                     code  boundary (suffix after the user content)
  =========================  ====  ==========================================================
  qwen2.5                    Q1    official: ``<|im_end|>\\n<|im_start|>assistant\\n``
                             Q2    official + an extra blank-line separator (``\\n``)
  llama3.1                   L1    compact header: ``...assistant<|end_header_id|>`` (no ``\\n\\n``)
                             L2    official header with its blank-line separator ``\\n\\n``
  deepseek-r1-distill-qwen   D1    ``<｜Assistant｜>`` without the reasoning opener
                             D2    official: ``<｜Assistant｜><think>\\n``
  =========================  ====  ==========================================================

Choices (documented, and settings where it matters):

* **System prompt** (``system=``): ``"official"`` (default) keeps exactly what the official
  template renders for a conversation of one user message — Qwen2.5's default system turn
  ("You are Qwen, created by Alibaba Cloud. ..."), Llama 3.1's default system header
  ("Cutting Knowledge Date: December 2023 / Today Date: 26 Jul 2024"), nothing for
  DeepSeek-R1-Distill (its template has no default system prompt). This is the context a deployed
  chat model sees. ``"none"`` drops the system turn (user turn + boundary only).
* **BOS token**: the template's leading BOS (``<|begin_of_text|>``, ``<｜begin▁of▁sentence｜>``) is
  *not* part of the view, because the target's tokenizer adds it when it encodes the prompt
  (transformers ``add_special_tokens=True``; vLLM/SGLang do the same for ``/v1/completions``).
  Keeping it would give a doubled BOS.
* **User content is not trimmed**: Llama 3.1's template applies ``| trim`` to message contents; a
  view must keep the query byte-exact, so it does not.
* **Other families** (e.g. the lab's models): :func:`template_views` derives the two boundary
  views from any tokenizer's chat template by rendering one user message holding a sentinel with
  ``add_generation_prompt=True`` and splitting around the sentinel (see its docstring).

Reasoning models' outputs (``<think>...</think>``) are kept raw by default; use
:func:`strip_reasoning` to remove them.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Literal

__all__ = [
    "FAMILIES",
    "ORIGINAL",
    "View",
    "family_views",
    "known_family",
    "load_tokenizer",
    "strip_reasoning",
    "template_views",
    "universal_views",
    "view_bank",
]

SystemMode = Literal["official", "none"]


@dataclasses.dataclass(frozen=True)
class View:
    """A query construction ``e``: ``e(q) = prefix + q + suffix``."""

    code: str
    name: str
    prefix: str = ""
    suffix: str = ""

    def apply(self, query: str) -> str:
        if not isinstance(query, str):
            raise ValueError(f"query must be a str, got {type(query).__name__}")
        return f"{self.prefix}{query}{self.suffix}"

    def __call__(self, query: str) -> str:
        return self.apply(query)

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


#: the original query e0 itself (identity view)
ORIGINAL = View("E0", "original")

_UNIVERSAL: tuple[View, ...] = (
    View("U1", "assistant-role", "Assistant:\n\n"),
    View("U2", "user-role", "User:\n"),
    View("U3", "response", "Response:\n\n"),
    View("U4", "answer", "Answer:\n\n"),
    View("U5", "reasoning", "Reasoning:\n\n"),
    View("U6", "final-answer", "Final answer:\n\n"),
    View("U7", "summary", "Summary:\n\n"),
    View("U8", "continuation", "Continue the text:\n"),
)


def universal_views() -> list[View]:
    """The eight universal views U1..U8 of the paper's Table "Eight universal controlled views"."""
    return list(_UNIVERSAL)


# --- the three families of the paper, written from their official chat templates ----------------

_QWEN_SYSTEM = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\n"
)
_LLAMA_SYSTEM = (
    "<|start_header_id|>system<|end_header_id|>\n\n"
    "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
)


def _qwen25(system: SystemMode) -> list[View]:
    pre = (_QWEN_SYSTEM if system == "official" else "") + "<|im_start|>user\n"
    boundary = "<|im_end|>\n<|im_start|>assistant\n"
    return [
        View("Q1", "qwen2.5-official-boundary", pre, boundary),
        View("Q2", "qwen2.5-boundary-extra-blank-line", pre, boundary + "\n"),
    ]


def _llama31(system: SystemMode) -> list[View]:
    pre = (_LLAMA_SYSTEM if system == "official" else "") + (
        "<|start_header_id|>user<|end_header_id|>\n\n"
    )
    header = "<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
    return [
        View("L1", "llama3.1-compact-header", pre, header),
        View("L2", "llama3.1-official-header", pre, header + "\n\n"),
    ]


def _deepseek_r1_distill_qwen(system: SystemMode) -> list[View]:
    # No default system prompt in this template: both modes give the same strings.
    pre = "<｜User｜>"
    return [
        View("D1", "deepseek-r1-boundary-no-reasoning-opener", pre, "<｜Assistant｜>"),
        View("D2", "deepseek-r1-official-boundary-think", pre, "<｜Assistant｜><think>\n"),
    ]


_BUILDERS = {
    "qwen2.5": _qwen25,
    "llama3.1": _llama31,
    "deepseek-r1-distill-qwen": _deepseek_r1_distill_qwen,
}
_ALIASES = {
    "qwen2.5": "qwen2.5",
    "qwen25": "qwen2.5",
    "qwen2": "qwen2.5",
    "qwen": "qwen2.5",
    "llama3.1": "llama3.1",
    "llama31": "llama3.1",
    "llama-3.1": "llama3.1",
    "llama3": "llama3.1",
    "deepseek-r1-distill-qwen": "deepseek-r1-distill-qwen",
    "deepseek-r1-distill": "deepseek-r1-distill-qwen",
    "deepseek-r1": "deepseek-r1-distill-qwen",
}
#: families with hand-written boundary views (others go through a tokenizer's chat template)
FAMILIES: tuple[str, ...] = tuple(_BUILDERS)


def _canonical_family(family: str) -> str | None:
    return _ALIASES.get(family.strip().lower().replace("_", "-").replace(" ", ""))


def known_family(family: str) -> bool:
    """Whether ``family`` names a family with built-in boundary views (or an alias of one)."""
    return _canonical_family(family) is not None


# --- generic derivation from any chat template ----------------------------------------------------

_SENTINEL = "\u2063CALIBDCD_SENTINEL_7f3a\u2063"
_REASONING_OPENER = re.compile(r"<think>\s*$")


def _render(tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    out = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    if not isinstance(out, str):
        raise ValueError("tokenizer.apply_chat_template(tokenize=False) did not return a string")
    return out


def _strip_auto_bos(tokenizer: Any, text: str) -> str:
    """Drop a leading BOS the tokenizer would add again itself when encoding the prompt."""
    bos = getattr(tokenizer, "bos_token", None)
    if not bos or not text.startswith(bos):
        return text
    try:
        ids = tokenizer("x", add_special_tokens=True)["input_ids"]
    except Exception:  # pragma: no cover - exotic tokenizers
        return text
    if ids and ids[0] == getattr(tokenizer, "bos_token_id", None):
        return text[len(bos) :]
    return text


def template_views(tokenizer: Any, *, code: str = "T", family: str = "template") -> list[View]:
    """Two assistant-boundary views derived from ``tokenizer``'s chat template.

    The template is rendered for ``[{"role": "user", "content": SENTINEL}]`` with
    ``add_generation_prompt=True`` and split around the sentinel: ``prefix`` = everything before
    (any default system turn the template inserts and the user header; a BOS the tokenizer adds by
    itself is removed), ``boundary`` = everything after (end of the user turn + the assistant
    generation prompt). The second view is the "nearby boundary variant", chosen like the paper's
    hand-written pairs:

    * boundary ends with a reasoning opener ``<think>`` (+ whitespace): ``{code}1`` drops it,
      ``{code}2`` is official (the DeepSeek-R1 pair);
    * boundary ends with a blank line ``\\n\\n``: ``{code}1`` is the compact header without the
      trailing whitespace, ``{code}2`` is official (the Llama 3.1 pair);
    * otherwise: ``{code}1`` is official, ``{code}2`` adds one more ``\\n`` (the Qwen2.5 pair).
    """
    if getattr(tokenizer, "chat_template", None) in (None, ""):
        raise ValueError(
            "tokenizer has no chat_template: cannot derive model-specific views "
            "(pass family= one of " + ", ".join(FAMILIES) + ")"
        )
    full = _render(tokenizer, [{"role": "user", "content": _SENTINEL}], True)
    if full.count(_SENTINEL) != 1:
        raise ValueError("chat template does not render the user message content verbatim once")
    prefix, boundary = full.split(_SENTINEL)
    prefix = _strip_auto_bos(tokenizer, prefix)
    if not boundary:
        raise ValueError("chat template renders nothing after the user message")
    m = _REASONING_OPENER.search(boundary)
    if m:
        pair = [("no-reasoning-opener", boundary[: m.start()]), ("official-boundary", boundary)]
    elif boundary.endswith("\n\n"):
        pair = [("compact-header", boundary.rstrip("\n")), ("official-boundary", boundary)]
    else:
        pair = [("official-boundary", boundary), ("boundary-extra-blank-line", boundary + "\n")]
    return [
        View(f"{code}{i}", f"{family}-{name}", prefix, suffix)
        for i, (name, suffix) in enumerate(pair, start=1)
    ]


def family_views(
    family: str | None, tokenizer: Any = None, *, system: SystemMode = "official"
) -> list[View]:
    """The two model-specific assistant-boundary views for ``family``.

    Known families (``qwen2.5``, ``llama3.1``, ``deepseek-r1-distill-qwen`` and aliases) use the
    hand-written official boundaries; any other family (e.g. the lab's models) needs ``tokenizer``
    (a transformers tokenizer, or a path to a model/tokenizer directory) whose chat template is used
    through :func:`template_views`.
    """
    if system not in ("official", "none"):
        raise ValueError(f"system must be 'official' or 'none', got {system!r}")
    canon = _canonical_family(family) if family else None
    if canon is not None:
        return _BUILDERS[canon](system)
    if tokenizer is None:
        raise ValueError(
            f"family {family!r} has no built-in boundary views ({', '.join(FAMILIES)}); "
            "pass tokenizer= (a tokenizer or model directory with a chat template)"
        )
    if system != "official":
        raise ValueError("system='none' is only supported for the built-in families")
    if isinstance(tokenizer, str) or hasattr(tokenizer, "__fspath__"):
        tokenizer = load_tokenizer(tokenizer)
    return template_views(tokenizer, family=family or "template")


def load_tokenizer(path: str | Any) -> Any:
    """The tokenizer (with its chat template) of a local checkpoint: a model/tokenizer directory,
    a ``.gguf`` file, or a directory holding one ``.gguf`` and no ``config.json`` (GGUF
    tokenizers are read from the file's metadata: no weights are loaded)."""
    from transformers import AutoTokenizer  # local import: views must not need torch

    from calibdcd.model_refs import resolve_model

    p = resolve_model(str(path), need="tokenizer").path  # a hub id: its cached snapshot
    if p.is_dir() and not (p / "config.json").exists() and not (p / "tokenizer.json").exists():
        ggufs = sorted(p.glob("*.gguf"))
        if len(ggufs) == 1:
            p = ggufs[0]
    if p.is_file() and p.suffix.lower() == ".gguf":
        return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    return AutoTokenizer.from_pretrained(str(p))


def view_bank(
    family: str | None, tokenizer: Any = None, *, system: SystemMode = "official"
) -> list[View]:
    """The ten controlled views of CalibDCD: U1..U8 followed by the family's two boundary views."""
    return universal_views() + family_views(family, tokenizer, system=system)


_THINK_BLOCK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)
_THINK_CLOSE = re.compile(r"^.*?</think>\s*", re.DOTALL)


def strip_reasoning(text: str) -> str:
    """Remove ``<think>...</think>`` reasoning from a completion.

    Also handles completions of prompts ending with the opener (D2-style views), whose text starts
    inside the reasoning block and contains only the closing ``</think>``. An unterminated
    ``<think>`` block (generation stopped while reasoning) leaves nothing of the answer: the
    result is the empty string.
    """
    if "<think>" not in text and "</think>" in text:
        return _THINK_CLOSE.sub("", text, count=1)
    out = _THINK_BLOCK.sub("", text)
    idx = out.find("<think>")
    return out[:idx] if idx >= 0 else out
