"""Key-token attribution (GiLOT beams and leave-one-out) on a real tiny proxy, and aggregation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from calibdcd.detectors.veilprobe import AttributionConfig, MaskedLMConfig
from calibdcd.detectors.veilprobe.attribution import (
    TokenScore,
    _beam_distributions,
    _variants,
    attribute,
    load_proxy,
)
from calibdcd.detectors.veilprobe.perturb import aggregate_key_tokens

POOL = [
    "The river flows past the old mill and into the quiet valley below the hills.",
    "A small library opened in the village square, lending books to every family.",
    "Engineers tested the bridge with heavy trucks before it opened to traffic.",
    "The committee approved the budget after a long debate about school funding.",
] * 3


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    from calibdcd.detectors.veilprobe.mlm import train_causal_proxy

    cfg = MaskedLMConfig(
        vocab_size=200, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, epochs=3
    )
    path = train_causal_proxy(POOL, tmp_path_factory.mktemp("proxy"), cfg, progress=False)
    return load_proxy(path, device="cpu")


def test_single_beam_distribution_is_the_greedy_next_token_distribution(proxy):
    import torch

    text = POOL[0]
    ids = proxy.tokenizer(text, add_special_tokens=False)["input_ids"][:12]
    input_ids, mask = _variants(proxy, ids)
    cfg = AttributionConfig(method="gilot", num_beams=1, beam_tokens=3)
    pi = _beam_distributions(proxy, input_ids[:1], mask[:1], cfg)[0]
    seq = input_ids[:1]
    with torch.no_grad():
        for _ in range(3):
            nxt = proxy.model(input_ids=seq).logits[0, -1].argmax()
            if proxy.eos_id is not None and int(nxt) == proxy.eos_id:
                break
            seq = torch.cat([seq, nxt.view(1, 1)], dim=1)
        expected = torch.softmax(proxy.model(input_ids=seq).logits[0, -1].float(), -1).numpy()
    np.testing.assert_allclose(pi, expected, atol=1e-5)


def test_masked_variants_mask_one_position_each(proxy):
    ids = [11, 12, 13, 14]
    input_ids, mask = _variants(proxy, ids)
    off = 1 if proxy.bos_id is not None else 0
    assert input_ids.shape == (5, 4 + off)
    assert mask[0].all()
    for a in range(4):
        assert mask[a + 1, a + off] == 0 and mask[a + 1].sum() == 3 + off
        assert input_ids[a + 1, a + off] == proxy.mask_id


@pytest.mark.parametrize("method", ["gilot", "loo"])
def test_attribution_scores_every_token(proxy, method):
    cfg = AttributionConfig(
        method=method, num_beams=3, beam_tokens=2, ipot_iterations=200, max_support=50
    )
    text = POOL[1]
    scores = attribute(proxy, text, cfg)
    n = len(proxy.tokenizer(text, add_special_tokens=False)["input_ids"])
    assert len(scores) == n
    vals = np.array([s.score for s in scores])
    assert np.all(np.isfinite(vals)) and np.all(vals >= -1e-9) and vals.max() > 0
    for s in scores:
        assert text[s.start : s.end] == s.token


def test_beam_weights_form_a_distribution(proxy):
    ids = proxy.tokenizer(POOL[2], add_special_tokens=False)["input_ids"][:10]
    input_ids, mask = _variants(proxy, ids)
    cfg = AttributionConfig(method="gilot", num_beams=4, beam_tokens=3)
    pis = _beam_distributions(proxy, input_ids[:3], mask[:3], cfg)
    np.testing.assert_allclose(pis.sum(axis=1), 1.0, atol=1e-5)
    assert not np.allclose(pis[0], pis[1])  # masking a token moves the distribution


def test_cross_proxy_aggregation():
    text = "alpha beta gamma beta delta"
    # proxy 1 ranks gamma > beta(2nd) > alpha; proxy 2 ranks beta(1st) > delta
    p1 = [
        TokenScore(0, 0, 5, "alpha", 0.1),
        TokenScore(1, 6, 10, "beta", 0.2),
        TokenScore(2, 11, 16, "gamma", 0.9),
        TokenScore(3, 17, 21, "beta", 0.5),
        TokenScore(4, 22, 27, "delta", 0.0),
    ]
    p2 = [
        TokenScore(0, 0, 5, "alpha", 0.0),
        TokenScore(1, 6, 10, "beta", 0.8),
        TokenScore(2, 11, 16, "gamma", 0.0),
        TokenScore(3, 17, 21, "beta", 0.1),
        TokenScore(4, 22, 27, "delta", 0.7),
    ]
    keys = aggregate_key_tokens([p1, p2], text, n_key=3, top_k_factor=2)
    # each proxy keeps its top 2*3 = 6 -> halved to 4 (5 tokens): p1 drops delta, p2 drops gamma
    # (ties keep token order); means: gamma .9, delta .7, beta (.5+.2+.8+.1)/4 = .4, alpha .05
    assert [k.token for k in keys] == ["gamma", "delta", "beta"]
    assert [k.score for k in keys] == pytest.approx([0.9, 0.7, 0.4])
    assert (keys[2].start, keys[2].end) in {(6, 10), (17, 21)}
    assert text[keys[0].start : keys[0].end] == "gamma"
    # k is halved until it fits the text: 1 key from a 5-token text with factor 8
    assert len(aggregate_key_tokens([p1], text, n_key=1, top_k_factor=8)) == 1


def test_proxy_bos_tokenizer_follows_each_proxy_tokenizer(proxy):
    """``proxy_bos="tokenizer"`` prepends the BOS token exactly for a proxy whose tokenizer adds
    one (Gemma-3's does, SmolLM2's and GPT-2's do not): two copies of the tiny proxy, one whose
    tokenizer adds it and one whose tokenizer does not, score as ``proxy_bos=True`` and
    ``proxy_bos=False``."""
    import dataclasses

    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    from calibdcd.detectors.veilprobe.attribution import tokenizer_adds_bos

    assert proxy.bos_id is not None
    bos = proxy.tokenizer.convert_ids_to_tokens(proxy.bos_id)

    def tokenizer(single: str):
        backend = proxy.tokenizer.backend_tokenizer.__class__.from_str(
            proxy.tokenizer.backend_tokenizer.to_str()
        )
        backend.post_processor = TemplateProcessing(
            single=single, special_tokens=[(bos, proxy.bos_id)]
        )
        return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos)

    plain, with_bos = tokenizer("$A"), tokenizer(f"{bos} $A")
    assert with_bos("a")["input_ids"][0] == proxy.bos_id != plain("a")["input_ids"][0]
    assert tokenizer_adds_bos(with_bos, proxy.bos_id)
    assert not tokenizer_adds_bos(plain, proxy.bos_id)
    assert not tokenizer_adds_bos(with_bos, None)
    adds = dataclasses.replace(proxy, tokenizer=with_bos, adds_bos=True)
    adds_none = dataclasses.replace(proxy, tokenizer=plain, adds_bos=False)

    def scores(p, bos_setting):
        cfg = AttributionConfig(method="loo", proxy_bos=bos_setting)
        return [t.score for t in attribute(p, POOL[1], cfg)]

    auto_bos, auto_plain = scores(adds, "tokenizer"), scores(adds_none, "tokenizer")
    assert auto_bos == scores(adds, True)
    assert auto_plain == scores(adds_none, False)
    assert auto_plain != auto_bos  # the BOS changes what the proxy predicts
    with pytest.raises(ValueError, match="proxy_bos"):
        AttributionConfig(proxy_bos="yes")


@pytest.mark.parametrize("method", ["gilot", "loo"])
def test_a_texts_ot_distances_in_one_batch_score_as_one_at_a_time(proxy, method, monkeypatch):
    """The batched solve a CUDA proxy uses (ot.ot_distances), run here on the CPU proxy, gives
    the per-position numpy scores to 1e-12: GiLOT's, and leave-one-out's with the OT distance."""
    from calibdcd.detectors.veilprobe import attribution

    cfg = AttributionConfig(
        method=method, loo_distance="ot", num_beams=3, beam_tokens=2, ipot_iterations=300,
        max_support=40,
    )  # fmt: skip
    text = POOL[2]
    one_by_one = np.array([s.score for s in attribute(proxy, text, cfg)])
    monkeypatch.setattr(attribution, "BATCHED_OT_DEVICES", ("cuda", "cpu"))
    batched = np.array([s.score for s in attribute(proxy, text, cfg)])
    assert len(one_by_one) > 5 and one_by_one.max() > 0
    np.testing.assert_allclose(batched, one_by_one, rtol=1e-12, atol=1e-14)


def test_a_tiny_model_is_published_whole_or_not_at_all(tmp_path, monkeypatch):
    """VeilProbe's pool-trained proxy (and masked LM) is built in a temporary sibling and renamed
    into place: a build that fails before its end leaves no directory the cache would half
    trust (it wrote into the final one), and a leftover without its done.json is replaced."""
    import calibdcd.detectors.veilprobe.mlm as mlm

    cfg = MaskedLMConfig(
        vocab_size=200, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, epochs=1
    )

    def crash(path, text):
        raise OSError("disk full")

    with monkeypatch.context() as m:
        m.setattr(mlm, "atomic_write_text", crash)  # fails at the last write, done.json
        with pytest.raises(OSError, match="disk full"):
            mlm.train_causal_proxy(POOL, tmp_path, cfg, progress=False)
    assert not [p for p in (tmp_path / "proxy").iterdir() if p.is_dir()]
    path = mlm._model_path("proxy", mlm._texts(POOL), cfg, tmp_path)
    assert not (path / "done.json").exists()
    path.mkdir()
    (path / "config.json").write_text("{half")  # an older build's leftover
    built = mlm.train_causal_proxy(POOL, tmp_path, cfg, progress=False)
    assert built == path and (path / "done.json").is_file()
    assert json.loads((path / "config.json").read_text())  # the leftover replaced
    assert load_proxy(path, device="cpu") is not None
    # the tokenizer was published once, whole, beside its lock
    (tok,) = [p for p in (tmp_path / "tokenizer").iterdir() if p.is_dir()]
    assert (tok / "tokenizer.json").is_file()
