"""The configs of the tiny transformers calibdcd builds from scratch (random weights, no download).

One place for the shape of a small model, shared by VeilProbe's local models
(:mod:`calibdcd.detectors.veilprobe.mlm`: the fill-mask model and the causal proxy;
:mod:`calibdcd.detectors.veilprobe.mapping`: the BERT2BERT mapping model) and the tests' tiny
target (:mod:`calibdcd.targets.tiny`). The caller seeds torch and instantiates the model
(``LlamaForCausalLM(llama_config(...))``): the weights then depend only on the seed and the
config. transformers is imported only when a function is called.
"""

from __future__ import annotations

from typing import Any

__all__ = ["bert_config", "llama_config"]


def llama_config(
    *,
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    intermediate_size: int,
    max_positions: int,
    pad_id: int | None,
    bos_id: int | None,
    eos_id: int | None,
) -> Any:
    """A Llama causal LM's ``LlamaConfig``: full multi-head attention (one key/value head per
    head) and input and output embeddings tied."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_positions,
        pad_token_id=pad_id,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        tie_word_embeddings=True,
    )


def bert_config(
    *,
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    intermediate_size: int,
    max_positions: int,
    pad_id: int | None,
    dropout: float = 0.1,
    **extra: Any,
) -> Any:
    """A BERT's ``BertConfig`` (``dropout``: hidden and attention dropout, BERT's 0.1 by
    default); ``extra`` goes to ``BertConfig`` as it is (e.g. ``is_decoder=True``)."""
    from transformers import BertConfig

    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_positions,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        pad_token_id=pad_id,
        **extra,
    )
