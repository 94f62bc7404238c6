"""calibdcd.tiny_lm: the one builder of tiny from-scratch configs gives exactly the configs its
callers wrote out before (VeilProbe's fill-mask model, causal proxy and mapping model; the tests'
tiny target), so their seeded weights and saved files stay the same bytes."""

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from calibdcd.tiny_lm import bert_config, llama_config  # noqa: E402

SHAPE = dict(vocab_size=97, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=24)


def _same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_llama_config_is_the_written_out_config():
    ours = llama_config(max_positions=40, pad_id=3, bos_id=1, eos_id=2, **SHAPE)
    theirs = transformers.LlamaConfig(
        vocab_size=97, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, intermediate_size=24, max_position_embeddings=40,
        pad_token_id=3, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
    )  # fmt: skip
    assert ours.to_json_string() == theirs.to_json_string()
    torch.manual_seed(0)
    a = transformers.LlamaForCausalLM(ours)
    torch.manual_seed(0)
    b = transformers.LlamaForCausalLM(theirs)
    assert _same_weights(a, b)


@pytest.mark.parametrize("dropout", [None, 0.25])
def test_bert_config_is_the_written_out_config(dropout):
    given = {} if dropout is None else {"dropout": dropout}
    kept = {} if dropout is None else {
        "hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout
    }  # fmt: skip
    ours = bert_config(max_positions=40, pad_id=0, is_decoder=True, **SHAPE, **given)
    theirs = transformers.BertConfig(
        vocab_size=97, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=24, max_position_embeddings=40, pad_token_id=0, is_decoder=True,
        **kept,
    )  # fmt: skip
    assert ours.to_json_string() == theirs.to_json_string()
    torch.manual_seed(0)
    a = transformers.BertForMaskedLM(ours)
    torch.manual_seed(0)
    b = transformers.BertForMaskedLM(theirs)
    assert _same_weights(a, b)
