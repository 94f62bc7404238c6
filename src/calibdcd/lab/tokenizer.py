"""The lab tokenizer: a byte-level BPE trained on background text only.

All chat tokens of all styles are added *special* tokens of the base tokenizer, so the base
model can be post-trained into any style. ``<think>``/``</think>`` are added tokens that are not
special (as in DeepSeek-R1-Distill), so they survive ``skip_special_tokens`` decoding. Nothing is
prepended automatically (like Qwen2.5); templates carry their own BOS.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from calibdcd.lab.chat import (
    ENDOFTEXT,
    PAD,
    SPECIAL_TOKENS,
    THINK_CLOSE,
    THINK_OPEN,
    ChatStyle,
    get_style,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

__all__ = ["style_tokenizer", "train_tokenizer"]

_THINK = (THINK_OPEN, THINK_CLOSE)


def train_tokenizer(texts: Sequence[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE (vocabulary including special and think tokens = vocab_size)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    n_special = len(SPECIAL_TOKENS)
    if vocab_size < 256 + n_special + len(_THINK) + 1:
        raise ValueError(f"vocab_size={vocab_size} is too small for a byte-level BPE")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(_THINK),
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer, length=len(texts))
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in _THINK])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=ENDOFTEXT,
        eos_token=ENDOFTEXT,
        pad_token=PAD,
        unk_token=None,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (ENDOFTEXT, PAD)],
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 30,
    )
    fast.padding_side = "left"
    return fast


def style_tokenizer(base: PreTrainedTokenizerFast, style: ChatStyle | str | None):
    """A copy of ``base`` configured for a chat style (template, BOS/EOS); ``None`` = the base.

    The base keeps the Qwen-style template, as Qwen2.5 base checkpoints do, so prompts can be
    put in a chat template even for the base model.
    """
    import copy

    tok = copy.deepcopy(base)
    st = (
        get_style("qwen2.5" if style is None else style)
        if not isinstance(style, ChatStyle)
        else style
    )
    tok.chat_template = st.template
    if style is None:
        tok.bos_token = ENDOFTEXT
        tok.eos_token = ENDOFTEXT
    else:
        tok.bos_token = st.bos_token or ENDOFTEXT
        tok.eos_token = st.eos_token
    return tok
